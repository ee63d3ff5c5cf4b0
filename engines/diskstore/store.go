package diskstore

import (
	"errors"
	"fmt"
	"github.com/klauspost/compress/s2"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/vfs"
)

// Errors of the disk store.
var (
	// ErrTooLarge: a record does not fit in one segment.
	ErrTooLarge = errors.New("diskstore: record larger than a segment")
	// ErrNoSlots: the log has 65536 live segments (see the location format).
	ErrNoSlots = errors.New("diskstore: every segment slot is in use")
	// ErrNotRecovered: Append before Recover.
	ErrNotRecovered = errors.New("diskstore: store not recovered yet")
)

// Durability says when a write is durable.
type Durability int

const (
	// DurabilitySync (the default): Commit returns once everything the
	// caller appended is written and fsynced. Concurrent committers share
	// one write and one fsync (group commit), so a kill -9 loses nothing
	// that Commit acknowledged.
	DurabilitySync Durability = iota
	// DurabilityLazy: Commit returns at once; a background flusher writes
	// and fsyncs every FlushInterval (and Sync and Close do so at once). A
	// crash loses up to FlushInterval of acknowledged writes; it never
	// tears a record or serves a partial one.
	DurabilityLazy
)

func (d Durability) String() string {
	switch d {
	case DurabilitySync:
		return "sync"
	case DurabilityLazy:
		return "lazy"
	}
	return fmt.Sprintf("Durability(%d)", int(d))
}

// Options configure a Store. The zero value works.
type Options struct {
	// FS is the file system. Default: vfs.Default.
	FS vfs.FS
	// SegmentSize is the size at which the head segment is sealed and a
	// new one started, at most 256 MiB (the 28 offset bits of a location).
	// A record or Write batch larger than what is left starts a segment of
	// its own, which may exceed SegmentSize up to 256 MiB (so a batch of
	// api.MaxBatchBytes, 64 MiB, always fits). It is also the collector's
	// unit: it frees whole segments, so the log carries up to about one
	// segment of garbage beyond MaxSpaceAmp. Default: 16 MiB.
	SegmentSize int64
	// Durability: DurabilitySync (default) or DurabilityLazy.
	Durability Durability
	// FlushInterval is how often the lazy mode writes and fsyncs.
	// Default: 50 ms.
	FlushInterval time.Duration
	// FlushBytes makes the lazy mode flush early once this many bytes
	// wait, so a long FlushInterval does not let a burst of writes pile
	// up in memory. Default: 8 MiB.
	FlushBytes int64
	// MaxSpaceAmp is the space amplification the collector keeps the store
	// within: the bytes of its files (segments and index blocks) over the
	// stored keys and values of its live records. Where record headers and
	// the index alone exceed it (tiny records), the collector still keeps
	// the garbage under 3% of the live bytes. Default: 1.15.
	MaxSpaceAmp float64
	// GCInterval is how often the collector checks for work. Default: 100 ms.
	GCInterval time.Duration
	// GCDutyCycle is the fraction of time the collector may run while the
	// space amplification is below 2 (above it, it runs flat out).
	// Default: 0.7 (read p99.9 during collection measured at 0.2× the best
	// peer's with it; see bench/README.md).
	GCDutyCycle float64
	// Now is the clock TTLs are measured by, Unix milliseconds.
	// Default: time.Now().UnixMilli().
	Now func() int64
	// Logger receives the store's events. Default: slog.Default().
	Logger *slog.Logger
	// CacheBytes bounds the read cache (ristretto; see cache.go): encoded
	// records by log position, filled by every append (write-through) and
	// every read that went to disk. Default: 64 MiB (a point partition
	// engine opens one store, so 64 MiB per partition); negative: no cache.
	CacheBytes int64
	// CacheBudget, when set, replaces CacheBytes: the cache is one share
	// of the budget, resized as other stores join and leave it.
	CacheBudget *engines.CacheBudget
	// IndexBlockBytes is how much log is appended between delta index
	// blocks (indexblock.go): the owner's index changes, persisted so that
	// a restart loads them and scans only the log after the last block.
	// Default: 8 MiB (a restart after a crash replays at most that much
	// log); negative: no index blocks (every open scans the
	// whole log). The owner must drive them (see RecoverIndexed).
	IndexBlockBytes int64
	// IndexBlockInterval also cuts a block once this much time (by Now)
	// passed since the last one and at least 64 index changes are
	// pending, so that a restart after a crash replays at most about this
	// long of writes when they come slower than IndexBlockBytes: each
	// replayed overwrite compares its key with the version it replaced,
	// a random read of a cold disk (measured: ~7,000 such reads were
	// 220 ms of a 430 ms restart of 1M keys). Default: 250 ms; negative:
	// by bytes only.
	IndexBlockInterval time.Duration
	// SnapshotWarnAge: a snapshot held longer than this is logged (as a
	// warning, again every SnapshotWarnAge while it is held), with the
	// collected segments it keeps on disk; Stats reports the oldest
	// snapshot's age too. Default: 10 minutes; negative: never logged.
	SnapshotWarnAge time.Duration
	// Compression compresses values when a record is written:
	// CompressionNone (default) or CompressionS2 (klauspost/compress s2,
	// for values of at least 64 bytes that shrink by 1/8 or more; a flag
	// on the record says so). Reads decompress whatever they find,
	// whatever the option.
	Compression Compression
	// ViewKey is the hash of a key and whether the owner keeps it in
	// every child of a split (the owner's mark in index blocks), by which
	// the store's view rules (ViewRule, the VIEW file) hide records. A
	// store with a VIEW refuses to open without it (ErrNoViewKey).
	ViewKey func(key []byte) (hash uint64, mark bool)
}

// Compression is a value codec.
type Compression string

// Compressions.
const (
	CompressionNone Compression = "none"
	CompressionS2   Compression = "s2"
)

// DefaultSegmentSize is Options.SegmentSize's default.
const DefaultSegmentSize = 16 << 20

// DefaultIndexBlockInterval is Options.IndexBlockInterval's default.
const DefaultIndexBlockInterval = 250 * time.Millisecond

// DefaultSnapshotWarnAge is Options.SnapshotWarnAge's default.
const DefaultSnapshotWarnAge = 10 * time.Minute

// DefaultCacheBytes is Options.CacheBytes's default.
const DefaultCacheBytes = 64 << 20

