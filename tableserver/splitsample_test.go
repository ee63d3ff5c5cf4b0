package tableserver

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// fakeNow is a clock a test moves.
type fakeNow struct{ t time.Time }

func (c *fakeNow) now() time.Time { return c.t }

// TestSplitSamplerUniform: a uniform load over a point partition's hashes
// halves near the middle of its range.
func TestSplitSamplerUniform(t *testing.T) {
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 1))
	clk := &fakeNow{time.Unix(1000, 0)}
	var s splitSampler
	for i := 0; i < 20000; i++ {
		s.observe(rng.Uint64(), nil, clk.now)
		if i%1000 == 0 {
			clk.t = clk.t.Add(100 * time.Millisecond)
		}
	}
	h, ok := s.hint(0, nil, clk.t)
	if !ok {
		t.Fatalf("seed %d: no hint after 20,000 uniform requests", seed)
	}
	if f := float64(h.hash) / math.MaxUint64; f < 0.35 || f > 0.65 {
		t.Fatalf("seed %d: hint %#x (%.2f of the range), want near the middle", seed, h.hash, f)
	}
	if h.left < 0.45 || h.left > 0.55 || h.samples != splitSampleSlots {
		t.Fatalf("seed %d: hint %+v: want half the %d samples left", seed, h, splitSampleSlots)
	}
}

// TestSplitSamplerSkewed: 80% of the load on the first tenth of the range
// (and the rest uniform) halves inside that tenth, where the load is; the
// load then moving to the last tenth moves the hint there within a few
// half-lives.
func TestSplitSamplerSkewed(t *testing.T) {
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 2))
	clk := &fakeNow{time.Unix(1000, 0)}
	var s splitSampler
	tenth := uint64(math.MaxUint64 / 10)
	run := func(lo uint64, n int) {
		for i := 0; i < n; i++ {
			h := rng.Uint64()
			if rng.Float64() < 0.8 {
				h = lo + rng.Uint64N(tenth)
			}
			s.observe(h, nil, clk.now)
			if i%1000 == 999 {
				clk.t = clk.t.Add(time.Second) // 1,000 requests/s
			}
		}
	}
	run(0, 20000)
	h, ok := s.hint(0, nil, clk.t)
	if !ok || h.hash == 0 || h.hash >= tenth {
		t.Fatalf("seed %d: hint %+v (ok %v), want inside the hot first tenth (< %#x)", seed, h, ok, tenth)
	}
	// 62.5% of the load is below the hot tenth's midpoint: the hint is
	// near 0.625 of the tenth.
	if f := float64(h.hash) / float64(tenth); f < 0.4 || f > 0.85 {
		t.Fatalf("seed %d: hint at %.2f of the hot tenth, want near 0.62", seed, f)
	}
	run(9*tenth, 60000) // six half-lives
	h, ok = s.hint(0, nil, clk.t)
	if !ok || h.hash < 9*tenth-tenth/2 {
		t.Fatalf("seed %d: after the load moved: hint %+v (ok %v), want inside the last tenth (>= %#x)", seed, h, ok, 9*tenth)
	}
}

// TestSplitSamplerOrdered: an ordered partition's hint is a key, where the
// load halves.
func TestSplitSamplerOrdered(t *testing.T) {
	clk := &fakeNow{time.Unix(1000, 0)}
	s := splitSampler{ordered: true}
	for i := 0; i < 4000; i++ {
		// Keys a000..a999 take 3/4 of the requests, b000..b999 the rest.
		k := fmt.Appendf(nil, "a%03d", i%1000)
		if i%4 == 3 {
			k = fmt.Appendf(nil, "b%03d", i%1000)
		}
		s.observe(0, k, clk.now)
	}
	h, ok := s.hint(0, []byte("a"), clk.t)
	// Within 15% of the load (3.4 standard errors of 128 samples): a467
	// has 35% of it on its left, a867 65%.
	if !ok || string(h.key) < "a467" || string(h.key) > "a867" {
		t.Fatalf("hint %q %+v (ok %v): want a key near a667, where the load halves", h.key, h, ok)
	}
	// The range starting at the hint's key: no split point there.
	if _, ok := s.hint(0, []byte("zzz"), clk.t); ok {
		t.Fatal("a hint at or below the partition's first key")
	}
}

// TestSplitSamplerNoHint: too few samples, samples gone cold, and one hot
// key (no cut halves it) give no hint.
func TestSplitSamplerNoHint(t *testing.T) {
	clk := &fakeNow{time.Unix(1000, 0)}
	var few splitSampler
	for i := 0; i < splitSampleMinSeen-1; i++ {
		few.observe(uint64(i+1)<<40, nil, clk.now)
	}
	if h, ok := few.hint(0, nil, clk.t); ok {
		t.Fatalf("hint %+v from %d samples", h, splitSampleMinSeen-1)
	}
	few.observe(1<<50, nil, clk.now)
	if _, ok := few.hint(0, nil, clk.t); !ok {
		t.Fatalf("no hint from %d distinct samples", splitSampleMinSeen)
	}
	// A minute without requests: the samples decayed below the minimum.
	if h, ok := few.hint(0, nil, clk.t.Add(time.Minute)); ok {
		t.Fatalf("hint %+v from samples a minute cold", h)
	}
	var hot splitSampler
	for i := 0; i < 10000; i++ {
		h := uint64(42) << 32 // 90% on one key
		if i%10 == 0 {
			h = uint64(i) << 40
		}
		hot.observe(h, nil, clk.now)
	}
	if h, ok := hot.hint(0, nil, clk.t); ok {
		t.Fatalf("hint %+v with 90%% of the load on one key", h)
	}
}

// BenchmarkSplitSamplerObserve is the request path's cost of the sampler.
func BenchmarkSplitSamplerObserve(b *testing.B) {
	var s splitSampler
	var i uint64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i++
			s.observe(i*0x9E3779B97F4A7C15, nil, time.Now)
		}
	})
}
