package main

import (
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"sync"
	"time"

	"github.com/puzpuzpuz/xsync/v4"

	"github.com/tabuladb/tabula/engines/point/lhash"
)

func init() {
	register(suite{
		name:  "pointindex",
		about: "point engine's linear-hash index vs Go map+RWMutex, map+Mutex, sync.Map, xsync.Map",
		run:   runPointIndex,
	})
}

// The contenders all map a uint64 key to a uint64 location: the key's record
// in recs, a 2n-long array where key i sits at i and at i+n (a log store
// writes each version somewhere new; a write points the key at one of its
// two records). Ours keeps no key: it verifies a candidate location by
// reading recs[loc], as the engine reads the record in its value store.
type contender interface {
	name() string
	get(k uint64) (loc uint64, ok bool)
	put(k, loc uint64)
}

// fmix64 is murmur3's finaliser: all 64 output bits depend on all input
// bits, which lhash needs (low bits address buckets, bits 32-47 are the tag).
func fmix64(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	k *= 0xc4ceb9fe1a85ec53
	k ^= k >> 33
	return k
}

type lhashC struct {
	ix   *lhash.Index
	recs []uint64 // location -> key (shared with the harness)
}

func newLhash(recs []uint64) *lhashC {
	c := &lhashC{recs: recs}
	c.ix = lhash.New(func(loc uint64) uint64 { return fmix64(c.recs[loc]) })
	for i, k := range recs[:len(recs)/2] {
		c.ix.Upsert(fmix64(k), uint64(i), func(l uint64) bool { return c.recs[l] == k })
	}
	return c
}

func (c *lhashC) name() string { return "lhash" }

func (c *lhashC) get(k uint64) (uint64, bool) {
	return c.ix.Lookup(fmix64(k), func(loc uint64) bool { return c.recs[loc] == k })
}

func (c *lhashC) put(k, loc uint64) {
	c.ix.Upsert(fmix64(k), loc, func(l uint64) bool { return c.recs[l] == k })
}

type rwMapC struct {
	mu sync.RWMutex
	m  map[uint64]uint64
}

func (c *rwMapC) name() string { return "map+RWMutex" }
func (c *rwMapC) get(k uint64) (uint64, bool) {
	c.mu.RLock()
	v, ok := c.m[k]
	c.mu.RUnlock()
	return v, ok
}
func (c *rwMapC) put(k, loc uint64) {
	c.mu.Lock()
	c.m[k] = loc
	c.mu.Unlock()
}

type mapC struct {
	mu sync.Mutex
	m  map[uint64]uint64
}

func (c *mapC) name() string { return "map+Mutex" }
func (c *mapC) get(k uint64) (uint64, bool) {
	c.mu.Lock()
	v, ok := c.m[k]
	c.mu.Unlock()
	return v, ok
}
func (c *mapC) put(k, loc uint64) {
	c.mu.Lock()
	c.m[k] = loc
	c.mu.Unlock()
}

type syncMapC struct{ m sync.Map }

func (c *syncMapC) name() string { return "sync.Map" }
func (c *syncMapC) get(k uint64) (uint64, bool) {
	v, ok := c.m.Load(k)
	if !ok {
		return 0, false
	}
	return v.(uint64), true
}
func (c *syncMapC) put(k, loc uint64) { c.m.Store(k, loc) }

type xsyncC struct{ m *xsync.Map[uint64, uint64] }

func (c *xsyncC) name() string                { return "xsync.Map" }
func (c *xsyncC) get(k uint64) (uint64, bool) { return c.m.Load(k) }
func (c *xsyncC) put(k, loc uint64)           { c.m.Store(k, loc) }

// workload is a read/write mix; writes overwrite existing keys.
type workload struct {
	name      string
	readPct   int
	perWorker int // operations per goroutine per run
	// record makes a read also fetch the key's record (recs[loc]), as an
	// engine Get must to return the value. Ours has read it already to
	// verify the key; the peers read it now.
	record bool
}

