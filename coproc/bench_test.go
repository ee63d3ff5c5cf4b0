package coproc_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/tabuladb/tabula/coproc"
	"github.com/tabuladb/tabula/engines"
)

// BenchmarkCall is the platform's cost of one call: pool, deadline, input
// copy, guest entry and exit; "nop" without the guest SDK, "input" through
// it. (bench/'s coproc suite measures the same through a table server.)
func BenchmarkCall(b *testing.B) {
	r := newRuntime(b, coproc.Options{})
	k := key("bench")
	compile(b, r, k, benchModule)
	p := primary(newEngine(b))
	// A request's context can be cancelled, as a gRPC handler's can.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, c := range []struct {
		method string
		input  int
	}{{"nop", 0}, {"input", 0}, {"input", 1024}} {
		b.Run(fmt.Sprintf("%s/%dB", c.method, c.input), func(b *testing.B) {
			req := coproc.CallRequest{Partition: p, Input: make([]byte, c.input)}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := r.Call(ctx, k, c.method, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkBatch32 is a call that batch-gets its 32 target keys: GetKeys,
// GetMulti, and the same call reading nothing.
func BenchmarkBatch32(b *testing.B) {
	r := newRuntime(b, coproc.Options{})
	k := key("bench")
	compile(b, r, k, benchModule)
	e := newEngine(b)
	keys := make([][]byte, 32)
	var muts []engines.Mutation
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "key-%04d", i)
		muts = append(muts, engines.Mutation{Key: keys[i], Value: make([]byte, 100)})
	}
	if err := e.(engines.Writer).Apply(muts); err != nil {
		b.Fatal(err)
	}
	req := coproc.CallRequest{Partition: primary(e), Keys: keys}
	ctx := context.Background()
	for _, m := range []string{"keys_only", "batch", "batch_multi"} {
		b.Run(m, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := r.Call(ctx, k, m, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkNativeBatch32 is BenchmarkBatch32's batch get without a guest.
func BenchmarkNativeBatch32(b *testing.B) {
	e := newEngine(b)
	keys := make([][]byte, 32)
	var muts []engines.Mutation
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "key-%04d", i)
		muts = append(muts, engines.Mutation{Key: keys[i], Value: make([]byte, 100)})
	}
	if err := e.(engines.Writer).Apply(muts); err != nil {
		b.Fatal(err)
	}
	p := primary(e)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := p.GetBatch(keys); err != nil {
			b.Fatal(err)
		}
	}
}
