package ordered

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/sstable"

	"github.com/tabuladb/tabula/engines"
)

// The benchmarks run the same operations on the engine and on pebble used
// directly with the same configuration (files in a temporary directory,
// WAL off as under Replayable, bloom filters, no compression), so the
// difference is the cost of this layer: the stripe lock, the note a write
// makes for the key counts and their background reconcile (count.go), the
// value header and the copy Get hands out.
//
//	go test -bench . -run XXX ./engines/ordered

const benchKeys = 100_000

var benchValue = make([]byte, 100)

func benchKey(i int) []byte { return []byte(fmt.Sprintf("pk%04d/rk%08d", i%1000, i)) }

func openBenchEngine(b *testing.B) *Engine {
	b.Helper()
	e, err := Open(engines.Options{Dir: b.TempDir(), Replayable: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close() })
	return e
}

func openBenchPebble(b *testing.B) *pebble.DB {
	b.Helper()
	o := &pebble.Options{DisableWAL: true, FormatMajorVersion: pebble.FormatNewest, Logger: slogLogger{engines.Options{}.WithDefaults()}}
	for i := range o.Levels {
		o.Levels[i].FilterPolicy = bloom.FilterPolicy(bloomBitsPerKey)
	}
	o.ApplyCompressionSettings(func() pebble.DBCompressionSettings {
		return pebble.UniformDBCompressionSettings(sstable.NoCompression)
	})
	db, err := pebble.Open(b.TempDir(), o)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	return db
}

func loadEngine(b *testing.B, e *Engine) {
	b.Helper()
	batch := make([]engines.Mutation, 0, 1000)
	for i := range benchKeys {
		batch = append(batch, engines.Mutation{Key: benchKey(i), Value: benchValue})
		if len(batch) == cap(batch) {
			if err := e.Apply(batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	if err := e.db.Flush(); err != nil {
		b.Fatal(err)
	}
}

func loadPebble(b *testing.B, db *pebble.DB) {
	b.Helper()
	batch := db.NewBatch()
	for i := range benchKeys {
		_ = batch.Set(benchKey(i), benchValue, nil)
		if batch.Count() == 1000 {
			if err := batch.Commit(pebble.NoSync); err != nil {
				b.Fatal(err)
			}
			batch = db.NewBatch()
		}
	}
	if err := batch.Commit(pebble.NoSync); err != nil {
		b.Fatal(err)
	}
	if err := db.Flush(); err != nil {
		b.Fatal(err)
	}
}

func BenchmarkOrderedPut(b *testing.B) {
	e := openBenchEngine(b)
	b.ReportAllocs()
	b.SetBytes(int64(len(benchValue)))
	i := 0
	for b.Loop() {
		if err := e.Apply([]engines.Mutation{{Key: benchKey(i % benchKeys), Value: benchValue}}); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkPebblePut(b *testing.B) {
	db := openBenchPebble(b)
	b.ReportAllocs()
	b.SetBytes(int64(len(benchValue)))
	i := 0
	for b.Loop() {
		if err := db.Set(benchKey(i%benchKeys), benchValue, pebble.NoSync); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkOrderedGet(b *testing.B) {
	e := openBenchEngine(b)
	loadEngine(b, e)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, _, err := e.Get(benchKey(i * 7919 % benchKeys)); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkPebbleGet(b *testing.B) {
	db := openBenchPebble(b)
	loadPebble(b, db)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		v, closer, err := db.Get(benchKey(i * 7919 % benchKeys))
		if err != nil {
			b.Fatal(err)
		}
		_ = append([]byte(nil), v...) // the copy a caller needs past Close
		closer.Close()
		i++
	}
}

// The miss benchmarks read keys that sort among the stored ones but are
// absent: the bloom filters answer without a data block.
func BenchmarkOrderedGetMiss(b *testing.B) {
	e := openBenchEngine(b)
	loadEngine(b, e)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		k := append(benchKey(i*7919%benchKeys), 'x')
		if _, _, err := e.Get(k); err != engines.ErrNotFound {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkPebbleGetMiss(b *testing.B) {
	db := openBenchPebble(b)
	loadPebble(b, db)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		k := append(benchKey(i*7919%benchKeys), 'x')
		if _, _, err := db.Get(k); err != pebble.ErrNotFound {
			b.Fatal(err)
		}
		i++
	}
}

// Range of 100: the 100 rows of one partition key, in key order.
func BenchmarkOrderedRange100(b *testing.B) {
	e := openBenchEngine(b)
	loadEngine(b, e)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		lo := []byte(fmt.Sprintf("pk%04d/", i%1000))
		hi := []byte(fmt.Sprintf("pk%04d0", i%1000))
		n := 0
		if err := e.Range(lo, hi, false, func(engines.Record) error { n++; return nil }); err != nil || n != 100 {
			b.Fatalf("range saw %d, %v", n, err)
		}
		i++
	}
}

func BenchmarkPebbleRange100(b *testing.B) {
	db := openBenchPebble(b)
	loadPebble(b, db)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		lo := []byte(fmt.Sprintf("pk%04d/", i%1000))
		hi := []byte(fmt.Sprintf("pk%04d0", i%1000))
		it, err := db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for ok := it.First(); ok; ok = it.Next() {
			if _, err := it.ValueAndErr(); err != nil {
				b.Fatal(err)
			}
			n++
		}
		if err := it.Close(); err != nil || n != 100 {
			b.Fatalf("range saw %d, %v", n, err)
		}
		i++
	}
}

// The parallel put benchmarks are the azure bench's engine-put: 16
// goroutines putting random keys of 100,000 preloaded ones, so the
// profile of the ordered one shows a put's whole cost, the background
// reconciles and compactions included.
func BenchmarkOrderedPutParallel(b *testing.B) {
	e := openBenchEngine(b)
	loadEngine(b, e)
	b.ReportAllocs()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		r := rand.New(rand.NewPCG(rand.Uint64(), 0))
		for pb.Next() {
			if err := e.Apply([]engines.Mutation{{Key: benchKey(r.IntN(benchKeys)), Value: benchValue}}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkPebblePutParallel(b *testing.B) {
	db := openBenchPebble(b)
	loadPebble(b, db)
	b.ReportAllocs()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		r := rand.New(rand.NewPCG(rand.Uint64(), 0))
		for pb.Next() {
			if err := db.Set(benchKey(r.IntN(benchKeys)), benchValue, pebble.NoSync); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
