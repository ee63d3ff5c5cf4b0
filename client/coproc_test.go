package client_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/coproc/abi"
	"github.com/tabuladb/tabula/coproc/coproctest"
	"github.com/tabuladb/tabula/internal/testcluster"
	"github.com/tabuladb/tabula/tableserver"
)

// coprocCluster starts 3 servers sharing the coprocessor test compilation
// cache (compiling a Go guest takes seconds, much more under -race).
func coprocCluster(t *testing.T) *testcluster.Cluster {
	t.Helper()
	cache := os.Getenv("TABULA_COPROC_TEST_CACHE")
	if cache == "" {
		uc, err := os.UserCacheDir()
		if err != nil {
			uc = t.TempDir()
		}
		cache = filepath.Join(uc, "tabula", "coproc-test-wazero")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tc, err := testcluster.Start(ctx, testcluster.Options{Servers: 3, Dir: t.TempDir(),
		ServerOptions: func(_ int, o *tableserver.Options) { o.CoprocCacheDir = cache }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tc.Close(); err != nil {
			t.Errorf("close cluster: %v", err)
		}
	})
	return tc
}

func buildModule(t *testing.T, dir string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	wasm, err := coproctest.Build(ctx, dir, t.TempDir())
	if err != nil {
		t.Fatalf("build %s: %v", dir, err)
	}
	return wasm
}

func le64(v int64) []byte { return binary.LittleEndian.AppendUint64(nil, uint64(v)) }

// TestCoprocessorsEndToEnd deploys example modules to a table on a
// 3-server cluster and invokes them through the SDK: a point write with an
// idempotency token applied once, a batch, a scatter-gather with merge;
// then a hostile module's runaway call is stopped while plain Gets go on.
func TestCoprocessorsEndToEnd(t *testing.T) {
	tc := coprocCluster(t)
	c := newClient(t, tc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tb := createTable(t, c, "feats", &api.TableOptions{Partitions: 4})

	// Invalid modules are refused at deploy; nothing is registered.
	if _, err := tb.DeployCoprocBytes(ctx, "bad", []byte("not wasm")); api.DetailOf(err).GetReason() != "module_invalid" {
		t.Fatalf("deploy of garbage: %v", err)
	}
	counter := buildModule(t, "examples/counter_add")
	v, err := tb.DeployCoprocBytes(ctx, "counter", counter)
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.WaitCoprocLive(ctx, "counter", v); err != nil {
		t.Fatal(err)
	}
	// The same bytes again are the same version.
	if v2, err := tb.DeployCoprocBytes(ctx, "counter", counter); err != nil || v2 != v {
		t.Fatalf("redeploy of the same module: version %d (first %d), %v", v2, v, err)
	}
	// A point call with a token, retried: applied once.
	for range 3 {
		out, err := tb.Invoke(ctx, "counter", "add", client.Invocation{Keys: [][]byte{[]byte("c1")}, Input: le64(5), IdempotencyToken: "tok-1"})
		if err != nil {
			t.Fatal(err)
		}
		if got := int64(binary.LittleEndian.Uint64(out)); got != 5 {
			t.Fatalf("counter after a retried add: %d, want 5", got)
		}
	}
	if v, err := tb.Get(ctx, []byte("c1")); err != nil || int64(binary.LittleEndian.Uint64(v)) != 5 {
		t.Fatalf("stored counter: %v %v", v, err)
	}
	// A batch over keys in several partitions: one call per partition.
	keys := [][]byte{[]byte("a"), []byte("b"), []byte("c"), []byte("d"), []byte("e"), []byte("f")}
	out, err := tb.Invoke(ctx, "counter", "add", client.Invocation{Keys: keys, Input: le64(2)})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 8*len(keys) {
		t.Fatalf("batch output %d bytes for %d keys", len(out), len(keys))
	}
	for _, k := range keys {
		if v, err := tb.Get(ctx, k); err != nil || int64(binary.LittleEndian.Uint64(v)) != 2 {
			t.Fatalf("counter %s after the batch: %v %v", k, v, err)
		}
	}
	// Unknown methods are refused clearly.
	if _, err := tb.Invoke(ctx, "counter", "nope", client.Invocation{Keys: [][]byte{[]byte("c1")}}); api.DetailOf(err).GetReason() != "unknown_method" {
		t.Fatalf("unknown method: %v", err)
	}

	// score_candidates: feature vectors in the table, a scatter-gather
	// over every partition, merged top-k at the coordinator.
	vec := func(xs ...float32) []byte {
		var b []byte
		for _, x := range xs {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
		}
		return b
	}
	var cands [][]byte
	for i := range 40 {
		k := []byte{'x', byte('a' + i%26), byte('0' + i/26)}
		cands = append(cands, k)
		if err := tb.Put(ctx, k, vec(float32(i), 1)); err != nil {
			t.Fatal(err)
		}
	}
	sv, err := tb.DeployCoprocBytes(ctx, "score", buildModule(t, "examples/score_candidates"))
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.WaitCoprocLive(ctx, "score", sv); err != nil {
		t.Fatal(err)
	}
	in := binary.LittleEndian.AppendUint32(nil, 3) // k
	in = binary.LittleEndian.AppendUint32(in, 2)   // dim
	in = append(in, vec(1, 0)...)                  // weights
	out, err = tb.Invoke(ctx, "score", "score", client.Invocation{Keys: cands, Input: in})
	if err != nil {
		t.Fatal(err)
	}
	items, err := abi.DecodeList(out[4:], 0)
	if err != nil || len(items) != 3 {
		t.Fatalf("merged top-k: %d items, %v; want 3", len(items), err)
	}
	for i, it := range items {
		if s := math.Float64frombits(binary.LittleEndian.Uint64(it)); s != float64(39-i) {
			t.Fatalf("top-k entry %d scores %v, want %d", i, s, 39-i)
		}
	}

	// A hostile module: its runaway call is stopped at its deadline while
	// plain Gets keep being served.
	hv, err := tb.DeployCoprocBytes(ctx, "hostile", buildModule(t, "examples/hostile"))
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.WaitCoprocLive(ctx, "hostile", hv); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var worst atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for !stop.Load() {
			t0 := time.Now()
			if _, err := tb.Get(ctx, []byte("c1")); err != nil {
				t.Errorf("get during a runaway call: %v", err)
				return
			}
			if d := time.Since(t0); d.Nanoseconds() > worst.Load() {
				worst.Store(d.Nanoseconds())
			}
		}
	})
	t0 := time.Now()
	_, err = tb.Invoke(ctx, "hostile", "spin", client.Invocation{Keys: [][]byte{[]byte("c1")}, Timeout: 200 * time.Millisecond})
	took := time.Since(t0)
	stop.Store(true)
	wg.Wait()
	if api.DetailOf(err).GetReason() != "guest_deadline" {
		t.Fatalf("runaway call: %v", err)
	}
	t.Logf("runaway call stopped after %v (deadline 200ms); slowest concurrent Get %v", took, time.Duration(worst.Load()))
	if took > 2*time.Second {
		t.Fatalf("runaway call took %v to stop", took)
	}
	// A Get stalled behind the guest would wait out its whole 200 ms.
	if w := time.Duration(worst.Load()); w > 190*time.Millisecond {
		t.Fatalf("a plain Get took %v while a guest spun", w)
	}
	cs, err := tb.Coprocs(ctx)
	if err != nil || len(cs) != 3 {
		t.Fatalf("coprocessors listed: %v %v", cs, err)
	}
}

