package coproc_test

import (
	"context"
	"testing"

	"github.com/tabuladb/tabula/coproc"
)

// BenchmarkCallEcho is the overhead of one call: pool, input copy, guest
// entry, emit, output.
func BenchmarkCallEcho(b *testing.B) {
	r := newRuntime(b, coproc.Options{})
	k := key("abitest")
	compile(b, r, k, abiTest)
	p := primary(newEngine(b))
	req := coproc.CallRequest{Partition: p, Input: make([]byte, 64)}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Call(ctx, k, "echo", req); err != nil {
			b.Fatal(err)
		}
	}
}
