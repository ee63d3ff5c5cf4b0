package lhash

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
)

// mix is a 64-bit finaliser (splitmix64), standing in for xxhash of a key.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// testSeed returns the seed for a randomised test, from TABULA_SEED if set,
// and logs it so a failure can be rerun.
func testSeed(t testing.TB) uint64 {
	seed := rand.Uint64()
	if s := os.Getenv("TABULA_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("TABULA_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (rerun with TABULA_SEED=%d)", seed, seed)
	return seed
}

// fixture is an index over locations 0..len(keys)-1 whose keys are keys[loc].
type fixture struct {
	ix   *Index
	keys []uint64
	hash func(uint64) uint64
}

func newFixture(keys []uint64, hash func(uint64) uint64) *fixture {
	f := &fixture{keys: keys, hash: hash}
	f.ix = New(func(loc uint64) uint64 { return hash(f.keys[loc]) })
	return f
}

func (f *fixture) lookup(k uint64) (uint64, bool) {
	return f.ix.Lookup(f.hash(k), func(loc uint64) bool { return f.keys[loc] == k })
}

func (f *fixture) upsert(k, loc uint64) (uint64, bool) {
	return f.ix.Upsert(f.hash(k), loc, func(l uint64) bool { return f.keys[l] == k })
}

func (f *fixture) delete(k uint64) (uint64, bool) {
	return f.ix.Delete(f.hash(k), func(l uint64) bool { return f.keys[l] == k })
}

// check verifies the structure of a quiescent index: every entry sits in the
// bucket its hash addresses, with the right tag; chains are packed; buckets
// past the end are empty; the entry and overflow counts agree.
func (f *fixture) check(t testing.TB) {
	t.Helper()
	if err := f.ix.check(func(loc uint64) uint64 { return f.hash(f.keys[loc]) }); err != nil {
		t.Fatal(err)
	}
}

func (ix *Index) check(hash func(uint64) uint64) error {
	st := ix.state.Load()
	nb := numBuckets(st)
	dir := *ix.dir.Load()
	var entries, overflow int
	for b := uint64(0); b < uint64(len(dir))*segBuckets; b++ {
		bk := ix.bucketAt(b)
		if bk[0]&1 != 0 {
			return fmt.Errorf("bucket %d locked", b)
		}
		if b >= nb {
			for i := 1; i <= slots; i++ {
				if bk[i] != 0 || bk[0]>>32 != 0 {
					return fmt.Errorf("bucket %d past the end (%d buckets) is not empty", b, nb)
				}
			}
			continue
		}
		cur, seenZero := bk, false
		for hops := 0; ; hops++ {
			if hops > 1<<20 {
				return fmt.Errorf("bucket %d: chain loops", b)
			}
			for i := 1; i <= slots; i++ {
				w := cur[i]
				if w == 0 {
					seenZero = true
					continue
				}
				if seenZero {
					return fmt.Errorf("bucket %d: chain not packed", b)
				}
				entries++
				h := hash(w & locMask)
				if got := addr(h, st); got != b {
					return fmt.Errorf("entry %#x in bucket %d belongs in %d", w, b, got)
				}
				if w&tagMask != tagOf(h) {
					return fmt.Errorf("entry %#x in bucket %d has a wrong tag", w, b)
				}
			}
			next := cur[0] >> 32
			if next == 0 {
				break
			}
			if seenZero {
				return fmt.Errorf("bucket %d: overflow after a partly empty bucket", b)
			}
			overflow++
			cur = ix.ovBucket(next)
			if cur[1] == 0 {
				return fmt.Errorf("bucket %d: empty overflow bucket in chain", b)
			}
		}
	}
	if entries != ix.Len() {
		return fmt.Errorf("%d entries, Len %d", entries, ix.Len())
	}
	if _, ov := ix.Buckets(); ov != overflow {
		return fmt.Errorf("%d overflow buckets in chains, %d accounted", overflow, ov)
	}
	return nil
}

func TestBasic(t *testing.T) {
	keys := []uint64{10, 20, 30, 10}
	f := newFixture(keys, mix)
	if _, ok := f.lookup(10); ok {
		t.Fatal("found 10 in an empty index")
	}
	if _, replaced := f.upsert(10, 0); replaced {
		t.Fatal("first insert replaced")
	}
	f.upsert(20, 1)
	if loc, ok := f.lookup(10); !ok || loc != 0 {
		t.Fatalf("lookup 10 = %d, %v", loc, ok)
	}
	if old, replaced := f.upsert(10, 3); !replaced || old != 0 {
		t.Fatalf("overwrite 10 = %d, %v", old, replaced)
	}
	if loc, ok := f.lookup(10); !ok || loc != 3 {
		t.Fatalf("lookup 10 after overwrite = %d, %v", loc, ok)
	}
	if old, ok := f.delete(10); !ok || old != 3 {
		t.Fatalf("delete 10 = %d, %v", old, ok)
	}
	if _, ok := f.delete(10); ok {
		t.Fatal("second delete of 10 succeeded")
	}
	if _, ok := f.lookup(30); ok {
		t.Fatal("found 30, never inserted")
	}
	if f.ix.Len() != 1 {
		t.Fatalf("Len = %d, want 1", f.ix.Len())
	}
	f.check(t)
}

func TestMaxLocation(t *testing.T) {
	f := newFixture(nil, mix)
	defer func() {
		if recover() == nil {
			t.Fatal("Upsert of a 49-bit location did not panic")
		}
	}()
	f.ix.Upsert(1, MaxLocation+1, func(uint64) bool { return false })
}

// TestTagCollisions uses a hash with only 4 distinct values, so every entry
// shares a few buckets and tags: chains get long, and match must decide.
func TestTagCollisions(t *testing.T) {
	const n = 2000
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = uint64(i)
	}
	weak := func(k uint64) uint64 { return (k % 4) * 0x0001_0001_0000_0001 }
	f := newFixture(keys, weak)
	for k := uint64(0); k < n; k++ {
		f.upsert(k, k)
	}
	f.check(t)
	for k := uint64(0); k < n; k++ {
		if loc, ok := f.lookup(k); !ok || loc != k {
			t.Fatalf("lookup %d = %d, %v", k, loc, ok)
		}
	}
	for k := uint64(0); k < n; k += 2 {
		if _, ok := f.delete(k); !ok {
			t.Fatalf("delete %d failed", k)
		}
	}
	f.check(t)
	for k := uint64(0); k < n; k++ {
		_, ok := f.lookup(k)
		if ok != (k%2 == 1) {
			t.Fatalf("lookup %d after deletes: %v", k, ok)
		}
	}
}

