package client

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tabuladb/tabula/api"
)

// callStub is a table server's stub whose point calls (Get, MultiGet,
// Put, Delete, CompareAndSwap) go on the server's Calls stream: one
// long-lived stream per server, each call one message each way, answered
// by id. A call costs far less CPU on both sides than a unary RPC, and is
// signed once with the stream. Every other method is the generated
// unary one. Each call gets exactly the reply or error the unary RPC
// would have given; a server without Calls (Unimplemented) gets unary
// calls from then on.
//
// Safe for concurrent use.
type callStub struct {
	api.TableServerClient
	base context.Context // the client's: Close ends the streams

	wg sync.WaitGroup // the streams' receivers

	mu sync.Mutex
	// Guarded by mu.
	cur    *callStream // the stream new calls go on; nil: open one
	unary  bool        // the server has no Calls
	closed bool        // close was called: no new streams
	nextID uint64
}

// callStream is one Calls stream and the calls waiting on it.
type callStream struct {
	st     api.TableServer_CallsClient
	cancel context.CancelFunc

	sendMu sync.Mutex // Send is not safe for concurrent use

	mu sync.Mutex
	// Guarded by mu.
	pending  map[uint64]chan *api.CallResponse
	err      error // set once the stream failed: every later call fails with it
	retiring bool  // the server asked for no more calls: CloseSend when idle
	closed   bool  // CloseSend called
}

func newCallStub(ts api.TableServerClient, base context.Context) *callStub {
	return &callStub{TableServerClient: ts, base: base}
}

// stream returns the stream for a new call and its id, opening one if
// there is none; nil with the server answering Unimplemented.
func (c *callStub) stream() (*callStream, uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.unary {
		return nil, 0, nil
	}
	if c.closed {
		return nil, 0, status.Error(codes.Canceled, "client: closed")
	}
	if c.cur == nil {
		ctx, cancel := context.WithCancel(c.base)
		st, err := c.TableServerClient.Calls(ctx)
		if err != nil {
			cancel()
			return nil, 0, err
		}
		cs := &callStream{st: st, cancel: cancel, pending: map[uint64]chan *api.CallResponse{}}
		c.cur = cs
		c.wg.Add(1)
		go c.receive(cs)
	}
	c.nextID++
	return c.cur, c.nextID, nil
}

// receive hands out cs's responses until it ends, then fails the calls
// still waiting on it.
func (c *callStub) receive(cs *callStream) {
	defer c.wg.Done()
	defer cs.cancel()
	for {
		resp, err := cs.st.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = status.Error(codes.Unavailable, "client: the server ended the call stream")
			}
			c.fail(cs, err)
			return
		}
		if resp.GetId() == 0 {
			// The server drains: new calls go on a new stream (which it
			// refuses, so they go elsewhere); this one ends once idle.
			c.retire(cs)
			continue
		}
		cs.mu.Lock()
		ch := cs.pending[resp.GetId()]
		delete(cs.pending, resp.GetId())
		cs.mu.Unlock()
		if ch != nil {
			ch <- resp
		}
		cs.closeIfIdle()
	}
}

// fail ends cs with err: its waiting calls get err, and new calls open a
// new stream.
func (c *callStub) fail(cs *callStream, err error) {
	c.mu.Lock()
	if c.cur == cs {
		c.cur = nil
	}
	if status.Code(err) == codes.Unimplemented {
		c.unary = true
	}
	c.mu.Unlock()
	cs.mu.Lock()
	if cs.err == nil {
		cs.err = err
	}
	pending := cs.pending
	cs.pending = nil
	cs.mu.Unlock()
	for _, ch := range pending {
		ch <- &api.CallResponse{Status: encodeStatusOf(err)}
	}
}

// retire stops new calls going on cs.
func (c *callStub) retire(cs *callStream) {
	c.mu.Lock()
	if c.cur == cs {
		c.cur = nil
	}
	c.mu.Unlock()
	cs.mu.Lock()
	cs.retiring = true
	cs.mu.Unlock()
	cs.closeIfIdle()
}

// closeIfIdle ends a retiring stream's sending side once no call waits.
func (cs *callStream) closeIfIdle() {
	cs.mu.Lock()
	idle := cs.retiring && !cs.closed && len(cs.pending) == 0
	if idle {
		cs.closed = true
	}
	cs.mu.Unlock()
	if idle {
		cs.sendMu.Lock()
		_ = cs.st.CloseSend()
		cs.sendMu.Unlock()
	}
}