// Validate says what is wrong with o, if anything.
func (o Options) Validate() error {
	switch {
	case o.SegmentSize != 0 && (o.SegmentSize < 4096 || o.SegmentSize > maxSegmentSize):
		return fmt.Errorf("diskstore: SegmentSize %d outside [4096, %d]", o.SegmentSize, maxSegmentSize)
	case o.Durability != DurabilitySync && o.Durability != DurabilityLazy:
		return fmt.Errorf("diskstore: unknown durability %d", o.Durability)
	case o.MaxSpaceAmp != 0 && o.MaxSpaceAmp <= 1:
		return fmt.Errorf("diskstore: MaxSpaceAmp %v must exceed 1", o.MaxSpaceAmp)
	case o.GCDutyCycle < 0 || o.GCDutyCycle > 1:
		return fmt.Errorf("diskstore: GCDutyCycle %v outside [0, 1]", o.GCDutyCycle)
	case o.Compression != "" && o.Compression != CompressionNone && o.Compression != CompressionS2:
		return fmt.Errorf("diskstore: unknown compression %q (have %q, %q)", o.Compression, CompressionNone, CompressionS2)
	}
	return nil
}

// WithDefaults returns o with zero fields set to their defaults.
func (o Options) WithDefaults() Options {
	if o.FS == nil {
		o.FS = vfs.Default
	}
	if o.SegmentSize == 0 {
		o.SegmentSize = DefaultSegmentSize
	}
	if o.FlushInterval == 0 {
		o.FlushInterval = 50 * time.Millisecond
	}
	if o.FlushBytes <= 0 {
		o.FlushBytes = 8 << 20
	}
	if o.MaxSpaceAmp == 0 {
		o.MaxSpaceAmp = 1.15
	}
	if o.GCInterval == 0 {
		o.GCInterval = 100 * time.Millisecond
	}
	if o.GCDutyCycle == 0 {
		o.GCDutyCycle = 0.7
	}
	if o.Now == nil {
		o.Now = func() int64 { return time.Now().UnixMilli() }
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.CacheBytes == 0 {
		o.CacheBytes = DefaultCacheBytes
	}
	if o.IndexBlockBytes == 0 {
		o.IndexBlockBytes = DefaultIndexBlockBytes
	}
	if o.IndexBlockInterval == 0 {
		o.IndexBlockInterval = DefaultIndexBlockInterval
	}
	if o.SnapshotWarnAge == 0 {
		o.SnapshotWarnAge = DefaultSnapshotWarnAge
	}
	return o
}

// Store is the log store. It is safe for concurrent use.
type Store struct {
	dir  string
	fs   vfs.FS
	opts Options
	// view hides the records of a split's other child (view.go); set at
	// Open, never changed.
	view view

	// table maps a slot to its segment; replaced (copied) on change, under mu.
	table atomic.Pointer[[]*segment]
	// synced is the log position (bytes appended since open) known durable.
	synced atomic.Int64
	// flushNow wakes the lazy flusher early (Options.FlushBytes waiting).
	flushNow chan struct{}

	// mu guards the append state below and segments' in-memory tails.
	mu sync.Mutex
	// segs are the live segments in sequence order; guarded by mu.
	segs []*segment
	// head takes appends; nil until the first append. Guarded by mu.
	head *segment
	// pending are segments with unwritten bytes, in order; guarded by mu.
	pending []*segment
	// appended is the log position: bytes appended since open; guarded by mu.
	appended int64
	// nextSeq, freeSlots (FIFO), nextSlot and gens allocate segments;
	// guarded by mu.
	nextSeq   uint64
	freeSlots []uint32
	nextSlot  uint32
	gens      []uint8
	// failed is the sticky error of a failed write or sync: after it the
	// store takes no more writes (the file state is unknown; reopening
	// recovers what is durable). Guarded by mu.
	failed error
	// recovered is set by Recover; guarded by mu.
	recovered bool
	// gcActive is set while the collector works towards its goal (see
	// pickVictim); guarded by mu.
	gcActive bool

	// cache holds records by position (nil when Options.CacheBytes < 0);
	// cacheOn is set once Recover is done (recovery reads would only
	// thrash it).
	cache   *readCache
	cacheOn atomic.Bool

	// syncMu makes one goroutine at a time the group-commit leader that
	// writes and fsyncs; the others wait on it and usually find their bytes
	// already durable.
	syncMu sync.Mutex

	// compressedSeen is set once the store may hold a compressed record
	// (it compresses, or read one): from then on Free and the index notes
	// take records' lengths from the log, not from their decoded values.
	compressedSeen atomic.Bool

	// collectMu makes one collection at a time (GC beside the background
	// collector).
	collectMu sync.Mutex

	// obsolete are segments the collector freed while a snapshot pinned
	// them, until their files are deleted; snaps are the snapshots holding
	// pins (snapshot.go). Guarded by mu.
	obsolete []*segment
	snaps    map[*Snapshot]struct{}

	// logBytes counts every byte appended since open (mirrors appended,
	// readable without mu).
	logBytes atomic.Int64
	// ix is the delta index block state (indexblock.go).
	ix indexLog

	closed  atomic.Bool
	closing chan struct{}
	wg      sync.WaitGroup

	stats struct {
		gcRuns, gcBytesMoved, gcSegmentsFreed, syncs atomic.Int64
		gcSegmentsDeferred                           atomic.Int64
		recoveryBytes                                atomic.Int64
	}
}

// Open opens (creating if needed) the store in dir and checks every segment
// header. The store serves reads of existing records at once; Recover must
// run before it takes appends.
func Open(dir string, opts Options) (*Store, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.WithDefaults()
	s := &Store{dir: dir, fs: opts.FS, opts: opts, closing: make(chan struct{}), nextSeq: 1, snaps: map[*Snapshot]struct{}{}}
	s.compressedSeen.Store(opts.Compression == CompressionS2)
	rules, err := ReadView(s.fs, dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("open disk store %s: %w", dir, err)
	}
	if len(rules) > 0 && opts.ViewKey == nil {
		return nil, fmt.Errorf("open disk store %s: %w", dir, ErrNoViewKey)
	}
	s.view = rules
	empty := []*segment{}
	s.table.Store(&empty)
	if err := s.fs.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("open disk store %s: %w", dir, err)
	}
	// The directory's name (and its parents', which MkdirAll may have just
	// made) must be durable before anything in it is.
	for d := filepath.Clean(dir); ; {
		p := filepath.Dir(d)
		if err := s.fs.SyncDir(p); err != nil {
			return nil, fmt.Errorf("open disk store %s: sync %s: %w", dir, p, err)
		}
		if p == d || p == "." || p == "/" {
			break
		}
		d = p
	}
	names, err := s.fs.List(dir)
	if err != nil {
		return nil, fmt.Errorf("open disk store %s: %w", dir, err)
	}
	if err := s.removeObsoleteFiles(names); err != nil {
		return nil, fmt.Errorf("open disk store %s: %w", dir, err)
	}
	var seqs []uint64
	for _, n := range names {
		if seq, ok := parseSegmentName(n); ok {
			seqs = append(seqs, seq)
		}
	}
	sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })
	for i, seq := range seqs {
		g, err := s.openSegment(seq, i == len(seqs)-1)
		if err != nil {
			return nil, errors.Join(err, s.closeFiles())
		}
		if g == nil {
			continue // an empty last segment whose header never became durable
		}
		s.segs = append(s.segs, g)
		s.installLocked(g)
		s.nextSeq = seq + 1
	}
	for slot := uint32(0); slot < s.nextSlot; slot++ {
		if (*s.table.Load())[slot] == nil {
			s.freeSlots = append(s.freeSlots, slot)
		}
	}
	switch {
	case opts.CacheBudget != nil:
		if s.cache, err = newReadCache(opts.CacheBudget.Share()); err != nil {
			return nil, errors.Join(err, s.closeFiles())
		}
		s.cache.leave = opts.CacheBudget.Join(s.cache)
	case opts.CacheBytes > 0:
		if s.cache, err = newReadCache(opts.CacheBytes); err != nil {
			return nil, errors.Join(err, s.closeFiles())
		}
	}
	return s, nil
}