// runMix runs w on c with g goroutines and returns operations per second.
// keys are the n keys; recs the 2n records (key i at i and i+n).
func runMix(c contender, keys, recs []uint64, w workload, g int, seed uint64) float64 {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// xorshift state per goroutine: math/rand/v2 would cost more
			// than some contenders' operations.
			x := seed + uint64(i)*0x9E3779B97F4A7C15 | 1
			n := uint64(len(keys))
			<-start
			for range w.perWorker {
				x ^= x << 13
				x ^= x >> 7
				x ^= x << 17
				slot := (x >> 8) % n
				if int(x%100) < w.readPct {
					loc, ok := c.get(keys[slot])
					if !ok {
						panic(fmt.Sprintf("%s: key %d missing", c.name(), keys[slot]))
					}
					if w.record && recs[loc] != keys[slot] {
						panic(fmt.Sprintf("%s: key %d points at the record of %d", c.name(), keys[slot], recs[loc]))
					}
				} else {
					// Point the key at one of its two records, as a log
					// store writes each version somewhere new.
					c.put(keys[slot], slot+n*(x>>40&1))
				}
			}
		}()
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	return float64(g*w.perWorker) / time.Since(t0).Seconds()
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func runPointIndex(out io.Writer, args []string) error {
	fs := flag.NewFlagSet("pointindex", flag.ContinueOnError)
	var (
		nKeys   = fs.Int("keys", 1<<20, "keys preloaded for the throughput runs")
		rounds  = fs.Int("rounds", 5, "rounds; contenders alternate within each")
		ops     = fs.Int("ops", 1_500_000, "operations per goroutine per run")
		g       = fs.Int("goroutines", 2, "goroutines per run")
		growTo  = fs.Int("grow", 4<<20, "keys for the growth/shrink latency run")
		passes  = fs.Int("passes", 3, "growth/shrink passes; each operation's fastest pass counts")
		seedArg = fs.Uint64("seed", 0, "seed (0: random)")
		cpuProf = fs.String("cpuprofile", "", "write a CPU profile of the throughput runs to this file")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	seed := *seedArg
	if seed == 0 {
		seed = rand.Uint64()
	}
	fmt.Fprintf(out, "# pointindex: %d keys, %d goroutines, GOMAXPROCS %d, %d rounds, seed %d (rerun with -seed %d)\n",
		*nKeys, *g, runtime.GOMAXPROCS(0), *rounds, seed, seed)
	rng := rand.New(rand.NewPCG(seed, 1))

	keys := make([]uint64, *nKeys)
	seen := make(map[uint64]bool, *nKeys)
	for i := range keys {
		k := rng.Uint64()
		for seen[k] {
			k = rng.Uint64()
		}
		seen[k] = true
		keys[i] = k
	}
	seen = nil
	recs := append(slices.Clone(keys), keys...)

	// Each contender is built fresh in every round and dropped after it, so
	// the heap during a run holds only the keys and that contender: the
	// garbage collector then charges each one for its own pointers and
	// allocations, not for the others'.
	builders := []func() contender{
		func() contender { return newLhash(recs) },
		func() contender { return &rwMapC{m: fillMap(keys)} },
		func() contender { return &mapC{m: fillMap(keys)} },
		func() contender {
			c := &syncMapC{}
			for i, k := range keys {
				c.m.Store(k, uint64(i))
			}
			return c
		},
		func() contender {
			c := &xsyncC{m: xsync.NewMap[uint64, uint64]()}
			for i, k := range keys {
				c.m.Store(k, uint64(i))
			}
			return c
		},
	}
	names := []string{"lhash", "map+RWMutex", "map+Mutex", "sync.Map", "xsync.Map"} // builders' order
	mixes := []workload{
		{name: "90/10", readPct: 90, perWorker: *ops},
		{name: "50/50", readPct: 50, perWorker: *ops},
		{name: "90/10+record", readPct: 90, perWorker: *ops, record: true},
		{name: "50/50+record", readPct: 50, perWorker: *ops, record: true},
	}
	if *cpuProf != "" {
		f, err := os.Create(*cpuProf)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer f.Close()
	}
	res := map[string]map[string][]float64{}
	for _, m := range mixes {
		res[m.name] = map[string][]float64{}
	}
	var lhBytes float64
	for r := range *rounds {
		order := slices.Clone(builders)
		if r%2 == 1 {
			slices.Reverse(order) // ABAB...BABA: no contender always runs first
		}
		for _, build := range order {
			c := build()
			if lh, ok := c.(*lhashC); ok {
				lhBytes = float64(lh.ix.MemoryBytes()) / float64(lh.ix.Len())
			}
			// Warm up (page faults, caches), then measure both mixes.
			runMix(c, keys, recs, workload{readPct: 50, perWorker: *ops / 10}, *g, seed)
			for _, m := range mixes {
				runtime.GC() // each run starts from a collected heap
				ops := runMix(c, keys, recs, m, *g, seed+uint64(r))
				res[m.name][c.name()] = append(res[m.name][c.name()], ops)
			}
			c = nil
			runtime.GC()
		}
	}
	for _, m := range mixes {
		for _, n := range names {
			fmt.Fprintf(out, "raw %s %s median %.2f Mops/s\n", n, m.name, median(res[m.name][n])/1e6)
		}
	}
	for _, m := range mixes {
		ours := median(res[m.name]["lhash"])
		for _, n := range names[1:] {
			fmt.Fprintf(out, "ratio lhash/%s %s %.2f\n", n, m.name, ours/median(res[m.name][n]))
		}
	}
	before := heapAlloc()
	m := fillMap(keys)
	mapBytes := float64(heapAlloc()-before) / float64(len(keys))
	runtime.KeepAlive(m)
	m = nil
	pprof.StopCPUProfile()
	fmt.Fprintf(out, "figure lhash-index-bytes-per-entry %.1f bytes\n", lhBytes)
	fmt.Fprintf(out, "figure map-heap-bytes-per-entry %.1f bytes\n", mapBytes)
	runtime.GC()

	growKeys := make([]uint64, *growTo)
	for i := range growKeys {
		growKeys[i] = rng.Uint64() // duplicates among 4M random uint64s: ~4e-7, harmless
	}
	growers := []func() growContender{
		func() growContender { return newGrowLhash(growKeys) },
		func() growContender { return &growMap{m: map[uint64]uint64{}} },
		func() growContender { return &growXsync{m: xsync.NewMap[uint64, uint64]()} },
	}
	for _, newC := range growers {
		name := newC().name()
		grow, shrink, rawGrow, rawShrink, extra := measureGrowShrink(newC, growKeys, *passes)
		fmt.Fprintf(out, "figure %s-worst-op-growth %.3f ms\n", name, ms(grow))
		fmt.Fprintf(out, "figure %s-worst-op-shrink %.3f ms\n", name, ms(shrink))
		fmt.Fprintf(out, "raw %s-worst-op-growth-single-pass %.3f ms\n", name, ms(rawGrow))
		fmt.Fprintf(out, "raw %s-worst-op-shrink-single-pass %.3f ms\n", name, ms(rawShrink))
		fmt.Fprint(out, extra)
	}
	return nil
}

func fillMap(keys []uint64) map[uint64]uint64 {
	m := make(map[uint64]uint64)
	for i, k := range keys {
		m[k] = uint64(i)
	}
	return m
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func heapAlloc() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// growContender is a table that grows from empty and shrinks back.
type growContender interface {
	name() string
	insert(i int, k uint64)
	remove(i int, k uint64)
	// report prints figures after the growth (full) and after the shrink.
	report(full bool) string
}

type growLhash struct{ c *lhashC }

func newGrowLhash(keys []uint64) *growLhash {
	c := &lhashC{recs: keys}
	c.ix = lhash.New(func(loc uint64) uint64 { return fmix64(c.recs[loc]) })
	return &growLhash{c: c}
}

func (g *growLhash) name() string { return "lhash" }
func (g *growLhash) insert(i int, k uint64) {
	g.c.ix.Upsert(fmix64(k), uint64(i), func(l uint64) bool { return g.c.recs[l] == k })
}
func (g *growLhash) remove(i int, k uint64) {
	g.c.ix.Delete(fmix64(k), func(l uint64) bool { return g.c.recs[l] == k })
}
func (g *growLhash) report(full bool) string {
	what := "after-shrink"
	if full {
		what = "at-full"
	}
	return fmt.Sprintf("figure lhash-index-bytes-per-entry-%s %.1f bytes\n", what,
		float64(g.c.ix.MemoryBytes())/float64(g.c.ix.Len()))
}

type growMap struct {
	mu sync.Mutex
	m  map[uint64]uint64
}

func (g *growMap) name() string { return "map+Mutex" }
func (g *growMap) insert(i int, k uint64) {
	g.mu.Lock()
	g.m[k] = uint64(i)
	g.mu.Unlock()
}
func (g *growMap) remove(i int, k uint64) {
	g.mu.Lock()
	delete(g.m, k)
	g.mu.Unlock()
}
func (g *growMap) report(bool) string { return "" }

type growXsync struct{ m *xsync.Map[uint64, uint64] }

func (g *growXsync) name() string           { return "xsync.Map" }
func (g *growXsync) insert(i int, k uint64) { g.m.Store(k, uint64(i)) }
func (g *growXsync) remove(i int, k uint64) { g.m.Delete(k) }
func (g *growXsync) report(bool) string     { return "" }

// measureGrowShrink inserts every key, then deletes 90% of them, in one
// goroutine, timing every operation, and returns the slowest insert and
// delete. The dev box is shared (2 cores, other builds running), so a single
// pass mostly measures preemption: even a map delete shows several ms. So it
// runs passes times on fresh tables and keeps, per operation, the fastest
// pass: a slow split, resize or allocation is slow in every pass, a
// descheduling is not. rawGrow and rawShrink are the single-pass worsts.
func measureGrowShrink(newC func() growContender, keys []uint64, passes int) (grow, shrink, rawGrow, rawShrink time.Duration, extra string) {
	nDel := len(keys) * 9 / 10
	growBest := make([]uint32, len(keys))
	shrinkBest := make([]uint32, nDel)
	for i := range growBest {
		growBest[i] = ^uint32(0)
	}
	for i := range shrinkBest {
		shrinkBest[i] = ^uint32(0)
	}
	clamp := func(d time.Duration) uint32 { return uint32(min(d, time.Duration(^uint32(0)))) }
	for p := range passes {
		c := newC()
		runtime.GC()
		for i, k := range keys {
			t0 := time.Now()
			c.insert(i, k)
			d := time.Since(t0)
			rawGrow = max(rawGrow, d)
			growBest[i] = min(growBest[i], clamp(d))
		}
		if p == 0 {
			extra += c.report(true)
		}
		for i, k := range keys[:nDel] {
			t0 := time.Now()
			c.remove(i, k)
			d := time.Since(t0)
			rawShrink = max(rawShrink, d)
			shrinkBest[i] = min(shrinkBest[i], clamp(d))
		}
		if p == 0 {
			extra += c.report(false)
		}
	}
	return time.Duration(slices.Max(growBest)), time.Duration(slices.Max(shrinkBest)), rawGrow, rawShrink, extra
}
