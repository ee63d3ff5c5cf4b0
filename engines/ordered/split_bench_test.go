package ordered

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/tabuladb/tabula/engines"
)

var splitRecords = flag.Int("split.records", 1_000_000, "records of the partition BenchmarkSplit splits")

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

// BenchmarkSplit splits an ordered partition of -split.records records
// (16-byte keys, 100-byte values) in half three ways: Split (checkpoints
// and Excise), checkpoints and DeleteRange (the rejected alternative:
// a range tombstone that compactions must later apply), and copying the
// records into two new engines. Each iteration splits a fresh parent,
// itself a checkpoint of one filled engine; the time counts from the open
// parent to both children open and durable. written-MB is what the split
// wrote (files not shared with the parent).
func BenchmarkSplit(b *testing.B) {
	root := b.TempDir()
	src, err := Open(engines.Options{Dir: filepath.Join(root, "src"), Storage: StorageSSD, Replayable: true})
	if err != nil {
		b.Fatal(err)
	}
	val := make([]byte, 100)
	batch := make([]engines.Mutation, 0, 1000)
	n := *splitRecords
	for i := range n {
		batch = append(batch, engines.Mutation{Key: fmt.Appendf(nil, "key-%011d", i), Value: val})
		if len(batch) == cap(batch) || i == n-1 {
			if err := src.Apply(batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	if err := src.db.Flush(); err != nil {
		b.Fatal(err)
	}
	// Let compactions settle, so every parent has the same shape.
	if err := src.db.Compact(context.Background(), []byte("key-"), []byte("key-~"), true); err != nil {
		b.Fatal(err)
	}
	at := fmt.Appendf(nil, "key-%011d", n/2)
	seq := 0
	parent := func(b *testing.B) (*Engine, engines.SplitSpec) {
		seq++
		dir := filepath.Join(root, fmt.Sprintf("p%d", seq))
		if err := src.db.Checkpoint(dir); err != nil {
			b.Fatal(err)
		}
		p, err := Open(engines.Options{Dir: dir, Storage: StorageSSD, Replayable: true})
		if err != nil {
			b.Fatal(err)
		}
		o := func(s string) engines.Options {
			return engines.Options{Dir: filepath.Join(root, fmt.Sprintf("%s%d", s, seq)), Storage: StorageSSD, Replayable: true}
		}
		return p, engines.SplitSpec{Key: at, Left: o("l"), Right: o("r")}
	}
	run := func(b *testing.B, split func(p *Engine, s engines.SplitSpec) (engines.Engine, engines.Engine)) {
		var written int64
		for range b.N {
			b.StopTimer()
			p, s := parent(b)
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
	b.Run("share-excise", func(b *testing.B) {
		run(b, func(p *Engine, s engines.SplitSpec) (engines.Engine, engines.Engine) {
			l, r, err := p.Split(s)
			if err != nil {
				b.Fatal(err)
			}
			return l, r
		})
	})
	b.Run("share-deleterange", func(b *testing.B) {
		run(b, func(p *Engine, s engines.SplitSpec) (engines.Engine, engines.Engine) {
			var kids [2]*Engine
			for i, o := range []engines.Options{s.Left, s.Right} {
				if err := p.checkpoint(o.Dir, nil); err != nil {
					b.Fatal(err)
				}
				k, err := Open(o)
				if err != nil {
					b.Fatal(err)
				}
				lo, hi := s.Key, bytes.Repeat([]byte{0xff}, 32)
				if i == 1 {
					lo, hi = []byte("key-"), s.Key
				}
				if err := k.db.DeleteRange(lo, hi, pebble.NoSync); err != nil {
					b.Fatal(err)
				}
				if err := k.db.Flush(); err != nil {
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
					return (bytes.Compare(key, s.Key) < 0) == left
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
	if err := src.Close(); err != nil {
		b.Fatal(err)
	}
}
