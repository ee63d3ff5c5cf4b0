package enginetest

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tabuladb/tabula/engines"
)

// LoadFunc installs records as everything e serves from now on, through
// the engine's own loading API (for bulk: a version built from them,
// loaded and made current). records is never empty, holds each key once,
// and every ExpiresAt is 0. It may be called from any goroutine, so it
// reports failure by its error.
type LoadFunc func(e engines.Engine, records []engines.Record) error

// RunReadOnly runs the suite against a read-only engine: one that takes no
// writes (it is not an engines.Writer, or every write returns
// engines.ErrReadOnly) but serves whole snapshots installed by load. It
// runs the read checks of Run over loaded data, and checks that a load
// replaces what is served and that reads running during loads see one
// snapshot's records.
func RunReadOnly(t *testing.T, open OpenFunc, load LoadFunc) {
	tests := []struct {
		name string
		fn   func(*env, LoadFunc)
	}{
		{"GetMissing", func(v *env, _ LoadFunc) { testGetMissing(v) }},
		{"ScanEmpty", func(v *env, _ LoadFunc) { testScanEmpty(v) }},
		{"Close", func(v *env, _ LoadFunc) { testClose(v) }},
		{"Writes", testReadOnlyWrites},
		{"LoadGet", testLoadGet},
		{"ValuesAreCopies", testLoadCopies},
		{"Reload", testReload},
		{"ScanOnce", testLoadScanOnce},
		{"ScanStops", testLoadScanStops},
		{"Stats", testLoadStats},
		{"BatchGet", testLoadBatchGet},
		{"ClosedReads", testClosedReads},
		{"ConcurrentReadLoad", testConcurrentReadLoad},
		{"Model", testLoadModel},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(newEnv(t, open), load) })
	}
}

// records turns a map into a load's records.
func records(m map[string]string) []engines.Record {
	out := make([]engines.Record, 0, len(m))
	for k, v := range m {
		out = append(out, engines.Record{Key: []byte(k), Value: []byte(v)})
	}
	return out
}

func (v *env) load(load LoadFunc, m map[string]string) {
	v.t.Helper()
	if err := load(v.e, records(m)); err != nil {
		v.t.Fatalf("load %d records: %v", len(m), err)
	}
}

// wantExactly checks that the engine serves m: each key by Get, and
// nothing else by Scan.
func (v *env) wantExactly(m map[string]string) {
	v.t.Helper()
	for k, val := range m {
		v.want(k, []byte(val))
	}
	got := v.scan()
	if !maps.Equal(got, m) {
		v.t.Fatalf("scan saw %d records, want %d (equal: %v)", len(got), len(m), maps.Equal(got, m))
	}
}

func testReadOnlyWrites(v *env, load LoadFunc) {
	v.load(load, map[string]string{"k": "v"})
	w, ok := v.e.(engines.Writer)
	if !ok {
		return // no write capability: callers cannot write
	}
	if err := w.Apply([]engines.Mutation{{Key: []byte("k"), Value: []byte("x")}}); !errors.Is(err, engines.ErrReadOnly) {
		v.t.Fatalf("apply to a read-only engine: %v, want ErrReadOnly", err)
	}
	if _, err := w.Delete([]byte("k")); !errors.Is(err, engines.ErrReadOnly) {
		v.t.Fatalf("delete on a read-only engine: %v, want ErrReadOnly", err)
	}
	c := engines.CAS{Key: []byte("k"), ExpectExists: true, ExpectedValue: []byte("v"), New: engines.Mutation{Value: []byte("x")}}
	if _, err := w.CompareAndSwap(c); !errors.Is(err, engines.ErrReadOnly) {
		v.t.Fatalf("compare and swap on a read-only engine: %v, want ErrReadOnly", err)
	}
	v.want("k", []byte("v"))
}

func testLoadGet(v *env, load LoadFunc) {
	m := map[string]string{"a": "1", "b": "", "c": "xyz", "long": strings.Repeat("v", 10_000)}
	v.load(load, m)
	v.want("a", []byte("1"))
	v.want("c", []byte("xyz"))
	v.want("long", []byte(m["long"]))
	v.want("d", nil)
	// An empty value is a present key.
	got, exp, err := v.e.Get([]byte("b"))
	if err != nil || len(got) != 0 || exp != 0 {
		v.t.Fatalf("get of an empty value = %q, %d, %v; want empty, 0, nil", got, exp, err)
	}
}

func testLoadCopies(v *env, load LoadFunc) {
	v.load(load, map[string]string{"k": "value"})
	got, _, err := v.e.Get([]byte("k"))
	if err != nil {
		v.t.Fatal(err)
	}
	copy(got, "XXXXX")
	v.want("k", []byte("value"))
}

