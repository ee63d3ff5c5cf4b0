package lhash

import (
	"fmt"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
)

const (
	// MaxLocation is the largest location an entry can hold (2^48-1): 256 TiB
	// of byte offsets, or 2^48 slots.
	MaxLocation = 1<<locBits - 1

	locBits = 48
	locMask = MaxLocation
	tagMask = ^uint64(locMask)
	seqMask = 1<<32 - 1

	slots       = 7 // entry words per bucket; word 0 is the control word
	bucketWords = 8 // 64 bytes, one cache line

	// A primary segment is 4096 buckets (256 KiB): allocating and zeroing
	// one costs ~30 µs, well inside the 1 ms worst-operation budget, and the
	// directory stays tiny (4M keys need ~180 segment pointers).
	segShift   = 12
	segBuckets = 1 << segShift
	// Overflow segments are smaller (1024 buckets, 64 KiB): only ~25% of
	// buckets have an overflow bucket.
	ovSegShift   = 10
	ovSegBuckets = 1 << ovSegShift

	// minLevel keeps at least 2^6 = 64 primary buckets: below that a merge
	// saves nothing worth a step.
	minLevel   = 6
	minBuckets = 1 << minLevel

	// A split happens when Len > 0.80 * 7 * buckets (64-byte buckets of 7
	// slots at 0.8 full: 11.4 bytes per entry, plus ~3 in overflow); a merge when
	// Len < 0.50 * 7 * buckets. The gap keeps a workload that inserts and
	// deletes at the boundary from splitting and merging the same bucket.
	splitNum, splitDen = 4, 5
	mergeNum, mergeDen = 1, 2

	stateLevelShift = 56
	stateNextMask   = 1<<stateLevelShift - 1
)

// bucket is one cache line: control word and 7 entry words.
type bucket [bucketWords]uint64

type segment [segBuckets]bucket

type ovSegment [ovSegBuckets]bucket

// Hasher returns the 64-bit hash of the key stored at loc. The index calls it
// only while splitting, for entries it holds under a bucket lock (so loc is
// live), and never concurrently with itself.
type Hasher func(loc uint64) uint64

// Index is a linear-hashing table from 64-bit hashes to 48-bit locations. It
// is safe for concurrent use; see the package comment for the protocol.
type Index struct {
	// state is level<<56 | next: the table has 2^level + next buckets.
	state atomic.Uint64
	// dir holds the primary segments; replaced (copied) only when a segment
	// is added or dropped. A dropped segment is never put back.
	dir atomic.Pointer[[]*segment]
	// ovDir holds the overflow segments; it only grows.
	ovDir atomic.Pointer[[]*ovSegment]
	_     [40]byte // keep count off the read-mostly words above
	count atomic.Int64
	_     [56]byte

	hash Hasher

	// resizeMu serialises splits and merges; writers TryLock it.
	resizeMu sync.Mutex
	// scratch holds a chain's entries during a split or merge; guarded by resizeMu.
	scratch []uint64

	// ovMu guards the overflow allocator below.
	ovMu sync.Mutex
	// ovBits has a set bit per overflow id in use (id 0 is always set: it
	// means "none"); ovSegUsed counts them per segment; ovHint is a lower
	// bound on the first segment with a free id; ovUsed counts overflow
	// buckets in chains. All guarded by ovMu.
	ovBits    []uint64
	ovSegUsed []int
	ovHint    int
	ovUsed    int
}

// New returns an empty index. hash must return the hash a key at a location
// was inserted with; splits need it because the index keeps only 16 bits of
// it. New panics if hash is nil.
func New(hash Hasher) *Index {
	if hash == nil {
		panic("lhash: New with a nil Hasher")
	}
	ix := &Index{hash: hash}
	dir := []*segment{new(segment)}
	ix.dir.Store(&dir)
	ovDir := []*ovSegment{}
	ix.ovDir.Store(&ovDir)
	ix.state.Store(minLevel << stateLevelShift)
	return ix
}

