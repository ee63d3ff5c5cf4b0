package api_test

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/replication/stream"
	"github.com/tabuladb/tabula/replication/stream/streampb"
)

// TestEveryRPCHasALimit: each request type of every service has a limit
// of its own; a new RPC must pick one (api/msglimits.go, or the stream
// package's MessageLimits).
func TestEveryRPCHasALimit(t *testing.T) {
	limits := api.MessageLimits{}.Merge(api.TableServerLimits(), api.MasterLimits(), stream.MessageLimits())
	for _, fd := range []protoreflect.FileDescriptor{api.File_tabula_proto, api.File_raft_transport_proto, streampb.File_stream_proto} {
		for i := 0; i < fd.Services().Len(); i++ {
			sd := fd.Services().Get(i)
			for j := 0; j < sd.Methods().Len(); j++ {
				md := sd.Methods().Get(j)
				if _, ok := limits[md.Input().FullName()]; !ok {
					t.Errorf("%s/%s: request type %s has no size limit; add one to api/msglimits.go", sd.FullName(), md.Name(), md.Input().FullName())
				}
			}
		}
	}
	if got := limits.Max(); got != api.MaxMessageBytes && got != stream.MaxMessageBytes {
		t.Errorf("largest limit %d: want the message limit", got)
	}
}

// guardedServer counts the calls that reached it and can hold one.
type guardedServer struct {
	api.UnimplementedTableServerServer
	calls atomic.Int64
	hold  chan struct{}
}

func (s *guardedServer) Get(ctx context.Context, req *api.GetRequest) (*api.GetResponse, error) {
	s.calls.Add(1)
	return &api.GetResponse{}, nil
}

func (s *guardedServer) Put(ctx context.Context, req *api.PutRequest) (*api.PutResponse, error) {
	s.calls.Add(1)
	if s.hold != nil {
		<-s.hold
	}
	return &api.PutResponse{}, nil
}

func (s *guardedServer) BulkUpload(ss grpc.ClientStreamingServer[api.BulkUploadRequest, api.BulkUploadResponse]) error {
	s.calls.Add(1)
	var n uint64
	for {
		m, err := ss.Recv()
		if err != nil {
			// What a careless handler does: report something else.
			if strings.Contains(err.Error(), "EOF") {
				return ss.SendAndClose(&api.BulkUploadResponse{Received: n})
			}
			return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "upload_failed", "upload failed")
		}
		n += uint64(len(m.GetData()))
	}
}

func startGuarded(t *testing.T, g *api.SizeGuard) (*guardedServer, api.TableServerClient) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	impl := &guardedServer{}
	srv := grpc.NewServer(g.ServerOptions()...)
	api.RegisterTableServerServer(srv, impl)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(api.MaxMessageBytes)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cc.Close()
		srv.Stop()
		<-done
	})
	return impl, api.NewTableServerClient(cc)
}

func TestSizeGuardRefusesBeforeTheHandler(t *testing.T) {
	g := api.NewSizeGuard(api.SizeGuardOptions{Limits: api.TableServerLimits()})
	impl, c := startGuarded(t, g)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hdr := &api.RequestHeader{Tenant: "t", Table: "x"}

	if _, err := c.Get(ctx, &api.GetRequest{Header: hdr, Key: []byte("k")}); err != nil {
		t.Fatalf("small get: %v", err)
	}
	// A Get of 100 KiB is over its 64 KiB limit though far under the
	// server-wide one.
	_, err := c.Get(ctx, &api.GetRequest{Header: hdr, Key: make([]byte, 100<<10)})
	d := api.DetailOf(err)
	if d.GetCode() != api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT || d.GetReason() != "message_too_large" || d.GetLimit() != api.SmallRequestBytes {
		t.Fatalf("oversized get: %v (detail %v)", err, d)
	}
	if !strings.Contains(err.Error(), "/tabula.v1.TableServer/Get") || !strings.Contains(err.Error(), "65536") {
		t.Fatalf("the error names neither the call nor the limit: %v", err)
	}
	if n := impl.calls.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1 (the small get only)", n)
	}
	// A Put of the same size is fine: its limit is a value's.
	if _, err := c.Put(ctx, &api.PutRequest{Header: hdr, Key: []byte("k"), Value: make([]byte, 100<<10)}); err != nil {
		t.Fatalf("put: %v", err)
	}

	// A client stream: the oversized chunk is refused, the handler's
	// own error replaced by the reason.
	st, err := c.BulkUpload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&api.BulkUploadRequest{Header: hdr, Data: make([]byte, 1<<20)}); err != nil {
		t.Fatal(err)
	}
	_ = st.Send(&api.BulkUploadRequest{Data: make([]byte, api.MaxBulkChunkBytes+api.SmallRequestBytes+1)})
	_, err = st.CloseAndRecv()
	if d := api.DetailOf(err); d.GetReason() != "message_too_large" || d.GetLimit() != api.MaxBulkChunkBytes+api.SmallRequestBytes {
		t.Fatalf("oversized chunk: %v", err)
	}
	if g.Refused() != 2 {
		t.Fatalf("refused %d, want 2", g.Refused())
	}
}

func TestSizeGuardBudget(t *testing.T) {
	budget := api.NewByteBudget(1 << 20)
	g := api.NewSizeGuard(api.SizeGuardOptions{Limits: api.TableServerLimits(), Budget: budget, BusyRetryAfter: 7 * time.Millisecond})
	impl, c := startGuarded(t, g)
	impl.hold = make(chan struct{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hdr := &api.RequestHeader{Tenant: "t", Table: "x"}
	// A request larger than the whole budget runs on an idle server.
	first := make(chan error, 1)
	go func() {
		_, err := c.Put(ctx, &api.PutRequest{Header: hdr, Key: []byte("k"), Value: make([]byte, 2<<20)})
		first <- err
	}()
	for budget.InUse() == 0 {
		select {
		case err := <-first:
			t.Fatalf("first put: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	_, err := c.Put(ctx, &api.PutRequest{Header: hdr, Key: []byte("k2"), Value: make([]byte, 1<<10)})
	if d := api.DetailOf(err); d.GetCode() != api.ErrorCode_ERROR_CODE_SERVER_BUSY || d.GetRetryAfterMs() != 7 {
		t.Fatalf("put over the budget: %v", err)
	}
	close(impl.hold)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if budget.InUse() != 0 {
		t.Fatalf("%d bytes still reserved", budget.InUse())
	}
	if impl.calls.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", impl.calls.Load())
	}
}
