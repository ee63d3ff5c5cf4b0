package client_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/testcluster"
)

// bigValueTable starts a one-server cluster and returns table "t" of one
// partition that takes values up to 40 MiB, with a context bounding the
// test; everything stops when the test ends. A put of 38 MiB takes ~2 s on
// an idle machine and several times that on a loaded CI one, so the client
// retries for up to a minute: the tests here are about refusals, not speed.
func bigValueTable(t *testing.T) (context.Context, *client.Table) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	c, err := testcluster.Start(ctx, testcluster.Options{Servers: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cl, err := client.New(ctx, client.Options{Masters: []string{c.MasterAddr()}, Credential: c.Credential(), RetryTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	if _, err := cl.CreateTable(ctx, "t", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Replication: 1, Partitions: 1, MaxValueBytes: 40 << 20}); err != nil {
		t.Fatal(err)
	}
	return ctx, cl.Table("t")
}

// TestBatchGetReplyTooLarge: a BatchGet whose values would not fit one reply
// fails at once with INVALID_ARGUMENT naming the limit, instead of being
// retried as if the server were busy.
func TestBatchGetReplyTooLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 160 MiB; the plain run covers it")
	}
	ctx, tb := bigValueTable(t)
	v := make([]byte, 40<<20)
	for _, k := range []string{"a", "b"} {
		if err := tb.Put(ctx, []byte(k), v); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Now()
	_, err := tb.BatchGet(ctx, [][]byte{[]byte("a"), []byte("b")})
	d := api.DetailOf(err)
	if d.GetCode() != api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT || d.GetReason() != "reply_too_large" || d.GetLimit() != api.MaxBatchBytes {
		t.Fatalf("BatchGet of 80 MiB: %v (code %v, reason %q)", err, d.GetCode(), d.GetReason())
	}
	if el := time.Since(t0); el > 30*time.Second { // retrying would last RetryTimeout, a minute
		t.Fatalf("refusal took %v: it was retried", el)
	}
	// One key at a time still works.
	if got, err := tb.Get(ctx, []byte("a")); err != nil || len(got) != len(v) {
		t.Fatalf("Get: %d bytes, %v", len(got), err)
	}
}

// TestOversizedSwapFailsAlone: a CompareAndSwap whose two values pass the
// servers' message limit fails by itself, with a clear error, and the
// point calls sharing its server's Calls stream go on untouched (on the
// stream, gRPC ends the whole stream over one message too large).
func TestOversizedSwapFailsAlone(t *testing.T) {
	ctx, tb := bigValueTable(t)
	big := make([]byte, 38<<20)
	if err := tb.Put(ctx, []byte("big"), big); err != nil {
		t.Fatal(err)
	}
	if err := tb.Put(ctx, []byte("small"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	// Readers keep calls in flight on the stream throughout.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var reads atomic.Int64
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if v, err := tb.Get(ctx, []byte("small")); err != nil || string(v) != "v" {
					errs <- fmt.Errorf("get beside the swap: %q, %v", v, err)
					return
				}
				reads.Add(1)
			}
		})
	}
	waitFor(t, 10*time.Second, "reads under way", func() bool { return reads.Load() > 100 })
	for range 3 {
		_, err := tb.CompareAndSwap(ctx, client.CAS{Key: []byte("big"), Expected: big, Value: big})
		if err == nil {
			t.Fatal("a swap of two 38 MiB values passed the 72 MiB message limit")
		}
		if d := api.DetailOf(err); d.GetCode() != api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT || d.GetReason() != "message_too_large" {
			t.Fatalf("swap over the message limit: %v (code %v, reason %q), want INVALID_ARGUMENT message_too_large", err, d.GetCode(), d.GetReason())
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
