package mph

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/tabuladb/tabula/engines"
)

func seedOf(t testing.TB) uint64 {
	if s := os.Getenv("TABULA_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	s := rand.Uint64()
	t.Logf("seed %d (rerun with TABULA_SEED=%d)", s, s)
	return s
}

func randomHashes(r *rand.Rand, n int) []uint64 {
	seen := make(map[uint64]struct{}, n)
	hs := make([]uint64, 0, n)
	for len(hs) < n {
		h := r.Uint64()
		if _, ok := seen[h]; ok {
			continue
		}
		seen[h] = struct{}{}
		hs = append(hs, h)
	}
	return hs
}

func checkPerfect(t *testing.T, tab *Table, hs []uint64) {
	t.Helper()
	if tab.Len() != len(hs) {
		t.Fatalf("Len %d, want %d", tab.Len(), len(hs))
	}
	seen := make([]bool, len(hs))
	for _, h := range hs {
		s := tab.Lookup(h)
		if s >= uint64(len(hs)) {
			t.Fatalf("hash %#x: slot %d out of [0, %d)", h, s, len(hs))
		}
		if seen[s] {
			t.Fatalf("hash %#x: slot %d taken twice", h, s)
		}
		seen[s] = true
	}
}

func TestPerfect(t *testing.T) {
	r := rand.New(rand.NewPCG(seedOf(t), 0))
	sizes := []int{0, 1, 2, 3, 4, 5, 7, 10, 31, 100, 1000, 12345, 100000}
	if !testing.Short() {
		sizes = append(sizes, 1<<20)
	}
	for _, n := range sizes {
		hs := randomHashes(r, n)
		tab, err := Build(hs, Options{})
		if err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		checkPerfect(t, tab, hs)
		// Absent hashes land in [0, n) too.
		for i := 0; i < 100 && n > 0; i++ {
			if s := tab.Lookup(r.Uint64()); s >= uint64(n) {
				t.Fatalf("n=%d: absent hash got slot %d", n, s)
			}
		}
		dec, err := Decode(tab.AppendBinary(nil))
		if err != nil {
			t.Fatalf("n=%d: decode: %v", n, err)
		}
		checkPerfect(t, dec, hs)
		if n > 0 {
			t.Logf("n=%d: %.2f bits/key encoded", n, float64(8*tab.EncodedLen())/float64(n))
		}
	}
}

func TestOptions(t *testing.T) {
	r := rand.New(rand.NewPCG(seedOf(t), 1))
	hs := randomHashes(r, 50000)
	for _, o := range []Options{{Lambda: 1}, {Lambda: 3}, {Lambda: 3.5}, {Alpha: 0.9}, {Alpha: 0.995}, {Seed: 77}} {
		tab, err := Build(hs, o)
		if err != nil {
			t.Fatalf("%+v: %v", o, err)
		}
		checkPerfect(t, tab, hs)
	}
	for _, o := range []Options{{Lambda: 0.5}, {Lambda: 4}, {Alpha: 0.2}, {Alpha: 1}, {MaxSeeds: -1}} {
		if err := o.Validate(); err == nil {
			t.Fatalf("%+v: Validate passed", o)
		}
	}
}

func TestDeterministic(t *testing.T) {
	r := rand.New(rand.NewPCG(seedOf(t), 2))
	hs := randomHashes(r, 30000)
	a, err := Build(hs, Options{})
	if err != nil {
		t.Fatal(err)
	}
	sh := slices.Clone(hs)
	r.Shuffle(len(sh), func(i, j int) { sh[i], sh[j] = sh[j], sh[i] })
	b, err := Build(sh, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.AppendBinary(nil), b.AppendBinary(nil)) {
		t.Fatal("same hash set in another order built a different table")
	}
}

// TestWorkers: the parts built by several goroutines give the same table
// and slots as one.
func TestWorkers(t *testing.T) {
	r := rand.New(rand.NewPCG(seedOf(t), 4))
	hs := randomHashes(r, 300000) // 5 parts
	want := make([]uint32, len(hs))
	a, err := BuildSlots(hs, Options{}, want)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []int{2, 3, 8} {
		got := make([]uint32, len(hs))
		b, err := BuildSlots(hs, Options{Workers: w}, got)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a.AppendBinary(nil), b.AppendBinary(nil)) || !slices.Equal(got, want) {
			t.Fatalf("workers %d: a different table or slots than one worker", w)
		}
	}
	if err := (Options{Workers: -1}).Validate(); err == nil {
		t.Fatal("Workers -1: Validate passed")
	}
}

func TestDuplicate(t *testing.T) {
	hs := []uint64{1, 2, 3, 2}
	if _, err := Build(hs, Options{}); !errors.Is(err, ErrDuplicateHash) {
		t.Fatalf("err %v, want ErrDuplicateHash", err)
	}
}

