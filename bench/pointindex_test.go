package main

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/puzpuzpuz/xsync/v4"
)

func benchKeys(n int) []uint64 {
	rng := rand.New(rand.NewPCG(1, 2))
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = rng.Uint64()
	}
	return keys
}

func benchGets(b *testing.B, c contender, keys []uint64) {
	b.ReportAllocs()
	b.ResetTimer()
	x := uint64(88172645463325252)
	n := uint64(len(keys))
	for range b.N {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		if _, ok := c.get(keys[(x>>8)%n]); !ok {
			b.Fatal("missing")
		}
	}
}

func BenchmarkGetLhash(b *testing.B) {
	keys := benchKeys(1 << 20)
	benchGets(b, newLhash(append(slices.Clone(keys), keys...)), keys)
}

func BenchmarkGetMap(b *testing.B) {
	keys := benchKeys(1 << 20)
	benchGets(b, &mapC{m: fillMap(keys)}, keys)
}

func BenchmarkGetXsync(b *testing.B) {
	keys := benchKeys(1 << 20)
	c := &xsyncC{m: xsync.NewMap[uint64, uint64]()}
	for i, k := range keys {
		c.m.Store(k, uint64(i))
	}
	benchGets(b, c, keys)
}

// The Small variants fit in cache: they compare per-lookup CPU cost, not
// memory latency.
func BenchmarkGetLhashSmall(b *testing.B) {
	keys := benchKeys(1 << 10)
	benchGets(b, newLhash(append(slices.Clone(keys), keys...)), keys)
}

func BenchmarkGetXsyncSmall(b *testing.B) {
	keys := benchKeys(1 << 10)
	c := &xsyncC{m: xsync.NewMap[uint64, uint64]()}
	for i, k := range keys {
		c.m.Store(k, uint64(i))
	}
	benchGets(b, c, keys)
}

func BenchmarkGetMapSmall(b *testing.B) {
	keys := benchKeys(1 << 10)
	benchGets(b, &mapC{m: fillMap(keys)}, keys)
}
