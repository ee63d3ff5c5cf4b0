package coproc_test

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/tabuladb/tabula/coproc"
)

func delta(d int64) []byte { return binary.LittleEndian.AppendUint64(nil, uint64(d)) }

func TestCounterAdd(t *testing.T) {
	r := newRuntime(t, coproc.Options{})
	k := key("counter")
	man := compile(t, r, k, counterAdd)
	if !man.Writes || !man.HasMethod("add") {
		t.Fatalf("manifest %+v", man)
	}
	e := newEngine(t)
	p := primary(e)
	ctx := context.Background()
	for i := 1; i <= 3; i++ {
		res, err := r.Call(ctx, k, "add", coproc.CallRequest{Partition: p, Input: delta(5), Keys: [][]byte{[]byte("c1")}})
		if err != nil {
			t.Fatal(err)
		}
		if got := int64(binary.LittleEndian.Uint64(res.Output)); got != int64(5*i) {
			t.Fatalf("call %d: output %d", i, got)
		}
	}
	v, _, err := e.Get([]byte("c1"))
	if err != nil || int64(binary.LittleEndian.Uint64(v)) != 15 {
		t.Fatalf("stored %v %v", v, err)
	}
	// A key listed twice is added twice: the second read sees the first write.
	res, err := r.Call(ctx, k, "add", coproc.CallRequest{Partition: p, Input: delta(1), Keys: [][]byte{[]byte("c2"), []byte("c2")}})
	if err != nil || len(res.Output) != 16 || binary.LittleEndian.Uint64(res.Output[8:]) != 2 {
		t.Fatalf("ryw: %x %v", res.Output, err)
	}
	// Bad input: the guest's error, nothing applied.
	_, err = r.Call(ctx, k, "add", coproc.CallRequest{Partition: p, Input: []byte("x"), Keys: [][]byte{[]byte("c1")}})
	var ge *coproc.GuestError
	if !errors.As(err, &ge) || ge.Status != 3 || !errors.Is(err, coproc.ErrGuestFailed) {
		t.Fatalf("bad input: %v", err)
	}
}
