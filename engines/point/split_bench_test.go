package point

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/diskstore"
	"github.com/tabuladb/tabula/engines/vfs"
	"github.com/tabuladb/tabula/internal/keyspace"
)

var splitRecords = flag.Int("split.records", 1_000_000, "records of the partition BenchmarkSplit splits")

// fillParent writes n records (16-byte keys, 100-byte values) into a
// closed ssd engine in dir, once per process.
func fillParent(b *testing.B, dir string, n int) {
	b.Helper()
	e, err := Open(engines.Options{Dir: dir, Storage: StorageSSD, Durability: "lazy", Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	val := make([]byte, 100)
	batch := make([]engines.Mutation, 0, 1000)
	for i := range n {
		batch = append(batch, engines.Mutation{Key: fmt.Appendf(nil, "key-%011d", i), Value: val})
		if len(batch) == cap(batch) || i == n-1 {
			if err := e.Apply(batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	if err := e.Close(); err != nil {
		b.Fatal(err)
	}
}

// ownBytes is the bytes of the files under dirs that no other name shares
// (link count 1): what a split wrote.
func ownBytes(b *testing.B, dirs ...string) int64 {
	var n int64
	for _, d := range dirs {
		ents, err := os.ReadDir(d)
		if err != nil {
			b.Fatal(err)
		}
		for _, en := range ents {
			fi, err := en.Info()
			if err != nil {
				b.Fatal(err)
			}
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
				continue
			}
			n += fi.Size()
		}
	}
	return n
}

// BenchmarkSplit splits an ssd point partition of -split.records records
// in half: by sharing its files (Split) and by copying its records into
// two new engines (the alternative). Each iteration splits a fresh
// hard-linked clone of one filled parent; the time counts from the open
// parent to both children open and durable. written-MB is what the split
// wrote (files not shared with the parent).
func BenchmarkSplit(b *testing.B) {
	root := b.TempDir()
	src := filepath.Join(root, "src")
	fillParent(b, src, *splitRecords)
	names, _, err := diskstore.SharedFiles(vfs.Default, src)
	if err != nil {
		b.Fatal(err)
	}
	spec := func(i int) engines.SplitSpec {
		o := func(s string) engines.Options {
			return engines.Options{Dir: filepath.Join(root, fmt.Sprintf("%s%d", s, i)), Storage: StorageSSD, Durability: "lazy", Logger: quiet}
		}
		return engines.SplitSpec{Hash: 1 << 63, Left: o("l"), Right: o("r")}
	}
	clone := func(b *testing.B, i int) *Engine {
		dir := filepath.Join(root, fmt.Sprintf("p%d", i))
		if err := engines.PrepareDir(vfs.Default, dir); err != nil {
			b.Fatal(err)
		}
		if err := engines.LinkFiles(vfs.Default, src, dir, func(n string) bool {
			for _, x := range names {
				if x == n {
					return true
				}
			}
			return false
		}); err != nil {
			b.Fatal(err)
		}
		e, err := Open(engines.Options{Dir: dir, Storage: StorageSSD, Durability: "lazy", Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		return e
	}
	run := func(b *testing.B, split func(p *Engine, s engines.SplitSpec) (engines.Engine, engines.Engine)) {
		var written int64
		for i := range b.N {
			b.StopTimer()
			p := clone(b, i)
			s := spec(i)
			b.StartTimer()
			l, r := split(p, s)
			b.StopTimer()
			written += ownBytes(b, s.Left.Dir, s.Right.Dir)
			if err := l.Close(); err != nil {
				b.Fatal(err)
			}
			if err := r.Close(); err != nil {
				b.Fatal(err)
			}
			for _, d := range []string{p.opts.Dir, s.Left.Dir, s.Right.Dir} {
				if err := os.RemoveAll(d); err != nil {
					b.Fatal(err)
				}
			}
			b.StartTimer()
		}
		b.ReportMetric(float64(written)/float64(b.N)/1e6, "written-MB/op")
	}
	b.Run("share", func(b *testing.B) {
		run(b, func(p *Engine, s engines.SplitSpec) (engines.Engine, engines.Engine) {
			l, r, err := p.Split(s)
			if err != nil {
				b.Fatal(err)
			}
			return l, r
		})
	})
	b.Run("copy", func(b *testing.B) {
		run(b, func(p *Engine, s engines.SplitSpec) (engines.Engine, engines.Engine) {
			var kids [2]*Engine
			for i, o := range []engines.Options{s.Left, s.Right} {
				k, err := Open(o)
				if err != nil {
					b.Fatal(err)
				}
				left := i == 0
				if err := engines.CopyRecords(k, p, func(key []byte) bool {
					return (keyspace.Hash(key) < s.Hash) == left
				}); err != nil {
					b.Fatal(err)
				}
				if err := k.Sync(); err != nil {
					b.Fatal(err)
				}
				kids[i] = k
			}
			if err := p.Close(); err != nil {
				b.Fatal(err)
			}
			return kids[0], kids[1]
		})
	})
}
