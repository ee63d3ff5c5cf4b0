package stream

import (
	"fmt"
	"sync"

	"github.com/tabuladb/tabula/replication/lrc"
)

// CodeLRC12 names LRC(12,2,2) (replication/lrc's default): 12 data
// fragments in 2 local groups of 6, one XOR parity per group, 2 global
// parities; 16 fragments, 1.33x storage. It is written to the manager's
// log: never change.
const CodeLRC12 = "lrc-12-2-2"

var (
	lrc12Once sync.Once
	lrc12     *lrc.Code
)

// codeOf returns the codec of a scheme name.
func codeOf(scheme string) (*lrc.Code, error) {
	if scheme != CodeLRC12 {
		return nil, badCmd("unknown erasure code %q", scheme)
	}
	lrc12Once.Do(func() {
		c, err := lrc.New(lrc.Options{})
		if err != nil {
			panic(fmt.Sprintf("stream: LRC(12,2,2): %v", err)) // constant options
		}
		lrc12 = c
	})
	return lrc12, nil
}

// fragmentGroup is the failure group of fragment i for placement: its
// local group, or one past the last for a global parity.
func fragmentGroup(c *lrc.Code, i int) int {
	k, l := c.DataShards(), c.LocalGroups()
	switch {
	case i < k:
		return i / (k / l)
	case i < k+l:
		return i - k
	}
	return l
}

// splitAtBlocks cuts an extent whose blocks start at starts (ascending,
// the first at 0) and which ends at length into k contiguous runs of whole
// blocks, making the largest run as small as it can be: boundaries[i] is
// where run i starts, boundaries[k] = length. Trailing runs may be empty.
// A block never spans two data fragments, so a read of a block goes to the
// one fragment holding it.
func splitAtBlocks(starts []int64, length int64, k int) []int64 {
	sizes := make([]int64, len(starts))
	var lo int64
	for i, s := range starts {
		end := length
		if i+1 < len(starts) {
			end = starts[i+1]
		}
		sizes[i] = end - s
		lo = max(lo, sizes[i])
	}
	fits := func(capacity int64) bool {
		runs, cur := 1, int64(0)
		for _, s := range sizes {
			if cur+s > capacity {
				runs++
				cur = 0
			}
			cur += s
		}
		return runs <= k
	}
	hi := max(lo, length)
	for lo < hi {
		mid := lo + (hi-lo)/2
		if fits(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	bounds := make([]int64, 0, k+1)
	bounds = append(bounds, 0)
	var cur int64
	for i, s := range sizes {
		if cur+s > lo {
			bounds = append(bounds, starts[i])
			cur = 0
		}
		cur += s
	}
	for len(bounds) <= k {
		bounds = append(bounds, length)
	}
	return bounds
}

// encodeExtent splits raw (an extent's blocks, [0, length)) at bounds into
// the code's data fragments, padded with zeros to the largest, and
// computes the parities.
func encodeExtent(c *lrc.Code, raw []byte, bounds []int64) ([][]byte, int64, error) {
	k := c.DataShards()
	if len(bounds) != k+1 || bounds[k] != int64(len(raw)) {
		return nil, 0, fmt.Errorf("encode extent: %d boundaries ending at %d for %d bytes: %w", len(bounds), bounds[len(bounds)-1], len(raw), ErrBadRange)
	}
	var size int64
	for i := range k {
		size = max(size, bounds[i+1]-bounds[i])
	}
	size = max(size, 1)
	buf := make([]byte, size*int64(c.TotalShards()))
	shards := make([][]byte, c.TotalShards())
	for i := range shards {
		shards[i] = buf[int64(i)*size : int64(i+1)*size : int64(i+1)*size]
		if i < k {
			copy(shards[i], raw[bounds[i]:bounds[i+1]])
		}
	}
	if err := c.Encode(shards); err != nil {
		return nil, 0, fmt.Errorf("encode extent: %w", err)
	}
	return shards, size, nil
}

// fragmentPiece is the part of a read that one data fragment holds.
type fragmentPiece struct {
	index  int
	offset int64 // in the fragment
	length int64
	at     int64 // where it goes in the read's output
}

// fragmentPieces maps the extent range [off, off+n) of a coded extent to
// the data fragments holding it.
func fragmentPieces(bounds []int64, off, n int64) []fragmentPiece {
	var out []fragmentPiece
	for i := 0; i+1 < len(bounds); i++ {
		lo, hi := max(off, bounds[i]), min(off+n, bounds[i+1])
		if lo < hi {
			out = append(out, fragmentPiece{index: i, offset: lo - bounds[i], length: hi - lo, at: lo - off})
		}
	}
	return out
}
