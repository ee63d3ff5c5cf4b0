package coproc_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tabuladb/tabula/coproc"
	"github.com/tabuladb/tabula/coproc/abi"
	"github.com/tabuladb/tabula/engines"
)

func abiRuntime(t *testing.T) (*coproc.Runtime, coproc.ModuleKey) {
	r := newRuntime(t, coproc.Options{})
	k := key("abitest")
	compile(t, r, k, abiTest)
	return r, k
}

func call(t *testing.T, r *coproc.Runtime, k coproc.ModuleKey, method string, req coproc.CallRequest) coproc.CallResult {
	t.Helper()
	res, err := r.Call(context.Background(), k, method, req)
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	return res
}

func list(t *testing.T, b []byte) [][]byte {
	t.Helper()
	items, err := abi.DecodeList(b, 0)
	if err != nil {
		t.Fatal(err)
	}
	return items
}

func TestInfoIsDeterministic(t *testing.T) {
	r, k := abiRuntime(t)
	e := newEngine(t)
	info := coproc.PartitionInfo{ID: 42, Epoch: 7, Index: 3, Count: 8, HashStart: 100, HashEnd: 200, Primary: true}
	p := coproc.PartitionFromEngine(e, info, nil)
	now := time.Unix(1700000000, 123)
	req := coproc.CallRequest{Partition: p, RequestID: "req-1", Now: now,
		Keys: [][]byte{[]byte("a"), []byte("b")}, Range: coproc.KeyRange{Start: []byte("a")}}
	items := list(t, call(t, r, k, "info", req).Output)
	if string(items[0]) != "req-1" || int64(binary.LittleEndian.Uint64(items[1])) != now.UnixNano() {
		t.Fatalf("request id / now: %q %x", items[0], items[1])
	}
	got, err := abi.DecodePartitionInfo(items[2])
	if err != nil || got != info {
		t.Fatalf("partition info %+v %v", got, err)
	}
	if keys := list(t, items[3]); len(keys) != 2 || string(keys[1]) != "b" {
		t.Fatalf("keys %q", keys)
	}
	if rng := list(t, items[4]); string(rng[0]) != "a" || rng[1] != nil {
		t.Fatalf("range %q", rng)
	}
}

func TestGetScanAndLargeValues(t *testing.T) {
	r, k := abiRuntime(t)
	e := newEngine(t)
	p := primary(e)
	big := bytes.Repeat([]byte("v"), 300<<10) // over the guest's 64 KiB buffer: the result() path
	var batch []engines.Mutation
	for i := 0; i < 50; i++ {
		batch = append(batch, engines.Mutation{Key: []byte(fmt.Sprintf("k%02d", i)), Value: []byte(fmt.Sprintf("v%d", i))})
	}
	batch = append(batch, engines.Mutation{Key: []byte("big"), Value: big}, engines.Mutation{Key: []byte("empty"), Value: []byte{}})
	if err := e.(engines.Writer).Apply(batch); err != nil {
		t.Fatal(err)
	}
	if out := call(t, r, k, "get", coproc.CallRequest{Partition: p, Input: []byte("big")}).Output; !bytes.Equal(out, big) {
		t.Fatalf("big value: %d bytes", len(out))
	}
	_, err := r.Call(context.Background(), k, "get", coproc.CallRequest{Partition: p, Input: []byte("nope")})
	var ge *coproc.GuestError
	if !errors.As(err, &ge) || ge.Status != 9 {
		t.Fatalf("absent key: %v", err)
	}
	vs := list(t, call(t, r, k, "getmulti", coproc.CallRequest{Partition: p,
		Input: abi.AppendList(nil, [][]byte{[]byte("k01"), []byte("nope"), []byte("big"), []byte("empty")})}).Output)
	if string(vs[0]) != "v1" || vs[1] != nil || !bytes.Equal(vs[2], big) || vs[3] == nil || len(vs[3]) != 0 {
		t.Fatalf("getmulti: %d items", len(vs))
	}
	// A range is a predicate on keys: k10 <= key < k20.
	kvs := list(t, call(t, r, k, "scan", coproc.CallRequest{Partition: p,
		Input: abi.AppendList(nil, [][]byte{[]byte("k10"), []byte("k20")})}).Output)
	if len(kvs) != 20 || string(kvs[0]) != "k10" || string(kvs[19]) != "v19" {
		t.Fatalf("scan: %q", kvs)
	}
	// Unbounded: every record, the big one through result().
	kvs = list(t, call(t, r, k, "scan", coproc.CallRequest{Partition: p, Input: abi.AppendList(nil, [][]byte{nil, nil})}).Output)
	if len(kvs) != 2*52 || string(kvs[0]) != "big" || !bytes.Equal(kvs[1], big) {
		t.Fatalf("full scan: %d items", len(kvs))
	}
}