// openSegment opens and checks one segment file. A last segment too short
// to hold a header was created but never synced: it is removed.
func (s *Store) openSegment(seq uint64, last bool) (*segment, error) {
	path := s.segPath(seq)
	f, err := s.fs.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open segment %d: %w", seq, err)
	}
	size, err := f.Size()
	if err != nil {
		return nil, errors.Join(fmt.Errorf("open segment %d: %w", seq, err), f.Close())
	}
	hdr := make([]byte, segmentHeaderLen)
	if size < segmentHeaderLen && last {
		s.opts.Logger.Warn("diskstore: removing a last segment with no durable header", "segment", seq, "bytes", size)
		if err := errors.Join(f.Close(), s.fs.Remove(path), s.fs.SyncDir(s.dir)); err != nil {
			return nil, fmt.Errorf("remove empty segment %d: %w", seq, err)
		}
		return nil, nil
	}
	if _, err := f.ReadAt(hdr, 0); err != nil {
		return nil, errors.Join(fmt.Errorf("read segment %d header: %w (%w)", seq, err, engines.ErrCorrupt), f.Close())
	}
	slot, gen, hseq, err := decodeSegmentHeader(hdr)
	if err == nil && hseq != seq {
		err = fmt.Errorf("segment file %d holds segment %d: %w", seq, hseq, engines.ErrCorrupt)
	}
	if err == nil && (*s.table.Load()) != nil && int(slot) < len(*s.table.Load()) && (*s.table.Load())[slot] != nil {
		err = fmt.Errorf("segment %d reuses slot %d of a live segment: %w", seq, slot, engines.ErrCorrupt)
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("open segment %s: %w", path, err), f.Close())
	}
	g := &segment{seq: seq, slot: slot, gen: gen, path: path, f: f, sealed: true, created: true}
	g.size.Store(size)
	g.written.Store(size)
	return g, nil
}

// installLocked publishes g in the slot table. Caller holds mu (or owns s).
func (s *Store) installLocked(g *segment) {
	old := *s.table.Load()
	n := max(len(old), int(g.slot)+1)
	t := make([]*segment, n)
	copy(t, old)
	t[g.slot] = g
	s.table.Store(&t)
	for uint32(len(s.gens)) <= g.slot {
		s.gens = append(s.gens, 0)
	}
	s.gens[g.slot] = g.gen
	s.nextSlot = max(s.nextSlot, g.slot+1)
}

// uninstallLocked takes g out of the location table and the segment list.
// Its slot is not free yet: a new segment may take it only once g's file
// is durably gone (freeSlotLocked). Reused before, a new segment's file
// could be durable beside g's after a crash, two files of one slot, and
// recovery refuses that as corruption (found by TestCrashConcurrentWriters).
func (s *Store) uninstallLocked(g *segment) {
	old := *s.table.Load()
	t := make([]*segment, len(old))
	copy(t, old)
	t[g.slot] = nil
	s.table.Store(&t)
	for i, x := range s.segs {
		if x == g {
			s.segs = append(s.segs[:i:i], s.segs[i+1:]...)
			break
		}
	}
}

// freeSlotLocked makes slot available to new segments, once the file of the
// segment that held it was removed and the removal synced. Caller holds
// s.mu.
func (s *Store) freeSlotLocked(slot uint32) {
	s.freeSlots = append(s.freeSlots, slot)
}

func (s *Store) segAt(slot uint32, gen uint8) *segment {
	t := *s.table.Load()
	if int(slot) >= len(t) {
		return nil
	}
	g := t[slot]
	if g == nil || g.gen != gen {
		return nil
	}
	return g
}

// ReplayFunc is called by Recover for each record in log order. A put
// record is live (counted in its segment's live bytes) until the owner
// Frees it; a tombstone is never live.
type ReplayFunc func(loc uint64, r engines.Record, tombstone bool) error

// Recover reads every record in log order and hands it to fn, which
// rebuilds the owner's index. A bad record in the last segment with no good
// record after it is a torn tail of unacknowledged writes: it is cut off.
// Any other bad record is corruption: Recover fails with engines.ErrCorrupt
// and changes nothing. After Recover the store takes appends (into a new
// segment) and its background flusher runs.
func (s *Store) Recover(fn ReplayFunc) error {
	return s.recoverFrom(fn, logPos{}, time.Now(), indexState{})
}

// RecoverIndexed is Recover with index blocks: it loads the newest chain of
// index blocks (a base and the deltas after it), hands each entry to load
// (its record counted live), and replays through fn only the records after
// the chain's position. An entry whose segment was freed since is stale and
// dropped (the collector re-appended the record after the chain's position
// or it was garbage). Without a usable chain, or one that disagrees with
// the log, it falls back to replaying the whole log, and logs why. Without
// index blocks (Options.IndexBlockBytes < 0) it is Recover. Afterwards the
// owner writes a new base (WriteIndexBase) before it appends. load also
// gets the bytes of log fn will then be handed (an owner may size its index
// for the records they hold).
func (s *Store) RecoverIndexed(load func(entries []IndexEntry, tailBytes int64) error, fn ReplayFunc) error {
	if !s.IndexBlocks() {
		return s.Recover(fn)
	}
	start := time.Now()
	s.ix.mu.Lock()
	s.ix.recovering = true
	s.ix.mu.Unlock()
	st, ok := s.loadIndexChain()
	var entries []IndexEntry
	if ok {
		entries, ok = s.resolveIndex(&st)
	}

	if !ok {
		if len(s.segs) > 0 {
			s.opts.Logger.Info("diskstore: no usable index blocks; scanning the whole log", "dir", s.dir)
		}
		st.at, st.blocks = logPos{}, 0
		return s.recoverFrom(fn, logPos{}, start, st)
	}
	var tail int64
	for _, g := range s.segs {
		switch {
		case g.seq > st.at.seq:
			tail += g.size.Load() - segmentHeaderLen
		case g.seq == st.at.seq:
			tail += max(g.size.Load()-max(st.at.off, segmentHeaderLen), 0)
		}
	}
	if err := load(entries, tail); err != nil {
		return fmt.Errorf("load index entries: %w", err)
	}
	s.ix.mu.Lock()
	// Continue the chain (the tail's changes become its next delta); if its
	// deltas outgrew its base, its live entries also replace its last block
	// as a new base, in the background once recovered.
	s.ix.prev, s.ix.prevAt = st.last, st.at
	s.ix.cont = st.last+1 == s.ix.next
	s.ix.base, s.ix.baseBytes, s.ix.deltaBytes, s.ix.deltas = st.base, st.baseBytes, st.deltaBytes, st.blocks-1
	if s.ix.cont && s.ix.compactDue() {
		s.ix.compact = &indexCompaction{n: st.last, at: st.at, changes: st.live,
			replacedBytes: st.deltaBytes, replacedDeltas: st.blocks - 1}
	}
	s.ix.mu.Unlock()
	return s.recoverFrom(fn, st.at, start, st)
}

