package mph

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/tabuladb/tabula/engines"
)

// Encoding constants: on-disk, never change or reuse.
const (
	magic      = "MPH1"
	version    = 2 // 1: one part, no part table (no longer read)
	headerLen  = 48
	pilotCount = 256
)

// C is the odd multiplier of the slot function (from PtrHash/FxHash).
const mulC = 0x517cc1b727220a95

// ErrDuplicateHash is returned by Build when two inputs are the same hash:
// no function can separate them. engines/bulk then rehashes its keys with
// another seed.
var ErrDuplicateHash = errors.New("mph: duplicate hash")

// ErrNoSolution is returned by Build when no seed of Options.MaxSeeds
// converged (never seen in practice).
var ErrNoSolution = errors.New("mph: no solution found")

// Options tune Build. The zero value works.
type Options struct {
	// Seed is the first seed tried. Default 0.
	Seed uint64
	// Lambda is the average number of keys per bucket: larger is smaller
	// (8/λ bits per key for pilots) but slower to build. Default 2.5.
	Lambda float64
	// Alpha is the load factor n/S of the slot space before remapping:
	// larger costs less remap memory (32·(1/α-1) bits per key) but builds
	// slower. Default 0.99. Must be in (0.5, 0.995].
	Alpha float64
	// MaxSeeds is how many seeds Build tries before ErrNoSolution. Default 8.
	MaxSeeds int
	// Workers is how many goroutines build parts at once. Default 1. The
	// table does not depend on it.
	Workers int
}

func (o Options) withDefaults() Options {
	if o.Lambda == 0 {
		o.Lambda = 2.5
	}
	if o.Alpha == 0 {
		o.Alpha = 0.99
	}
	if o.MaxSeeds == 0 {
		o.MaxSeeds = 8
	}
	return o
}

// Validate explains what is wrong with o.
func (o Options) Validate() error {
	o = o.withDefaults()
	switch {
	case !(o.Lambda >= 1 && o.Lambda <= 3.5):
		return fmt.Errorf("mph: Lambda %v, want 1..3.5 (larger buckets do not place in reasonable time with 8-bit pilots)", o.Lambda)
	case !(o.Alpha > 0.5 && o.Alpha <= 0.995):
		return fmt.Errorf("mph: Alpha %v, want (0.5, 0.995]", o.Alpha)
	case o.MaxSeeds < 0:
		return fmt.Errorf("mph: MaxSeeds %d < 0", o.MaxSeeds)
	case o.Workers < 0:
		return fmt.Errorf("mph: Workers %d < 0", o.Workers)
	}
	return nil
}

// Table is a minimal perfect hash over a set of n hashes. It is immutable
// and safe for concurrent use.
type Table struct {
	n, slots, buckets uint64
	seed              uint64
	nparts            uint64
	parts             []part
	pilots            []byte
	remap             []uint32
	ph                [pilotCount]uint64
}

// part is one part's place in the table and its skewed bucket function.
// 64 bytes: a lookup reads one cache line of it.
type part struct {
	slotStart, slots     uint64
	bucketStart, buckets uint64
	m1, m2, b1           uint64
	_                    uint64
}

// Len is the number of keys n; Lookup returns slots in [0, n).
func (t *Table) Len() int { return int(t.n) }

// Seed is the seed the table was built with.
func (t *Table) Seed() uint64 { return t.seed }

// MemoryBytes is the memory the table holds: pilots, remap, the parts and
// the pilot hash table.
func (t *Table) MemoryBytes() int {
	return len(t.pilots) + 4*len(t.remap) + 64*len(t.parts) + 8*pilotCount + 96
}

// fmix64 is murmur3's finaliser, a bijection in which every output bit
// depends on every input bit.
func fmix64(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	k *= 0xc4ceb9fe1a85ec53
	k ^= k >> 33
	return k
}

func reduce(x, n uint64) uint64 {
	hi, _ := bits.Mul64(x, n)
	return hi
}

func (t *Table) initPilotHashes() {
	for p := range t.ph {
		t.ph[p] = fmix64(uint64(p) + t.seed*0x9e3779b97f4a7c15 + 0x632be59bd9b4e019)
	}
}

func (t *Table) mix(h uint64) uint64 { return fmix64(h ^ t.seed) }