// testReload loads a second snapshot over a first: keys only in the first
// are gone, changed keys read their new value, new keys appear.
func testReload(v *env, load LoadFunc) {
	first := map[string]string{"keep": "1", "change": "old", "drop": "x"}
	v.load(load, first)
	v.wantExactly(first)
	second := map[string]string{"keep": "1", "change": "new", "add": "y"}
	v.load(load, second)
	v.want("drop", nil)
	v.wantExactly(second)
	third := map[string]string{"only": "z"}
	v.load(load, third)
	v.want("keep", nil)
	v.wantExactly(third)
}

func testLoadScanOnce(v *env, load LoadFunc) {
	const n = 5000
	m := make(map[string]string, n)
	for i := range n {
		m[fmt.Sprintf("key-%05d", i)] = fmt.Sprintf("v%d", i*i)
	}
	v.load(load, m)
	v.wantExactly(m) // scan fails on a duplicate
}

func testLoadScanStops(v *env, load LoadFunc) {
	m := map[string]string{}
	for i := range 10 {
		m[fmt.Sprint(i)] = "v"
	}
	v.load(load, m)
	checkScanStops(v)
}

func testLoadStats(v *env, load LoadFunc) {
	if s := v.e.Stats(); s.Keys != 0 || s.Bytes != 0 {
		v.t.Fatalf("stats of an empty engine: %+v", s)
	}
	v.load(load, map[string]string{"ab": "xyzwvut", "fgh": ""}) // 12 bytes
	v.want("ab", []byte("xyzwvut"))
	v.want("nope", nil)
	s := v.e.Stats()
	// Bytes may count what the engine keeps beside the data (a file's
	// index and checksums), never less than the data.
	if s.Keys != 2 || s.Bytes < 12 {
		v.t.Fatalf("stats after loading 2 keys of 12 bytes: %+v", s)
	}
	if s.Reads < 2 || s.Writes != 0 {
		v.t.Fatalf("stats count %d reads and %d writes; want at least 2 and 0", s.Reads, s.Writes)
	}
}

func testLoadBatchGet(v *env, load LoadFunc) {
	bg, ok := v.e.(engines.BatchGetter)
	if !ok {
		v.t.Skip("engine is not an engines.BatchGetter")
	}
	v.load(load, map[string]string{"a": "1", "c": ""})
	keys := [][]byte{[]byte("a"), []byte("b"), []byte("c"), []byte("a")}
	vals, exps, found := make([][]byte, 4), make([]int64, 4), make([]bool, 4)
	if err := bg.GetBatch(keys, vals, exps, found); err != nil {
		v.t.Fatal(err)
	}
	want := []struct {
		v     string
		found bool
	}{{"1", true}, {"", false}, {"", true}, {"1", true}}
	for i, w := range want {
		if found[i] != w.found || string(vals[i]) != w.v || exps[i] != 0 {
			v.t.Fatalf("GetBatch[%d] = %q, %v, %d; want %q, %v, 0", i, vals[i], found[i], exps[i], w.v, w.found)
		}
	}
}

func testClosedReads(v *env, load LoadFunc) {
	v.load(load, map[string]string{"k": "v"})
	if err := v.e.Close(); err != nil {
		v.t.Fatalf("close: %v", err)
	}
	if _, _, err := v.e.Get([]byte("k")); !errors.Is(err, engines.ErrClosed) {
		v.t.Fatalf("get after close: %v, want ErrClosed", err)
	}
	if err := v.e.Scan(func(engines.Record) error { return nil }); !errors.Is(err, engines.ErrClosed) {
		v.t.Fatalf("scan after close: %v, want ErrClosed", err)
	}
	if bg, ok := v.e.(engines.BatchGetter); ok {
		err := bg.GetBatch([][]byte{[]byte("k")}, make([][]byte, 1), make([]int64, 1), make([]bool, 1))
		if !errors.Is(err, engines.ErrClosed) {
			v.t.Fatalf("get batch after close: %v, want ErrClosed", err)
		}
	}
	if err := load(v.e, records(map[string]string{"k": "w"})); err == nil {
		v.t.Fatal("a load after close succeeded")
	}
}

