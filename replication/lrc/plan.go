package lrc

import (
	"fmt"
	"math/bits"

	"github.com/klauspost/reedsolomon"
)

// bitset holds a set of shard indices; k+l+r <= 256.
type bitset [4]uint64

func (b *bitset) set(i int)      { b[i>>6] |= 1 << (i & 63) }
func (b *bitset) has(i int) bool { return b[i>>6]&(1<<(i&63)) != 0 }
func (b *bitset) empty() bool    { return b[0]|b[1]|b[2]|b[3] == 0 }

func (b *bitset) len() int {
	return bits.OnesCount64(b[0]) + bits.OnesCount64(b[1]) + bits.OnesCount64(b[2]) + bits.OnesCount64(b[3])
}

// planKey identifies a decode: which shards are missing, which of them are
// wanted.
type planKey struct{ missing, targets bitset }

// plan rebuilds the shards outputs from the shards inputs: outputs =
// matrix · inputs, run by a reedsolomon encoder whose "data" are the inputs
// and whose "parity" are the outputs. Immutable once built.
type plan struct {
	inputs  []int // shards read, ascending
	outputs []int // shards produced, ascending
	enc     reedsolomon.Encoder
}

// plan returns the cached plan for (missing, targets) or builds one.
func (c *Code) plan(missing, targets bitset) (*plan, error) {
	key := planKey{missing, targets}
	if c.cacheMax > 0 {
		c.mu.Lock()
		p := c.plans[key]
		c.mu.Unlock()
		if p != nil {
			return p, nil
		}
	}
	// Built outside the lock: two goroutines may build the same plan; one
	// wins the map slot, both results are correct.
	p, err := c.buildPlan(missing, targets)
	if err != nil {
		return nil, err
	}
	if c.cacheMax > 0 {
		c.mu.Lock()
		if len(c.plans) >= c.cacheMax {
			// Evict an arbitrary plan (map order). A stripe sees few
			// distinct patterns; a miss costs one buildPlan, ~12-18 µs,
			// so an LRU's bookkeeping would not pay for itself.
			for k := range c.plans {
				delete(c.plans, k)
				break
			}
		}
		c.plans[key] = p
		c.mu.Unlock()
	}
	return p, nil
}

// buildPlan chooses the shards to read and the decode matrix.
//
// The wanted shards T are rows of the generator matrix G; they can be
// rebuilt from the present shards P iff every row of G[T] lies in the row
// space of G[P], and then G[T] = X·G[P] for some X (solveRows). That test
// is exact for any coefficients: a pattern either solves, or returns
// ErrUndecodable. reedsolomon's plain Reconstruct instead inverts the first
// k present rows, which for a non-MDS code can be singular on a decodable
// pattern: with x0, x1 and global parity 0 lost from LRC(12,2,2), its first
// 12 present rows are 10 data fragments and both local parities, and group
// 1's parity adds nothing to its intact data (TestLibraryReconstructFails).
//
// To read as little as possible the present rows are offered to the
// elimination in order of cost: data fragments first, then local parities,
// then global parities. Gauss-Jordan keeps a row as a pivot only if it adds
// rank, so a global parity is used only when the data and local parities
// cannot determine the targets, and X has zeros for every row not needed.
// The shards read are the columns of X that are not all zero: for one lost
// data fragment in an otherwise intact group that is its k/l-1 group
// siblings and the group's local parity (6 for LRC(12,2,2)); a lost global
// parity or a loss the locals cannot cover reads k.
func (c *Code) buildPlan(missing, targets bitset) (*plan, error) {
	var present []int
	for i := range c.n { // ascending: data, then locals, then globals
		if !missing.has(i) {
			present = append(present, i)
		}
	}
	var outputs []int
	for i := range c.n {
		if targets.has(i) {
			outputs = append(outputs, i)
		}
	}
	a := make([][]byte, len(present))
	for j, i := range present {
		a[j] = c.gen[i]
	}
	b := make([][]byte, len(outputs))
	for j, i := range outputs {
		b[j] = c.gen[i]
	}
	x, ok := solveRows(a, b, c.k)
	if !ok {
		return nil, fmt.Errorf("lrc: rebuild shards %v with shards %v missing: %w", outputs, c.list(missing), ErrUndecodable)
	}
	var used []int // indices into present
	for j := range present {
		for t := range x {
			if x[t][j] != 0 {
				used = append(used, j)
				break
			}
		}
	}
	p := &plan{outputs: outputs}
	m := make([][]byte, len(outputs))
	for t := range m {
		m[t] = make([]byte, len(used))
		for u, j := range used {
			m[t][u] = x[t][j]
		}
	}
	for _, j := range used {
		p.inputs = append(p.inputs, present[j])
	}
	enc, err := reedsolomon.New(len(p.inputs), len(p.outputs), reedsolomon.WithCustomMatrix(m))
	if err != nil {
		return nil, fmt.Errorf("lrc: build decoder for %v from %v: %w", p.outputs, p.inputs, err)
	}
	p.enc = enc
	return p, nil
}

func (c *Code) list(b bitset) []int {
	var l []int
	for i := range c.n {
		if b.has(i) {
			l = append(l, i)
		}
	}
	return l
}
