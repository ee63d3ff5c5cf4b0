package keyspace

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestRangeAgreesWithIndex(t *testing.T) {
	for _, n := range []int{1, 2, 3, 7, 12, 100, 4096} {
		var prevEnd uint64
		for i := 0; i < n; i++ {
			start, end := Range(i, n)
			if i == 0 && start != 0 {
				t.Fatalf("n=%d: first partition starts at %d", n, start)
			}
			if i > 0 && start != prevEnd+1 {
				t.Fatalf("n=%d i=%d: gap or overlap: start %d after end %d", n, i, start, prevEnd)
			}
			if got := Index(start, n); got != i {
				t.Fatalf("n=%d: Index(start of %d) = %d", n, i, got)
			}
			if got := Index(end, n); got != i {
				t.Fatalf("n=%d: Index(end of %d) = %d", n, i, got)
			}
			prevEnd = end
		}
		if prevEnd != math.MaxUint64 {
			t.Fatalf("n=%d: last partition ends at %d", n, prevEnd)
		}
	}
}

func TestIndexSpread(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 0))
	const n, keys = 12, 120000
	counts := make([]int, n)
	key := make([]byte, 16)
	for i := 0; i < keys; i++ {
		for j := range key {
			key[j] = byte(r.Uint32())
		}
		counts[Index(Hash(key), n)]++
	}
	for i, c := range counts {
		if c < keys/n*9/10 || c > keys/n*11/10 {
			t.Fatalf("partition %d got %d of %d keys", i, c, keys)
		}
	}
}
