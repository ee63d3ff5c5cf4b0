package coproc_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/tabuladb/tabula/coproc"
)

func counter(t *testing.T, p coproc.Partition, k string) int64 {
	v, ok, err := p.Get([]byte(k))
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		return 0
	}
	return int64(binary.LittleEndian.Uint64(v))
}

func TestIdempotentRetriesApplyOnce(t *testing.T) {
	r := newRuntime(t, coproc.Options{})
	k := key("counter")
	compile(t, r, k, counterAdd)
	p := primary(newEngine(t))
	ctx := context.Background()
	req := coproc.CallRequest{Partition: p, Input: delta(10), Keys: [][]byte{[]byte("c")}, IdempotencyToken: "tok-1"}
	first, err := r.Call(ctx, k, "add", req)
	if err != nil || first.Replayed || first.Writes != 1 {
		t.Fatalf("first: %+v %v", first, err)
	}
	for i := 0; i < 3; i++ {
		res, err := r.Call(ctx, k, "add", req)
		if err != nil || !res.Replayed || string(res.Output) != string(first.Output) {
			t.Fatalf("retry %d: %+v %v", i, res, err)
		}
	}
	if got := counter(t, p, "c"); got != 10 {
		t.Fatalf("counter %d after retries, want 10", got)
	}
	// Concurrent duplicates of a new token: exactly one applies.
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := req
			req.IdempotencyToken = "tok-2"
			if _, err := r.Call(ctx, k, "add", req); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if got := counter(t, p, "c"); got != 20 {
		t.Fatalf("counter %d after concurrent duplicates, want 20", got)
	}
	// A token reused for another method is refused.
	abi := key("abitest")
	compile(t, r, abi, abiTest)
	_, err = r.Call(ctx, abi, "echo", coproc.CallRequest{Partition: p, IdempotencyToken: "tok-1"})
	if !errors.Is(err, coproc.ErrTokenReused) {
		t.Fatalf("reused token: %v", err)
	}
	// The idempotency record is invisible to the guest's scans.
	out, err := r.Call(ctx, abi, "scan", coproc.CallRequest{Partition: p, Input: []byte{2, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}})
	if err != nil || len(list(t, out.Output)) != 2 {
		t.Fatalf("scan sees %d items, %v", len(list(t, out.Output)), err)
	}
}

// TestConcurrentReadModifyWrite: concurrent calls on one key serialize
// through the commit check; every increment lands once.
func TestConcurrentReadModifyWrite(t *testing.T) {
	r := newRuntime(t, coproc.Options{MaxConflictRetries: 100, MaxConcurrency: 4})
	k := key("counter")
	compile(t, r, k, counterAdd)
	p := primary(newEngine(t))
	var wg sync.WaitGroup
	const workers, each = 4, 25
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				_, err := r.Call(context.Background(), k, "add", coproc.CallRequest{Partition: p, Input: delta(1),
					Keys: [][]byte{[]byte("hot")}, IdempotencyToken: fmt.Sprintf("w%d-%d", w, i)})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if got := counter(t, p, "hot"); got != workers*each {
		t.Fatalf("counter %d, want %d", got, workers*each)
	}
	t.Logf("conflicts retried: %d", r.Stats().Conflicts)
}