// resolveIndex turns the chain's live records into entries at their current
// locations, dropping those of freed segments, and counts them live in
// their segments; ok is false (and nothing is counted) if the chain
// disagrees with the log (a record past its segment's end or past the
// chain's position), so the log must be scanned whole.
func (s *Store) resolveIndex(st *indexState) (entries []IndexEntry, ok bool) {
	segs := newSeqTable(s.segs)
	if g := segs.get(st.at.seq); g != nil && g.size.Load() < st.at.off {
		s.opts.Logger.Warn("diskstore: index chain position past its segment's end", "dir", s.dir, "segment", g.seq, "offset", st.at.off)
		return nil, false
	}
	// Two halves at once (a restart's critical path: 1M entries took
	// ~65 ms in one goroutine), each compacting its part of puts (the live
	// changes, kept for a compaction) and filling its part of entries, and
	// counting live bytes per segment to add once per segment.
	puts := st.puts
	entries = make([]IndexEntry, len(puts))
	mid := len(puts) / 2
	if len(puts) < 1<<16 {
		mid = len(puts)
	}
	type half struct {
		lo, hi, n, stale int
		live             []segLive
		bad              *logPos
	}
	halves := []*half{{lo: 0, hi: mid}, {lo: mid, hi: len(puts)}}
	var wg sync.WaitGroup
	for _, hf := range halves {
		wg.Go(func() {
			hf.live = make([]segLive, len(segs.segs))
			w := hf.lo
			for i := hf.lo; i < hf.hi; i++ {
				c := puts[i]
				p := c.pos
				if len(st.removed) > 0 {
					if _, ok := st.removed[p]; ok {
						continue
					}
				}
				k := segs.index(p.seq)
				if k < 0 {
					hf.stale++
					continue
				}
				if s.view.hides(p.seq, c.hash, c.mark) {
					continue // the other child's, since a split
				}
				g := segs.segs[k]
				end := p.off + recordLen(0, 0) + c.bytes
				if p.off < segmentHeaderLen || end > g.size.Load() || p.seq > st.at.seq || (p.seq == st.at.seq && end > st.at.off) {
					hf.bad = &p
					return
				}
				c.old = logPos{}
				puts[w] = c
				entries[w] = IndexEntry{Hash: c.hash, Loc: g.loc(p.off), Bytes: c.bytes, ExpiresAt: c.exp, Marked: c.mark}
				w++
				hf.live[k].add(recordLen(0, 0)+c.bytes, c.exp)
			}
			hf.n = w - hf.lo
		})
	}
	wg.Wait()
	for _, hf := range halves {
		if hf.bad != nil {
			s.opts.Logger.Warn("diskstore: index entry outside the log it covers", "dir", s.dir, "segment", hf.bad.seq, "offset", hf.bad.off)
			return nil, false
		}
	}
	h0, h1 := halves[0], halves[1]
	copy(puts[h0.n:], puts[h1.lo:h1.lo+h1.n])
	copy(entries[h0.n:], entries[h1.lo:h1.lo+h1.n])
	n := h0.n + h1.n
	for k, g := range segs.segs {
		if g != nil {
			g.addLiveBulk(h0.live[k].plus(h1.live[k]))
		}
	}
	st.puts, st.removed, st.live = nil, nil, puts[:n]
	st.stale = h0.stale + h1.stale
	return entries[:n], true
}

// seqTable finds segments by sequence number: an array over the live
// numbers' range (a map lookup per index entry was a third of resolving
// 1M entries).
type seqTable struct {
	min  uint64
	segs []*segment // by seq-min; nil: no such segment
	m    map[uint64]int
}

func newSeqTable(segs []*segment) seqTable {
	t := seqTable{}
	if len(segs) == 0 {
		return t
	}
	lo, hi := segs[0].seq, segs[0].seq
	for _, g := range segs {
		lo, hi = min(lo, g.seq), max(hi, g.seq)
	}
	if hi-lo >= 1<<20 { // sparse: a map, with segs listing them
		t.m = make(map[uint64]int, len(segs))
		t.segs = segs
		for i, g := range segs {
			t.m[g.seq] = i
		}
		return t
	}
	t.min = lo
	t.segs = make([]*segment, hi-lo+1)
	for _, g := range segs {
		t.segs[g.seq-lo] = g
	}
	return t
}

// index is where seq's segment is in t.segs, -1 if none.
func (t seqTable) index(seq uint64) int {
	if t.m != nil {
		if i, ok := t.m[seq]; ok {
			return i
		}
		return -1
	}
	if seq < t.min || seq-t.min >= uint64(len(t.segs)) || t.segs[seq-t.min] == nil {
		return -1
	}
	return int(seq - t.min)
}

func (t seqTable) get(seq uint64) *segment {
	if i := t.index(seq); i >= 0 {
		return t.segs[i]
	}
	return nil
}