// Grow sizes an empty index for n entries, so that inserting them does no
// split (recovery knows how many entries it will load). It must be called
// before the index is shared; it returns an error if the index is not empty.
func (ix *Index) Grow(n int) error {
	if ix.count.Load() != 0 {
		return fmt.Errorf("lhash: Grow on an index of %d entries", ix.count.Load())
	}
	// The bucket count at which n entries sit just below the split load.
	nb := uint64(n)*splitDen/(slots*splitNum) + 1
	if nb <= minBuckets {
		return nil
	}
	level := uint64(bits.Len64(nb) - 1)
	next := nb - 1<<level
	segs := (nb-1)>>segShift + 1
	dir := make([]*segment, segs)
	for i := range dir {
		dir[i] = new(segment)
	}
	ix.dir.Store(&dir)
	ix.state.Store(level<<stateLevelShift | next)
	return nil
}

// BucketBits is the number of low hash bits that pick an entry's primary
// bucket (one more for the buckets already split this round): inserting
// entries in the order of hash&(1<<BucketBits()-1) walks the table
// sequentially, which is how a bulk load after Grow avoids a cache miss per
// entry.
func (ix *Index) BucketBits() int { return int(ix.state.Load() >> stateLevelShift) }

// tagOf is the entry's tag for hash h, already shifted into place: hash bits
// 32..47, with 0 mapped to 1 so that no entry word is zero.
func tagOf(h uint64) uint64 {
	t := (h >> 32) & 0xFFFF
	if t == 0 {
		t = 1
	}
	return t << locBits
}

// addr is the bucket that owns h in state st.
func addr(h, st uint64) uint64 {
	level := st >> stateLevelShift
	next := st & stateNextMask
	m := uint64(1)<<level - 1
	b := h & m
	if b < next {
		b = h & (m<<1 | 1)
	}
	return b
}

// numBuckets is the bucket count of state st.
func numBuckets(st uint64) uint64 {
	return 1<<(st>>stateLevelShift) + st&stateNextMask
}

// bucketAt returns primary bucket b, or nil if its segment is not (or no
// longer) in the directory.
func (ix *Index) bucketAt(b uint64) *bucket {
	d := *ix.dir.Load()
	si := b >> segShift
	if si >= uint64(len(d)) {
		return nil
	}
	return &d[si][b&(segBuckets-1)]
}

// ovBucket returns overflow bucket id, or nil if id is out of range (only a
// stale reader can see that; it then retries).
func (ix *Index) ovBucket(id uint64) *bucket {
	d := *ix.ovDir.Load()
	si := id >> ovSegShift
	if si >= uint64(len(d)) {
		return nil
	}
	return &d[si][id&(ovSegBuckets-1)]
}

// backoff yields after a few failed attempts: on 2 cores a spinning reader
// can otherwise hold off the writer it waits for.
func backoff(spins int) {
	if spins > 4 {
		runtime.Gosched()
	}
}

// Lookup returns the location of the entry for hash whose location match
// accepts. match runs without locks and may see stale locations (see the
// package comment); the result is returned only from a consistent read.
func (ix *Index) Lookup(hash uint64, match func(loc uint64) bool) (loc uint64, ok bool) {
	tag := tagOf(hash)
	for spins := 0; ; spins++ {
		backoff(spins)
		st := ix.state.Load()
		b := addr(hash, st)
		bk := ix.bucketAt(b)
		if bk == nil {
			continue
		}
		v1 := atomic.LoadUint64(&bk[0])
		if v1&1 != 0 {
			continue
		}
		loc, ok, consistent := ix.scan(bk, v1, tag, match)
		if !consistent {
			continue
		}
		// The order matters: state and directory are checked while the
		// bucket is known unchanged (between v1 and the final load), so at
		// that instant bucket b of the live segment owned hash and held
		// what we read.
		if st2 := ix.state.Load(); st2 != st && addr(hash, st2) != b {
			continue
		}
		if ix.bucketAt(b) != bk {
			continue
		}
		if atomic.LoadUint64(&bk[0]) != v1 {
			continue
		}
		return loc, ok
	}
}

