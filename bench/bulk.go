package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/tabuladb/tabula/engines/bulk"
	"github.com/tabuladb/tabula/engines/bulk/mph"
	"github.com/tabuladb/tabula/engines/diskstore"
	"github.com/tabuladb/tabula/engines/vfs"
)

func init() {
	register(suite{
		name:  "bulk",
		about: "bulk table files: MPH and file build speed, RAM per record, Get/BatchGet latency vs a Go map[string]uint64 index",
		run:   runBulk,
	})
}

// bulkData is the benchmark's records, in two arenas.
type bulkData struct {
	keys, vals []byte
	kLen, vLen int
	recs       []bulk.Record
}

func makeBulkData(rng *rand.Rand, n, kLen, vLen int, varVals bool) *bulkData {
	d := &bulkData{keys: make([]byte, n*kLen), kLen: kLen, vLen: vLen, recs: make([]bulk.Record, n)}
	for i := 0; i < len(d.keys); i += 8 {
		v := rng.Uint64()
		for j := 0; j < 8 && i+j < len(d.keys); j++ {
			d.keys[i+j] = byte(v >> (8 * j))
		}
	}
	d.vals = make([]byte, n*vLen)
	for i := range d.vals {
		d.vals[i] = byte(i * 131)
	}
	for i := range d.recs {
		vl := vLen
		if varVals {
			vl = vLen/2 + int(d.keys[i*kLen])%vLen // vLen/2 .. 3vLen/2-1, capped below
			vl = min(vl, vLen)
		}
		d.recs[i] = bulk.Record{Key: d.keys[i*kLen : (i+1)*kLen : (i+1)*kLen], Value: d.vals[i*vLen : i*vLen+vl : i*vLen+vl]}
	}
	return d
}

func medianF(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func percentile(ds []time.Duration, p float64) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[int(float64(len(s)-1)*p)])
}

// mapIndex is the baseline: a Go map from key to the record's offset in
// the same file, then the record is read and verified as ours does.
type mapIndex struct {
	m    map[string]uint64
	data []byte // the file's records section (mapped)
}

func (mi *mapIndex) appendGet(dst, key []byte) ([]byte, bool, error) {
	off, ok := mi.m[string(key)]
	if !ok {
		return dst, false, nil
	}
	pr, err := diskstore.DecodePutRecord(mi.data[off:])
	if err != nil {
		return dst, false, err
	}
	return append(dst, pr.Value...), true, nil
}