// TestGrowShrink grows to millions of entries one split at a time, checks
// the structure, then deletes all but a few and checks that the table and
// its memory shrank back.
func TestGrowShrink(t *testing.T) {
	n := 1 << 21
	if raceEnabled || testing.Short() {
		n = 1 << 17
	}
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = uint64(i) * 7919
	}
	f := newFixture(keys, mix)
	empty := f.ix.MemoryBytes()
	for i := range n {
		f.upsert(keys[i], uint64(i))
		if i == n/3 {
			f.check(t)
		}
	}
	f.check(t)
	nb, ov := f.ix.Buckets()
	perEntry := float64(f.ix.MemoryBytes()) / float64(n)
	t.Logf("%d entries: %d buckets, %d overflow, %.1f bytes/entry", n, nb, ov, perEntry)
	if perEntry > 16 {
		t.Errorf("%.1f index bytes per entry, want <= 16", perEntry)
	}
	if lf := float64(n) / float64(nb*slots); lf < 0.5 || lf > 0.81 {
		t.Errorf("load factor %.2f outside [0.5, 0.81]", lf)
	}
	for i := range n {
		if loc, ok := f.lookup(keys[i]); !ok || loc != uint64(i) {
			t.Fatalf("lookup key %d = %d, %v", i, loc, ok)
		}
	}
	keep := 100
	for i := keep; i < n; i++ {
		if _, ok := f.delete(keys[i]); !ok {
			t.Fatalf("delete key %d failed", i)
		}
		if i == n/2 {
			f.check(t)
		}
	}
	f.check(t)
	nb, _ = f.ix.Buckets()
	if nb != minBuckets {
		t.Errorf("%d buckets after shrinking to %d entries, want %d", nb, keep, minBuckets)
	}
	// At most the spare primary segment and two overflow segments (one in
	// use, one spare) beyond an empty index, plus the allocator bitmaps.
	if m := f.ix.MemoryBytes(); m > empty+segBuckets*64+2*ovSegBuckets*64+1<<15 {
		t.Errorf("memory after shrink %d bytes, empty index %d", m, empty)
	}
	for i := range keep {
		if loc, ok := f.lookup(keys[i]); !ok || loc != uint64(i) {
			t.Fatalf("lookup key %d after shrink = %d, %v", i, loc, ok)
		}
	}
}

