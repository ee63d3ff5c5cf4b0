package ordered

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/tabuladb/tabula/engines"
)

// fillMedian writes n keys k000000.. of vlen-byte values, flushing every
// per keys so the engine has sstables.
func fillMedian(tb testing.TB, n, vlen, per int) *Engine {
	e, err := Open(engines.Options{Dir: tb.TempDir(), Storage: StorageSSD, Replayable: true})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = e.Close() })
	val := bytes.Repeat([]byte("v"), vlen)
	for i := 0; i < n; i += 100 {
		var b []engines.Mutation
		for j := i; j < i+100 && j < n; j++ {
			b = append(b, engines.Mutation{Key: fmt.Appendf(nil, "k%06d", j), Value: val})
		}
		if err := e.Apply(b); err != nil {
			tb.Fatal(err)
		}
		if (i+100)%per == 0 {
			if err := e.db.Flush(); err != nil {
				tb.Fatal(err)
			}
		}
	}
	if err := e.db.Flush(); err != nil {
		tb.Fatal(err)
	}
	return e
}

// TestSizeMedian: the median of keys of equal size is near the middle key,
// inside a range too; an empty engine and one range with a single file
// boundary say nothing.
func TestSizeMedian(t *testing.T) {
	empty, err := Open(engines.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = empty.Close() }()
	if k, _, _, err := empty.SizeMedian(nil, nil); err != nil || k != nil {
		t.Fatalf("empty engine: median %q, %v; want none", k, err)
	}
	const n = 20000
	e := fillMedian(t, n, 256, 1000)
	for _, c := range []struct {
		lo, hi []byte
		want   int // the middle key's number
	}{
		{nil, nil, n / 2},
		{[]byte("k010000"), nil, 15000},
		{[]byte("k002000"), []byte("k006000"), 4000},
	} {
		k, share, files, err := e.SizeMedian(c.lo, c.hi)
		if err != nil || k == nil {
			t.Fatalf("[%q, %q): median %q, %v (%d files)", c.lo, c.hi, k, err, files)
		}
		var got int
		if _, err := fmt.Sscanf(string(k), "k%06d", &got); err != nil {
			t.Fatalf("median %q: %v", k, err)
		}
		// Within one flushed file (1,000 keys) and a bit of the middle.
		if d := got - c.want; d < -1500 || d > 1500 {
			t.Errorf("[%q, %q): median %q (left share %.2f, %d files), want near k%06d", c.lo, c.hi, k, share, files, c.want)
		}
	}
}

// BenchmarkSizeMedian is the cost of a size median (taken off the request
// path, at most every few seconds per replica).
func BenchmarkSizeMedian(b *testing.B) {
	e := fillMedian(b, 100000, 256, 1000)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if k, _, _, err := e.SizeMedian(nil, nil); err != nil || k == nil {
			b.Fatal(k, err)
		}
	}
}
