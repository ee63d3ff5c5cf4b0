package point

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/diskstore"
	"github.com/tabuladb/tabula/engines/enginetest"
	"github.com/tabuladb/tabula/engines/vfs"
)

// gcOpts makes the collector run hard on small segments, so records move
// under the readers.
func gcOpts(cache int64) diskstore.Options {
	return diskstore.Options{SegmentSize: 16 << 10, GCInterval: time.Millisecond, MaxSpaceAmp: 1.3, GCDutyCycle: 1, CacheBytes: cache}
}

// TestGetBatchMatchesGet: on a log with overwrites, deletes, expired
// records, values longer than one 4 KiB read, absent and repeated keys,
// GetBatch returns exactly what a loop of Get does — with and without the
// read cache.
func TestGetBatchMatchesGet(t *testing.T) {
	for _, cache := range []int64{-1, 1 << 20} {
		t.Run(fmt.Sprintf("cache=%d", cache), func(t *testing.T) {
			seed := enginetest.Seed(t)
			rng := rand.New(rand.NewPCG(seed, 1))
			clock := enginetest.NewClock()
			e, err := openMemOpts(t, vfs.NewMem(), clock, gcOpts(cache))
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			const nkeys = 600
			for i := range 3 * nkeys {
				k := fmt.Appendf(nil, "k%04d", rng.IntN(nkeys))
				m := engines.Mutation{Key: k, Value: bytes.Repeat([]byte{byte(i)}, rng.IntN(1500))}
				switch rng.IntN(20) {
				case 0:
					m.Value = bytes.Repeat([]byte{'L'}, 5000+rng.IntN(5000)) // longer than one read
				case 1:
					m.Delete = true
				case 2:
					m.ExpiresAt = clock.Now() + 1 + rng.Int64N(2000)
				}
				if err := e.Apply([]engines.Mutation{m}); err != nil {
					t.Fatal(err)
				}
			}
			clock.Advance(1000) // about half the TTL records are gone
			for round := range 200 {
				n := 1 + rng.IntN(100)
				keys := make([][]byte, n)
				for i := range keys {
					keys[i] = fmt.Appendf(nil, "k%04d", rng.IntN(nkeys+50)) // some never written
				}
				if n > 2 {
					keys[n-1] = keys[0] // a repeat
				}
				checkBatch(t, e, keys, fmt.Sprintf("round %d", round))
			}
			if _, err := e.GC(); err != nil {
				t.Fatal(err)
			}
			checkBatch(t, e, [][]byte{[]byte("k0001"), []byte("k0002"), []byte("nope")}, "after GC")
		})
	}
}

func checkBatch(t *testing.T, e *Engine, keys [][]byte, where string) {
	t.Helper()
	n := len(keys)
	values, expires, found := make([][]byte, n), make([]int64, n), make([]bool, n)
	if err := e.GetBatch(keys, values, expires, found); err != nil {
		t.Fatalf("%s: GetBatch: %v", where, err)
	}
	for i, k := range keys {
		v, exp, err := e.Get(k)
		switch {
		case errors.Is(err, engines.ErrNotFound):
			if found[i] {
				t.Fatalf("%s: key %s: GetBatch found %d bytes, Get: not found", where, k, len(values[i]))
			}
		case err != nil:
			t.Fatalf("%s: Get %s: %v", where, k, err)
		case !found[i] || !bytes.Equal(v, values[i]) || exp != expires[i]:
			t.Fatalf("%s: key %s: GetBatch (%v, %d bytes, exp %d), Get (%d bytes, exp %d)",
				where, k, found[i], len(values[i]), expires[i], len(v), exp)
		}
	}
}

// TestGetBatchConcurrent: while writers overwrite and delete keys and the
// collector relocates records under them, every value a GetBatch returns
// is the key's own, and no older than what was acknowledged before the
// batch began (reads are never stale across a relocation or an overwrite).
func TestGetBatchConcurrent(t *testing.T) {
	for _, cache := range []int64{-1, 256 << 10} {
		t.Run(fmt.Sprintf("cache=%d", cache), func(t *testing.T) {
			seed := enginetest.Seed(t)
			e, err := openMemOpts(t, vfs.NewMem(), enginetest.NewClock(), gcOpts(cache))
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			h := newVersionedKeys(200)
			h.run(t, e, seed, 400*time.Millisecond, func(rng *rand.Rand) error {
				n := 1 + rng.IntN(64)
				keys := make([][]byte, n)
				ids := make([]int, n)
				for i := range keys {
					ids[i] = rng.IntN(len(h.acked))
					keys[i] = h.key(ids[i])
				}
				before := h.snapshot(ids)
				values, expires, found := make([][]byte, n), make([]int64, n), make([]bool, n)
				if err := e.GetBatch(keys, values, expires, found); err != nil {
					return err
				}
				for i := range keys {
					if err := h.check(ids[i], before[i], values[i], found[i]); err != nil {
						return err
					}
				}
				return nil
			})
			st := e.Stats()
			if st.Segments == 0 || st.LiveBytes == 0 {
				t.Fatalf("disk stats not filled: %+v", st)
			}
			ds, _ := e.DiskStats()
			t.Logf("GC runs %d, cache hits %d misses %d", ds.GCRuns, st.CacheHits, st.CacheMisses)
		})
	}
}

