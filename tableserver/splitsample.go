package tableserver

import (
	"bytes"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The load-based split finder: which point of a partition's range halves
// its load, reported to the master with the heartbeat
// (ReplicaStatus.load_split) so an automatic split by load cuts where the
// load is, not at the middle of the range. WAS profiles a RangePartition's
// load by adaptive ranges; CockroachDB's load-based splitter samples
// request keys into a small reservoir and picks the candidate that best
// balances left and right. This does the latter, decayed over time:
//
//   - Every request key passing the partition check (checkKey: gets, batch
//     gets, writes, CAS, coprocessor calls on keys) is counted; one in
//     splitSampleEvery is sampled (every one while the reservoir is short
//     of splitSampleSlots, so a partition that warms up shows a hint in
//     seconds). The request path pays a random number (~2 ns); a sampled key a
//     mutex, a clock read and, for ordered tables, a copy of the key.
//   - Samples go into a reservoir of splitSampleSlots (Chao's weighted
//     algorithm R: a sample stands for the requests it was picked from)
//     whose count of requests seen halves every splitSampleHalfLife: a new
//     sample replaces a slot with probability slots*weight/seen, so the reservoir
//     follows the load within a few half-lives, as the master's rates do
//     (tablemaster/load.go, the same 10 s).
//   - The hint is the sample that best halves the reservoir: left the
//     samples below it, right the ones at or above it (it is the right
//     child's first hash or key). No hint with fewer than
//     splitSampleMinSeen requests seen (decayed: a partition gone cold
//     loses its hint), or when no cut leaves at least splitSampleMinShare
//     of the samples on each side (one hot key: splitting cannot halve its
//     load), or when the cut is the range's first point (the left child
//     would be empty).
//
// Point tables sample the routing hash (keyspace.Hash) the partition
// ranges cut, ordered tables the key. Scans are not sampled: a range
// read's cost is spread over its range and is not one point.

// Sampler parameters. 128 slots estimate the load median within ~4.4% of
// the load (the standard error of a median of n samples is 0.5/sqrt(n)).
const (
	splitSampleSlots    = 128
	splitSampleEvery    = 8
	splitSampleMinSeen  = 64
	splitSampleMinShare = 0.25
	splitSampleHalfLife = 10 * time.Second
)

// splitSampler samples a partition's request keys. The zero value is
// ready for a point table; set ordered before use for an ordered one.
// Safe for concurrent use.
type splitSampler struct {
	ordered bool
	// sparse is set once enough samples were seen: then one request in
	// splitSampleEvery is sampled, before every one.
	sparse atomic.Bool

	mu sync.Mutex
	// Guarded by mu:
	slots  [splitSampleSlots]keySample
	filled int
	seen   float64 // requests seen, halved every splitSampleHalfLife
	last   time.Time
}

// keySample is one sampled request: its hash (point tables) or its key
// (ordered tables).
type keySample struct {
	hash uint64
	key  []byte
}

// splitHint is a split point: the right child's first hash (point) or
// key (ordered), with the samples it was computed from and the share of
// them left of it.
type splitHint struct {
	hash    uint64
	key     []byte
	samples int
	left    float64
}

// observe counts one request on hash (point tables) or key (ordered). A
// nil sampler counts nothing.
func (s *splitSampler) observe(hash uint64, key []byte, now func() time.Time) {
	if s == nil {
		return
	}
	// Sampled at random, not every n-th: a periodic request pattern
	// would alias with a counter (runtime-backed, per-thread, ~2 ns).
	w := 1.0 // the requests this sample stands for
	if s.sparse.Load() {
		if rand.Uint64()%splitSampleEvery != 0 {
			return
		}
		w = splitSampleEvery
	}
	t := now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.decayLocked(t)
	ks := keySample{hash: hash}
	if s.ordered {
		ks = keySample{key: bytes.Clone(key)}
	}
	// Chao's weighted reservoir: kept with probability slots*w/seen, so
	// a sample taken 1 in 8 counts 8 times one taken while dense.
	s.seen += w
	if s.filled < splitSampleSlots {
		s.slots[s.filled] = ks
		s.filled++
	} else if rand.Float64()*s.seen < splitSampleSlots*w {
		s.slots[rand.IntN(splitSampleSlots)] = ks
	}
	s.sparse.Store(s.seen >= 2*splitSampleSlots)
}

// decayLocked halves seen for every half-life since the last decay.
func (s *splitSampler) decayLocked(t time.Time) {
	if s.last.IsZero() {
		s.last = t
		return
	}
	if d := t.Sub(s.last); d >= time.Second {
		s.seen *= math.Exp2(-d.Seconds() / splitSampleHalfLife.Seconds())
		s.last = t
		s.sparse.Store(s.seen >= 2*splitSampleSlots)
	}
}

// hint is the point that halves the sampled load inside a partition whose
// range starts at start (point tables) or keyStart (ordered), if the
// samples say one; ok false otherwise (see the top of the file).
func (s *splitSampler) hint(start uint64, keyStart []byte, now time.Time) (h splitHint, ok bool) {
	if s == nil {
		return h, false
	}
	s.mu.Lock()
	s.decayLocked(now)
	if s.seen < splitSampleMinSeen || s.filled < splitSampleMinSeen {
		s.mu.Unlock()
		return h, false
	}
	samples := slices.Clone(s.slots[:s.filled])
	s.mu.Unlock()
	return bestCut(samples, s.ordered, start, keyStart)
}

// bestCut is the cut of samples nearest to half: the right side begins
// at one sample's point (all its equal samples go right).
func bestCut(samples []keySample, ordered bool, start uint64, keyStart []byte) (splitHint, bool) {
	cmp := func(a, b keySample) int {
		if ordered {
			return bytes.Compare(a.key, b.key)
		}
		switch {
		case a.hash < b.hash:
			return -1
		case a.hash > b.hash:
			return 1
		}
		return 0
	}
	slices.SortFunc(samples, cmp)
	n := len(samples)
	best, bestDiff := -1, n+1
	for i := 1; i < n; i++ {
		if cmp(samples[i-1], samples[i]) == 0 {
			continue // a cut between equal points is not a cut
		}
		if d := abs(n - 2*i); d < bestDiff {
			best, bestDiff = i, d
		}
	}
	if best < 0 || float64(min(best, n-best)) < splitSampleMinShare*float64(n) {
		return splitHint{}, false
	}
	h := splitHint{hash: samples[best].hash, key: samples[best].key, samples: n, left: float64(best) / float64(n)}
	if ordered && bytes.Compare(h.key, keyStart) <= 0 || !ordered && h.hash <= start {
		return splitHint{}, false // the left child would be empty
	}
	return h, true
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
