package client_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
)

// TestGetsCoalesce: concurrent Gets to one server go together in MultiGet
// calls, and each still returns its own key's value, or ErrKeyNotFound,
// exactly as alone.
func TestGetsCoalesce(t *testing.T) {
	tc := startCluster(t, 1)
	var gets, multis, carried atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		switch {
		case strings.HasSuffix(method, "/Get"):
			gets.Add(1)
		case strings.HasSuffix(method, "/MultiGet"):
			multis.Add(1)
			carried.Add(int64(len(req.(*api.MultiGetRequest).GetGets())))
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	c, err := client.New(context.Background(), client.Options{Masters: []string{tc.MasterAddr()}, Credential: tc.Credential(), Seed: testSeed,
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(count)}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := testCtx(t)
	tbl := createTable(t, c, "co", &api.TableOptions{Partitions: 4, Replication: 1})
	const keys = 200
	for i := range keys {
		k := fmt.Appendf(nil, "k%d", i)
		if i%2 == 0 {
			if err := tbl.Put(ctx, k, k); err != nil {
				t.Fatal(err)
			}
		}
	}
	gets.Store(0)
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for w := range 32 {
		wg.Go(func() {
			for i := w; i < keys*5; i += 32 {
				k := fmt.Appendf(nil, "k%d", i%keys)
				v, err := tbl.Get(ctx, k)
				switch {
				case (i%keys)%2 == 1 && err != client.ErrKeyNotFound:
					errs <- fmt.Errorf("get %s of a key never written: %q, %v", k, v, err)
					return
				case (i%keys)%2 == 0 && (err != nil || !bytes.Equal(v, k)):
					errs <- fmt.Errorf("get %s: %q, %v", k, v, err)
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
	if multis.Load() == 0 || gets.Load()+carried.Load() < keys*5 {
		t.Fatalf("%d Gets: %d sent alone, %d in %d MultiGets", keys*5, gets.Load(), carried.Load(), multis.Load())
	}
	t.Logf("%d Gets: %d sent alone, %d in %d MultiGets", keys*5, gets.Load(), carried.Load(), multis.Load())
}