// split maps a mixed hash to its part and the rest of its bits, which pick
// the bucket within the part: x·P = part·2^64 + rest.
func (t *Table) split(x uint64) (p, rest uint64) { return bits.Mul64(x, t.nparts) }

// skewT is the split of the bucket function: hashes below it (60% of keys)
// go to the first 30% of buckets.
const skewT = (1 << 64 / 5) * 3

// setBuckets derives the bucket function of a part of b buckets.
func (p *part) setBuckets(b uint64) {
	p.buckets = b
	p.b1 = (b*3 + 9) / 10
	if b >= 2 && p.b1 >= b {
		p.b1 = b - 1
	}
	p.m1 = p.b1 * 5 / 3
	p.m2 = (b - p.b1) * 5 / 2
}

// bucket maps the rest of a mixed hash to its bucket in the part: PTHash's
// skew, which makes the first buckets big (placed first, while most slots
// are free) and the rest small (placed last, when a small bucket still
// finds free slots).
func (p *part) bucket(rest uint64) uint64 {
	if rest < skewT {
		return reduce(rest, p.m1)
	}
	return min(p.b1+reduce(rest-skewT, p.m2), p.buckets-1)
}

// slot is the slot within its part of a mixed hash under pilot hash ph.
func slot(x, ph, slots uint64) uint64 { return reduce((x^ph)*mulC, slots) }

// Lookup returns the slot of h, in [0, n) when n > 0. For a hash that was
// not in the build set it returns an arbitrary slot in [0, n). With n == 0
// it returns 0.
func (t *Table) Lookup(h uint64) uint64 {
	if t.n == 0 {
		return 0
	}
	x := t.mix(h)
	pi, rest := t.split(x)
	p := &t.parts[pi]
	s := p.slotStart + slot(x, t.ph[t.pilots[p.bucketStart+p.bucket(rest)]], p.slots)
	if s >= t.n {
		s = uint64(t.remap[s-t.n])
	}
	return s
}

// Build returns a minimal perfect hash over hashes, which must be distinct
// (else ErrDuplicateHash). hashes is not modified. The result depends only on
// the set of hashes and opts.
func Build(hashes []uint64, opts Options) (*Table, error) {
	return BuildSlots(hashes, opts, nil)
}

