package keyspace

import (
	"math/bits"

	"github.com/cespare/xxhash/v2"
)

// Hash is the routing hash of key.
func Hash(key []byte) uint64 { return xxhash.Sum64(key) }

// Index is the partition (0..n-1) of n that holds hash h.
func Index(h uint64, n int) int {
	hi, _ := bits.Mul64(h, uint64(n))
	return int(hi)
}

// Range is the inclusive hash range [start, end] of partition i of n.
// It agrees with Index: Index(h, n) == i exactly when start <= h <= end.
func Range(i, n int) (start, end uint64) {
	return lowest(i, n), lowest(i+1, n) - 1
}

// lowest is the smallest h with Index(h, n) >= i: ceil(i*2^64/n), wrapping to
// 0 for i == n so that Range's end for the last partition is 2^64-1.
func lowest(i, n int) uint64 {
	if i >= n {
		return 0
	}
	q, r := bits.Div64(uint64(i), 0, uint64(n))
	if r != 0 {
		q++
	}
	return q
}
