package diskstore

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/tabuladb/tabula/engines"
)

// Batch reads: sorted and issued in parallel.
const (
	// batchGap: two records of one segment at most this far apart (end of
	// the first's guessed 4 KiB to the start of the next) are read with one
	// ReadAt. On an SSD a 64 KiB read costs about as much as a 4 KiB one
	// (both are one command; ~20 µs vs ~25 µs), so reading the gap is
	// cheaper than a second I/O.
	batchGap = 64 << 10
	// batchMaxRead bounds one coalesced read, so that a dense batch still
	// spreads over several parallel reads and no single buffer grows big.
	batchMaxRead = 256 << 10
	// batchParallel is how many reads of one batch are in flight at once:
	// enough to fill an NVMe queue's sweet spot without one batch taking
	// every goroutine.
	batchParallel = 8
	// recordGuess is how much of a record one read fetches before it knows
	// the record's length (as Read's first read).
	recordGuess = 4096
)

// batchItem is one location of a ReadBatch awaiting a disk read.
type batchItem struct {
	i   int // index into the caller's slices
	g   *segment
	off int64
}

// batchRun is one coalesced read: items[lo:hi] in [start, end) of one segment.
type batchRun struct {
	lo, hi     int
	start, end int64
}

// ReadBatch reads the record at each of locs as Read would, setting
// recs[i], found[i] and errs[i] for locs[i]: found is false where Read's ok
// would be (a freed location or a tombstone), errs[i] is what Read would
// have failed with (a corrupt record wraps engines.ErrCorrupt and is never
// returned). Records of mapped segments are copied from the mapping, their
// memory reads overlapped (see readBatchMapped); of the others, those in
// the cache are served from it and the rest are read in location order,
// neighbours in one segment coalesced into one read (gaps up to 64 KiB,
// reads up to 256 KiB), up to 8 reads at a time. Every record is checked
// against its CRC. The records' slices are the caller's: fresh memory that
// no one else holds (values of one batch may share an allocation). The
// caller verifies the keys: a location may be stale by the time it is
// read, as with Read. Safe for concurrent use.
func (s *Store) ReadBatch(locs []uint64, recs []engines.Record, found []bool, errs []error) {
	s.readBatch(locs, recs, found, errs, false)
}

// ReadBatchCold is ReadBatch for records that are likely on disk only
// (an owner reading ahead during recovery): none is read through a
// mapping — a page fault blocks its processor for the whole disk read, one
// fault at a time per processor — but with positioned reads, coalesced only
// where records overlap (no gap is read: it would come off the device too),
// coldParallel in flight.
func (s *Store) ReadBatchCold(locs []uint64, recs []engines.Record, found []bool, errs []error) {
	s.readBatch(locs, recs, found, errs, true)
}

// coldParallel is how many reads of a ReadBatchCold are in flight at once:
// a device queue's worth (each is a goroutine blocked in pread).
const coldParallel = 32

func (s *Store) readBatch(locs []uint64, recs []engines.Record, found []bool, errs []error, cold bool) {
	sc := batchScratchPool.Get().(*batchScratch)
	defer func() {
		clear(sc.items)
		clear(sc.spans)
		clear(sc.pins)
		batchScratchPool.Put(sc)
	}()
	items := sc.items[:0]
	for i, loc := range locs {
		recs[i], found[i], errs[i] = engines.Record{}, false, nil
		slot, gen, off := unpackLoc(loc)
		if g := s.segAt(slot, gen); g != nil {
			items = append(items, batchItem{i: i, g: g, off: off})
		}
	}
	sc.items = items
	if !cold {
		items = s.readBatchMapped(sc, items, recs, found, errs)
	}
	if len(items) == 0 {
		return
	}
	caching := s.cacheOn.Load()
	if caching {
		rest := items[:0]
		for _, it := range items {
			b, ok := s.cache.get(cacheKey(it.g.seq, it.off))
			if !ok {
				rest = append(rest, it)
				continue
			}
			r, err := s.cachedRecord(clone(b)) // the caller's to keep
			if err != nil {
				errs[it.i] = fmt.Errorf("read segment %d offset %d: %w", it.g.seq, it.off, err)
				continue
			}
			recs[it.i], found[it.i] = r, true
		}
		items = rest
	}
	if len(items) == 0 {
		return
	}
	slices.SortFunc(items, func(a, b batchItem) int {
		if a.g.seq != b.g.seq {
			if a.g.seq < b.g.seq {
				return -1
			}
			return 1
		}
		return int(a.off - b.off)
	})
	runs := make([]batchRun, 0, len(items))
	gap := int64(batchGap)
	if cold {
		gap = 0 // cold reads come off the device: read no more than asked
	}
	for j, it := range items {
		end := min(it.off+recordGuess, it.g.size.Load())
		if n := len(runs); n > 0 {
			r := &runs[n-1]
			if items[r.lo].g == it.g && it.off <= r.end+gap && max(end, r.end)-r.start <= batchMaxRead {
				r.hi, r.end = j+1, max(end, r.end)
				continue
			}
		}
		runs = append(runs, batchRun{lo: j, hi: j + 1, start: it.off, end: end})
	}
	workers := min(len(runs), batchParallel)
	if cold {
		workers = min(len(runs), coldParallel)
	}
	if workers == 1 {
		s.readRun(items, runs[0], recs, found, errs, caching, cold)
		return
	}
	// The caller is one of the workers; each takes the next run.
	var next atomic.Int64
	work := func() {
		for {
			k := int(next.Add(1) - 1)
			if k >= len(runs) {
				return
			}
			s.readRun(items, runs[k], recs, found, errs, caching, cold)
		}
	}
	var wg sync.WaitGroup
	for range workers - 1 {
		wg.Go(work)
	}
	work()
	wg.Wait()
}