// scan looks for tag in the chain of primary bucket bk, read at version v1.
// consistent is false if the chain changed while it was being followed.
//
// It tests all seven tags of a bucket without a data-dependent branch, then
// walks the (almost always zero or one) hits, re-reading the word from the
// bucket, now in cache. A word changed since its tag test is caught by the
// caller's version check.
func (ix *Index) scan(bk *bucket, v1, tag uint64, match func(uint64) bool) (loc uint64, ok, consistent bool) {
	b := bk
	next := v1 >> 32
	for {
		for m := tagMatches(b, tag); m != 0; m &= m - 1 {
			if l := atomic.LoadUint64(&b[bits.TrailingZeros32(m)+1]) & locMask; match(l) {
				return l, true, true
			}
		}
		if next == 0 {
			return 0, false, true
		}
		// Before following the link, make sure the chain is still the one
		// read at v1: a freed overflow bucket may already belong to another
		// chain, and following it blindly could loop.
		if atomic.LoadUint64(&bk[0]) != v1 {
			return 0, false, false
		}
		if b = ix.ovBucket(next); b == nil {
			return 0, false, false
		}
		next = atomic.LoadUint64(&b[0]) >> 32
	}
}

// fullMask has a bit per slot: a bucket whose used mask equals it is full.
const fullMask = 1<<slots - 1

// tagMatches has bit i set when slot i+1 of b carries tag. Empty words
// never match: tags are non-zero.
func tagMatches(b *bucket, tag uint64) uint32 {
	var m uint32
	for i := range slots {
		d := (atomic.LoadUint64(&b[i+1]) ^ tag) & tagMask
		m |= uint32((d|-d)>>63^1) << i
	}
	return m
}

// used has bit i set when slot i+1 of b holds an entry.
func used(b *bucket) uint32 {
	var m uint32
	for i := range slots {
		w := atomic.LoadUint64(&b[i+1])
		m |= uint32((w|-w)>>63) << i
	}
	return m
}

// lockFor locks the bucket that owns hash and returns it.
func (ix *Index) lockFor(hash uint64) *bucket {
	for spins := 0; ; spins++ {
		backoff(spins)
		st := ix.state.Load()
		b := addr(hash, st)
		bk := ix.bucketAt(b)
		if bk == nil {
			continue
		}
		w := atomic.LoadUint64(&bk[0])
		if w&1 != 0 || !atomic.CompareAndSwapUint64(&bk[0], w, w+1) {
			continue
		}
		// Holding b's lock, no split or merge can move b's hashes, so a
		// state and directory read now are the truth for b.
		if addr(hash, ix.state.Load()) != b || ix.bucketAt(b) != bk {
			unlock(bk)
			continue
		}
		return bk
	}
}

// lock spins until it holds bk. Only the resizer uses it, and only for
// buckets the current state owns.
func lock(bk *bucket) {
	for spins := 0; ; spins++ {
		w := atomic.LoadUint64(&bk[0])
		if w&1 == 0 && atomic.CompareAndSwapUint64(&bk[0], w, w+1) {
			return
		}
		backoff(spins)
	}
}

// unlock releases bk, advancing its seq (mod 2^32, without touching the
// overflow id).
func unlock(bk *bucket) {
	w := atomic.LoadUint64(&bk[0])
	atomic.StoreUint64(&bk[0], w&^seqMask|uint64(uint32(w)+1))
}

// setNext sets b's overflow link to id, keeping its seq half.
func setNext(b *bucket, id uint64) {
	w := atomic.LoadUint64(&b[0])
	atomic.StoreUint64(&b[0], w&seqMask|id<<32)
}

