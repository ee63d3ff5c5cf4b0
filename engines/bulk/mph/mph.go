package mph

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"

	"github.com/tabuladb/tabula/engines"
)

// Encoding constants: on-disk, never change or reuse.
const (
	magic      = "MPH1"
	version    = 1
	headerLen  = 40
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
	}
	return nil
}

// Table is a minimal perfect hash over a set of n hashes. It is immutable
// and safe for concurrent use.
type Table struct {
	n, slots, buckets uint64
	seed              uint64
	m1, m2, b1        uint64 // skewed bucket function, from buckets
	pilots            []byte
	remap             []uint32
	ph                [pilotCount]uint64
}

// Len is the number of keys n; Lookup returns slots in [0, n).
func (t *Table) Len() int { return int(t.n) }

// Seed is the seed the table was built with.
func (t *Table) Seed() uint64 { return t.seed }

// MemoryBytes is the memory the table holds: pilots, remap and the pilot
// hash table.
func (t *Table) MemoryBytes() int {
	return len(t.pilots) + 4*len(t.remap) + 8*pilotCount + 64
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

// skewT is the split of the bucket function: hashes below it (60% of keys)
// go to the first 30% of buckets.
const skewT = (1 << 64 / 5) * 3

func (t *Table) initBuckets() {
	t.b1 = (t.buckets*3 + 9) / 10
	if t.buckets >= 2 && t.b1 >= t.buckets {
		t.b1 = t.buckets - 1
	}
	t.m1 = t.b1 * 5 / 3
	t.m2 = (t.buckets - t.b1) * 5 / 2
}

// bucket maps a mixed hash to its bucket: PTHash's skew, which makes the
// first buckets big (placed first, while most slots are free) and the rest
// small (placed last, when a small bucket still finds free slots).
func (t *Table) bucket(x uint64) uint64 {
	if x < skewT {
		return reduce(x, t.m1)
	}
	return min(t.b1+reduce(x-skewT, t.m2), t.buckets-1)
}

func (t *Table) slot(x uint64, p byte) uint64 {
	return reduce((x^t.ph[p])*mulC, t.slots)
}

// Lookup returns the slot of h, in [0, n) when n > 0. For a hash that was
// not in the build set it returns an arbitrary slot in [0, n). With n == 0
// it returns 0.
func (t *Table) Lookup(h uint64) uint64 {
	if t.n == 0 {
		return 0
	}
	x := t.mix(h)
	s := t.slot(x, t.pilots[t.bucket(x)])
	if s >= t.n {
		s = uint64(t.remap[s-t.n])
	}
	return s
}

// Build returns a minimal perfect hash over hashes, which must be distinct
// (else ErrDuplicateHash). hashes is not modified. The result depends only on
// the set of hashes and opts.
func Build(hashes []uint64, opts Options) (*Table, error) {
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
		t, err := buildSeed(hashes, opts, opts.Seed+uint64(i))
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

// builder is the state of one construction attempt.
type builder struct {
	t      *Table
	xs     []uint64 // mixed hashes grouped by bucket
	start  []uint32 // bucket b's keys are xs[start[b]:start[b+1]]
	owner  []uint32 // slot -> bucket+1, 0 free
	taken  []uint64 // bitmap of owner != 0: the hot check stays in cache
	osize  []uint8  // slot -> size of its owner bucket (saturated)
	heap   []uint32 // evicted buckets, max-heap by (size, -bucket)
	recent [16]uint32
	nrec   int
	rng    uint64
	slotsB [64]uint64 // scratch: slots of the bucket being placed
}

func buildSeed(hashes []uint64, opts Options, seed uint64) (*Table, error) {
	n := uint64(len(hashes))
	t := &Table{n: n, seed: seed}
	t.initPilotHashes()
	if n == 0 {
		t.slots, t.buckets = 0, 0
		return t, nil
	}
	t.slots = uint64(math.Ceil(float64(n) / opts.Alpha))
	if t.slots < n {
		t.slots = n
	}
	t.buckets = uint64(math.Ceil(float64(n) / opts.Lambda))
	t.pilots = make([]byte, t.buckets)
	t.initBuckets()

	b := &builder{t: t, rng: seed ^ 0x2545f4914f6cdd1d}
	// Counting sort of the mixed hashes by bucket.
	counts := make([]uint32, t.buckets+1)
	for _, h := range hashes {
		counts[t.bucket(t.mix(h))+1]++
	}
	maxSize := uint32(0)
	for i := uint64(1); i <= t.buckets; i++ {
		maxSize = max(maxSize, counts[i])
		counts[i] += counts[i-1]
	}
	if maxSize > uint32(len(b.slotsB)) {
		return nil, fmt.Errorf("mph: a bucket of %d keys (seed %d)", maxSize, seed)
	}
	b.start = counts
	b.xs = make([]uint64, n)
	fill := make([]uint32, t.buckets)
	copy(fill, counts[:t.buckets])
	for _, h := range hashes {
		x := t.mix(h)
		bk := t.bucket(x)
		b.xs[fill[bk]] = x
		fill[bk]++
	}
	// Duplicates meet in one bucket. Sort each bucket's keys (they are few)
	// so the construction cannot depend on input order, and spot duplicates.
	for bk := uint64(0); bk < t.buckets; bk++ {
		ks := b.xs[b.start[bk]:b.start[bk+1]]
		for i := 1; i < len(ks); i++ {
			for j := i; j > 0 && ks[j] < ks[j-1]; j-- {
				ks[j], ks[j-1] = ks[j-1], ks[j]
			}
		}
		for i := 1; i < len(ks); i++ {
			if ks[i] == ks[i-1] {
				return nil, ErrDuplicateHash
			}
		}
	}
	// Order buckets by size, largest first, ties by bucket number.
	bySize := make([]uint32, maxSize+2)
	for bk := uint64(0); bk < t.buckets; bk++ {
		bySize[maxSize-b.size(uint32(bk))+1]++
	}
	for i := 1; i < len(bySize); i++ {
		bySize[i] += bySize[i-1]
	}
	order := make([]uint32, t.buckets)
	for bk := uint64(0); bk < t.buckets; bk++ {
		k := maxSize - b.size(uint32(bk))
		order[bySize[k]] = uint32(bk)
		bySize[k]++
	}
	fill = nil
	b.owner = make([]uint32, t.slots)
	b.taken = make([]uint64, (t.slots+63)/64)
	b.osize = make([]uint8, t.slots)
	budget := 16*n + 1<<12 // eviction steps before giving up on this seed
	for _, bk := range order {
		if b.size(bk) == 0 {
			break
		}
		if !b.place(bk, &budget) {
			return nil, fmt.Errorf("mph: eviction did not converge (seed %d)", seed)
		}
		for len(b.heap) > 0 {
			e := b.pop()
			if !b.place(e, &budget) {
				return nil, fmt.Errorf("mph: eviction did not converge (seed %d)", seed)
			}
		}
	}
	// Remap taken slots >= n onto the free slots below n, in order.
	t.remap = make([]uint32, t.slots-n)
	free := uint64(0)
	for s := n; s < t.slots; s++ {
		if b.owner[s] == 0 {
			continue
		}
		for b.owner[free] != 0 {
			free++
		}
		t.remap[s-n] = uint32(free)
		free++
	}
	return t, nil
}

func (b *builder) size(bk uint32) uint32 { return b.start[bk+1] - b.start[bk] }

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
	for i, x := range ks {
		s := b.t.slot(x, p)
		for j := 0; j < i; j++ {
			if b.slotsB[j] == s {
				return false
			}
		}
		b.slotsB[i] = s
	}
	return true
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
	for d := 0; d < pilotCount; d++ {
		p := byte(d) + off
		if !b.slotsOf(ks, p) {
			continue
		}
		free := true
		for i := range ks {
			s := b.slotsB[i]
			if b.taken[s/64]&(1<<(s%64)) != 0 {
				free = false
				break
			}
		}
		if free {
			b.assign(bk, ks, p)
			return true
		}
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
	b.t.pilots[bk] = p
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
	p := b.t.pilots[bk]
	for _, x := range b.xs[b.start[bk]:b.start[bk+1]] {
		s := b.t.slot(x, p)
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
	dst = append(dst, h[:]...)
	dst = append(dst, t.pilots...)
	for _, r := range t.remap {
		dst = binary.LittleEndian.AppendUint32(dst, r)
	}
	return dst
}

// EncodedLen is the length of the table's encoding.
func (t *Table) EncodedLen() int { return headerLen + len(t.pilots) + 4*len(t.remap) }

// Decode decodes a table encoded by AppendBinary, which must be all of b.
// The table does not alias b. A malformed encoding is an error wrapping
// engines.ErrCorrupt.
func Decode(b []byte) (*Table, error) {
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
	}
	rest := uint64(len(b) - headerLen)
	switch {
	case t.n >= math.MaxUint32:
		return nil, fmt.Errorf("mph: %d keys: %w", t.n, engines.ErrCorrupt)
	case t.n == 0 && (t.slots != 0 || t.buckets != 0):
		return nil, fmt.Errorf("mph: empty table with %d slots, %d buckets: %w", t.slots, t.buckets, engines.ErrCorrupt)
	case t.n > 0 && (t.buckets == 0 || t.slots < t.n || t.slots > 2*t.n+1 || t.buckets > t.n):
		return nil, fmt.Errorf("mph: %d keys, %d slots, %d buckets: %w", t.n, t.slots, t.buckets, engines.ErrCorrupt)
	case rest != t.buckets+4*(t.slots-t.n):
		return nil, fmt.Errorf("mph: %d bytes after the header, want %d: %w", rest, t.buckets+4*(t.slots-t.n), engines.ErrCorrupt)
	}
	b = b[headerLen:]
	t.pilots = append([]byte(nil), b[:t.buckets]...)
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
	t.initBuckets()
	return t, nil
}