// do runs one call on the stream; ok is false when the server has no
// Calls (the caller then calls the unary RPC).
func (c *callStub) do(ctx context.Context, req *api.CallRequest) (resp *api.CallResponse, ok bool, err error) {
	for attempt := 0; ; attempt++ {
		cs, id, err := c.stream()
		switch {
		case err != nil:
			return nil, true, err
		case cs == nil:
			return nil, false, nil
		}
		req.Id = id
		req.TimeoutMs = 0
		if d, has := ctx.Deadline(); has {
			left := time.Until(d)
			if left <= 0 {
				return nil, true, status.FromContextError(context.DeadlineExceeded).Err()
			}
			// Rounded up: the server's deadline must not fire before
			// the caller's (its answer would then be a failure the
			// caller's own deadline would not have given).
			req.TimeoutMs = uint64((left + time.Millisecond - 1) / time.Millisecond)
		}
		ch := make(chan *api.CallResponse, 1)
		cs.mu.Lock()
		if cs.err != nil || cs.retiring {
			cs.mu.Unlock()
			if attempt < 3 {
				continue // it ended meanwhile: the next call opens another
			}
			return nil, true, status.Error(codes.Unavailable, "client: the call stream keeps ending")
		}
		cs.pending[id] = ch
		cs.mu.Unlock()
		cs.sendMu.Lock()
		serr := cs.st.Send(req)
		cs.sendMu.Unlock()
		if serr != nil && !errors.Is(serr, io.EOF) {
			// Refused before it left (gRPC aborts the stream too): this
			// call gets the error; Recv ends the stream for the others.
			cs.mu.Lock()
			delete(cs.pending, id)
			cs.mu.Unlock()
			return nil, true, serr
		}
		// io.EOF: the stream has ended; Recv has (or will have) why and
		// answers every waiting call with it.
		select {
		case r := <-ch:
			if len(r.GetStatus()) > 0 {
				var st spb.Status
				if uerr := proto.Unmarshal(r.GetStatus(), &st); uerr != nil {
					return nil, true, status.Errorf(codes.Internal, "client: undecodable status of a call: %v", uerr)
				}
				if st.Code == int32(codes.Unimplemented) && c.isUnary() {
					return nil, false, nil // a server without Calls
				}
				return nil, true, status.ErrorProto(&st)
			}
			return r, true, nil
		case <-ctx.Done():
			cs.mu.Lock()
			delete(cs.pending, id)
			cs.mu.Unlock()
			cs.closeIfIdle()
			return nil, true, status.FromContextError(ctx.Err()).Err()
		}
	}
}

// close waits for the streams' receivers, which end with the client's
// context (the caller cancels it first).
func (c *callStub) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.wg.Wait()
}

func (c *callStub) isUnary() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.unary
}

// encodeStatusOf is err as an encoded google.rpc.Status.
func encodeStatusOf(err error) []byte {
	b, _ := proto.Marshal(status.Convert(err).Proto())
	return b
}

// Get implements api.TableServerClient.
func (c *callStub) Get(ctx context.Context, req *api.GetRequest, opts ...grpc.CallOption) (*api.GetResponse, error) {
	if len(opts) == 0 {
		if r, ok, err := c.do(ctx, &api.CallRequest{Call: &api.CallRequest_Get{Get: req}}); ok {
			if err != nil {
				return nil, err
			}
			return r.GetGet(), nil
		}
	}
	return c.TableServerClient.Get(ctx, req, opts...)
}

// MultiGet implements api.TableServerClient.
func (c *callStub) MultiGet(ctx context.Context, req *api.MultiGetRequest, opts ...grpc.CallOption) (*api.MultiGetResponse, error) {
	if len(opts) == 0 {
		if r, ok, err := c.do(ctx, &api.CallRequest{Call: &api.CallRequest_MultiGet{MultiGet: req}}); ok {
			if err != nil {
				return nil, err
			}
			return r.GetMultiGet(), nil
		}
	}
	return c.TableServerClient.MultiGet(ctx, req, opts...)
}

// Put implements api.TableServerClient.
func (c *callStub) Put(ctx context.Context, req *api.PutRequest, opts ...grpc.CallOption) (*api.PutResponse, error) {
	if len(opts) == 0 {
		if r, ok, err := c.do(ctx, &api.CallRequest{Call: &api.CallRequest_Put{Put: req}}); ok {
			if err != nil {
				return nil, err
			}
			return r.GetPut(), nil
		}
	}
	return c.TableServerClient.Put(ctx, req, opts...)
}

// Delete implements api.TableServerClient.
func (c *callStub) Delete(ctx context.Context, req *api.DeleteRequest, opts ...grpc.CallOption) (*api.DeleteResponse, error) {
	if len(opts) == 0 {
		if r, ok, err := c.do(ctx, &api.CallRequest{Call: &api.CallRequest_Delete{Delete: req}}); ok {
			if err != nil {
				return nil, err
			}
			return r.GetDelete(), nil
		}
	}
	return c.TableServerClient.Delete(ctx, req, opts...)
}

// CompareAndSwap implements api.TableServerClient.
func (c *callStub) CompareAndSwap(ctx context.Context, req *api.CompareAndSwapRequest, opts ...grpc.CallOption) (*api.CompareAndSwapResponse, error) {
	if len(opts) == 0 {
		if r, ok, err := c.do(ctx, &api.CallRequest{Call: &api.CallRequest_CompareAndSwap{CompareAndSwap: req}}); ok {
			if err != nil {
				return nil, err
			}
			return r.GetCompareAndSwap(), nil
		}
	}
	return c.TableServerClient.CompareAndSwap(ctx, req, opts...)
}