// BuildSlots is Build that also sets slots[i] to the slot of hashes[i]
// (Lookup(hashes[i])) when slots is not nil; it must be len(hashes) long.
// The builder knows every slot, so this is cheaper than a Lookup per hash
// afterwards (measured at 10M keys: 0.1 s instead of 0.6-1.2 s).
func BuildSlots(hashes []uint64, opts Options, slots []uint32) (*Table, error) {
	if slots != nil && len(slots) != len(hashes) {
		return nil, fmt.Errorf("mph: %d slots for %d hashes", len(slots), len(hashes))
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	n := uint64(len(hashes))
	if n >= math.MaxUint32 {
		return nil, fmt.Errorf("mph: %d keys, at most %d", n, uint64(math.MaxUint32-1))
	}
	var lastErr error
	for i := 0; i < opts.MaxSeeds; i++ {
		t, err := buildSeed(hashes, opts, opts.Seed+uint64(i), slots)
		if err == nil {
			return t, nil
		}
		if errors.Is(err, ErrDuplicateHash) {
			return nil, err
		}
		lastErr = err
	}
	return nil, fmt.Errorf("%w after %d seeds: %v", ErrNoSolution, opts.MaxSeeds, lastErr)
}

// partKeys is the number of keys per part Build aims at: a part's working
// set (about 14 bytes per key) then stays in a core's L2 cache.
const partKeys = 1 << 16

// partsFor is the number of parts of a table of n keys.
func partsFor(n uint64) uint64 { return max(1, (n+partKeys/2)/partKeys) }

func buildSeed(hashes []uint64, opts Options, seed uint64, slots []uint32) (*Table, error) {
	n := uint64(len(hashes))
	t := &Table{n: n, seed: seed}
	t.initPilotHashes()
	if n == 0 {
		return t, nil
	}
	t.nparts = partsFor(n)
	t.parts = make([]part, t.nparts)

	// Counting sort of the mixed hashes by part: P sequential write
	// streams, so the scatter stays in cache.
	counts := make([]uint64, t.nparts+1)
	for _, h := range hashes {
		p, _ := t.split(t.mix(h))
		counts[p+1]++
	}
	maxPart := uint64(0)
	for p := uint64(0); p < t.nparts; p++ {
		maxPart = max(maxPart, counts[p+1])
		counts[p+1] += counts[p]
	}
	xs := make([]uint64, n)
	var is []uint32 // with slots: is[k] is the index in hashes of xs[k]
	if slots != nil {
		is = make([]uint32, n)
	}
	fill := make([]uint64, t.nparts)
	copy(fill, counts)
	for i, h := range hashes {
		x := t.mix(h)
		p, _ := t.split(x)
		xs[fill[p]] = x
		if is != nil {
			is[fill[p]] = uint32(i)
		}
		fill[p]++
	}
	fill = nil
	for p := range t.parts {
		np := counts[p+1] - counts[p]
		pt := &t.parts[p]
		pt.slots = max(1, min(uint64(math.Ceil(float64(np)/opts.Alpha)), 2*np+1))
		pt.setBuckets(max(1, min(uint64(math.Ceil(float64(np)/opts.Lambda)), np)))
		if p > 0 {
			pv := &t.parts[p-1]
			pt.slotStart = pv.slotStart + pv.slots
			pt.bucketStart = pv.bucketStart + pv.buckets
		}
	}
	last := &t.parts[t.nparts-1]
	t.slots = last.slotStart + last.slots
	t.buckets = last.bucketStart + last.buckets
	t.pilots = make([]byte, t.buckets)
	// The parts, by up to opts.Workers goroutines: each part's result
	// depends only on its keys, so the table does not depend on the
	// worker count. A part's pilots, slots and taken bits are its own;
	// only the taken words at the parts' edges are shared (atomic OR).
	taken := make([]uint64, (t.slots+63)/64) // global: for the remap
	var next atomic.Uint64
	var mu sync.Mutex
	failed, failErr := t.nparts, error(nil) // the lowest failed part; guarded by mu
	build := func() {
		b := newBuilder(t, maxPart, is != nil)
		for {
			p := next.Add(1) - 1
			mu.Lock()
			stop := p >= failed
			mu.Unlock()
			if p >= t.nparts || stop {
				return
			}
			var pis []uint32
			if is != nil {
				pis = is[counts[p]:counts[p+1]]
			}
			if err := b.buildPart(p, xs[counts[p]:counts[p+1]], pis); err != nil {
				mu.Lock()
				if p < failed {
					failed, failErr = p, err
				}
				mu.Unlock()
				continue
			}
			if is != nil && t.slots <= math.MaxUint32 {
				b.pairsOfPart(pis)
			}
			b.markTaken(taken)
		}
	}
	workers := min(uint64(max(1, opts.Workers)), t.nparts)
	var wg sync.WaitGroup
	for range workers - 1 {
		wg.Go(build)
	}
	build()
	wg.Wait()
	if failErr != nil {
		return nil, failErr
	}
	// Remap taken slots >= n onto the free slots below n, in order.
	t.remap = make([]uint32, t.slots-n)
	free := uint64(0)
	for s := n; s < t.slots; s++ {
		if taken[s/64]&(1<<(s%64)) == 0 {
			continue
		}
		for taken[free/64]&(1<<(free%64)) != 0 {
			free++
		}
		t.remap[s-n] = uint32(free)
		free++
	}
	if slots != nil && t.slots > math.MaxUint32 {
		// Slots past 2^32 before the remap: look them up instead.
		for i, h := range hashes {
			slots[i] = uint32(t.Lookup(h))
		}
	} else if slots != nil {
		scatterSlots(xs, t.remap, slots)
	}
	return t, nil
}

// builder places the buckets of one part at a time; its scratch is sized
// for the largest part and reused.
type builder struct {
	t      *Table
	pt     *part
	seed   uint64
	xs     []uint64 // the part's mixed hashes, grouped by bucket
	is     []uint32 // their indices in the input, or nil
	tmp    []uint64 // scratch for the counting sort
	tmpI   []uint32
	start  []uint32 // bucket b's keys are xs[start[b]:start[b+1]]
	owner  []uint32 // slot -> bucket+1, 0 free
	taken  []uint64 // bitmap of owner != 0: the hot check stays in cache
	osize  []uint8  // slot -> size of its owner bucket (saturated)
	order  []uint32
	heap   []uint32 // evicted buckets, max-heap by (size, -bucket)
	pilots []byte   // the part's pilots
	recent [16]uint32
	nrec   int
	rng    uint64
	slotsB [64]uint64 // scratch: slots of the bucket being placed
}

func newBuilder(t *Table, maxPart uint64, withIndices bool) *builder {
	maxSlots, maxBuckets := uint64(0), uint64(0)
	for i := range t.parts {
		maxSlots = max(maxSlots, t.parts[i].slots)
		maxBuckets = max(maxBuckets, t.parts[i].buckets)
	}
	var tmpI []uint32
	if withIndices {
		tmpI = make([]uint32, maxPart)
	}
	return &builder{
		t:     t,
		tmpI:  tmpI,
		tmp:   make([]uint64, maxPart),
		start: make([]uint32, maxBuckets+1),
		owner: make([]uint32, maxSlots),
		taken: make([]uint64, (maxSlots+63)/64),
		osize: make([]uint8, maxSlots),
		order: make([]uint32, maxBuckets),
	}
}

// buildPart finds the pilots of part p, whose mixed hashes are xs (which
// it reorders, and is, if not nil, alongside).
func (b *builder) buildPart(p uint64, xs []uint64, is []uint32) error {
	t := b.t
	pt := &t.parts[p]
	b.pt, b.xs, b.is = pt, xs, is
	b.pilots = t.pilots[pt.bucketStart : pt.bucketStart+pt.buckets]
	b.heap, b.nrec = b.heap[:0], 0
	b.rng = fmix64(t.seed^0x2545f4914f6cdd1d^(p+1)*0x9e3779b97f4a7c15) | 1
	nb := pt.buckets
	// Counting sort of the part's hashes by bucket.
	start := b.start[:nb+1]
	clear(start)
	for _, x := range xs {
		_, rest := t.split(x)
		start[pt.bucket(rest)+1]++
	}
	maxSize := uint32(0)
	for i := uint64(1); i <= nb; i++ {
		maxSize = max(maxSize, start[i])
		start[i] += start[i-1]
	}
	if maxSize > uint32(len(b.slotsB)) {
		return fmt.Errorf("mph: a bucket of %d keys (seed %d)", maxSize, t.seed)
	}
	tmp := b.tmp[:len(xs)]
	if is == nil {
		for _, x := range xs {
			_, rest := t.split(x)
			bk := pt.bucket(rest)
			tmp[start[bk]] = x
			start[bk]++
		}
	} else {
		tmpI := b.tmpI[:len(is)]
		for k, x := range xs {
			_, rest := t.split(x)
			bk := pt.bucket(rest)
			tmp[start[bk]] = x
			tmpI[start[bk]] = is[k]
			start[bk]++
		}
		copy(is, tmpI)
	}
	// start[bk] is now the end of bucket bk: shift back.
	copy(start[1:], start[:nb])
	start[0] = 0
	copy(xs, tmp)
	// Duplicates meet in one bucket. Sort each bucket's keys (they are few)
	// so the construction cannot depend on input order, and spot duplicates.
	for bk := uint64(0); bk < nb; bk++ {
		ks := xs[start[bk]:start[bk+1]]
		for i := 1; i < len(ks); i++ {
			for j := i; j > 0 && ks[j] < ks[j-1]; j-- {
				ks[j], ks[j-1] = ks[j-1], ks[j]
				if is != nil {
					o := int(start[bk])
					is[o+j], is[o+j-1] = is[o+j-1], is[o+j]
				}
			}
		}
		for i := 1; i < len(ks); i++ {
			if ks[i] == ks[i-1] {
				return ErrDuplicateHash
			}
		}
	}
	// Order buckets by size, largest first, ties by bucket number.
	var bySize [66]uint32
	for bk := uint64(0); bk < nb; bk++ {
		bySize[maxSize-b.size(uint32(bk))+1]++
	}
	for i := 1; i < len(bySize); i++ {
		bySize[i] += bySize[i-1]
	}
	order := b.order[:nb]
	for bk := uint64(0); bk < nb; bk++ {
		k := maxSize - b.size(uint32(bk))
		order[bySize[k]] = uint32(bk)
		bySize[k]++
	}
	ns := pt.slots
	clear(b.owner[:ns])
	clear(b.taken[:(ns+63)/64])
	clear(b.osize[:ns])
	budget := 16*uint64(len(xs)) + 1<<12 // eviction steps before giving up on this seed
	for _, bk := range order {
		if b.size(bk) == 0 {
			break
		}
		if !b.place(bk, &budget) {
			return fmt.Errorf("mph: eviction did not converge (seed %d, part %d)", t.seed, p)
		}
		for len(b.heap) > 0 {
			e := b.pop()
			if !b.place(e, &budget) {
				return fmt.Errorf("mph: eviction did not converge (seed %d, part %d)", t.seed, p)
			}
		}
	}
	return nil
}

// markTaken sets the part's taken slots in the table-wide bitmap taken.
func (b *builder) markTaken(taken []uint64) {
	pt := b.pt
	w, acc := pt.slotStart/64, uint64(0)
	for s := uint64(0); s < pt.slots; s++ {
		g := pt.slotStart + s
		if g/64 != w {
			if acc != 0 {
				atomic.OrUint64(&taken[w], acc)
			}
			w, acc = g/64, 0
		}
		acc |= (b.taken[s/64] >> (s % 64) & 1) << (g % 64)
	}
	if acc != 0 {
		atomic.OrUint64(&taken[w], acc)
	}
}

func (b *builder) size(bk uint32) uint32 { return b.start[bk+1] - b.start[bk] }

// pairsOfPart overwrites the part's mixed hashes, no longer needed, with
// is[k]<<32 | the (global, not yet remapped) slot of the part's k-th key.
func (b *builder) pairsOfPart(is []uint32) {
	pt := b.pt
	for bk := uint64(0); bk < pt.buckets; bk++ {
		ph := b.t.ph[b.pilots[bk]]
		for k := b.start[bk]; k < b.start[bk+1]; k++ {
			b.xs[k] = uint64(is[k])<<32 | (pt.slotStart + slot(b.xs[k], ph, pt.slots))
		}
	}
}

// scatterSlots sets slots[i] to the remapped slot of each pair i<<32 | slot
// of pairs, a permutation of the indices. Stored straight from the pairs,
// in part order, each store would miss the cache; grouped first by the
// index's top bits (64 sequential streams), each group's stores fall in a
// range of slots that stays in the cache. At 10M keys: 1.9 s instead of
// 2.1 s for the build (medians of 6, alternating in one process), for 8
// bytes per key more, briefly.
func scatterSlots(pairs []uint64, remap []uint32, slots []uint32) {
	n := uint64(len(pairs))
	shift := max(0, bits.Len64(n)-scatterBits)
	groups := (n + 1<<shift - 1) >> shift
	pos := make([]uint64, groups) // group g holds the indices [g<<shift, (g+1)<<shift)
	for g := range pos {
		pos[g] = uint64(g) << shift
	}
	tmp := make([]uint64, n)
	for _, pr := range pairs {
		g := pr >> 32 >> shift
		tmp[pos[g]] = pr
		pos[g]++
	}
	for _, pr := range tmp {
		s := uint32(pr)
		if uint64(s) >= n {
			s = remap[uint64(s)-n]
		}
		slots[pr>>32] = s
	}
}

// scatterBits: scatterSlots makes at most 2^scatterBits groups.
const scatterBits = 6

func (b *builder) less(i, j uint32) bool { // heap order: bigger first, then lower bucket
	si, sj := b.size(i), b.size(j)
	return si > sj || si == sj && i < j
}

func (b *builder) push(bk uint32) {
	b.heap = append(b.heap, bk)
	i := len(b.heap) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !b.less(b.heap[i], b.heap[p]) {
			break
		}
		b.heap[i], b.heap[p] = b.heap[p], b.heap[i]
		i = p
	}
}

