package client_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/testcluster"
	"github.com/tabuladb/tabula/tableserver"
)

// callCounter counts a client's unary point calls and Calls streams.
type callCounter struct {
	unary   atomic.Int64 // Get, Put, Delete, CompareAndSwap, MultiGet RPCs
	streams atomic.Int64 // Calls streams opened
}

func (c *callCounter) options() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			for _, m := range []string{"/Get", "/Put", "/Delete", "/CompareAndSwap", "/MultiGet"} {
				if strings.HasPrefix(method, "/tabula.v1.TableServer/") && strings.HasSuffix(method, m) {
					c.unary.Add(1)
				}
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			if method == api.TableServer_Calls_FullMethodName {
				c.streams.Add(1)
			}
			return streamer(ctx, desc, cc, method, opts...)
		}),
	}
}

// pointWorkload runs puts, gets, deletes and swaps from 4 goroutines and
// checks every answer.
func pointWorkload(t *testing.T, tbl *client.Table) {
	t.Helper()
	ctx := testCtx(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Go(func() {
			for i := range 10 {
				k := fmt.Appendf(nil, "w%d-k%d", w, i)
				if err := tbl.Put(ctx, k, k); err != nil {
					errs <- fmt.Errorf("put %s: %w", k, err)
					return
				}
				if v, err := tbl.Get(ctx, k); err != nil || string(v) != string(k) {
					errs <- fmt.Errorf("get %s: %q, %v", k, v, err)
					return
				}
				res, err := tbl.CompareAndSwap(ctx, client.CAS{Key: k, Expected: k, Value: []byte("swapped")})
				if err != nil || !res.Swapped {
					errs <- fmt.Errorf("swap %s: %+v, %v", k, res, err)
					return
				}
				res, err = tbl.CompareAndSwap(ctx, client.CAS{Key: k, Expected: k, Value: []byte("again")})
				if err != nil || res.Swapped || string(res.Current) != "swapped" {
					errs <- fmt.Errorf("stale swap %s: %+v, %v", k, res, err)
					return
				}
				if existed, err := tbl.Delete(ctx, k); err != nil || !existed {
					errs <- fmt.Errorf("delete %s: %t, %v", k, existed, err)
					return
				}
				if _, err := tbl.Get(ctx, k); err != client.ErrKeyNotFound {
					errs <- fmt.Errorf("get %s after delete: %v", k, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestCallsGoOnTheStream: with Calls on the stream, every point call goes
// there (one stream per server, none as an RPC of its own) and answers as
// the RPC does; with CallsUnary, none does.
func TestCallsGoOnTheStream(t *testing.T) {
	tc := startCluster(t, 3)
	for _, mode := range []client.CallMode{client.CallsStream, client.CallsUnary} {
		var n callCounter
		c, err := client.New(context.Background(), client.Options{Masters: tc.MasterAddrs(), Credential: tc.Credential(), Seed: testSeed,
			Calls: mode, DialOptions: n.options()})
		if err != nil {
			t.Fatal(err)
		}
		tbl := createTable(t, c, fmt.Sprintf("calls%d", mode), &api.TableOptions{Partitions: 6, Replication: 3})
		n.unary.Store(0)
		pointWorkload(t, tbl)
		switch mode {
		case client.CallsStream:
			if n.unary.Load() != 0 || n.streams.Load() == 0 || n.streams.Load() > 3 {
				t.Errorf("streamed calls: %d point RPCs, %d Calls streams; want 0 RPCs and one stream per server", n.unary.Load(), n.streams.Load())
			}
		case client.CallsUnary:
			if n.unary.Load() == 0 || n.streams.Load() != 0 {
				t.Errorf("unary calls: %d point RPCs, %d Calls streams; want only RPCs", n.unary.Load(), n.streams.Load())
			}
		}
		c.Close()
	}
}

// TestCallsFallBackToRPCs: against servers that do not serve Calls
// (Unimplemented, as an older server answers), the client sends its point
// calls as RPCs, and every call still succeeds.
func TestCallsFallBackToRPCs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tc, err := testcluster.Start(ctx, testcluster.Options{Servers: 3, Dir: t.TempDir(),
		ServerOptions: func(i int, o *tableserver.Options) {
			o.StreamInterceptors = append(o.StreamInterceptors, func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
				if info.FullMethod == api.TableServer_Calls_FullMethodName {
					return status.Error(codes.Unimplemented, "unknown method Calls")
				}
				return h(srv, ss)
			})
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	var n callCounter
	c, err := client.New(ctx, client.Options{Masters: tc.MasterAddrs(), Credential: tc.Credential(), Seed: testSeed,
		Calls: client.CallsStream, DialOptions: n.options()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tbl := createTable(t, c, "fallback", &api.TableOptions{Partitions: 3, Replication: 3})
	pointWorkload(t, tbl)
	if n.unary.Load() == 0 || n.streams.Load() > 3 {
		t.Errorf("%d point RPCs, %d Calls streams tried; want RPCs, and at most one try per server", n.unary.Load(), n.streams.Load())
	}
}