// TestModel compares random operations on the index with a map.
func TestModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 1))
	runModel(t, rng.Uint64, 200_000, 3000)
}

// runModel does ops random operations over a universe of keys, each key k
// stored at location k or k+universe, comparing with a map.
func runModel(t *testing.T, next func() uint64, ops, universe int) {
	keys := make([]uint64, 2*universe)
	for i := range keys {
		keys[i] = uint64(i % universe)
	}
	hash := mix
	if next()%2 == 0 {
		// Sometimes a weak hash, for long chains and tag collisions.
		hash = func(k uint64) uint64 { return mix(k % 97) }
	}
	f := newFixture(keys, hash)
	model := map[uint64]uint64{}
	for i := range ops {
		r := next()
		k := r % uint64(universe)
		switch r >> 62 {
		case 0, 1:
			loc := k + uint64(universe)*(r>>61&1)
			old, replaced := f.upsert(k, loc)
			mold, mok := model[k]
			if replaced != mok || (mok && old != mold) {
				t.Fatalf("op %d: upsert %d = %d, %v; model %d, %v", i, k, old, replaced, mold, mok)
			}
			model[k] = loc
		case 2:
			old, ok := f.delete(k)
			mold, mok := model[k]
			if ok != mok || (mok && old != mold) {
				t.Fatalf("op %d: delete %d = %d, %v; model %d, %v", i, k, old, ok, mold, mok)
			}
			delete(model, k)
		case 3:
			loc, ok := f.lookup(k)
			mloc, mok := model[k]
			if ok != mok || (mok && loc != mloc) {
				t.Fatalf("op %d: lookup %d = %d, %v; model %d, %v", i, k, loc, ok, mloc, mok)
			}
		}
	}
	if f.ix.Len() != len(model) {
		t.Fatalf("Len %d, model %d", f.ix.Len(), len(model))
	}
	f.check(t)
}

// FuzzIndex drives the model test from fuzz input.
func FuzzIndex(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte("\xff\x00\x80\x40\xc0\x01\x41\x81\xc1"))
	f.Fuzz(func(t *testing.T, data []byte) {
		i := 0
		next := func() uint64 {
			var v uint64
			for j := 0; j < 3; j++ {
				if i < len(data) {
					v = v<<8 | uint64(data[i])
					i++
				}
			}
			return mix(v) // spread input bytes over all bits, incl. the op bits
		}
		runModel(t, next, len(data)/3+1, 600)
	})
}

