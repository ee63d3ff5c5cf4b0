package coproc_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tabuladb/tabula/coproc"
)

// TestDeadlineCapped: a requested deadline beyond Options.MaxDeadline is
// cut to it; a spinning guest asked to run for a minute is stopped at the
// cap, with an error that names the cap; the tenant's CPU time counts it.
func TestDeadlineCapped(t *testing.T) {
	const cap = 400 * time.Millisecond
	r, k := hostileRuntime(t, coproc.Options{MaxDeadline: cap})
	if got := r.Options().DefaultTimeout; got != cap {
		t.Fatalf("default timeout %v is over the cap %v", got, cap)
	}
	p := primary(newEngine(t))
	// An instance ready (a stopped guest's instance is replaced in the
	// background; under -race that can outlast a short deadline).
	warm := func() {
		t.Helper()
		var err error
		for range 20 {
			if _, err = r.Call(context.Background(), k, "ok", coproc.CallRequest{Partition: p}); err == nil {
				return
			}
		}
		t.Fatalf("warm call: %v", err)
	}
	warm()
	before := r.TenantCPUOf(k.Tenant)
	t0 := time.Now()
	_, err := r.Call(context.Background(), k, "spin", coproc.CallRequest{Partition: p, Deadline: time.Now().Add(time.Minute)})
	took := time.Since(t0)
	if !errors.Is(err, coproc.ErrDeadline) || !strings.Contains(err.Error(), "caps a call's deadline at 400ms") {
		t.Fatalf("spin: %v", err)
	}
	if took < cap || took > cap+2*time.Second {
		t.Fatalf("spin stopped after %v, want about %v", took, cap)
	}
	spent := r.TenantCPUOf(k.Tenant) - before
	if spent < cap*9/10 || spent > took {
		t.Fatalf("tenant %s charged %v for a %v spin", k.Tenant, spent, took)
	}
	if all := r.TenantCPU(); all[k.Tenant] != r.TenantCPUOf(k.Tenant) || len(all) != 1 {
		t.Fatalf("TenantCPU %v", all)
	}
	// A deadline under the cap is the caller's and the error says nothing
	// of the cap.
	warm()
	_, err = r.Call(context.Background(), k, "spin", coproc.CallRequest{Partition: p, Deadline: time.Now().Add(20 * time.Millisecond)})
	if !errors.Is(err, coproc.ErrDeadline) || strings.Contains(err.Error(), "caps") {
		t.Fatalf("short spin: %v", err)
	}
}

// TestTokenBoundToInput: a token reused with other input, keys or range is
// refused, not answered with the first call's result; the same call again
// is replayed. An over-long token is refused before anything runs.
func TestTokenBoundToInput(t *testing.T) {
	r := newRuntime(t, coproc.Options{})
	k := key("counter")
	compile(t, r, k, counterAdd)
	p := primary(newEngine(t))
	ctx := context.Background()
	req := coproc.CallRequest{Partition: p, Input: delta(5), Keys: [][]byte{[]byte("c")}, IdempotencyToken: "tok"}
	first, err := r.Call(ctx, k, "add", req)
	if err != nil || first.Replayed {
		t.Fatalf("first: %+v %v", first, err)
	}
	again, err := r.Call(ctx, k, "add", req)
	if err != nil || !again.Replayed || string(again.Output) != string(first.Output) {
		t.Fatalf("retry: %+v %v", again, err)
	}
	other := req
	other.Input = delta(7)
	otherKey := req
	otherKey.Keys = [][]byte{[]byte("d")}
	for name, r2 := range map[string]coproc.CallRequest{"input": other, "keys": otherKey} {
		res, err := r.Call(ctx, k, "add", r2)
		if !errors.Is(err, coproc.ErrTokenReused) || !strings.Contains(err.Error(), "other input") || res.Replayed {
			t.Fatalf("token reused with other %s: %+v %v", name, res, err)
		}
	}
	if got := counter(t, p, "c"); got != 5 {
		t.Fatalf("counter %d, want 5", got)
	}
	if got := counter(t, p, "d"); got != 0 {
		t.Fatalf("counter d %d, want 0", got)
	}
	long := req
	long.IdempotencyToken = strings.Repeat("x", coproc.MaxTokenBytes+1)
	if _, err := r.Call(ctx, k, "add", long); !errors.Is(err, coproc.ErrTokenTooLong) {
		t.Fatalf("long token: %v", err)
	}
	long.IdempotencyToken = strings.Repeat("x", coproc.MaxTokenBytes)
	if _, err := r.Call(ctx, k, "add", long); err != nil {
		t.Fatalf("token at the limit: %v", err)
	}
}