// recoverFrom replays the records at and after from (all of them for the
// zero position); ist describes the index blocks loaded before.
func (s *Store) recoverFrom(fn ReplayFunc, from logPos, start time.Time, ist indexState) error {
	var bytesRead int64
	type held struct {
		loc    uint64
		rec    engines.Record
		tomb   bool
		stored int64 // the record's length in the log
	}
	var batch []held // records of an unfinished batch, copied
	for i, g := range s.segs {
		last := i == len(s.segs)-1
		if g.seq < from.seq {
			continue
		}
		r := &segReader{s: s, g: g, end: g.size.Load(), off: segmentHeaderLen}
		if g.seq == from.seq {
			r.off = max(from.off, segmentHeaderLen)
		}
		batchStart := int64(-1)
		for {
			off, h, key, value, err := r.next()
			if err == io.EOF && batchStart >= 0 {
				err = fmt.Errorf("batch from offset %d has no last record: %w", batchStart, engines.ErrCorrupt)
				off = batchStart
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				if !last || !errors.Is(err, engines.ErrCorrupt) {
					return fmt.Errorf("recover segment %d at offset %d: %w", g.seq, off, err)
				}
				if s.goodRecordAfter(g, off) {
					return fmt.Errorf("recover segment %d: bad record at offset %d followed by good ones: %w", g.seq, off, err)
				}
				cut := off
				if batchStart >= 0 {
					cut = batchStart // an unfinished batch is dropped whole
				}
				if err := s.truncate(g, cut); err != nil {
					return err
				}
				batch = batch[:0]
				break
			}
			bytesRead += h.total()
			loc := g.loc(off)
			var rec engines.Record
			switch h.kind {
			case kindPut:
				v, err := s.decodeValue(h, value)
				if err != nil {
					return fmt.Errorf("recover segment %d at offset %d: %w", g.seq, off, err)
				}
				rec = engines.Record{Key: key, Value: v, ExpiresAt: h.aux}
			case kindTombstone:
				rec = engines.Record{Key: key}
			}
			tomb := h.kind == kindTombstone
			if h.flags&flagBatchCont != 0 || batchStart >= 0 {
				if batchStart < 0 {
					batchStart = off
				}
				rec.Key = append([]byte(nil), rec.Key...)
				rec.Value = append([]byte(nil), rec.Value...)
				batch = append(batch, held{loc, rec, tomb, h.total()})
				if h.flags&flagBatchCont != 0 {
					continue
				}
				batchStart = -1
				for _, b := range batch {
					if err := s.replay(fn, b.loc, b.rec, b.tomb, b.stored); err != nil {
						return err
					}
				}
				batch = batch[:0]
				continue
			}
			if err := s.replay(fn, loc, rec, tomb, h.total()); err != nil {
				return err
			}
		}
	}
	s.mu.Lock()
	s.recovered = true
	for _, g := range s.segs {
		g.markFullLocked() // every segment recovered is sealed
	}
	s.mu.Unlock()
	s.cacheOn.Store(s.cache != nil)
	s.opts.Logger.Info("diskstore: recovered", "dir", s.dir, "segments", len(s.segs),
		"bytes_read", bytesRead+ist.bytes, "index_blocks", ist.blocks, "index_bytes", ist.bytes,
		"stale_entries", ist.stale, "tail_bytes", bytesRead, "duration", time.Since(start))
	s.stats.recoveryBytes.Store(bytesRead + ist.bytes)
	if s.opts.Durability == DurabilityLazy {
		s.mu.Lock()
		s.flushNow = make(chan struct{}, 1)
		s.mu.Unlock()
		s.wg.Add(1)
		go s.flushLoop()
	}
	return nil
}

// replay counts a put live in its segment and hands the record to fn.
func (s *Store) replay(fn ReplayFunc, loc uint64, r engines.Record, tomb bool, stored int64) error {
	slot, gen, off := unpackLoc(loc)
	g := s.segAt(slot, gen)
	if s.hidesKey(g.seq, r.Key) {
		return nil // the other child's, since a split: garbage here
	}
	if !tomb {
		g.addLive(stored, r.ExpiresAt)
	}
	if err := fn(loc, r, tomb); err != nil {
		return fmt.Errorf("replay segment %d at offset %d: %w", g.seq, off, err)
	}
	return nil
}

// goodRecordAfter reports whether any valid record starts after off in g:
// then the bad bytes at off are not a torn tail but damage to synced data.
// It searches every byte offset of the rest of the segment (a flipped length
// field hides where the next record starts).
func (s *Store) goodRecordAfter(g *segment, off int64) bool {
	end := g.size.Load()
	if end-off <= recordHeaderLen {
		return false
	}
	rest := make([]byte, end-off)
	if err := s.readAt(g, rest, off); err != nil {
		return false
	}
	for p := 1; p+recordHeaderLen <= len(rest); p++ {
		if _, _, _, err := decodeRecord(rest[p:]); err == nil {
			return true
		}
	}
	return false
}

// truncate cuts g's torn tail at off, durably.
func (s *Store) truncate(g *segment, off int64) error {
	s.opts.Logger.Warn("diskstore: cutting a torn tail", "segment", g.seq, "offset", off, "bytes", g.size.Load()-off)
	f, err := s.fs.OpenReadWrite(g.path)
	if err != nil {
		return fmt.Errorf("truncate segment %d: %w", g.seq, err)
	}
	if err := errors.Join(f.Truncate(off), f.Sync()); err != nil {
		return errors.Join(fmt.Errorf("truncate segment %d at %d: %w", g.seq, off, err), f.Close())
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("truncate segment %d: %w", g.seq, err)
	}
	g.size.Store(off)
	g.written.Store(off)
	return nil
}

// Append adds a put record to the log and returns its location. It is
// durable once a later Commit or Sync returns; until then it is readable
// (from memory) but a crash may lose it.
func (s *Store) Append(r engines.Record) (uint64, error) {
	v, flags := s.encodeValue(r.Value)
	return s.append(kindPut, flags, r.Key, v, r.ExpiresAt, true)
}

// AppendRelocated is Append for a record the collector moves: it does not
// enter the read cache (a relocated record is old, not hot; caching it would
// displace what readers use and cost the collector a third of its time).
func (s *Store) AppendRelocated(r engines.Record) (uint64, error) {
	v, flags := s.encodeValue(r.Value)
	return s.append(kindPut, flags, r.Key, v, r.ExpiresAt, false)
}

// Op is one record of a Write: a put of Record, or a tombstone of
// Record.Key shadowing the deleted version at Shadowed.
type Op struct {
	Record    engines.Record
	Tombstone bool
	Shadowed  uint64
	// Cold keeps the record out of the read cache (engines.Mutation.Cold):
	// writes otherwise go through to it.
	Cold bool
}