// TestConcurrent runs writers that churn a range of keys up and down (forcing
// splits and merges) and overwrite stable keys, against readers that must
// always find every stable key at one of its two locations.
func TestConcurrent(t *testing.T) {
	stable, churn := 20_000, 200_000
	if raceEnabled || testing.Short() {
		stable, churn = 4000, 20_000
	}
	n := stable + churn
	// Location l holds key l%n, so each key has two locations: k and k+n.
	keys := make([]uint64, 2*n)
	for i := range keys {
		keys[i] = uint64(i % n)
	}
	f := newFixture(keys, mix)
	for k := range stable {
		f.upsert(uint64(k), uint64(k))
	}
	var (
		stop   atomic.Bool
		wg     sync.WaitGroup
		failed atomic.Value
	)
	fail := func(format string, args ...any) {
		failed.CompareAndSwap(nil, fmt.Sprintf(format, args...))
		stop.Store(true)
	}
	const writers, readers = 2, 2
	var writersDone sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		writersDone.Add(1)
		go func() {
			defer wg.Done()
			defer writersDone.Done()
			// Each writer owns half of the churn keys.
			lo := stable + w*churn/writers
			hi := lo + churn/writers
			for round := 0; round < 3 && !stop.Load(); round++ {
				for k := lo; k < hi; k++ {
					f.upsert(uint64(k), uint64(k))
					if k%8 == 0 {
						s := uint64(k % stable)
						f.upsert(s, s+uint64(n)*uint64(k%16/8))
					}
				}
				for k := lo; k < hi; k++ {
					if _, ok := f.delete(uint64(k)); !ok {
						fail("writer %d: delete %d failed", w, k)
						return
					}
				}
			}
		}()
	}
	for r := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := r; !stop.Load(); i++ {
				k := uint64(i*7919) % uint64(stable)
				loc, ok := f.lookup(k)
				if !ok || loc%uint64(n) != k {
					fail("reader: lookup %d = %d, %v", k, loc, ok)
					return
				}
			}
		}()
	}
	writersDone.Wait()
	stop.Store(true)
	wg.Wait()
	if msg := failed.Load(); msg != nil {
		t.Fatal(msg)
	}
	if f.ix.Len() != stable {
		t.Fatalf("Len %d, want %d", f.ix.Len(), stable)
	}
	f.check(t)
}

func BenchmarkLookup(b *testing.B) {
	const n = 1 << 20
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = uint64(i)
	}
	f := newFixture(keys, mix)
	for i := range n {
		f.upsert(uint64(i), uint64(i))
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := uint64(rand.Uint32())
		for pb.Next() {
			i = (i + 0x9E3779B9) & (n - 1)
			if _, ok := f.lookup(i); !ok {
				b.Fatal("missing key")
			}
		}
	})
}

func BenchmarkUpsertOverwrite(b *testing.B) {
	const n = 1 << 20
	keys := make([]uint64, 2*n)
	for i := range keys {
		keys[i] = uint64(i % n)
	}
	f := newFixture(keys, mix)
	for i := range n {
		f.upsert(uint64(i), uint64(i))
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := uint64(rand.Uint32())
		for pb.Next() {
			i = (i + 0x9E3779B9) & (n - 1)
			f.upsert(i, i+n*(i&1))
		}
	})
}

func BenchmarkInsertGrow(b *testing.B) {
	keys := make([]uint64, b.N)
	for i := range keys {
		keys[i] = uint64(i)
	}
	f := newFixture(keys, mix)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		f.upsert(uint64(i), uint64(i))
	}
}

// TestGrow checks that a pre-sized index takes its entries without a split
// (the Hasher is never called), stays well formed, and still splits and
// merges past them.
func TestGrow(t *testing.T) {
	for _, n := range []int{0, 1, 300, 100_000} {
		keys := make([]uint64, 2*n+10)
		for i := range keys {
			keys[i] = uint64(i)*104729 + 1
		}
		hashed := 0
		f := &fixture{keys: keys, hash: mix}
		f.ix = New(func(loc uint64) uint64 { hashed++; return mix(f.keys[loc]) })
		if err := f.ix.Grow(n); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			f.upsert(keys[i], uint64(i))
		}
		if hashed != 0 {
			t.Fatalf("n=%d: %d entries rehashed while loading a pre-sized index", n, hashed)
		}
		f.check(t)
		if n > 0 {
			if err := f.ix.Grow(n); err == nil {
				t.Fatalf("n=%d: Grow of a non-empty index succeeded", n)
			}
		}
		for i := n; i < len(keys); i++ {
			f.upsert(keys[i], uint64(i))
		}
		f.check(t)
		for i := range keys {
			if loc, ok := f.lookup(keys[i]); !ok || loc != uint64(i) {
				t.Fatalf("n=%d: lookup key %d = %d, %v", n, i, loc, ok)
			}
		}
		for i := range keys {
			f.delete(keys[i])
		}
		f.check(t)
	}
}
