package eliasfano

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/tabuladb/tabula/engines"
)

func TestRoundTrip(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 0))
	for _, n := range []int{0, 1, 2, 3, 255, 256, 257, 1000, 70000} {
		for _, gap := range []uint64{0, 1, 7, 100, 1 << 20} {
			vals := make([]uint64, n)
			v := uint64(0)
			for i := range vals {
				if gap > 0 {
					v += r.Uint64N(2 * gap)
				}
				vals[i] = v
			}
			l, err := Build(vals)
			if err != nil {
				t.Fatal(err)
			}
			d, err := Decode(l.AppendBinary(nil))
			if err != nil {
				t.Fatalf("n=%d gap=%d: %v", n, gap, err)
			}
			for _, x := range []*List{l, d} {
				for i := range vals {
					if got := x.Get(i); got != vals[i] {
						t.Fatalf("n=%d gap=%d: Get(%d)=%d, want %d", n, gap, i, got, vals[i])
					}
					if i+1 < n {
						a, b := x.Get2(i)
						if a != vals[i] || b != vals[i+1] {
							t.Fatalf("Get2(%d)=%d,%d want %d,%d", i, a, b, vals[i], vals[i+1])
						}
					}
				}
			}
		}
	}
	if _, err := Build([]uint64{2, 1}); err == nil {
		t.Fatal("decreasing list accepted")
	}
}

func FuzzDecode(f *testing.F) {
	for _, vals := range [][]uint64{nil, {0}, {0, 5, 5, 100}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 1000, 1 << 40}} {
		l, _ := Build(vals)
		f.Add(l.AppendBinary(nil))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := Decode(b)
		if err != nil {
			if !errors.Is(err, engines.ErrCorrupt) {
				t.Fatal(err)
			}
			return
		}
		prev := uint64(0)
		for i := 0; i < l.Len(); i++ {
			v := l.Get(i)
			if v < prev {
				t.Fatalf("decreasing at %d", i)
			}
			prev = v
			if i+1 < l.Len() {
				l.Get2(i)
			}
		}
		if !bytes.Equal(l.AppendBinary(nil), b) {
			t.Fatal("re-encoding differs")
		}
	})
}