// Write appends ops as one batch and sets locs[i] to the location of each
// put (0 for tombstones). The batch lands in one segment and only its last
// record lacks the batch-continues flag, so after a crash recovery replays
// all of it or none. On error nothing was appended. Durable as Append.
func (s *Store) Write(ops []Op, locs []uint64) error {
	var total int64
	// The values as stored and their flags, compressed before the lock
	// (only a compressing store allocates for them).
	var stored [][]byte
	var sflags []byte
	if s.opts.Compression == CompressionS2 {
		stored, sflags = make([][]byte, len(ops)), make([]byte, len(ops))
	}
	value := func(i int) ([]byte, byte) {
		if stored == nil {
			return ops[i].Record.Value, 0
		}
		return stored[i], sflags[i]
	}
	for i := range ops {
		r := &ops[i].Record
		if len(r.Key) == 0 || len(r.Key) > MaxKeyLen {
			return fmt.Errorf("write op %d: a %d-byte key: %w", i, len(r.Key), ErrTooLarge)
		}
		if ops[i].Tombstone {
			total += recordLen(len(r.Key), 0)
		} else {
			if stored != nil {
				stored[i], sflags[i] = s.encodeValue(r.Value)
			}
			v, _ := value(i)
			total += recordLen(len(r.Key), len(v))
		}
	}
	if total > maxSegmentSize-segmentHeaderLen {
		return fmt.Errorf("write batch of %d bytes, more than a segment holds (%d): %w", total, maxSegmentSize-segmentHeaderLen, ErrTooLarge)
	}
	if s.closed.Load() {
		return engines.ErrClosed
	}
	s.mu.Lock()
	g, err := s.headForLocked(total)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	start := int64(len(g.buf))
	// One growth for the whole batch rather than a doubling per record
	// (a batch of large values otherwise copied its buffer over and over).
	g.buf = slices.Grow(g.buf, int(total))
	for i := range ops {
		var flags byte
		if i < len(ops)-1 {
			flags = flagBatchCont
		}
		op := &ops[i]
		if op.Tombstone {
			aux := int64(g.seq)
			slot, gen, _ := unpackLoc(op.Shadowed)
			if sg := s.segAt(slot, gen); sg != nil {
				aux = int64(sg.seq)
			}
			s.appendLocked(g, kindTombstone, flags, op.Record.Key, nil, aux)
			locs[i] = 0
		} else {
			v, vflags := value(i)
			locs[i] = s.appendLocked(g, kindPut, flags|vflags, op.Record.Key, v, op.Record.ExpiresAt)
		}
	}
	// The batch's bytes: appends only ever write past len(g.buf) and a
	// flushed buffer is dropped, not reused, so they stay as they are after
	// mu is released.
	enc := g.buf[start:]
	base := g.size.Load() - int64(len(enc))
	s.mu.Unlock()
	if s.cacheOn.Load() {
		for i := range ops {
			if ops[i].Tombstone || ops[i].Cold {
				continue
			}
			_, _, off := unpackLoc(locs[i])
			v, _ := value(i)
			n := recordLen(len(ops[i].Record.Key), len(v))
			s.cache.set(cacheKey(g.seq, off), clone(enc[off-base:off-base+n]))
		}
	}
	return nil
}

func clone(b []byte) []byte { return append(make([]byte, 0, len(b)), b...) }

// Tombstone appends a delete marker for key: the version at shadowed (a
// location of key's deleted record) stays deleted after a restart. Durable
// as Append.
func (s *Store) Tombstone(key []byte, shadowed uint64) error {
	slot, gen, _ := unpackLoc(shadowed)
	var seq int64 = -1
	if g := s.segAt(slot, gen); g != nil {
		seq = int64(g.seq)
	}
	_, err := s.append(kindTombstone, 0, key, nil, seq, false)
	return err
}

// headForLocked returns the head segment, rotated if n more bytes do not
// fit. Caller holds mu.
func (s *Store) headForLocked(n int64) (*segment, error) {
	switch {
	case s.failed != nil:
		return nil, fmt.Errorf("append: store failed earlier: %w", s.failed)
	case !s.recovered:
		return nil, ErrNotRecovered
	}
	if g := s.head; g != nil && g.size.Load()+n <= s.opts.SegmentSize {
		return g, nil
	}
	return s.rotateLocked()
}

// appendLocked appends one record to g, the head. Caller holds mu.
func (s *Store) appendLocked(g *segment, kind, flags byte, key, value []byte, aux int64) uint64 {
	n := recordLen(len(key), len(value))
	off := g.size.Load()
	g.buf = appendRecord(g.buf, kind, flags, key, value, aux)
	g.size.Add(n)
	if kind == kindPut {
		g.addLive(n, aux)
	}
	s.appended += n
	s.logBytes.Add(n)
	if s.flushNow != nil && s.appended-s.synced.Load() >= s.opts.FlushBytes {
		select {
		case s.flushNow <- struct{}{}:
		default:
		}
	}
	if !g.queued {
		g.queued = true
		s.pending = append(s.pending, g)
	}
	return g.loc(off)
}

func (s *Store) append(kind, flags byte, key, value []byte, aux int64, cache bool) (uint64, error) {
	if len(key) == 0 || len(key) > MaxKeyLen {
		return 0, fmt.Errorf("append record with a %d-byte key: %w", len(key), ErrTooLarge)
	}
	n := recordLen(len(key), len(value))
	if n > maxSegmentSize-segmentHeaderLen {
		return 0, fmt.Errorf("append record of %d bytes, more than a segment holds (%d): %w", n, maxSegmentSize-segmentHeaderLen, ErrTooLarge)
	}
	if s.closed.Load() {
		return 0, engines.ErrClosed
	}
	s.mu.Lock()
	g, err := s.headForLocked(n)
	if err != nil {
		s.mu.Unlock()
		return 0, err
	}
	if kind == kindTombstone && aux < 0 {
		aux = int64(g.seq) // shadowed segment unknown: older versions are at most this new
	}
	loc := s.appendLocked(g, kind, flags, key, value, aux)
	enc := g.buf[int64(len(g.buf))-n:] // immutable once written (see Write)
	s.mu.Unlock()
	if cache && kind == kindPut && s.cacheOn.Load() {
		_, _, off := unpackLoc(loc)
		s.cache.set(cacheKey(g.seq, off), clone(enc))
	}
	return loc, nil
}

// rotateLocked seals the head and starts a new segment in memory; the sync
// leader creates its file.
func (s *Store) rotateLocked() (*segment, error) {
	var slot uint32
	switch {
	case len(s.freeSlots) > 0:
		slot = s.freeSlots[0]
		s.freeSlots = s.freeSlots[1:]
	case s.nextSlot < maxSlots:
		slot = s.nextSlot
	default:
		return nil, fmt.Errorf("start segment %d: %w", s.nextSeq, ErrNoSlots)
	}
	var gen uint8
	if int(slot) < len(s.gens) {
		gen = (s.gens[slot] + 1) & genMask
	}
	seq := s.nextSeq
	s.nextSeq++
	g := &segment{seq: seq, slot: slot, gen: gen, path: s.segPath(seq)}
	g.buf = encodeSegmentHeader(slot, gen, seq)
	g.size.Store(segmentHeaderLen)
	s.appended += segmentHeaderLen
	s.logBytes.Add(segmentHeaderLen)
	if s.head != nil {
		s.head.sealed = true
		s.head.markFullLocked()
	}
	s.head = g
	s.segs = append(s.segs, g)
	s.installLocked(g)
	g.queued = true
	s.pending = append(s.pending, g)
	return g, nil
}