// Upsert points hash's entry accepted by match at loc, or inserts one. It
// returns the location it replaced. match runs under the bucket lock.
// Upsert panics if loc > MaxLocation.
func (ix *Index) Upsert(hash, loc uint64, match func(loc uint64) bool) (old uint64, replaced bool) {
	if loc > MaxLocation {
		panic(fmt.Sprintf("lhash: location %#x exceeds 48 bits", loc))
	}
	tag := tagOf(hash)
	nw := tag | loc
	bk := ix.lockFor(hash)
	b := bk
	for {
		for m := tagMatches(b, tag); m != 0; m &= m - 1 {
			i := bits.TrailingZeros32(m) + 1
			if l := atomic.LoadUint64(&b[i]) & locMask; match(l) {
				atomic.StoreUint64(&b[i], nw)
				unlock(bk)
				return l, true
			}
		}
		// Entries are packed, so a bucket with room ends the chain.
		if u := used(b); u != fullMask {
			atomic.StoreUint64(&b[bits.TrailingZeros32(^u)+1], nw)
			unlock(bk)
			ix.added()
			return 0, false
		}
		next := atomic.LoadUint64(&b[0]) >> 32
		if next == 0 {
			id, nb := ix.allocOverflow()
			atomic.StoreUint64(&nb[1], nw)
			setNext(b, id)
			unlock(bk)
			ix.added()
			return 0, false
		}
		b = ix.ovBucket(next)
	}
}

// Delete removes hash's entry accepted by match and returns its location.
// match runs under the bucket lock.
func (ix *Index) Delete(hash uint64, match func(loc uint64) bool) (old uint64, ok bool) {
	tag := tagOf(hash)
	bk := ix.lockFor(hash)
	var (
		hit      *bucket
		hitSlot  int
		prev, b  *bucket = nil, bk
		bID      uint64  // overflow id of b; 0 while b is the primary
		lastSlot int
	)
	// Walk the whole chain: the hole is filled with the chain's last entry
	// to keep entries packed.
	for {
		if hit == nil {
			for m := tagMatches(b, tag); m != 0; m &= m - 1 {
				i := bits.TrailingZeros32(m) + 1
				if l := atomic.LoadUint64(&b[i]) & locMask; match(l) {
					hit, hitSlot, old = b, i, l
					break
				}
			}
		}
		u := used(b)
		lastSlot = bits.Len32(u)
		next := atomic.LoadUint64(&b[0]) >> 32
		if next == 0 || u != fullMask {
			break
		}
		prev, b, bID = b, ix.ovBucket(next), next
	}
	if hit == nil {
		unlock(bk)
		return 0, false
	}
	atomic.StoreUint64(&hit[hitSlot], atomic.LoadUint64(&b[lastSlot]))
	atomic.StoreUint64(&b[lastSlot], 0)
	if lastSlot == 1 && b != bk {
		setNext(prev, 0)
		ix.freeOverflow(bID)
	}
	unlock(bk)
	ix.removed()
	return old, true
}

// Len is the number of entries.
func (ix *Index) Len() int { return int(ix.count.Load()) }

// MemoryBytes is the memory the index holds: segments, overflow arena and
// directories.
func (ix *Index) MemoryBytes() uint64 {
	d := *ix.dir.Load()
	od := *ix.ovDir.Load()
	n := uint64(len(d))*(segBuckets*64+8) + uint64(len(od))*(ovSegBuckets*64+8)
	ix.ovMu.Lock()
	n += uint64(cap(ix.ovBits))*8 + uint64(cap(ix.ovSegUsed))*8
	ix.ovMu.Unlock()
	return n + 256 // the Index struct itself
}

// Buckets returns the number of primary buckets and of overflow buckets in
// use; for tests and metrics.
func (ix *Index) Buckets() (primary, overflow int) {
	ix.ovMu.Lock()
	overflow = ix.ovUsed
	ix.ovMu.Unlock()
	return int(numBuckets(ix.state.Load())), overflow
}

func (ix *Index) added() {
	n := uint64(ix.count.Add(1))
	if n*splitDen > numBuckets(ix.state.Load())*slots*splitNum {
		ix.resize()
	}
}

