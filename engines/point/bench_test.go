package point

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/diskstore"
)

// benchRecords × 1 KiB values: 100 MiB of log, more than the default
// 64 MiB cache.
const benchRecords = 100_000

// buildBenchStore writes the benchmark's records into a new directory.
func buildBenchStore(b *testing.B) string {
	b.Helper()
	dir := b.TempDir()
	e, err := OpenDisk(engines.Options{Dir: dir, Logger: quiet}, diskstore.Options{Durability: diskstore.DurabilityLazy, CacheBytes: -1})
	if err != nil {
		b.Fatal(err)
	}
	val := make([]byte, 1024)
	batch := make([]engines.Mutation, 0, 1000)
	for i := range benchRecords {
		val[0], val[1] = byte(i), byte(i>>8)
		batch = append(batch, engines.Mutation{Key: benchKey(i), Value: append([]byte(nil), val...)})
		if len(batch) == cap(batch) {
			if err := e.Apply(batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	if err := e.Close(); err != nil {
		b.Fatal(err)
	}
	return dir
}

func benchKey(i int) []byte { return fmt.Appendf(nil, "bench-key-%08d", i) }

// benchReads runs read (64 random keys per op) on the store in dir with a
// cache of cache bytes (-1: none).
func benchReads(b *testing.B, dir string, cache int64, read func(e *Engine, keys [][]byte, values [][]byte, expires []int64, found []bool)) {
	e, err := OpenDisk(engines.Options{Dir: dir, Logger: quiet}, diskstore.Options{CacheBytes: cache})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 64
	keys := make([][]byte, n)
	values, expires, found := make([][]byte, n), make([]int64, n), make([]bool, n)
	b.ReportAllocs()
	b.SetBytes(n * 1024)
	b.ResetTimer()
	for b.Loop() {
		for i := range keys {
			keys[i] = benchKey(rng.IntN(benchRecords))
		}
		read(e, keys, values, expires, found)
	}
	b.StopTimer()
	for i := range found {
		if !found[i] {
			b.Fatalf("key %s not found", keys[i])
		}
	}
	if st := e.Stats(); st.CacheHits+st.CacheMisses > 0 {
		b.ReportMetric(float64(st.CacheHits)/float64(st.CacheHits+st.CacheMisses), "hit-rate")
	}
}

var benchCaches = []struct {
	name  string
	bytes int64
}{{"cache=off", -1}, {"cache=64MiB", 0}}

// BenchmarkGetBatch64 reads 64 random keys of 100k 1 KiB records with one
// GetBatch (compare BenchmarkGetLoop64).
func BenchmarkGetBatch64(b *testing.B) {
	dir := buildBenchStore(b)
	for _, c := range benchCaches {
		b.Run(c.name, func(b *testing.B) {
			benchReads(b, dir, c.bytes, func(e *Engine, keys [][]byte, values [][]byte, expires []int64, found []bool) {
				if err := e.GetBatch(keys, values, expires, found); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
}

// BenchmarkGetLoop64 reads the same keys as BenchmarkGetBatch64 with a loop
// of Gets.
func BenchmarkGetLoop64(b *testing.B) {
	dir := buildBenchStore(b)
	for _, c := range benchCaches {
		b.Run(c.name, func(b *testing.B) {
			benchReads(b, dir, c.bytes, func(e *Engine, keys [][]byte, values [][]byte, expires []int64, found []bool) {
				for i, k := range keys {
					v, exp, err := e.Get(k)
					if err != nil {
						b.Fatal(err)
					}
					values[i], expires[i], found[i] = v, exp, true
				}
			})
		})
	}
}
