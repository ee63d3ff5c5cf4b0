package client_test

import (
	"context"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
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
	c := newClient(t, tc.MasterAddr())
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
	cs, err := tb.Coprocs(ctx)
	if err != nil || len(cs) != 3 {
		t.Fatalf("coprocessors listed: %v %v", cs, err)
	}
}