func runBulk(out io.Writer, args []string) error {
	fs := flag.NewFlagSet("bulk", flag.ContinueOnError)
	var (
		nKeys   = fs.Int("keys", 10_000_000, "records")
		kLen    = fs.Int("keybytes", 16, "key length")
		vLen    = fs.Int("valbytes", 64, "value length")
		rounds  = fs.Int("rounds", 3, "rounds; ours and the map alternate within each (ABBA)")
		lookups = fs.Int("lookups", 1_000_000, "timed Gets per contender per round (present and absent each)")
		bsize   = fs.Int("batch", 100, "keys per BatchGet")
		dirArg  = fs.String("dir", "", "directory for the files (default: a temporary one, removed)")
		seedArg = fs.Uint64("seed", 0, "seed (0: random)")
		cpuProf = fs.String("cpuprofile", "", "write a CPU profile of the file builds (not the MPH or Gets) to this file")
		only    = fs.Bool("buildonly", false, "measure the MPH and file builds only (no RAM or Get figures)")
		workers = fs.Int("workers", runtime.GOMAXPROCS(0), "workers of the second file build (PartitionOptions.Workers; <= 1: no second build)")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	seed := *seedArg
	if seed == 0 {
		seed = rand.Uint64()
	}
	n := *nKeys
	fmt.Fprintf(out, "# bulk: %d records, %d-byte keys, %d-byte values, GOMAXPROCS %d, %d rounds, seed %d (rerun with -seed %d)\n",
		n, *kLen, *vLen, runtime.GOMAXPROCS(0), *rounds, seed, seed)
	dir := *dirArg
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "tabula-bench-bulk-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	d := makeBulkData(rng, n, *kLen, *vLen, false)
	ctx := context.Background()

	// MPH build, one goroutine: keys/s per core.
	hs := make([]uint64, n)
	for i, r := range d.recs {
		hs[i] = xxhash.Sum64(r.Key)
	}
	var mphRates, mphCPURates []float64
	var tab *mph.Table
	for range *rounds {
		runtime.GC()
		t0, c0 := time.Now(), cpuTime()
		t, err := mph.Build(hs, mph.Options{})
		if err != nil {
			return err
		}
		mphRates = append(mphRates, float64(n)/time.Since(t0).Seconds())
		mphCPURates = append(mphCPURates, float64(n)/(cpuTime()-c0).Seconds())
		tab = t
	}
	fmt.Fprintf(out, "figure mph-build-keys-per-s-per-core %.2f M\n", medianF(mphRates)/1e6)
	fmt.Fprintf(out, "raw mph-build-keys-per-cpu-s %.2f M (process CPU time, GC included)\n", medianF(mphCPURates)/1e6)
	fmt.Fprintf(out, "figure mph-bits-per-key %.2f bits\n", float64(8*tab.EncodedLen())/float64(n))
	tab, hs = nil, nil

	// File build: records/s with one worker (per core; a second goroutine
	// writes the file), then with -workers.
	path := filepath.Join(dir, "fixed.bulk")
	var info bulk.PartitionInfo
	if *cpuProf != "" {
		pf, err := os.Create(*cpuProf)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(pf); err != nil {
			pf.Close()
			return err
		}
	}
	buildRates := func(workers int) (wall, cpu float64, err error) {
		var rates, cpuRates []float64
		for range *rounds {
			// A build writes a new file: replacing the last round's
			// (freeing 1 GB of page cache, ~0.3 s) is not part of it.
			os.Remove(path)
			runtime.GC()
			t0, c0 := time.Now(), cpuTime()
			info, err = bulk.BuildPartition(ctx, path, d.recs, bulk.PartitionSpec{}, bulk.PartitionOptions{Workers: workers})
			if err != nil {
				return 0, 0, err
			}
			rates = append(rates, float64(n)/time.Since(t0).Seconds())
			cpuRates = append(cpuRates, float64(n)/(cpuTime()-c0).Seconds())
		}
		return medianF(rates), medianF(cpuRates), nil
	}
	wall, cpu, err := buildRates(1)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "figure file-build-records-per-s-per-core %.2f M\n", wall/1e6)
	fmt.Fprintf(out, "raw file-build-records-per-cpu-s %.2f M (process CPU time, GC included; the wall figure also waits for fsync)\n", cpu/1e6)
	if *workers > 1 {
		wall, cpu, err := buildRates(*workers)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "figure file-build-records-per-s-%d-workers %.2f M\n", *workers, wall/1e6)
		fmt.Fprintf(out, "raw file-build-records-per-cpu-s-%d-workers %.2f M\n", *workers, cpu/1e6)
	}
	if *cpuProf != "" {
		pprof.StopCPUProfile()
	}
	fmt.Fprintf(out, "raw file-bytes %d (%.1f per record)\n", info.FileBytes, float64(info.FileBytes)/float64(n))
	if *only {
		return nil
	}

	f, err := bulk.Open(vfs.Default, path, bulk.OpenOptions{})
	if err != nil {
		return err
	}
	defer f.Close()
	oursBytes := float64(f.Stats().IndexBytes) / float64(n)
	fmt.Fprintf(out, "figure ram-bytes-per-record-fixed-len %.3f bytes\n", oursBytes)

	// Variable-length values: the offsets table is then an Elias-Fano list.
	{
		dv := makeBulkData(rand.New(rand.NewPCG(seed, 8)), min(n, 2_000_000), *kLen, *vLen, true)
		vpath := filepath.Join(dir, "var.bulk")
		vi, err := bulk.BuildPartition(ctx, vpath, dv.recs, bulk.PartitionSpec{}, bulk.PartitionOptions{})
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "figure ram-bytes-per-record-var-len %.3f bytes (values %d..%d bytes, %d records)\n",
			float64(vi.IndexBytes)/float64(len(dv.recs)), *vLen/2, *vLen, len(dv.recs))
		os.Remove(vpath)
	}

	var mi *mapIndex
	// Baseline index: map[string]uint64 key -> record offset, read from the
	// file itself so both serve the same bytes.
	{
		raw, err := os.ReadFile(path) // the whole file in memory: records from byte 16
		if err != nil {
			return err
		}
		before := heapAlloc()
		mi = &mapIndex{m: make(map[string]uint64)}
		off := uint64(0)
		if err := f.Scan(ctx, func(k, v []byte, _ bool) error {
			mi.m[string(k)] = off + 16
			off += uint64(diskstore.RecordLen(len(k), len(v)))
			return nil
		}); err != nil {
			return err
		}
		mapBytes := float64(heapAlloc()-before) / float64(n)
		// The baseline reads records from huge pages too, as ours does
		// (its mapping is advised MADV_HUGEPAGE): the comparison is of the
		// indexes, not of page sizes.
		mi.data = hugeCopy(raw)
		raw = nil
		fmt.Fprintf(out, "figure map-ram-bytes-per-record %.1f bytes (keys included: a map must hold them to reject absent keys)\n", mapBytes)
		fmt.Fprintf(out, "ratio bulk/map ram-bytes-per-record %.2f (map bytes ÷ ours: > 1 means ours is smaller)\n", mapBytes/oursBytes)
	}

	// Get latency, present and absent, ours and the map alternating. The
	// keys to look up sit in one arena in lookup order, as a server's keys
	// arrive in request buffers: reading a key is not a cache miss of its
	// own (it was: ~200 ns of every Get, ours and the map's, went to
	// fetching the key from the 160 MB input arena).
	present := make([][]byte, *lookups)
	absent := make([][]byte, *lookups)
	arena := make([]byte, 2**lookups**kLen)
	for i := range present {
		k := arena[2*i**kLen : (2*i+1)**kLen : (2*i+1)**kLen]
		copy(k, d.recs[rng.IntN(n)].Key)
		present[i] = k
		k = arena[(2*i+1)**kLen : (2*i+2)**kLen : (2*i+2)**kLen]
		for j := range k {
			k[j] = byte(rng.Uint32())
		}
		absent[i] = k
	}
	type getFn func(dst, key []byte) ([]byte, bool, error)
	contenders := []struct {
		name string
		get  getFn
	}{{"bulk", f.AppendGet}, {"map", mi.appendGet}}
	// One untimed pass each first: ours maps its file on first touch
	// (page faults), the map's copy is already in the heap.
	for _, c := range contenders {
		var buf []byte
		for _, k := range present {
			buf, _, _ = c.get(buf[:0], k)
		}
	}
	fmt.Fprintf(out, "figure bulk-file-huge-mapped-pct %.0f %% (of the mapping, from /proc/self/smaps FilePmdMapped: records read through 2 MiB pages)\n", hugeMappedPct(path))
	fmt.Fprintf(out, "figure mem-random-read-1gib-ns %.0f ns (one dependent random read in 1 GiB of huge pages, median of 3: the box's memory latency, a floor for a Get that misses the cache)\n", memLatency(1<<30))
	lat := map[string][]time.Duration{}
	mean := map[string][]float64{}
	for r := range *rounds {
		order := []int{0, 1}
		if r%2 == 1 {
			order = []int{1, 0}
		}
		for _, ci := range order {
			c := contenders[ci]
			for _, kind := range []string{"present", "absent"} {
				keys := present
				if kind == "absent" {
					keys = absent
				}
				var buf []byte
				// Mean: a tight loop. Percentiles: each Get timed alone
				// (includes ~20-30 ns of clock reads).
				t0 := time.Now()
				for _, k := range keys {
					var ok bool
					buf, ok, err = c.get(buf[:0], k)
					if err != nil || ok != (kind == "present") {
						return fmt.Errorf("%s get %s: ok %v err %v", c.name, kind, ok, err)
					}
				}
				mean[c.name+" "+kind] = append(mean[c.name+" "+kind], float64(time.Since(t0).Nanoseconds())/float64(len(keys)))
				ds := make([]time.Duration, len(keys))
				for i, k := range keys {
					t := time.Now()
					buf, _, _ = c.get(buf[:0], k)
					ds[i] = time.Since(t)
				}
				lat[c.name+" "+kind] = append(lat[c.name+" "+kind], ds...)
			}
		}
	}
	for _, kind := range []string{"present", "absent"} {
		for _, c := range contenders {
			k := c.name + " " + kind
			fmt.Fprintf(out, "figure %s-get-%s-p50 %.0f ns\n", c.name, kind, percentile(lat[k], 0.5))
			fmt.Fprintf(out, "figure %s-get-%s-p99 %.0f ns\n", c.name, kind, percentile(lat[k], 0.99))
			fmt.Fprintf(out, "raw %s-get-%s-mean %.1f ns (tight loop, median of rounds)\n", c.name, kind, medianF(mean[k]))
		}
		fmt.Fprintf(out, "ratio bulk/map get-%s-p50 %.2f (map ns ÷ ours)\n", kind,
			percentile(lat["map "+kind], 0.5)/percentile(lat["bulk "+kind], 0.5))
		fmt.Fprintf(out, "ratio bulk/map get-%s-mean %.2f (map ns ÷ ours)\n", kind,
			medianF(mean["map "+kind])/medianF(mean["bulk "+kind]))
	}

	// BatchGet: ns per key, present keys.
	bs := *bsize
	vals := make([][]byte, bs)
	found := make([]bool, bs)
	var perKey []float64
	for range *rounds {
		var buf []byte
		t0 := time.Now()
		cnt := 0
		for i := 0; i+bs <= len(present); i += bs {
			buf, err = f.AppendGetBatch(buf[:0], present[i:i+bs], vals, found)
			if err != nil {
				return err
			}
			cnt += bs
		}
		perKey = append(perKey, float64(time.Since(t0).Nanoseconds())/float64(cnt))
	}
	fmt.Fprintf(out, "figure bulk-batchget-ns-per-key %.1f ns (batches of %d)\n", medianF(perKey), bs)
	return nil
}