// Commit makes the caller's earlier appends as durable as the store's
// Durability promises: with DurabilitySync it returns once they are
// written and fsynced (shared with concurrent committers); with
// DurabilityLazy it returns at once.
func (s *Store) Commit() error {
	if s.opts.Durability == DurabilityLazy {
		return nil
	}
	return s.Sync()
}

// Sync writes and fsyncs everything appended before the call, whatever the
// durability mode. When it returns nil, those records survive a crash.
func (s *Store) Sync() error {
	s.mu.Lock()
	target := s.appended
	s.mu.Unlock()
	return s.syncTo(target)
}

// syncTo makes the log durable up to position target. One caller at a time
// leads: it takes every pending byte (its own and everyone else's), writes
// and fsyncs each segment in order, then the directory if it created a
// file. The callers queued behind it then find their bytes durable.
func (s *Store) syncTo(target int64) error {
	if s.synced.Load() >= target {
		return nil
	}
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	if s.synced.Load() >= target {
		return nil
	}
	s.mu.Lock()
	if s.failed != nil {
		s.mu.Unlock()
		return fmt.Errorf("sync: store failed earlier: %w", s.failed)
	}
	end := s.appended
	work := s.pending
	s.pending = nil
	for _, g := range work {
		g.flushing, g.buf = g.buf, nil
		g.queued = false
	}
	s.mu.Unlock()

	err := s.writeOut(work)
	if err != nil {
		s.mu.Lock()
		if s.failed == nil {
			s.failed = err
		}
		s.mu.Unlock()
		s.opts.Logger.Error("diskstore: write failed; the store takes no more writes until reopened", "dir", s.dir, "err", err)
		return fmt.Errorf("sync: %w", err)
	}
	s.stats.syncs.Add(1)
	s.synced.Store(end)
	return nil
}

// writeOut writes and fsyncs work in order. Caller holds syncMu.
func (s *Store) writeOut(work []*segment) error {
	newFile := false
	for _, g := range work {
		if !g.created {
			f, err := s.fs.Create(g.path)
			if err != nil {
				return fmt.Errorf("create segment %d: %w", g.seq, err)
			}
			g.f = f
			g.created = true
			newFile = true
		}
		if len(g.flushing) > 0 {
			n, err := g.f.Write(g.flushing)
			if err != nil {
				return fmt.Errorf("write segment %d: %d of %d bytes: %w", g.seq, n, len(g.flushing), err)
			}
		}
		s.mu.Lock()
		g.written.Add(int64(len(g.flushing)))
		g.flushing = nil
		g.markFullLocked()
		s.mu.Unlock()
		if err := g.f.Sync(); err != nil {
			return fmt.Errorf("sync segment %d: %w", g.seq, err)
		}
	}
	if newFile {
		if err := s.fs.SyncDir(s.dir); err != nil {
			return fmt.Errorf("sync directory %s: %w", s.dir, err)
		}
	}
	return nil
}

// flushLoop is the lazy mode's flusher.
func (s *Store) flushLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-s.closing:
			return
		case <-t.C:
		case <-s.flushNow:
		}
		if err := s.Sync(); err != nil {
			s.opts.Logger.Error("diskstore: background flush failed", "dir", s.dir, "err", err)
		}
	}
}

// Read returns the record at loc, verified against its CRC. ok is false if
// loc names no live segment (it was freed, maybe reused); a record that
// fails its check is an error wrapping engines.ErrCorrupt, never returned.
// The record's slices may alias buf.
func (s *Store) Read(loc uint64, buf []byte) (engines.Record, bool, error) {
	slot, gen, off := unpackLoc(loc)
	g := s.segAt(slot, gen)
	if g == nil {
		return engines.Record{}, false, nil
	}
	// A mapped segment's pages are the OS's cache already: its records are
	// read from the mapping, and the read cache fronts only the records
	// read with system calls (the head, and file systems that cannot map).
	h, raw, key, value, mapped, err := s.readMapped(g, off, buf)
	if !mapped {
		caching := s.cacheOn.Load()
		if caching {
			if b, ok := s.cache.get(cacheKey(g.seq, off)); ok {
				r, err := s.cachedRecord(b)
				if err != nil {
					return engines.Record{}, false, fmt.Errorf("read segment %d offset %d: %w", g.seq, off, err)
				}
				return r, true, nil
			}
		}
		h, raw, key, value, err = s.readRecord(g, off, buf)
		if err == nil && caching && h.kind == kindPut {
			s.cache.set(cacheKey(g.seq, off), clone(raw))
		}
	}
	if err != nil {
		if g.dead.Load() {
			return engines.Record{}, false, nil // freed under us
		}
		return engines.Record{}, false, fmt.Errorf("read segment %d offset %d: %w", g.seq, off, err)
	}
	if h.kind != kindPut {
		return engines.Record{}, false, nil
	}
	v, err := s.decodeValue(h, value)
	if err != nil {
		return engines.Record{}, false, fmt.Errorf("read segment %d offset %d: %w", g.seq, off, err)
	}
	return engines.Record{Key: key, Value: v, ExpiresAt: h.aux}, true, nil
}

// cachedRecord decodes a cached record: checked when it was cached, and
// immutable since.
func (s *Store) cachedRecord(b []byte) (engines.Record, error) {
	h, _ := parseHeader(b)
	v, err := s.decodeValue(h, b[recordHeaderLen+h.keyLen:h.total():h.total()])
	return engines.Record{
		Key:       b[recordHeaderLen : recordHeaderLen+h.keyLen : recordHeaderLen+h.keyLen],
		Value:     v,
		ExpiresAt: h.aux,
	}, err
}

// minCompress is the smallest value Compression tries to compress.
const minCompress = 64

// encodeValue returns v as the store keeps it and the flag that says how:
// s2-compressed if the store compresses and that saves 1/8 or more.
func (s *Store) encodeValue(v []byte) ([]byte, byte) {
	if s.opts.Compression != CompressionS2 || len(v) < minCompress {
		return v, 0
	}
	enc := s2.Encode(nil, v)
	if len(enc) > len(v)-len(v)/8 {
		return v, 0
	}
	return enc, flagS2
}

// decodeValue returns the value a record of header h stores as v. A
// compressed value that does not decode, or would decode past
// maxDecodedValue, is corrupt.
func (s *Store) decodeValue(h header, v []byte) ([]byte, error) {
	if h.flags&flagS2 == 0 {
		return v, nil
	}
	s.compressedSeen.Store(true)
	n, err := s2.DecodedLen(v)
	if err != nil || n > maxDecodedValue {
		return nil, fmt.Errorf("compressed value (decoded length %d, limit %d): %v: %w", n, maxDecodedValue, err, engines.ErrCorrupt)
	}
	d, err := s2.Decode(make([]byte, n), v)
	if err != nil {
		return nil, fmt.Errorf("compressed value: %v: %w", err, engines.ErrCorrupt)
	}
	return d, nil
}