func TestDecodeRejects(t *testing.T) {
	r := rand.New(rand.NewPCG(seedOf(t), 3))
	hs := randomHashes(r, 1000)
	tab, err := Build(hs, Options{})
	if err != nil {
		t.Fatal(err)
	}
	enc := tab.AppendBinary(nil)
	for _, b := range [][]byte{nil, enc[:10], enc[:len(enc)-1], append(slices.Clone(enc), 0)} {
		if _, err := Decode(b); !errors.Is(err, engines.ErrCorrupt) {
			t.Fatalf("len %d: err %v, want ErrCorrupt", len(b), err)
		}
	}
	bad := slices.Clone(enc)
	bad[4] = 9
	if _, err := Decode(bad); !errors.Is(err, engines.ErrCorrupt) {
		t.Fatalf("bad version: %v", err)
	}
}

// TestBuildSpeed logs build throughput and size for the parameter grid;
// TABULA_MPH_N sets the key count (default 1M, skipped in -short).
func TestBuildSpeed(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	n := 1 << 20
	if s := os.Getenv("TABULA_MPH_N"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	r := rand.New(rand.NewPCG(seedOf(t), 4))
	hs := randomHashes(r, n)
	grid := []Options{{}}
	if os.Getenv("TABULA_MPH_GRID") != "" {
		grid = nil
		for _, l := range []float64{2, 2.5, 3, 3.5} {
			for _, a := range []float64{0.97, 0.99, 0.995} {
				grid = append(grid, Options{Lambda: l, Alpha: a})
			}
		}
	}
	for _, o := range grid {
		t0 := time.Now()
		tab, err := Build(hs, o)
		if err != nil {
			t.Fatal(err)
		}
		d := time.Since(t0)
		t0 = time.Now()
		var sum uint64
		for _, h := range hs {
			sum += tab.Lookup(h)
		}
		ld := time.Since(t0)
		t.Logf("λ=%.1f α=%.3f n=%d: build %.2f Mkeys/s, %.2f bits/key, lookup %.1f ns (seed %d) %d",
			o.withDefaults().Lambda, o.withDefaults().Alpha, n, float64(n)/d.Seconds()/1e6,
			float64(8*tab.EncodedLen())/float64(n), float64(ld.Nanoseconds())/float64(n), tab.Seed(), sum%2)
	}
}

func BenchmarkLookup(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	hs := randomHashes(r, 1<<20)
	tab, err := Build(hs, Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	var sum uint64
	for i := 0; i < b.N; i++ {
		sum += tab.Lookup(hs[i&(1<<20-1)])
	}
	_ = sum
}

func BenchmarkBuild(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	hs := randomHashes(r, 1<<20)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := Build(hs, Options{}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(hs)*b.N)/b.Elapsed().Seconds(), "keys/s")
}

func FuzzDecode(f *testing.F) {
	for _, n := range []int{0, 1, 5, 100} {
		tab, _ := Build(randomHashes(rand.New(rand.NewPCG(uint64(n), 0)), n), Options{})
		f.Add(tab.AppendBinary(nil))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		tab, err := Decode(b)
		if err != nil {
			if !errors.Is(err, engines.ErrCorrupt) {
				t.Fatalf("error does not wrap ErrCorrupt: %v", err)
			}
			return
		}
		for _, h := range []uint64{0, 1, 1 << 63, 12345} {
			if s := tab.Lookup(h); tab.Len() > 0 && s >= uint64(tab.Len()) {
				t.Fatalf("slot %d out of range %d", s, tab.Len())
			}
		}
		if !bytes.Equal(tab.AppendBinary(nil), b) {
			t.Fatal("re-encoding differs")
		}
	})
}

func TestBuildSlots(t *testing.T) {
	r := rand.New(rand.NewPCG(seedOf(t), 5))
	for _, n := range []int{0, 1, 7, 1000, 200_000} {
		hs := randomHashes(r, n)
		slots := make([]uint32, n)
		tab, err := BuildSlots(hs, Options{}, slots)
		if err != nil {
			t.Fatal(err)
		}
		for i, h := range hs {
			if got := tab.Lookup(h); uint64(slots[i]) != got {
				t.Fatalf("n %d: slots[%d] = %d, Lookup says %d", n, i, slots[i], got)
			}
		}
		plain, err := Build(hs, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(plain.AppendBinary(nil), tab.AppendBinary(nil)) {
			t.Fatalf("n %d: BuildSlots built another table than Build", n)
		}
	}
	if _, err := BuildSlots([]uint64{1, 2}, Options{}, make([]uint32, 1)); err == nil {
		t.Fatal("slots of the wrong length accepted")
	}
}