func (ix *Index) removed() {
	n := uint64(ix.count.Add(-1))
	nb := numBuckets(ix.state.Load())
	if nb > minBuckets && n*mergeDen < nb*slots*mergeNum {
		ix.resize()
	}
}

// resize does up to two split or merge steps if the load is out of bounds.
// Two, not one, so that two writers inserting at once (one of them losing
// the TryLock) cannot outrun it; bounded, so one writer never pays for many.
func (ix *Index) resize() {
	if !ix.resizeMu.TryLock() {
		return
	}
	defer ix.resizeMu.Unlock()
	for range 2 {
		n := uint64(ix.count.Load())
		st := ix.state.Load()
		nb := numBuckets(st)
		switch {
		case n*splitDen > nb*slots*splitNum:
			ix.splitLocked(st)
		case nb > minBuckets && n*mergeDen < nb*slots*mergeNum:
			ix.mergeLocked(st)
		default:
			return
		}
	}
}

// splitLocked splits bucket next into next and next+2^level. Caller holds resizeMu.
func (ix *Index) splitLocked(st uint64) {
	level := st >> stateLevelShift
	next := st & stateNextMask
	s, t := next, next+1<<level
	if t>>segShift >= uint64(len(*ix.dir.Load())) {
		d := *ix.dir.Load()
		nd := make([]*segment, len(d)+1)
		copy(nd, d)
		nd[len(d)] = new(segment)
		ix.dir.Store(&nd)
	}
	sb, tb := ix.bucketAt(s), ix.bucketAt(t)
	lock(sb)
	lock(tb)
	entries := ix.drainLocked(sb, ix.scratch[:0])
	ws, wt := chainWriter{ix: ix, cur: sb, i: 1}, chainWriter{ix: ix, cur: tb, i: 1}
	for _, w := range entries {
		if ix.hash(w&locMask)>>level&1 == 0 {
			ws.add(w)
		} else {
			wt.add(w)
		}
	}
	next++
	if next == 1<<level {
		level, next = level+1, 0
	}
	ix.state.Store(level<<stateLevelShift | next)
	unlock(tb)
	unlock(sb)
}

// mergeLocked merges the last bucket into its buddy. Caller holds resizeMu.
func (ix *Index) mergeLocked(st uint64) {
	level := st >> stateLevelShift
	next := st & stateNextMask
	if next == 0 {
		level--
		next = 1 << level
	}
	next--
	b, l := next, next+1<<level
	bb, lb := ix.bucketAt(b), ix.bucketAt(l)
	lock(bb)
	lock(lb)
	// Rebuild the buddy's chain too rather than append to it: re-allocated
	// overflow buckets take the lowest free ids, so after a shrink the high
	// overflow segments empty out and are dropped (47 bytes per entry left
	// after deleting 90% of 4M keys when chains kept their old ids, 21 now).
	entries := ix.drainLocked(bb, ix.scratch[:0])
	entries = ix.drainLocked(lb, entries)
	w := chainWriter{ix: ix, cur: bb, i: 1}
	for _, e := range entries {
		w.add(e)
	}
	ix.state.Store(level<<stateLevelShift | next)
	unlock(lb)
	unlock(bb)

	// Drop trailing segments no bucket uses, keeping one spare so that a
	// workload hovering at a segment boundary does not allocate and drop
	// 256 KiB over and over.
	need := (numBuckets(ix.state.Load()) + segBuckets - 1) >> segShift
	if d := *ix.dir.Load(); uint64(len(d)) > need+1 {
		nd := make([]*segment, need+1)
		copy(nd, d)
		ix.dir.Store(&nd)
	}
}