// readRun does one coalesced read and decodes its records into the caller's
// slices (each run writes distinct indexes).
func (s *Store) readRun(items []batchItem, r batchRun, recs []engines.Record, found []bool, errs []error, caching, cold bool) {
	g := items[r.lo].g
	buf := make([]byte, r.end-r.start)
	if err := s.readAtVia(g, buf, r.start, !cold); err != nil {
		for _, it := range items[r.lo:r.hi] {
			if !g.dead.Load() { // freed under us: no record, as Read
				errs[it.i] = fmt.Errorf("read segment %d offset %d: %w", g.seq, it.off, err)
			}
		}
		return
	}
	for _, it := range items[r.lo:r.hi] {
		h, raw, key, value, err := s.finishRecord(g, it.off, buf[it.off-r.start:])
		if err == nil && h.kind == kindPut {
			value, err = s.decodeValue(h, value)
		}
		switch {
		case err != nil:
			if !g.dead.Load() {
				errs[it.i] = fmt.Errorf("read segment %d offset %d: %w", g.seq, it.off, err)
			}
		case h.kind == kindPut:
			recs[it.i] = engines.Record{Key: key, Value: value, ExpiresAt: h.aux}
			found[it.i] = true
			if caching {
				s.cache.set(cacheKey(g.seq, it.off), clone(raw))
			}
		}
	}
}

// batchScratch is one ReadBatch's working memory, pooled.
type batchScratch struct {
	items []batchItem
	spans []mappedSpan
	pins  []*segment // segments this batch pinned, each once
	sink  uint64     // what the touching loads read, kept so they stay
}

var batchScratchPool = sync.Pool{New: func() any { return new(batchScratch) }}

// mappedSpan is one record of a batch read from a mapping.
type mappedSpan struct {
	it batchItem
	m  []byte // the segment's mapping, pinned by the batch
	n  int64  // the record's length, -1 if its header was bad
}

// pinOnce returns g's mapping pinned for the rest of the batch, pinning it
// (and mapping it if never tried) the first time; nil if g is not mapped.
func (sc *batchScratch) pinOnce(s *Store, g *segment) []byte {
	for _, p := range sc.pins {
		if p == g {
			return *g.mapped.Load() // pinned: stays mapped
		}
	}
	m := s.pinMapped(g)
	if m != nil {
		sc.pins = append(sc.pins, g)
	}
	return m
}

// readBatchMapped reads the items whose segments are mapped and returns the
// others. A mapped read is a memory copy (a page fault if the page is not
// in the OS cache), so there is no system call to coalesce; what there is
// to overlap is the memory latency, the cache and TLB misses of records
// scattered over the mappings. So the records are read in passes of
// independent loads — the first byte of every record, then (headers
// parsed) one byte of each further cache line — which the processor
// keeps in flight together, and only then copied, each into one shared
// buffer and checked against its CRC. Records in the mappings are the
// OS's cache already: the read cache is not consulted or filled for them.
func (s *Store) readBatchMapped(sc *batchScratch, items []batchItem, recs []engines.Record, found []bool, errs []error) []batchItem {
	defer func() {
		for _, g := range sc.pins {
			g.unpin()
		}
		sc.pins = sc.pins[:0]
	}()
	spans := sc.spans[:0]
	rest := items[:0]
	var sink uint64
	for _, it := range items {
		var m []byte
		if it.g.full.Load() {
			m = sc.pinOnce(s, it.g)
		}
		if m == nil {
			rest = append(rest, it)
			continue
		}
		if it.off < int64(len(m)) {
			sink += uint64(m[it.off])
		}
		spans = append(spans, mappedSpan{it: it, m: m})
	}
	total := 0
	for j := range spans {
		sp := &spans[j]
		h, err := mappedRecordLen(sp.m, sp.it.off)
		if err != nil {
			sp.n = -1
			errs[sp.it.i] = fmt.Errorf("read segment %d offset %d: %w", sp.it.g.seq, sp.it.off, err)
			continue
		}
		sp.n = h.total()
		total += int(sp.n)
		end := sp.it.off + sp.n
		for o := sp.it.off + 64; o < end; o += 64 {
			sink += uint64(sp.m[o])
		}
	}
	sc.sink += sink
	sc.spans = spans
	arena := make([]byte, total)
	for _, sp := range spans {
		if sp.n < 0 {
			continue
		}
		b := arena[:sp.n:sp.n]
		arena = arena[sp.n:]
		copy(b, sp.m[sp.it.off:sp.it.off+sp.n])
		h, key, value, err := decodeRecord(b)
		if err == nil && h.kind == kindPut {
			value, err = s.decodeValue(h, value)
		}
		switch {
		case err != nil:
			errs[sp.it.i] = fmt.Errorf("read segment %d offset %d: %w", sp.it.g.seq, sp.it.off, err)
		case h.kind == kindPut:
			recs[sp.it.i] = engines.Record{Key: key, Value: value, ExpiresAt: h.aux}
			found[sp.it.i] = true
		}
	}
	return rest
}