func TestScanClippedToPartition(t *testing.T) {
	r, k := abiRuntime(t)
	e := newEngine(t)
	var batch []engines.Mutation
	for i := 0; i < 200; i++ {
		batch = append(batch, engines.Mutation{Key: []byte(fmt.Sprintf("k%03d", i)), Value: []byte("v")})
	}
	if err := e.(engines.Writer).Apply(batch); err != nil {
		t.Fatal(err)
	}
	// Two partitions over one engine: their scans split the keys.
	total := 0
	for i := 0; i < 2; i++ {
		info := coproc.PartitionInfo{Index: i, Count: 2, Primary: true}
		info.HashStart, info.HashEnd = uint64(i)<<63, uint64(i)<<63|(1<<63-1)
		p := coproc.PartitionFromEngine(e, info, nil)
		n := len(list(t, call(t, r, k, "scan", coproc.CallRequest{Partition: p, Input: abi.AppendList(nil, [][]byte{nil, nil})}).Output)) / 2
		if n == 0 || n == 200 {
			t.Fatalf("partition %d saw %d keys", i, n)
		}
		total += n
	}
	if total != 200 {
		t.Fatalf("partitions saw %d keys, want 200", total)
	}
}

func TestReadYourWrites(t *testing.T) {
	r, k := abiRuntime(t)
	e := newEngine(t)
	if err := e.(engines.Writer).Apply([]engines.Mutation{{Key: []byte("ryw/c"), Value: []byte("stored")}}); err != nil {
		t.Fatal(err)
	}
	res := call(t, r, k, "ryw", coproc.CallRequest{Partition: primary(e), Keys: [][]byte{[]byte("ryw/a"), []byte("ryw/b"), []byte("ryw/c")}})
	kvs := list(t, res.Output)
	if len(kvs) != 4 || string(kvs[0]) != "ryw/b" || string(kvs[1]) != "3" || string(kvs[2]) != "ryw/c" {
		t.Fatalf("scan inside the call: %q", kvs)
	}
	if res.Writes != 2 {
		t.Fatalf("writes %d, want 2 (a deleted, b put)", res.Writes)
	}
	if v, _, err := e.Get([]byte("ryw/b")); err != nil || string(v) != "3" {
		t.Fatalf("ryw/b = %q %v", v, err)
	}
	if _, _, err := e.Get([]byte("ryw/a")); !errors.Is(err, engines.ErrNotFound) {
		t.Fatalf("ryw/a: %v", err)
	}
}

func TestFailedCallDiscardsWrites(t *testing.T) {
	r, k := abiRuntime(t)
	e := newEngine(t)
	res, err := r.Call(context.Background(), k, "put_then_fail", coproc.CallRequest{Partition: primary(e)})
	if !errors.Is(err, coproc.ErrGuestFailed) || res.Status != 7 || res.Message != "changed my mind" {
		t.Fatalf("put_then_fail: %+v %v", res, err)
	}
	if _, _, err := e.Get([]byte("fail-key")); !errors.Is(err, engines.ErrNotFound) {
		t.Fatalf("staged write applied: %v", err)
	}
}

func TestReservedKeysAndReadOnly(t *testing.T) {
	r, k := abiRuntime(t)
	e := newEngine(t)
	out := string(call(t, r, k, "reserved", coproc.CallRequest{Partition: primary(e)}).Output)
	if strings.Count(out, "reserved") != 2 {
		t.Fatalf("reserved: %s", out)
	}
	// A reserved key is never a call's target (get_keys would read it).
	_, err := r.Call(context.Background(), k, "echo", coproc.CallRequest{Partition: primary(e), Keys: [][]byte{coproc.IdempotencyKey("t")}})
	if !errors.Is(err, coproc.ErrReservedKey) {
		t.Fatalf("call on a reserved target key: %v", err)
	}
	secondary := coproc.PartitionFromEngine(e, coproc.PartitionInfo{Primary: false}, nil)
	out = string(call(t, r, k, "tryput", coproc.CallRequest{Partition: secondary}).Output)
	if !strings.Contains(out, "read-only") {
		t.Fatalf("put on a secondary: %s", out)
	}
	merged, err := r.Merge(context.Background(), k, "tryput", [][]byte{[]byte("a"), []byte("b")})
	if err != nil || string(merged) != "guest: no partition (in a merge)|guest: read-only (not the primary, or in a merge)|2" {
		t.Fatalf("merge: %q %v", merged, err)
	}
	// No merge export: concatenation.
	merged, err = r.Merge(context.Background(), k, "echo", [][]byte{[]byte("a"), []byte("b")})
	if err != nil || string(merged) != "ab" {
		t.Fatalf("concatenating merge: %q %v", merged, err)
	}
}