// TestCoprocessorsRangeLimitsIsolation runs filter_scan over a key range,
// checks that the platform's idempotency records stay out of clients'
// reach, that a memory bomb is stopped at its cap while the server keeps
// serving, and that two tables never share an instance.
func TestCoprocessorsRangeLimitsIsolation(t *testing.T) {
	tc := coprocCluster(t)
	c := newClient(t, tc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tb := createTable(t, c, "people", &api.TableOptions{Partitions: 4})
	deploy := func(tb *client.Table, name, dir string) {
		t.Helper()
		v, err := tb.DeployCoprocBytes(ctx, name, buildModule(t, dir))
		if err != nil {
			t.Fatal(err)
		}
		if err := tb.WaitCoprocLive(ctx, name, v); err != nil {
			t.Fatal(err)
		}
	}

	// A range call: every partition filters its keys in [u10, u20).
	for i := range 30 {
		rec := fmt.Sprintf("name=n%02d,age=%d", i, i)
		if err := tb.Put(ctx, fmt.Appendf(nil, "u%02d", i), []byte(rec)); err != nil {
			t.Fatal(err)
		}
	}
	deploy(tb, "filter", "examples/filter_scan")
	out, err := tb.Invoke(ctx, "filter", "filter", client.Invocation{
		Range: &client.KeyRange{Start: []byte("u10"), End: []byte("u20")},
		Input: []byte("where age>=15\nselect name\n"),
	})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	slices.Sort(lines)
	want := []string{"u15\tname=n15", "u16\tname=n16", "u17\tname=n17", "u18\tname=n18", "u19\tname=n19"}
	if !slices.Equal(lines, want) {
		t.Fatalf("range call output %q, want %q", lines, want)
	}
	if _, err := tb.Invoke(ctx, "filter", "filter", client.Invocation{Range: &client.KeyRange{}, All: true}); api.DetailOf(err).GetReason() != "no_target" {
		t.Fatalf("a range and all at once: %v", err)
	}

	// Idempotency records are the platform's: never in a scan, never
	// readable or writable by a client, never a call's target.
	deploy(tb, "counter", "examples/counter_add")
	if _, err := tb.Invoke(ctx, "counter", "add", client.Invocation{Keys: [][]byte{[]byte("c1")}, Input: le64(1), IdempotencyToken: "t1"}); err != nil {
		t.Fatal(err)
	}
	n := 0
	err = tb.Scan(ctx, func(key, _ []byte) error {
		if bytes.HasPrefix(key, []byte(abi.ReservedPrefix)) {
			return fmt.Errorf("scan returned the reserved key %q", key)
		}
		n++
		return nil
	})
	if err != nil || n != 31 {
		t.Fatalf("scan: %d records (want 31), %v", n, err)
	}
	idem := []byte(abi.IdempotencyPrefix + "t1")
	if _, err := tb.Get(ctx, idem); api.DetailOf(err).GetReason() != "key_reserved" {
		t.Fatalf("get of a reserved key: %v", err)
	}
	if err := tb.Put(ctx, idem, []byte("x")); api.DetailOf(err).GetReason() != "key_reserved" {
		t.Fatalf("put of a reserved key: %v", err)
	}
	if _, err := tb.Invoke(ctx, "counter", "add", client.Invocation{Keys: [][]byte{idem}, Input: le64(1)}); api.DetailOf(err).GetReason() != "key_reserved" {
		t.Fatalf("invoke on a reserved key: %v", err)
	}

	// A memory bomb is stopped at the cap; the server keeps serving.
	deploy(tb, "hostile", "examples/hostile")
	_, err = tb.Invoke(ctx, "hostile", "membomb", client.Invocation{Keys: [][]byte{[]byte("c1")}, Timeout: 5 * time.Second})
	if api.DetailOf(err).GetReason() != "guest_memory_limit" {
		t.Fatalf("memory bomb: %v", err)
	}
	if v, err := tb.Get(ctx, []byte("u01")); err != nil || string(v) != "name=n01,age=1" {
		t.Fatalf("get after a memory bomb: %q %v", v, err)
	}

	// Two tables with the same module: each has its own instances, so an
	// instance-local counter counts each table's calls alone.
	abitest := buildModule(t, "testdata/abitest")
	t1 := createTable(t, c, "iso1", &api.TableOptions{Partitions: 1})
	t2 := createTable(t, c, "iso2", &api.TableOptions{Partitions: 1})
	for _, x := range []*client.Table{t1, t2} {
		v, err := x.DeployCoprocBytes(ctx, "seq", abitest)
		if err != nil {
			t.Fatal(err)
		}
		if err := x.WaitCoprocLive(ctx, "seq", v); err != nil {
			t.Fatal(err)
		}
	}
	for i := uint64(1); i <= 3; i++ {
		for _, x := range []*client.Table{t1, t2} {
			out, err := x.Invoke(ctx, "seq", "seq", client.Invocation{Keys: [][]byte{[]byte("k")}})
			if err != nil {
				t.Fatal(err)
			}
			if got := binary.LittleEndian.Uint64(out); got != i {
				t.Fatalf("call %d on %s saw instance counter %d: an instance served another table", i, x.Name(), got)
			}
		}
	}
}

// TestCoprocessorFollowsPartitionMove moves a table's only partition to a
// server that never hosted the table (its first server drains): the new
// server compiles the live version in the background and the module serves
// there, with no redeploy.
func TestCoprocessorFollowsPartitionMove(t *testing.T) {
	tc := coprocCluster(t)
	c := newClient(t, tc)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tb := createTable(t, c, "moving", &api.TableOptions{Partitions: 1, Storage: "memory"})
	v, err := tb.DeployCoprocBytes(ctx, "counter", buildModule(t, "examples/counter_add"))
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.WaitCoprocLive(ctx, "counter", v); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Invoke(ctx, "counter", "add", client.Invocation{Keys: [][]byte{[]byte("k")}, Input: le64(1)}); err != nil {
		t.Fatal(err)
	}
	host := func() string {
		m, err := tb.Map(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return m.GetPartitions()[0].GetReplicas()[0].GetAddr()
	}
	from := host()
	idx := slices.Index(tc.ServerAddrs(), from)
	if idx < 0 {
		t.Fatalf("partition on %s, not a cluster server %v", from, tc.ServerAddrs())
	}
	if err := tc.Server(idx).Drain(); err != nil {
		t.Fatal(err)
	}
	// The client rides out the move (NOT_OWNER, then coproc_compiling on
	// the new server) with its retries.
	out, err := tb.Invoke(ctx, "counter", "add", client.Invocation{Keys: [][]byte{[]byte("k")}, Input: le64(1)})
	if err != nil {
		t.Fatalf("invoke after the move: %v", err)
	}
	if to := host(); to == from {
		t.Fatalf("the partition did not move off the drained server %s", from)
	}
	// The partition's replicas hold its data (memory tables replicate
	// too): the count goes on from the first call's.
	if got := binary.LittleEndian.Uint64(out); got != 2 {
		t.Fatalf("counter after the move: %d, want 2 (the replicated count survives the drain)", got)
	}
}