func (b *builder) pop() uint32 {
	h := b.heap
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	i := 0
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(h) && b.less(h[l], h[m]) {
			m = l
		}
		if r < len(h) && b.less(h[r], h[m]) {
			m = r
		}
		if m == i {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	b.heap = h
	return top
}

func (b *builder) isRecent(bk uint32) bool {
	for i := 0; i < b.nrec && i < len(b.recent); i++ {
		if b.recent[i] == bk {
			return true
		}
	}
	return false
}

// slotsOf fills b.slotsB with the slots of bucket bk under pilot p and
// reports whether they are distinct.
func (b *builder) slotsOf(ks []uint64, p byte) bool {
	ph, ns := b.t.ph[p], b.pt.slots
	for i, x := range ks {
		s := slot(x, ph, ns)
		for j := 0; j < i; j++ {
			if b.slotsB[j] == s {
				return false
			}
		}
		b.slotsB[i] = s
	}
	return true
}

// freeSlots is slotsOf that also gives up at the first taken slot: most
// pilots fail on their first key once the part fills up.
func (b *builder) freeSlots(ks []uint64, p byte) bool {
	ph, ns, taken := b.t.ph[p], b.pt.slots, b.taken
	for i, x := range ks {
		s := slot(x, ph, ns)
		if taken[s/64]&(1<<(s%64)) != 0 {
			return false
		}
		for j := 0; j < i; j++ {
			if b.slotsB[j] == s {
				return false
			}
		}
		b.slotsB[i] = s
	}
	return true
}

// firstFree finds the first pilot from off on (wrapping) under which the
// keys ks land on distinct free slots, leaving their slots in b.slotsB. It
// tests the first key (and the second and third, if any) under 8 pilots at
// a time without branches: whether a slot is free is a coin toss the
// branch predictor loses, and most pilots fail on the first keys once the
// part fills up. Testing the first two keys instead of one, and three for
// buckets of three or more, took the 10M-key build from 1.94 to 1.77 s
// (medians of 6, alternating in one process).
func (b *builder) firstFree(ks []uint64, off byte) (byte, bool) {
	ph, ns, taken := &b.t.ph, b.pt.slots, b.taken
	x0 := ks[0]
	if len(ks) == 1 {
		for d0 := 0; d0 < pilotCount; d0 += 8 {
			var free uint32
			for i := 0; i < 8; i++ {
				s := slot(x0, ph[byte(d0+i)+off], ns)
				free |= uint32(^taken[s/64]>>(s%64)&1) << i
			}
			if free != 0 {
				p := byte(d0+bits.TrailingZeros32(free)) + off
				b.slotsB[0] = slot(x0, ph[p], ns)
				return p, true
			}
		}
		return 0, false
	}
	x1 := ks[1]
	if len(ks) >= 3 {
		x2 := ks[2]
		for d0 := 0; d0 < pilotCount; d0 += 8 {
			var free uint32
			for i := 0; i < 8; i++ {
				h := ph[byte(d0+i)+off]
				s0, s1, s2 := slot(x0, h, ns), slot(x1, h, ns), slot(x2, h, ns)
				f := (^taken[s0/64] >> (s0 % 64)) & (^taken[s1/64] >> (s1 % 64)) & (^taken[s2/64] >> (s2 % 64))
				d01, d02, d12 := s0^s1, s0^s2, s1^s2 // 0: one slot for two keys
				f &= (d01 | -d01) >> 63 & ((d02 | -d02) >> 63) & ((d12 | -d12) >> 63)
				free |= uint32(f&1) << i
			}
			for free != 0 {
				p := byte(d0+bits.TrailingZeros32(free)) + off
				free &= free - 1
				if b.freeSlots(ks, p) {
					return p, true
				}
			}
		}
		return 0, false
	}
	for d0 := 0; d0 < pilotCount; d0 += 8 {
		var free uint32
		for i := 0; i < 8; i++ {
			h := ph[byte(d0+i)+off]
			s0, s1 := slot(x0, h, ns), slot(x1, h, ns)
			f := (^taken[s0/64] >> (s0 % 64)) & (^taken[s1/64] >> (s1 % 64))
			d := s0 ^ s1 // 0: one slot for both keys
			f &= (d | -d) >> 63
			free |= uint32(f&1) << i
		}
		for free != 0 {
			p := byte(d0+bits.TrailingZeros32(free)) + off
			free &= free - 1
			if b.freeSlots(ks, p) {
				return p, true
			}
		}
	}
	return 0, false
}

// place finds bucket bk a pilot, evicting other buckets if it must.
func (b *builder) place(bk uint32, budget *uint64) bool {
	ks := b.xs[b.start[bk]:b.start[bk+1]]
	// First pass: a pilot whose slots are all free. Start at a pseudo-random
	// pilot so that a bucket placed again does not retake the same one.
	b.rng ^= b.rng << 13
	b.rng ^= b.rng >> 7
	b.rng ^= b.rng << 17
	off := byte(b.rng)
	if b.nrec == 0 {
		off = 0
	}
	if p, ok := b.firstFree(ks, off); ok {
		b.assign(bk, ks, p)
		return true
	}
	// Second pass: the pilot with the cheapest collisions.
	if *budget == 0 {
		return false
	}
	*budget--
	best, bestCost := -1, uint64(math.MaxUint64)
	for d := 0; d < pilotCount; d++ {
		p := byte(d) + off
		if !b.slotsOf(ks, p) {
			continue
		}
		cost := uint64(0)
		for i := range ks {
			s := b.slotsB[i]
			if b.taken[s/64]&(1<<(s%64)) == 0 {
				continue
			}
			sz := uint64(b.osize[s])
			cost += sz * sz
			if cost >= bestCost {
				break
			}
			if b.isRecent(b.owner[s] - 1) {
				cost = math.MaxUint64
				break
			}
		}
		if cost < bestCost {
			best, bestCost = int(p), cost
		}
	}
	if best < 0 {
		return false // every pilot puts two keys of the bucket on one slot
	}
	p := byte(best)
	b.slotsOf(ks, p)
	for i := range ks {
		o := b.owner[b.slotsB[i]]
		if o == 0 {
			continue
		}
		b.evict(o - 1)
		b.push(o - 1)
	}
	b.assign(bk, ks, p)
	return true
}

func (b *builder) assign(bk uint32, ks []uint64, p byte) {
	b.pilots[bk] = p
	sz := uint8(min(len(ks), 255))
	for i := range ks {
		s := b.slotsB[i]
		b.owner[s] = bk + 1
		b.osize[s] = sz
		b.taken[s/64] |= 1 << (s % 64)
	}
	b.recent[b.nrec%len(b.recent)] = bk
	b.nrec++
}

func (b *builder) evict(bk uint32) {
	ph, ns := b.t.ph[b.pilots[bk]], b.pt.slots
	for _, x := range b.xs[b.start[bk]:b.start[bk+1]] {
		s := slot(x, ph, ns)
		if b.owner[s] == bk+1 {
			b.owner[s] = 0
			b.taken[s/64] &^= 1 << (s % 64)
		}
	}
}

// AppendBinary appends the table's encoding (see the package comment) to dst.
func (t *Table) AppendBinary(dst []byte) []byte {
	var h [headerLen]byte
	copy(h[0:], magic)
	binary.LittleEndian.PutUint32(h[4:], version)
	binary.LittleEndian.PutUint64(h[8:], t.n)
	binary.LittleEndian.PutUint64(h[16:], t.slots)
	binary.LittleEndian.PutUint64(h[24:], t.buckets)
	binary.LittleEndian.PutUint64(h[32:], t.seed)
	binary.LittleEndian.PutUint64(h[40:], t.nparts)
	dst = append(dst, h[:]...)
	for i := range t.parts {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(t.parts[i].slots))
		dst = binary.LittleEndian.AppendUint32(dst, uint32(t.parts[i].buckets))
	}
	dst = append(dst, t.pilots...)
	for _, r := range t.remap {
		dst = binary.LittleEndian.AppendUint32(dst, r)
	}
	return dst
}