// drainLocked appends the entries of bk's chain to out (ix.scratch, reused),
// empties the chain and frees its overflow buckets. bk is locked; caller
// holds resizeMu.
func (ix *Index) drainLocked(bk *bucket, out []uint64) []uint64 {
	b, id := bk, uint64(0)
	for {
		for i := 1; i <= slots; i++ {
			w := atomic.LoadUint64(&b[i])
			if w == 0 {
				break
			}
			out = append(out, w)
			atomic.StoreUint64(&b[i], 0)
		}
		next := atomic.LoadUint64(&b[0]) >> 32
		if id != 0 {
			ix.freeOverflow(id)
		}
		if next == 0 {
			break
		}
		b, id = ix.ovBucket(next), next
	}
	setNext(bk, 0)
	ix.scratch = out
	return out
}

// chainWriter appends entries to a locked chain, adding overflow buckets as
// it fills.
type chainWriter struct {
	ix  *Index
	cur *bucket
	i   int
}

func (c *chainWriter) add(w uint64) {
	if c.i > slots {
		id, nb := c.ix.allocOverflow()
		setNext(c.cur, id)
		c.cur, c.i = nb, 1
	}
	atomic.StoreUint64(&c.cur[c.i], w)
	c.i++
}

// allocOverflow returns a zeroed overflow bucket and its id. It hands out
// the lowest free id, so that after a shrink the high segments empty out and
// can be dropped.
func (ix *Index) allocOverflow() (uint64, *bucket) {
	ix.ovMu.Lock()
	defer ix.ovMu.Unlock()
	for ix.ovHint < len(ix.ovSegUsed) && ix.ovSegUsed[ix.ovHint] == ovSegBuckets {
		ix.ovHint++
	}
	si := ix.ovHint
	if si == len(ix.ovSegUsed) {
		d := *ix.ovDir.Load()
		if uint64(len(d)+1)<<ovSegShift > 1<<32 {
			panic("lhash: 2^32 overflow buckets in use")
		}
		nd := make([]*ovSegment, len(d)+1)
		copy(nd, d)
		nd[len(d)] = new(ovSegment)
		ix.ovDir.Store(&nd)
		ix.ovSegUsed = append(ix.ovSegUsed, 0)
		ix.ovBits = append(ix.ovBits, make([]uint64, ovSegBuckets/64)...)
		if si == 0 {
			// id 0 means "no overflow": never hand it out.
			ix.ovBits[0] = 1
			ix.ovSegUsed[0] = 1
		}
	}
	words := ix.ovBits[si*ovSegBuckets/64 : (si+1)*ovSegBuckets/64]
	for wi, w := range words {
		if w == ^uint64(0) {
			continue
		}
		bit := bits.TrailingZeros64(^w)
		words[wi] |= 1 << bit
		ix.ovSegUsed[si]++
		ix.ovUsed++
		id := uint64(si)<<ovSegShift | uint64(wi*64+bit)
		return id, ix.ovBucket(id)
	}
	panic("lhash: overflow segment count and bitmap disagree")
}

// freeOverflow zeroes overflow bucket id and returns it to the allocator.
// Stale readers may still be reading it; they notice through the primary
// bucket's seq.
func (ix *Index) freeOverflow(id uint64) {
	b := ix.ovBucket(id)
	for i := range b {
		atomic.StoreUint64(&b[i], 0)
	}
	ix.ovMu.Lock()
	defer ix.ovMu.Unlock()
	si := int(id >> ovSegShift)
	ix.ovBits[id/64] &^= 1 << (id % 64)
	ix.ovSegUsed[si]--
	ix.ovUsed--
	ix.ovHint = min(ix.ovHint, si)
	// Drop the last segment while it and the one before are empty (one
	// empty segment stays as a spare). Segment 0 always holds id 0.
	for n := len(ix.ovSegUsed); n >= 2 && ix.ovSegUsed[n-1] == 0 && ix.ovSegUsed[n-2] == 0; n-- {
		d := *ix.ovDir.Load()
		nd := make([]*ovSegment, n-1)
		copy(nd, d)
		ix.ovDir.Store(&nd)
		ix.ovSegUsed = ix.ovSegUsed[:n-1]
		ix.ovBits = ix.ovBits[:(n-1)*ovSegBuckets/64]
	}
}
