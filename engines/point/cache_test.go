package point

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/diskstore"
	"github.com/tabuladb/tabula/engines/enginetest"
	"github.com/tabuladb/tabula/engines/vfs"
)

// TestCacheNeverStale: with a small read cache (constant eviction), writers
// overwriting, deleting and CASing keys and the collector relocating
// records, a Get never returns a deleted or overwritten value: each read
// sees at least the version acknowledged before it began.
func TestCacheNeverStale(t *testing.T) {
	seed := enginetest.Seed(t)
	e, err := openMemOpts(t, vfs.NewMem(), enginetest.NewClock(), gcOpts(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	h := newVersionedKeys(100)
	h.run(t, e, seed, 500*time.Millisecond, func(rng *rand.Rand) error {
		id := rng.IntN(len(h.acked))
		before := h.acked[id].Load()
		v, _, err := e.Get(h.key(id))
		if err != nil && !errors.Is(err, engines.ErrNotFound) {
			return err
		}
		return h.check(id, before, v, err == nil)
	})
	st := e.Stats()
	if st.CacheHits == 0 {
		t.Fatalf("no cache hits: %+v", st)
	}
	t.Logf("cache hits %d, misses %d", st.CacheHits, st.CacheMisses)
}

// TestCacheHitRate: a read-heavy loop over a hot set that fits the cache is
// served mostly from it (the cache holds half the records, the hot set a
// tenth), and Stats reports the hits; the memory store and a
// disabled cache report none.
func TestCacheHitRate(t *testing.T) {
	seed := enginetest.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 3))
	e, err := openMemOpts(t, vfs.NewMem(), enginetest.NewClock(), diskstore.Options{SegmentSize: 1 << 20, CacheBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	const keys = 2000
	val := make([]byte, 1000)
	for i := range keys {
		if err := e.Apply([]engines.Mutation{{Key: fmt.Appendf(nil, "k%05d", i), Value: val}}); err != nil {
			t.Fatal(err)
		}
	}
	before := e.Stats()
	const reads = 20000
	for range reads {
		// 90% of the reads go to 10% of the keys.
		i := rng.IntN(keys)
		if rng.IntN(10) != 0 {
			i = rng.IntN(keys / 10)
		}
		if _, _, err := e.Get(fmt.Appendf(nil, "k%05d", i)); err != nil {
			t.Fatal(err)
		}
	}
	st := e.Stats()
	hits, misses := st.CacheHits-before.CacheHits, st.CacheMisses-before.CacheMisses
	rate := float64(hits) / float64(hits+misses)
	t.Logf("read-heavy loop: %d hits, %d misses: hit rate %.3f (stats %+v)", hits, misses, rate, st)
	if hits+misses < reads || rate < 0.8 {
		t.Fatalf("hit rate %.3f over %d counted reads, want >= 0.8 over at least %d", rate, hits+misses, reads)
	}
	if st.Segments == 0 || st.LiveBytes < keys*1000 || st.GarbageBytes == 0 {
		t.Fatalf("disk stats: %+v", st)
	}

	mem, err := Open(engines.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	mustPut(t, mem, "k", "v")
	if _, _, err := mem.Get([]byte("k")); err != nil {
		t.Fatal(err)
	}
	if st := mem.Stats(); st.CacheHits != 0 || st.CacheMisses != 0 || st.Segments != 0 || st.LiveBytes != 0 || st.GarbageBytes != 0 {
		t.Fatalf("memory store reports disk stats: %+v", st)
	}
}
