package bulk

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/tabuladb/tabula/engines/vfs"
)

func benchFile(b *testing.B, n int) (*File, []Record) {
	r := rand.New(rand.NewPCG(1, 2))
	recs := randomRecords(r, n, 64, true)
	path := filepath.Join(b.TempDir(), "p.bulk")
	if _, err := BuildPartition(context.Background(), path, recs, PartitionSpec{}, PartitionOptions{}); err != nil {
		b.Fatal(err)
	}
	f, err := Open(vfs.Default, path, OpenOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	return f, recs
}

func BenchmarkGetPresent(b *testing.B) {
	f, recs := benchFile(b, 1<<18)
	b.ReportAllocs()
	b.ResetTimer()
	var buf []byte
	for i := 0; i < b.N; i++ {
		buf, _, _ = f.AppendGet(buf[:0], recs[i&(1<<18-1)].Key)
	}
}

func BenchmarkGetAbsent(b *testing.B) {
	f, _ := benchFile(b, 1<<18)
	keys := make([][]byte, 1024)
	r := rand.New(rand.NewPCG(3, 4))
	for i := range keys {
		keys[i] = absentKey(r)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f.AppendGet(nil, keys[i&1023])
	}
}

func BenchmarkBuildPartition(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	recs := randomRecords(r, 1<<18, 64, true)
	dir := b.TempDir()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := BuildPartition(context.Background(), filepath.Join(dir, "p.bulk"), recs, PartitionSpec{}, PartitionOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(recs)*b.N)/b.Elapsed().Seconds(), "records/s")
}
