package tableserver

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tabuladb/tabula/api"
)

// The Calls stream (api.TableServer.Calls): many point calls on one
// long-lived stream, each answered by its id. A call on it costs one
// message each way where a unary RPC costs a new HTTP/2 stream, its
// headers and a signature check, which on a busy server was most of a
// Get's CPU. Each call runs through the same chain a unary call of its
// kind does after the signature check (the Options' interceptors, then
// admission), under the unary method's name, so it is admitted, counted,
// throttled and answered exactly alike.
//
// Reads run on the stream's goroutine, in the order they arrive; writes
// wait for their log records to replicate, so each runs on a goroutine
// of its own. A drain asks the client to end the stream (a response with
// id 0) once the calls it sent are answered; calls that still arrive are
// refused as draining, as unary calls are.

// callsMaxTimeout bounds a call's deadline on the stream, as the SDK's
// longest call timeout does.
const callsMaxTimeout = 10 * time.Minute

// chainUnary composes interceptors into one, the first outermost.
func chainUnary(ics []grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		for i := len(ics) - 1; i >= 0; i-- {
			ic, next := ics[i], h
			h = func(ctx context.Context, req any) (any, error) { return ic(ctx, req, info, next) }
		}
		return h(ctx, req)
	}
}

// Calls implements api.TableServerServer.
func (s *service) Calls(st api.TableServer_CallsServer) error {
	ctx := st.Context()
	var (
		sendMu  sync.Mutex
		sendErr error
		wg      sync.WaitGroup
	)
	send := func(resp *api.CallResponse) {
		sendMu.Lock()
		defer sendMu.Unlock()
		if sendErr == nil {
			sendErr = st.Send(resp)
		}
	}
	defer wg.Wait()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-s.drainStarted:
			send(&api.CallResponse{Id: 0})
		case <-stop:
		case <-ctx.Done():
		}
	}()
	for {
		req, err := st.Recv()
		switch {
		case errors.Is(err, io.EOF):
			return nil
		case err != nil:
			return err
		}
		if req.GetId() == 0 {
			return api.InvalidArgument("id", "call_id_missing", 0, "a call on the Calls stream needs an id other than 0")
		}
		switch req.GetCall().(type) {
		case *api.CallRequest_Put, *api.CallRequest_Delete, *api.CallRequest_CompareAndSwap:
			wg.Add(1)
			go func() {
				defer wg.Done()
				send(s.call(ctx, req))
			}()
		default:
			send(s.call(ctx, req))
		}
	}
}

// call runs one call of the stream and builds its response.
func (s *service) call(ctx context.Context, req *api.CallRequest) *api.CallResponse {
	resp := &api.CallResponse{Id: req.GetId()}
	// The guard checks the whole message (too large, in-flight bytes)
	// first: a message it refused was not decoded (it has its id alone).
	release, err := s.limits.guard.Admit(api.TableServer_Calls_FullMethodName, req)
	if err != nil {
		resp.Status = encodeStatus(err)
		return resp
	}
	defer release()
	var (
		method string
		inner  proto.Message
		h      grpc.UnaryHandler
	)
	switch c := req.GetCall().(type) {
	case *api.CallRequest_Get:
		method, inner = api.TableServer_Get_FullMethodName, c.Get
		h = func(ctx context.Context, r any) (any, error) { return s.Get(ctx, r.(*api.GetRequest)) }
	case *api.CallRequest_MultiGet:
		method, inner = api.TableServer_MultiGet_FullMethodName, c.MultiGet
		h = func(ctx context.Context, r any) (any, error) { return s.MultiGet(ctx, r.(*api.MultiGetRequest)) }
	case *api.CallRequest_Put:
		method, inner = api.TableServer_Put_FullMethodName, c.Put
		h = func(ctx context.Context, r any) (any, error) { return s.Put(ctx, r.(*api.PutRequest)) }
	case *api.CallRequest_Delete:
		method, inner = api.TableServer_Delete_FullMethodName, c.Delete
		h = func(ctx context.Context, r any) (any, error) { return s.Delete(ctx, r.(*api.DeleteRequest)) }
	case *api.CallRequest_CompareAndSwap:
		method, inner = api.TableServer_CompareAndSwap_FullMethodName, c.CompareAndSwap
		h = func(ctx context.Context, r any) (any, error) {
			return s.CompareAndSwap(ctx, r.(*api.CompareAndSwapRequest))
		}
	default:
		resp.Status = encodeStatus(api.InvalidArgument("call", "call_missing", 0, "call %d carries no call this server knows (a newer client?)", req.GetId()))
		return resp
	}
	// Reads never wait (an engine read, no queue or log to wait on), so
	// they are spared the deadline's timer: it was ~5% of a server's CPU
	// under a read load. Writes wait for the log and keep it.
	if t := req.GetTimeoutMs(); t > 0 && !isRead(req) {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, min(time.Duration(t)*time.Millisecond, callsMaxTimeout))
		defer cancel()
	}
	out, err := s.callChain(ctx, inner, &grpc.UnaryServerInfo{Server: s, FullMethod: method}, h)
	if err != nil {
		resp.Status = encodeStatus(err)
		return resp
	}
	switch r := out.(type) {
	case *api.GetResponse:
		resp.Reply = &api.CallResponse_Get{Get: r}
	case *api.MultiGetResponse:
		resp.Reply = &api.CallResponse_MultiGet{MultiGet: r}
	case *api.PutResponse:
		resp.Reply = &api.CallResponse_Put{Put: r}
	case *api.DeleteResponse:
		resp.Reply = &api.CallResponse_Delete{Delete: r}
	case *api.CompareAndSwapResponse:
		resp.Reply = &api.CallResponse_CompareAndSwap{CompareAndSwap: r}
	}
	return resp
}

// isRead reports whether req is a Get or MultiGet, which answer from the
// engine without waiting on their context.
func isRead(req *api.CallRequest) bool {
	switch req.GetCall().(type) {
	case *api.CallRequest_Get, *api.CallRequest_MultiGet:
		return true
	}
	return false
}

// encodeStatus is err as an encoded google.rpc.Status.
func encodeStatus(err error) []byte {
	b, merr := proto.Marshal(status.Convert(err).Proto())
	if merr != nil {
		b, _ = proto.Marshal(status.New(status.Code(err), err.Error()).Proto())
	}
	return b
}