// maxDecodedValue bounds a decompressed value: the largest value a table
// may allow (api.MaxValueBytesLimit).
const maxDecodedValue = 64 << 20

// storedLen is the log length of the record r read at loc: its encoded
// length, which differs from r's when its value was compressed.
func (s *Store) storedLen(loc uint64, r engines.Record) int64 {
	if s.compressedSeen.Load() {
		if h, ok := s.headerAt(loc); ok {
			return h.total()
		}
	}
	return recordLen(len(r.Key), len(r.Value))
}

// headerAt reads the header of the record at loc.
func (s *Store) headerAt(loc uint64) (header, bool) {
	slot, gen, off := unpackLoc(loc)
	g := s.segAt(slot, gen)
	if g == nil {
		return header{}, false
	}
	var hdr [recordHeaderLen]byte
	if err := s.readAt(g, hdr[:], off); err != nil {
		return header{}, false
	}
	h, err := parseHeader(hdr[:])
	return h, err == nil
}

// Free marks the record r at loc garbage: its bytes leave its segment's
// live count, which drives the collector.
func (s *Store) Free(loc uint64, r engines.Record) error {
	slot, gen, off := unpackLoc(loc)
	if g := s.segAt(slot, gen); g != nil {
		g.subLive(s.storedLen(loc, r), r.ExpiresAt)
		if s.cacheOn.Load() {
			s.cache.del(cacheKey(g.seq, off)) // garbage: make room
		}
	}
	return nil
}

// Stats is a snapshot of the store's counters.
type Stats struct {
	Segments     int
	LogBytes     int64 // bytes of every segment, headers included
	LiveBytes    int64 // bytes of unexpired records the index points at
	GarbageBytes int64 // LogBytes - LiveBytes
	// SpaceAmp is LogBytes / LiveBytes (0 when empty).
	SpaceAmp          float64
	Syncs             int64 // group commits (write + fsync rounds)
	GCRuns            int64 // segments collected
	GCBytesMoved      int64
	GCSegmentsFreed   int64
	Durability        Durability
	SegmentSizeTarget int64
	// CacheHits and CacheMisses count reads (Read, ReadBatch) served by
	// the read cache and reads that went to the log; both 0 without one.
	CacheHits   int64
	CacheMisses int64
	// RecoveryBytes is what the last Recover read: index blocks and the
	// log records it replayed.
	RecoveryBytes int64
	// MappedSegments is how many segments are read through a memory
	// mapping (sealed, fully written, on a file system that maps).
	MappedSegments int
	// Snapshots is how many snapshots hold pins; OldestSnapshotMs the age
	// of the oldest (by Options.Now), 0 without one.
	Snapshots        int
	OldestSnapshotMs int64
	// PinnedSegments are the live segments some snapshot pins (they may
	// still be collected). ObsoleteSegments and ObsoleteBytes are the
	// segments the collector freed while pinned, whose files wait for
	// their last pin: disk space outside LogBytes (and SpaceAmp), the
	// price of open snapshots.
	PinnedSegments   int
	ObsoleteSegments int
	ObsoleteBytes    int64
	// GCSegmentsDeferred counts the segments collected while pinned (their
	// files deleted later); GCSegmentsFreed includes them.
	GCSegmentsDeferred int64
	// IndexChainBlocks is the length of the index block chain a restart
	// would read (a base and its deltas; 0 without one), and
	// IndexCompacting whether a compaction is shortening it now.
	IndexChainBlocks int
	IndexCompacting  bool
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	st := Stats{Segments: len(s.segs), Durability: s.opts.Durability, SegmentSizeTarget: s.opts.SegmentSize}
	now := s.opts.Now()
	for _, g := range s.segs {
		st.LogBytes += g.size.Load()
		st.LiveBytes += g.liveAt(now)
		if g.mapped.Load() != nil {
			st.MappedSegments++
		}
		if g.pins > 0 {
			st.PinnedSegments++
		}
	}
	for _, g := range s.obsolete {
		st.ObsoleteSegments++
		st.ObsoleteBytes += g.size.Load()
	}
	st.Snapshots = len(s.snaps)
	for sn := range s.snaps {
		st.OldestSnapshotMs = max(st.OldestSnapshotMs, now-sn.taken)
	}
	s.mu.Unlock()
	st.GCSegmentsDeferred = s.stats.gcSegmentsDeferred.Load()
	st.GarbageBytes = st.LogBytes - st.LiveBytes
	if st.LiveBytes > 0 {
		st.SpaceAmp = float64(st.LogBytes) / float64(st.LiveBytes)
	}
	st.Syncs = s.stats.syncs.Load()
	st.GCRuns = s.stats.gcRuns.Load()
	st.GCBytesMoved = s.stats.gcBytesMoved.Load()
	st.GCSegmentsFreed = s.stats.gcSegmentsFreed.Load()
	st.RecoveryBytes = s.stats.recoveryBytes.Load()
	s.ix.mu.Lock()
	if s.ix.base != 0 {
		st.IndexChainBlocks = 1 + s.ix.deltas
	}
	st.IndexCompacting = s.ix.compacting
	s.ix.mu.Unlock()
	if s.cache != nil {
		st.CacheHits, st.CacheMisses = s.cache.counts()
	}
	return st
}

// Close stops the background goroutines, makes every appended record
// durable (in either durability mode) and closes the files. It is
// idempotent.
func (s *Store) Close() error {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	close(s.closing)
	s.wg.Wait()
	var errs []error
	s.mu.Lock()
	failed := s.failed != nil
	s.mu.Unlock()
	if !failed {
		if err := s.Sync(); err != nil {
			errs = append(errs, err)
		}
	}
	// Open snapshots end with the store: their pins go, and the segments
	// collected under them are deleted (a Scan still running returns
	// engines.ErrClosed).
	s.mu.Lock()
	snaps := make([]*Snapshot, 0, len(s.snaps))
	for sn := range s.snaps {
		snaps = append(snaps, sn)
	}
	obsolete := append([]*segment(nil), s.obsolete...)
	s.mu.Unlock()
	for _, sn := range snaps {
		if err := sn.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, g := range obsolete {
		if err := s.dropSegment(g); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, s.closeFiles())
	if s.cache != nil {
		s.cache.close()
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close disk store %s: %w", s.dir, err)
	}
	return nil
}

func (s *Store) closeFiles() error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	s.mu.Lock()
	segs := append([]*segment(nil), s.segs...)
	s.mu.Unlock()
	var errs []error
	for _, g := range segs {
		if err := s.unmapSegment(g); err != nil {
			errs = append(errs, err)
		}
		if g.f != nil {
			if err := g.f.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
				errs = append(errs, fmt.Errorf("close segment %d: %w", g.seq, err))
			}
		}
	}
	return errors.Join(errs...)
}