// testConcurrentReadLoad has readers get, batch-get and scan while a
// loader installs snapshot after snapshot. Every value names its key and
// its snapshot: a reader can tell a torn or misrouted record, and a scan
// that mixed snapshots.
func testConcurrentReadLoad(v *env, load LoadFunc) {
	const keys, readers, loads = 64, 3, 12
	key := func(i int) string { return fmt.Sprintf("k%02d", i%keys) }
	snapshot := func(gen int) map[string]string {
		m := map[string]string{}
		for i := range keys {
			if (i+gen)%5 != 0 { // each snapshot drops a different fifth
				m[key(i)] = fmt.Sprintf("%s|%d|%s", key(i), gen, strings.Repeat("p", (i*gen)%50))
			}
		}
		return m
	}
	v.load(load, snapshot(0))
	var (
		wg     sync.WaitGroup
		failed atomic.Pointer[string]
		done   atomic.Bool
	)
	fail := func(format string, args ...any) {
		s := fmt.Sprintf(format, args...)
		failed.CompareAndSwap(nil, &s)
	}
	check := func(k, val []byte) (gen string, ok bool) {
		rest, found := bytes.CutPrefix(val, append(bytes.Clone(k), '|'))
		if !found {
			return "", false
		}
		g, _, found := bytes.Cut(rest, []byte("|"))
		return string(g), found
	}
	for r := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !done.Load() && failed.Load() == nil; i++ {
				switch {
				case r == 0 && i%20 == 0:
					gens := map[string]bool{}
					seen := map[string]bool{}
					err := v.e.Scan(func(rec engines.Record) error {
						g, ok := check(rec.Key, rec.Value)
						if !ok {
							return fmt.Errorf("scan: key %q has value %q", rec.Key, rec.Value)
						}
						if seen[string(rec.Key)] {
							return fmt.Errorf("scan: key %q seen twice", rec.Key)
						}
						seen[string(rec.Key)] = true
						gens[g] = true
						return nil
					})
					if err != nil {
						fail("%v", err)
					} else if len(gens) > 1 {
						fail("one scan saw records of snapshots %v", gens)
					}
				case r == 1:
					bg, ok := v.e.(engines.BatchGetter)
					if !ok {
						continue
					}
					ks := [][]byte{[]byte(key(i)), []byte(key(i + 1)), []byte(key(i + 7))}
					vals, exps, found := make([][]byte, 3), make([]int64, 3), make([]bool, 3)
					if err := bg.GetBatch(ks, vals, exps, found); err != nil {
						fail("get batch: %v", err)
						continue
					}
					gen := ""
					for j := range ks {
						if !found[j] {
							continue
						}
						g, ok := check(ks[j], vals[j])
						if !ok || (gen != "" && g != gen) {
							fail("get batch %q = %q: torn, or a mix of snapshots", ks, vals)
						}
						gen = g
					}
				default:
					k := []byte(key(i*13 + r))
					val, _, err := v.e.Get(k)
					if errors.Is(err, engines.ErrNotFound) {
						continue
					}
					if _, ok := check(k, val); err != nil || !ok {
						fail("get %q = %q, %v", k, val, err)
					}
				}
			}
		}()
	}
	var last map[string]string
	for gen := 1; gen <= loads && failed.Load() == nil; gen++ {
		last = snapshot(gen)
		if err := load(v.e, records(last)); err != nil {
			fail("load %d: %v", gen, err)
		}
	}
	done.Store(true)
	wg.Wait()
	if s := failed.Load(); s != nil {
		v.t.Fatal(*s)
	}
	v.wantExactly(last)
}

// testLoadModel loads a series of random snapshots, each a random change
// of the one before (so an engine that loads differences is exercised
// too), and compares every read with the model.
func testLoadModel(v *env, load LoadFunc) {
	rng := rand.New(rand.NewPCG(Seed(v.t), 0x6c6f6164))
	randKey := func() string { return fmt.Sprintf("key%d", rng.IntN(400)) }
	randVal := func() string { return strings.Repeat(string(rune('a'+rng.IntN(26))), rng.IntN(40)) }
	model := map[string]string{}
	for len(model) < 100 {
		model[randKey()] = randVal()
	}
	for round := range 8 {
		next := maps.Clone(model)
		for range rng.IntN(80) {
			k := randKey()
			if rng.IntN(3) == 0 {
				delete(next, k)
			} else {
				next[k] = randVal()
			}
		}
		if len(next) == 0 {
			next[randKey()] = randVal()
		}
		if err := load(v.e, records(next)); err != nil {
			v.t.Fatalf("round %d: load: %v", round, err)
		}
		model = next
		for range 300 {
			k := randKey()
			val, exp, err := v.e.Get([]byte(k))
			want, ok := model[k]
			switch {
			case !ok && !errors.Is(err, engines.ErrNotFound):
				v.t.Fatalf("round %d: get %q = %q, %v; model absent", round, k, val, err)
			case ok && (err != nil || string(val) != want || exp != 0):
				v.t.Fatalf("round %d: get %q = %q (exp %d), %v; model %q", round, k, val, exp, err, want)
			}
		}
		if got := v.scan(); !maps.Equal(got, model) {
			v.t.Fatalf("round %d: scan saw %d records, model has %d", round, len(got), len(model))
		}
	}
}