// versionedKeys is a workload whose values say which write made them: key
// i's writes carry versions 1, 2, ...; every third version is a delete.
// acked[i] is the newest version acknowledged.
// started[i] the newest version a writer began.
type versionedKeys struct {
	acked, started []atomic.Int64
}

func newVersionedKeys(n int) *versionedKeys {
	return &versionedKeys{acked: make([]atomic.Int64, n), started: make([]atomic.Int64, n)}
}

func (h *versionedKeys) key(i int) []byte { return fmt.Appendf(nil, "key-%04d", i) }

func isDelete(v int64) bool { return v%3 == 0 }

func (h *versionedKeys) snapshot(ids []int) []int64 {
	out := make([]int64, len(ids))
	for i, id := range ids {
		out[i] = h.acked[id].Load()
	}
	return out
}

// check says whether a read of key id that began after version before was
// acknowledged may return (value, found).
func (h *versionedKeys) check(id int, before int64, value []byte, found bool) error {
	started := h.started[id].Load() // read after the read: an upper bound
	if !found {
		// Absent: the acknowledged state was a delete (or nothing yet), or
		// a delete began since (every third version is one).
		if before == 0 || isDelete(before) || started >= before+2 || started == before+1 && isDelete(before+1) {
			return nil
		}
		return fmt.Errorf("key %d: absent, but version %d (a put) was acknowledged before the read", id, before)
	}
	prefix, rest, ok := strings.Cut(string(value), "|")
	v, err := strconv.ParseInt(rest[:strings.IndexByte(rest+"|", '|')], 10, 64)
	switch {
	case !ok || err != nil || prefix != string(h.key(id)):
		return fmt.Errorf("key %d: value %.40q is not the key's own", id, value)
	case v < before || (v == before && isDelete(before)):
		return fmt.Errorf("key %d: read version %d, but version %d was acknowledged before the read", id, v, before)
	case isDelete(v):
		return fmt.Errorf("key %d: read version %d, which was a delete", id, v)
	case v > started:
		return fmt.Errorf("key %d: read version %d, never written", id, v)
	}
	return nil
}

// run writes with two writers (each key owned by one, cycling puts,
// overwrites, deletes and CAS) while two readers call read, for d.
func (h *versionedKeys) run(t *testing.T, e *Engine, seed uint64, d time.Duration, read func(*rand.Rand) error) {
	t.Helper()
	var stop atomic.Bool
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	const writers = 2
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(10+w)))
			for !stop.Load() {
				id := w + writers*rng.IntN(len(h.acked)/writers)
				k := h.key(id)
				v := h.acked[id].Load() + 1
				h.started[id].Store(v)
				var err error
				switch {
				case isDelete(v):
					_, err = e.Delete(k)
				case rng.IntN(2) == 0:
					val := fmt.Appendf(nil, "%s|%d|%s", k, v, bytes.Repeat([]byte{'x'}, rng.IntN(600)))
					err = e.Apply([]engines.Mutation{{Key: k, Value: val}})
				default:
					cur, _, gerr := e.Get(k)
					if gerr != nil && !errors.Is(gerr, engines.ErrNotFound) {
						err = gerr
						break
					}
					val := fmt.Appendf(nil, "%s|%d|cas", k, v)
					var res engines.CASResult
					res, err = e.CompareAndSwap(engines.CAS{Key: k, ExpectExists: gerr == nil, ExpectedValue: cur, New: engines.Mutation{Value: val}})
					if err == nil && !res.Swapped {
						err = fmt.Errorf("key %d: CAS by its only writer did not swap", id)
					}
				}
				if err != nil {
					errc <- fmt.Errorf("writer %d: %w", w, err)
					return
				}
				h.acked[id].Store(v)
			}
		})
	}
	for r := range 2 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(20+r)))
			for !stop.Load() {
				if err := read(rng); err != nil {
					errc <- fmt.Errorf("reader %d: %w", r, err)
					return
				}
			}
		})
	}
	deadline := time.After(d)
	select {
	case err := <-errc:
		stop.Store(true)
		wg.Wait()
		t.Fatal(err)
	case <-deadline:
	}
	stop.Store(true)
	wg.Wait()
	select {
	case err := <-errc:
		t.Fatal(err)
	default:
	}
}