// EncodedLen is the length of the table's encoding.
func (t *Table) EncodedLen() int {
	return headerLen + 8*len(t.parts) + len(t.pilots) + 4*len(t.remap)
}

// Decode decodes a table encoded by AppendBinary, which must be all of b.
// The table does not alias b. A malformed encoding is an error wrapping
// engines.ErrCorrupt.
func Decode(b []byte) (*Table, error) { return decode(b, false) }

// DecodeShared is Decode for a table that keeps b's pilot bytes (the bulk
// of the encoding: 8/λ bits per key) instead of copying them, so the caller
// chooses their memory (engines/bulk puts them in huge pages). b must not
// change, nor be freed, while the table is in use.
func DecodeShared(b []byte) (*Table, error) { return decode(b, true) }

func decode(b []byte, shared bool) (*Table, error) {
	if len(b) < headerLen {
		return nil, fmt.Errorf("mph: %d bytes, shorter than the header: %w", len(b), engines.ErrCorrupt)
	}
	if string(b[:4]) != magic {
		return nil, fmt.Errorf("mph: bad magic %q: %w", b[:4], engines.ErrCorrupt)
	}
	if v := binary.LittleEndian.Uint32(b[4:]); v != version {
		return nil, fmt.Errorf("mph: encoding version %d, this build reads %d: %w", v, version, engines.ErrCorrupt)
	}
	t := &Table{
		n:       binary.LittleEndian.Uint64(b[8:]),
		slots:   binary.LittleEndian.Uint64(b[16:]),
		buckets: binary.LittleEndian.Uint64(b[24:]),
		seed:    binary.LittleEndian.Uint64(b[32:]),
		nparts:  binary.LittleEndian.Uint64(b[40:]),
	}
	rest := uint64(len(b) - headerLen)
	switch {
	case t.n >= math.MaxUint32:
		return nil, fmt.Errorf("mph: %d keys: %w", t.n, engines.ErrCorrupt)
	case t.n == 0 && (t.slots != 0 || t.buckets != 0 || t.nparts != 0):
		return nil, fmt.Errorf("mph: empty table with %d slots, %d buckets, %d parts: %w", t.slots, t.buckets, t.nparts, engines.ErrCorrupt)
	case t.n > 0 && t.nparts != partsFor(t.n):
		return nil, fmt.Errorf("mph: %d parts for %d keys, want %d: %w", t.nparts, t.n, partsFor(t.n), engines.ErrCorrupt)
	case t.n > 0 && (t.slots < t.n || t.slots > 2*t.n+t.nparts || t.buckets < t.nparts || t.buckets > t.n+t.nparts):
		return nil, fmt.Errorf("mph: %d keys, %d slots, %d buckets: %w", t.n, t.slots, t.buckets, engines.ErrCorrupt)
	case rest != 8*t.nparts+t.buckets+4*(t.slots-t.n):
		return nil, fmt.Errorf("mph: %d bytes after the header, want %d: %w", rest, 8*t.nparts+t.buckets+4*(t.slots-t.n), engines.ErrCorrupt)
	}
	b = b[headerLen:]
	t.parts = make([]part, t.nparts)
	var slots, buckets uint64
	for i := range t.parts {
		pt := &t.parts[i]
		s := uint64(binary.LittleEndian.Uint32(b[8*i:]))
		bk := uint64(binary.LittleEndian.Uint32(b[8*i+4:]))
		if s == 0 || bk == 0 {
			return nil, fmt.Errorf("mph: part %d of %d slots, %d buckets: %w", i, s, bk, engines.ErrCorrupt)
		}
		pt.slotStart, pt.slots, pt.bucketStart = slots, s, buckets
		pt.setBuckets(bk)
		slots += s
		buckets += bk
	}
	if slots != t.slots || buckets != t.buckets {
		return nil, fmt.Errorf("mph: parts of %d slots and %d buckets in a table of %d and %d: %w", slots, buckets, t.slots, t.buckets, engines.ErrCorrupt)
	}
	b = b[8*t.nparts:]
	if shared {
		t.pilots = b[:t.buckets:t.buckets]
	} else {
		t.pilots = append([]byte(nil), b[:t.buckets]...)
	}
	b = b[t.buckets:]
	t.remap = make([]uint32, t.slots-t.n)
	for i := range t.remap {
		r := binary.LittleEndian.Uint32(b[4*i:])
		if uint64(r) >= t.n {
			return nil, fmt.Errorf("mph: remap entry %d is %d, want < %d: %w", i, r, t.n, engines.ErrCorrupt)
		}
		t.remap[i] = r
	}
	t.initPilotHashes()
	return t, nil
}
