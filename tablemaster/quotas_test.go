package tablemaster

import (
	"math"
	"testing"
)

// TestShareOf: shares sum to the quota; every server gets at least the
// floor; a demand that follows the shares (a pacing client) converges to
// the split by primaries instead of running away; a raw client's hot
// spot draws most of the quota to its server.
func TestShareOf(t *testing.T) {
	const quota = 100
	prims := []int{3, 2, 1, 0} // the fourth server holds only secondaries
	all := 6
	share := func(demand []float64) []float64 {
		var sum float64
		for _, d := range demand {
			sum += d
		}
		out := make([]float64, len(prims))
		for i := range prims {
			out[i] = shareOf(quota, len(prims), prims[i], all, demand[i], sum)
		}
		return out
	}
	sum := func(xs []float64) (s float64) {
		for _, x := range xs {
			s += x
		}
		return s
	}
	for _, demand := range [][]float64{{0, 0, 0, 0}, {10, 0, 0, 0}, {1, 2, 3, 4}, {0, 0, 0, 500}} {
		sh := share(demand)
		if math.Abs(sum(sh)-quota) > 1e-9 {
			t.Errorf("demand %v: shares %v sum to %v", demand, sh, sum(sh))
		}
		for i, x := range sh {
			if x < quota*0.1/float64(len(prims))-1e-9 {
				t.Errorf("demand %v: server %d gets %v, under the floor", demand, i, x)
			}
		}
	}
	// Pacing: demand each round is the last round's share, started skewed.
	sh := []float64{1, 1, 1, 97}
	for range 30 {
		sh = share(sh)
	}
	for i, p := range prims {
		// The fixed point of x = Q(0.45 p/P + 0.45 x/Q + 0.1/n): the
		// primaries' split, with the floor.
		want := quota * (0.45*float64(p)/float64(all) + 0.1/float64(len(prims))) / 0.55
		if math.Abs(sh[i]-want) > 0.5 {
			t.Errorf("paced shares settle at %v, want about the primaries' split (server %d: %v)", sh, i, want)
		}
	}
	// A raw client hammering the server with one primary.
	if sh := share([]float64{1, 1, 1000, 0}); sh[2] < 45 {
		t.Errorf("a hot spot on server 2 draws only %v of %d", sh[2], quota)
	}
}
