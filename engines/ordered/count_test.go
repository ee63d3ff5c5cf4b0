package ordered

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/enginetest"
)

// storedCounts counts what pebble holds, expired records included, as
// Stats.Keys and Stats.Bytes must.
func storedCounts(t *testing.T, e *Engine) (keys, bytes uint64) {
	t.Helper()
	it, err := e.db.NewIter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		v, _, err := decodeValue(it.Value())
		if err != nil {
			t.Fatal(err)
		}
		keys++
		bytes += uint64(len(it.Key()) + len(v))
	}
	return keys, bytes
}

// TestCountsExact: writers of every kind (batches with repeated keys,
// blind deletes of absent keys, TTLs, Delete, CompareAndSwap, Gets that
// drop expired records) race with Stats calls and background reconciles
// (every 7 notes here); whenever the writers stop, Stats matches a count of
// the stored records, and so does the count a reopen makes.
func TestCountsExact(t *testing.T) {
	seed := enginetest.Seed(t)
	clock := enginetest.NewClock()
	opts := engines.Options{Dir: t.TempDir(), Replayable: true, Now: clock.Now}
	e, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { e.Close() }()
	e.reconcileAt = 7
	key := func(r *rand.Rand) []byte { return fmt.Appendf(nil, "k%02d", r.IntN(40)) }
	val := func(r *rand.Rand) []byte { return make([]byte, r.IntN(20)) }
	for round := range 5 {
		var wg sync.WaitGroup
		errs := make(chan error, 5)
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(seed, uint64(round*10+w)))
				for range 300 {
					var err error
					switch r.IntN(6) {
					case 0, 1:
						var batch []engines.Mutation
						for range 1 + r.IntN(4) {
							m := engines.Mutation{Key: key(r), Value: val(r), Delete: r.IntN(4) == 0}
							if r.IntN(5) == 0 {
								m.ExpiresAt = clock.Now() + int64(r.IntN(3))
							}
							batch = append(batch, m)
						}
						err = e.Apply(batch)
					case 2:
						_, err = e.Delete(key(r))
					case 3:
						k := key(r)
						cur, _, gerr := e.Get(k)
						_, err = e.CompareAndSwap(engines.CAS{Key: k, ExpectExists: gerr == nil, ExpectedValue: cur,
							New: engines.Mutation{Value: val(r), Delete: r.IntN(3) == 0}})
					case 4:
						_, _, err = e.Get(key(r)) // may drop an expired record
						if err == engines.ErrNotFound {
							err = nil
						}
					case 5:
						_ = e.Stats()
					}
					if err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		// The clock moves while they write, so records expire under them.
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				clock.Advance(1)
			}
		}()
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		k, b := storedCounts(t, e)
		if s := e.Stats(); s.Keys != k || s.Bytes != b {
			t.Fatalf("round %d: Stats counts %d keys, %d bytes; pebble holds %d, %d", round, s.Keys, s.Bytes, k, b)
		}
	}
	k, b := storedCounts(t, e)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if s := e.Stats(); s.Keys != k || s.Bytes != b {
		t.Fatalf("after Close: Stats counts %d keys, %d bytes; want %d, %d", s.Keys, s.Bytes, k, b)
	}
	if e, err = Open(opts); err != nil {
		t.Fatal(err)
	}
	if s := e.Stats(); s.Keys != k || s.Bytes != b {
		t.Fatalf("after reopen: Stats counts %d keys, %d bytes; want %d, %d", s.Keys, s.Bytes, k, b)
	}
}

// TestReconcileInBackground: without a Stats call, a writer whose notes
// pass reconcileAt starts a reconcile that brings the counters up to date
// and drops the notes, so they do not grow without bound.
func TestReconcileInBackground(t *testing.T) {
	e, err := Open(engines.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	e.reconcileAt = 100
	for i := range 100 {
		// Each key twice: 100 notes, 50 keys.
		if err := e.Apply([]engines.Mutation{{Key: fmt.Appendf(nil, "k%02d", i%50), Value: []byte("vv")}}); err != nil {
			t.Fatal(err)
		}
	}
	e.bg.Wait()
	if e.pending.Load() != 0 || e.snap.Load() != nil {
		t.Fatalf("after a background reconcile: %d notes pending, snapshot %v", e.pending.Load(), e.snap.Load())
	}
	if k, b := e.keys.Load(), e.bytes.Load(); k != 50 || b != 50*5 {
		t.Fatalf("counters after a background reconcile: %d keys, %d bytes; want 50, 250", k, b)
	}
	var notes int
	for i := range e.stripes {
		notes += len(e.stripes[i].notes)
	}
	if notes != 0 {
		t.Fatalf("%d notes left in the stripes", notes)
	}
}

// TestPutReadsNothing: a plain put (Apply) does not read the record it
// replaces; the engine's reads of it are Stats' reconcile, once per key.
func TestPutReadsNothing(t *testing.T) {
	e, err := Open(engines.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	k := []byte("k")
	if err := e.Apply([]engines.Mutation{{Key: k, Value: []byte("v")}}); err != nil {
		t.Fatal(err)
	}
	// The record is in an sstable, so reading it goes through the block
	// cache (and the bloom filter, counted too).
	if err := e.db.Flush(); err != nil {
		t.Fatal(err)
	}
	reads := func() [4]int64 {
		m := e.db.Metrics()
		return [4]int64{m.BlockCache.Hits, m.BlockCache.Misses, m.Filter.Hits, m.Filter.Misses}
	}
	before := reads()
	if _, _, err := e.Get(k); err != nil {
		t.Fatal(err)
	}
	if reads() == before {
		t.Fatal("a Get of a flushed record left pebble's read metrics unchanged: the test cannot see reads")
	}
	before = reads()
	for range 100 {
		if err := e.Apply([]engines.Mutation{{Key: k, Value: []byte("w")}}); err != nil {
			t.Fatal(err)
		}
	}
	if got := reads(); got != before {
		t.Fatalf("100 puts read pebble: block cache hits, misses, filter hits, misses %v -> %v", before, got)
	}
}

// BenchmarkReconcile: one reconcile of reconcileAt puts of random keys of
// 100,000 stored ones (the azure bench's engine-put), per op.
func BenchmarkReconcile(b *testing.B) {
	e := openBenchEngine(b)
	loadEngine(b, e)
	e.reconcileAt = 1 << 62 // reconcile only when the benchmark says
	r := rand.New(rand.NewPCG(1, 2))
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		for range reconcileAt {
			if err := e.Apply([]engines.Mutation{{Key: benchKey(r.IntN(benchKeys)), Value: benchValue}}); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		e.reconcile()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*reconcileAt), "ns/note")
}
