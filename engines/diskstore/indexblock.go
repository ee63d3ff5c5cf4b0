package diskstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tabuladb/tabula/engines"
)

// Index block constants: on-disk, never change or reuse.
const (
	indexMagic     = "TABIDXBK"
	indexHeaderLen = 64
	indexVersion   = 1
	indexExt       = ".idx"
	indexTmpExt    = ".idx.tmp"
	indexKindBase  = 1
	indexKindDelta = 2
	indexOpPut     = 1
	indexOpDelete  = 2
	// indexOpPutMarked is a put of a key the owner marked (Options.ViewKey:
	// kept by both children of a split).
	indexOpPutMarked = 3
	indexMaxFileLen  = 1 << 34 // sanity bound on a block file
)

// DefaultIndexBlockBytes is Options.IndexBlockBytes's default.
const DefaultIndexBlockBytes = 8 << 20

// IndexEntry is one live record the owner's index points at, as persisted
// in an index block: the key's 64-bit hash (so a restart can place the entry
// without reading the key), its location, its key+value bytes and expiry.
type IndexEntry struct {
	Hash      uint64
	Loc       uint64
	Bytes     int64 // len(key) + len(value)
	ExpiresAt int64
	// Marked is the owner's mark of the key (NoteIndexPut's mark): view
	// rules never hide it.
	Marked bool
}

// logPos is a position in the log: records at (seq, off) and after it.
type logPos struct {
	seq uint64
	off int64
}

// indexChange is one index change with its locations resolved to log
// positions (segment sequence numbers are never reused, slots are).
type indexChange struct {
	op    byte
	hash  uint64
	pos   logPos // the new record (put)
	old   logPos // the replaced (put) or deleted record; seq 0 = none
	bytes int64
	exp   int64
	mark  bool // a put of a marked key (indexOpPutMarked on disk)
}

// indexLog is the store's side of the delta index blocks.
type indexLog struct {
	mu sync.Mutex
	// Guarded by mu.
	pending []indexChange
	broken  bool   // a change or block was lost: write no more deltas
	next    uint64 // number of the next block file
	prev    uint64 // number of the last block written (0: none yet)
	prevAt  logPos // the log position block prev describes (seq 0: unknown)
	cutAt   int64  // logBytes at the last cut
	cutTime int64  // Now at the last cut (0: none yet)
	cont    bool   // recovery may continue the chain it loaded
	// recovering is set from RecoverIndexed to FinishIndexRecovery; a
	// recovery that will write a base notes nothing.
	recovering bool

	// compact, set by RecoverIndexed when the loaded chain's deltas outgrew
	// its base, is the chain's live entries as of its last block: after
	// recovery they replace that block as a base, in the background.
	compact *indexCompaction
	// The chain on disk: base is the number of its base block (0: none
	// known); baseBytes its size; deltaBytes and deltas size the deltas
	// after it. compacting is set while a compaction runs.
	base                  uint64
	baseBytes, deltaBytes int64
	deltas                int
	compacting            bool

	// writeMu orders block writes.
	writeMu sync.Mutex
}

// indexCompaction is a base block to write in place of delta block n: the
// live entries as of n's log position, so blocks older than n can go. With
// changes nil, the compaction reads them from the chain's files.
type indexCompaction struct {
	n       uint64
	at      logPos
	changes []indexChange
	// replacedBytes and replacedDeltas size the deltas up to n (known
	// already when changes is not nil).
	replacedBytes  int64
	replacedDeltas int
}

// compactDue reports whether the chain's deltas outgrew half its base (so a
// restart reads at most 1.5× the index), or number more than
// indexMaxDeltas files. Caller holds s.ix.mu.
func (ix *indexLog) compactDue() bool {
	return ix.base != 0 && !ix.compacting && !ix.broken &&
		(2*ix.deltaBytes > ix.baseBytes && (ix.deltaBytes > 1<<20 || ix.deltas > 16) || ix.deltas > indexMaxDeltas)
}

// IndexCut is the index changes up to a log position, taken by
// CutIndexDelta and persisted by WriteIndexDelta.
type IndexCut struct {
	changes []indexChange
	at      logPos
}

func indexName(n uint64) string { return fmt.Sprintf("%016x%s", n, indexExt) }

func parseIndexName(name string) (uint64, bool) {
	base, ok := strings.CutSuffix(name, indexExt)
	if !ok || len(base) != 16 {
		return 0, false
	}
	n, err := strconv.ParseUint(base, 16, 64)
	return n, err == nil
}

// IndexBlocks reports whether the store keeps delta index blocks.
func (s *Store) IndexBlocks() bool { return s.opts.IndexBlockBytes > 0 }

// posOf resolves loc to its log position; ok is false if its segment is gone.
func (s *Store) posOf(loc uint64) (logPos, bool) {
	slot, gen, off := unpackLoc(loc)
	g := s.segAt(slot, gen)
	if g == nil {
		return logPos{}, false
	}
	return logPos{g.seq, off}, true
}

// NoteIndexPut records that the owner's index now points hash at loc (a
// record of n key+value bytes expiring at exp), replacing old (0: none);
// mark is the owner's mark of the key (see Options.ViewKey). The owner
// calls it under the key's write lock, after the index change.
func (s *Store) NoteIndexPut(hash, loc, old uint64, n, exp int64, mark bool) {
	if !s.IndexBlocks() {
		return
	}
	if s.compressedSeen.Load() {
		if h, ok := s.headerAt(loc); ok {
			n = h.total() - recordHeaderLen // the stored, not the decoded, bytes
		}
	}
	p, ok := s.posOf(loc)
	c := indexChange{op: indexOpPut, hash: hash, pos: p, bytes: n, exp: exp, mark: mark}
	if old != 0 {
		var ok2 bool
		c.old, ok2 = s.posOf(old)
		ok = ok && ok2
	}
	s.noteChange(c, ok)
}

// NoteIndexDelete records that the owner's index no longer points hash at
// old. Called as NoteIndexPut.
func (s *Store) NoteIndexDelete(hash, old uint64) {
	if !s.IndexBlocks() {
		return
	}
	p, ok := s.posOf(old)
	s.noteChange(indexChange{op: indexOpDelete, hash: hash, old: p}, ok)
}

func (s *Store) noteChange(c indexChange, ok bool) {
	s.ix.mu.Lock()
	defer s.ix.mu.Unlock()
	if s.ix.broken || (s.ix.recovering && !s.ix.cont) {
		return
	}
	if !ok {
		// Cannot happen while the owner frees only unindexed records; if it
		// does, the chain stops here and the next restart scans from the
		// last block on.
		s.ix.broken, s.ix.pending = true, nil
		s.opts.Logger.Error("diskstore: index change names no live segment; no more index blocks until reopened", "dir", s.dir)
		return
	}
	s.ix.pending = append(s.ix.pending, c)
}

// StopIndexBlocks makes the store write no more index blocks until it is
// reopened (which then replays the log from the last block written): the
// owner calls it when its index may not match the log.
func (s *Store) StopIndexBlocks(why error) {
	s.ix.mu.Lock()
	defer s.ix.mu.Unlock()
	if !s.ix.broken {
		s.opts.Logger.Warn("diskstore: no more index blocks until reopened", "dir", s.dir, "why", why)
	}
	s.ix.broken, s.ix.pending = true, nil
}

// indexMinTimedChanges is the fewest pending changes a block cut by time
// (Options.IndexBlockInterval) holds: a trickle of writes does not make a
// file per interval.
const indexMinTimedChanges = 64

// indexMaxDeltas is how many deltas a chain may have before it is
// compacted whatever their size (see compactDue).
const indexMaxDeltas = 256

// IndexDeltaDue reports whether IndexBlockBytes of log were appended since
// the last cut, or IndexBlockInterval passed with enough changes pending.
func (s *Store) IndexDeltaDue() bool {
	if !s.IndexBlocks() {
		return false
	}
	s.ix.mu.Lock()
	defer s.ix.mu.Unlock()
	if s.ix.broken || s.ix.next == 0 {
		return false
	}
	if s.logBytes.Load()-s.ix.cutAt >= s.opts.IndexBlockBytes {
		return true
	}
	iv := s.opts.IndexBlockInterval.Milliseconds()
	return iv > 0 && len(s.ix.pending) >= indexMinTimedChanges && s.opts.Now()-s.ix.cutTime >= iv
}

// CutIndexDelta takes the index changes noted so far and the log position
// they cover. The owner must call it while none of its writers is between
// appending a record and noting its index change (holding every key lock):
// then the changes are exactly those of the records before the position.
func (s *Store) CutIndexDelta() IndexCut {
	at := s.logPosition()
	s.ix.mu.Lock()
	defer s.ix.mu.Unlock()
	c := IndexCut{changes: s.ix.pending, at: at}
	s.ix.pending = nil
	s.ix.cutAt = s.logBytes.Load()
	s.ix.cutTime = s.opts.Now()
	return c
}

// logPosition is the position the next append goes to (or after).
func (s *Store) logPosition() logPos {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.head != nil {
		return logPos{s.head.seq, s.head.size.Load()}
	}
	return logPos{s.nextSeq, 0}
}

// WriteIndexDelta syncs the log (so every change in c names a durable
// record) and persists c as the next delta block. Durable when it returns
// nil. On failure the store writes no more deltas until reopened (restart
// then scans the log from the last good block on).
func (s *Store) WriteIndexDelta(c IndexCut) error {
	if !s.IndexBlocks() {
		return nil
	}
	s.ix.writeMu.Lock()
	defer s.ix.writeMu.Unlock()
	s.ix.mu.Lock()
	broken, n, prev := s.ix.broken, s.ix.next, s.ix.prev
	s.ix.mu.Unlock()
	if broken || n == 0 {
		return nil
	}
	err := s.Sync()
	var size int64
	if err == nil {
		size, err = s.writeIndexFile(n, indexKindDelta, prev, c.at, c.changes)
	}
	s.ix.mu.Lock()
	defer s.ix.mu.Unlock()
	if err != nil {
		s.ix.broken, s.ix.pending = true, nil
		return fmt.Errorf("write index block %d: %w", n, err)
	}
	s.ix.prev, s.ix.prevAt, s.ix.next = n, c.at, n+1
	s.ix.deltaBytes += size
	s.ix.deltas++
	if !s.ix.recovering && s.ix.compactDue() {
		s.startCompactionLocked(&indexCompaction{n: n, at: c.at})
	}
	return nil
}

// startCompactionLocked runs c in the background. Caller holds s.ix.mu.
func (s *Store) startCompactionLocked(c *indexCompaction) {
	select {
	case <-s.closing:
		return
	default:
	}
	s.ix.compacting = true
	s.wg.Add(1)
	go s.compactIndex(c)
}

// FinishIndexRecovery persists the index as recovered, after RecoverIndexed
// and before any append: if the chain loaded is short, the changes the
// replayed tail made (noted with NoteIndexPut/NoteIndexDelete) as its next
// delta block; else (no chain, a broken one, or deltas larger than their
// base) a new base of entries(). Durable when it returns nil.
func (s *Store) FinishIndexRecovery(entries func() []IndexEntry) error {
	if !s.IndexBlocks() {
		return nil
	}
	s.ix.mu.Lock()
	cont, compact := s.ix.cont, s.ix.compact
	s.ix.recovering, s.ix.compact = false, nil
	s.ix.mu.Unlock()
	if !cont {
		return s.WriteIndexBase(entries())
	}
	if compact != nil {
		// The chain up to the loaded blocks is complete whatever happens to
		// the tail's delta: compact it.
		s.ix.mu.Lock()
		s.startCompactionLocked(compact)
		s.ix.mu.Unlock()
	}
	return s.WriteIndexDelta(s.CutIndexDelta())
}

// compactIndex writes c's entries as a base block in place of delta block
// c.n (an atomic rename: either file describes the same index at the same
// log position, and later deltas follow either), then removes the older
// blocks. Restart work stays proportional to the index, not to its history;
// a failure only leaves the longer chain, which still loads.
func (s *Store) compactIndex(c *indexCompaction) {
	defer s.wg.Done()
	var size int64
	err := func() error {
		start := time.Now()
		s.ix.mu.Lock()
		base := s.ix.base
		s.ix.mu.Unlock()
		if c.changes == nil {
			var err error
			if c.changes, c.replacedBytes, err = s.mergeChainFiles(base, c.n); err != nil {
				return err
			}
			c.replacedDeltas = int(c.n - base)
		}
		s.ix.writeMu.Lock()
		defer s.ix.writeMu.Unlock()
		select {
		case <-s.closing:
			return nil
		default:
		}
		var err error
		if size, err = s.writeIndexFile(c.n, indexKindBase, 0, c.at, c.changes); err != nil {
			return err
		}
		if err := s.removeIndexFilesBelow(c.n); err != nil {
			return err
		}
		s.opts.Logger.Info("diskstore: index chain compacted", "dir", s.dir, "block", c.n, "entries", len(c.changes), "bytes", size, "took", time.Since(start))
		return nil
	}()
	s.ix.mu.Lock()
	defer s.ix.mu.Unlock()
	s.ix.compacting = false
	if err != nil {
		s.opts.Logger.Warn("diskstore: index chain not compacted; restarts read the longer chain", "dir", s.dir, "block", c.n, "err", err)
		s.ix.base = 0 // do not retry until reopened
		return
	}
	if size > 0 {
		// The deltas after c.n stay; their sizes are what is left.
		s.ix.base, s.ix.baseBytes = c.n, size
		s.ix.deltaBytes -= c.replacedBytes
		s.ix.deltas -= c.replacedDeltas
		// Deltas written while this compaction ran may already make the
		// chain too long again; with no more writes nothing else would
		// notice, so compact up to the newest block now.
		if s.ix.prev > c.n && s.ix.prevAt.seq != 0 && !s.ix.recovering && s.ix.compactDue() {
			s.startCompactionLocked(&indexCompaction{n: s.ix.prev, at: s.ix.prevAt})
		}
	}
}

// mergeChainFiles reads base block base and the deltas after it up to block
// n, and returns the live entries as of block n (puts minus those replaced
// or deleted later) and the bytes of the deltas read.
func (s *Store) mergeChainFiles(base, n uint64) (live []indexChange, deltaBytes int64, err error) {
	var chain []indexBlock
	for k := base; k <= n; k++ {
		blk, size, err := s.readIndexFile(k)
		if err == nil && k == base && blk.kind != indexKindBase {
			err = fmt.Errorf("block %d is not a base: %w", k, engines.ErrCorrupt)
		}
		if err == nil && k > base && (blk.kind != indexKindDelta || blk.prev != k-1) {
			err = fmt.Errorf("block %d does not continue the chain: %w", k, engines.ErrCorrupt)
		}
		if err != nil {
			return nil, 0, fmt.Errorf("read index block %d: %w", k, err)
		}
		if k > base {
			deltaBytes += size
		}
		chain = append(chain, blk)
	}
	puts, removed := mergeBlocks(chain)
	live = puts[:0]
	for _, c := range puts {
		if _, ok := removed[c.pos]; !ok {
			c.old = logPos{}
			live = append(live, c)
		}
	}
	return live, deltaBytes, nil
}

// mergeBlocks returns the put changes of a chain (base first) and the
// positions its deltas replaced or deleted.
func mergeBlocks(chain []indexBlock) (puts []indexChange, removed map[logPos]struct{}) {
	// One slice for every put of the chain: the base's (all puts), grown
	// once if its decoder left no room for the deltas' (copying the base's
	// entries again per delta would cost more than decoding them).
	n := 0
	for _, blk := range chain {
		n += len(blk.changes)
	}
	removed = map[logPos]struct{}{}
	for i, blk := range chain {
		if i == 0 && blk.kind == indexKindBase && allPuts(blk.changes) {
			puts = blk.changes
			if cap(puts) < n {
				puts = append(make([]indexChange, 0, n), puts...)
			}
			continue
		}
		if puts == nil {
			puts = make([]indexChange, 0, n)
		}
		for _, c := range blk.changes {
			if blk.kind == indexKindDelta && c.old.seq != 0 {
				removed[c.old] = struct{}{}
			}
			if c.op == indexOpPut {
				puts = append(puts, c)
			}
		}
	}
	return puts, removed
}

func allPuts(cs []indexChange) bool {
	for i := range cs {
		if cs[i].op != indexOpPut {
			return false
		}
	}
	return true
}

// WriteIndexBase persists entries (every entry of the owner's index, right
// after Recover and before any append) as a new base block, then removes
// the older blocks. Durable when it returns nil. On failure no deltas are
// written until reopened.
func (s *Store) WriteIndexBase(entries []IndexEntry) error {
	if !s.IndexBlocks() {
		return nil
	}
	s.ix.writeMu.Lock()
	defer s.ix.writeMu.Unlock()
	at := s.logPosition()
	changes := make([]indexChange, 0, len(entries))
	for _, e := range entries {
		p, ok := s.posOf(e.Loc)
		if !ok {
			s.ix.mu.Lock()
			s.ix.broken = true
			s.ix.mu.Unlock()
			return fmt.Errorf("write index base: entry at %d names no live segment", e.Loc)
		}
		changes = append(changes, indexChange{op: indexOpPut, hash: e.Hash, pos: p, bytes: e.Bytes, exp: e.ExpiresAt, mark: e.Marked})
	}
	s.ix.mu.Lock()
	n := s.ix.next
	s.ix.mu.Unlock()
	if n == 0 {
		return nil // recovered without RecoverIndexed: no chain to continue
	}
	size, err := s.writeIndexFile(n, indexKindBase, 0, at, changes)
	if err == nil {
		err = s.removeIndexFilesBelow(n)
	}
	s.ix.mu.Lock()
	defer s.ix.mu.Unlock()
	if err != nil {
		s.ix.broken = true
		return fmt.Errorf("write index base %d: %w", n, err)
	}
	s.ix.base, s.ix.baseBytes, s.ix.deltaBytes, s.ix.deltas = n, size, 0, 0
	s.ix.prev, s.ix.prevAt, s.ix.next, s.ix.pending, s.ix.cutAt, s.ix.cutTime = n, at, n+1, nil, s.logBytes.Load(), s.opts.Now()
	return nil
}

func (s *Store) removeIndexFilesBelow(n uint64) error {
	names, err := s.fs.List(s.dir)
	if err != nil {
		return err
	}
	removed := false
	for _, name := range names {
		if k, ok := parseIndexName(name); ok && k < n {
			if err := s.fs.Remove(filepath.Join(s.dir, name)); err != nil {
				return err
			}
			removed = true
		}
	}
	if removed {
		return s.fs.SyncDir(s.dir)
	}
	return nil
}

// Index block file:
//
//	 0       8         12     13    16       24       32          40          48        56        64
//	| magic | version | kind | 0   | number | prev   | tail seq  | tail off  | count   | 0 (8)   |
//	| (8)   | (4, =1) | (1)  | (3) | (8)    | (8)    | (8)       | (8)       | (8)     |         |
//	| entries ... | crc32c (4) of everything before it |
//
// magic is "TABIDXBK"; kind 1 base (the whole index), 2 delta (the changes
// since block prev, which is number-1). The block covers every record before
// (tail seq, tail off): restart applies the chain, then scans the log from
// there. An entry is an op byte, the key hash (8, little-endian), then
// uvarints: put (1, or 3 for a key the owner marked): seq, off, bytes, expiresAt, old seq (0: none), [old
// off]; delete (2): seq, off of the deleted record. Files are written to
// "<name>.tmp", fsynced, renamed, and the directory fsynced.
func encodeIndexBlock(kind byte, n, prev uint64, at logPos, changes []indexChange) []byte {
	b := make([]byte, indexHeaderLen, indexHeaderLen+len(changes)*24+4)
	copy(b, indexMagic)
	binary.LittleEndian.PutUint32(b[8:], indexVersion)
	b[12] = kind
	binary.LittleEndian.PutUint64(b[16:], n)
	binary.LittleEndian.PutUint64(b[24:], prev)
	binary.LittleEndian.PutUint64(b[32:], at.seq)
	binary.LittleEndian.PutUint64(b[40:], uint64(at.off))
	binary.LittleEndian.PutUint64(b[48:], uint64(len(changes)))
	for _, c := range changes {
		if c.op == indexOpPut && c.mark {
			b = append(b, indexOpPutMarked)
		} else {
			b = append(b, c.op)
		}
		b = binary.LittleEndian.AppendUint64(b, c.hash)
		switch c.op {
		case indexOpPut:
			b = binary.AppendUvarint(b, c.pos.seq)
			b = binary.AppendUvarint(b, uint64(c.pos.off))
			b = binary.AppendUvarint(b, uint64(c.bytes))
			b = binary.AppendUvarint(b, uint64(c.exp))
			b = binary.AppendUvarint(b, c.old.seq)
			if c.old.seq != 0 {
				b = binary.AppendUvarint(b, uint64(c.old.off))
			}
		case indexOpDelete:
			b = binary.AppendUvarint(b, c.old.seq)
			b = binary.AppendUvarint(b, uint64(c.old.off))
		}
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// indexBlock is a decoded block.
type indexBlock struct {
	kind    byte
	n, prev uint64
	at      logPos
	changes []indexChange
}

// decodeIndexBlock decodes and checks a whole block file. Errors wrap
// engines.ErrCorrupt (or ErrFormatVersion).
func decodeIndexBlock(b []byte) (blk indexBlock, err error) { return decodeIndexBlockCap(b, 0) }

// decodeIndexBlockCap is decodeIndexBlock with room for extra more changes
// in blk.changes (a chain's base then takes its deltas' puts without a
// copy of its own).
func decodeIndexBlockCap(b []byte, extra int) (blk indexBlock, err error) {
	if len(b) < indexHeaderLen+4 {
		return blk, fmt.Errorf("index block of %d bytes: %w", len(b), engines.ErrCorrupt)
	}
	body := b[:len(b)-4]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return blk, fmt.Errorf("index block crc: %w", engines.ErrCorrupt)
	}
	if string(b[:8]) != indexMagic {
		return blk, fmt.Errorf("index block magic %q: %w", b[:8], engines.ErrCorrupt)
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != indexVersion {
		return blk, fmt.Errorf("index block version %d, this build reads %d: %w", v, indexVersion, ErrFormatVersion)
	}
	blk.kind = b[12]
	if b[13]|b[14]|b[15] != 0 || binary.LittleEndian.Uint64(b[56:]) != 0 {
		return blk, fmt.Errorf("index block reserved bytes set: %w", engines.ErrCorrupt)
	}
	if blk.kind != indexKindBase && blk.kind != indexKindDelta {
		return blk, fmt.Errorf("index block kind %d: %w", blk.kind, engines.ErrCorrupt)
	}
	blk.n = binary.LittleEndian.Uint64(b[16:])
	blk.prev = binary.LittleEndian.Uint64(b[24:])
	blk.at = logPos{binary.LittleEndian.Uint64(b[32:]), int64(binary.LittleEndian.Uint64(b[40:]))}
	count := binary.LittleEndian.Uint64(b[48:])
	if count > uint64(len(body)) || blk.at.off < 0 || blk.at.off > maxSegmentSize {
		return blk, fmt.Errorf("index block header fields: %w", engines.ErrCorrupt)
	}
	blk.changes = make([]indexChange, 0, count+uint64(extra))
	p := body[indexHeaderLen:]
	bad := false
	uv := func() uint64 {
		v, k := binary.Uvarint(p)
		if k <= 0 {
			bad = true
			return 0
		}
		p = p[k:]
		return v
	}
	for range count {
		if len(p) < 9 {
			return blk, fmt.Errorf("index block entries cut: %w", engines.ErrCorrupt)
		}
		c := indexChange{op: p[0], hash: binary.LittleEndian.Uint64(p[1:])}
		p = p[9:]
		if c.op == indexOpPutMarked {
			c.op, c.mark = indexOpPut, true
		}
		switch c.op {
		case indexOpPut:
			c.pos = logPos{uv(), int64(uv())}
			c.bytes, c.exp = int64(uv()), int64(uv())
			if c.old.seq = uv(); c.old.seq != 0 {
				c.old.off = int64(uv())
			}
		case indexOpDelete:
			c.old = logPos{uv(), int64(uv())}
		default:
			return blk, fmt.Errorf("index block entry op %d: %w", c.op, engines.ErrCorrupt)
		}
		if bad || c.pos.off < 0 || c.old.off < 0 || c.bytes < 0 {
			return blk, fmt.Errorf("index block entry: %w", engines.ErrCorrupt)
		}
		blk.changes = append(blk.changes, c)
	}
	if len(p) != 0 {
		return blk, fmt.Errorf("index block has %d bytes after its entries: %w", len(p), engines.ErrCorrupt)
	}
	return blk, nil
}

// writeIndexFile writes a block durably: temp file, fsync, rename, fsync
// the directory.
func (s *Store) writeIndexFile(n uint64, kind byte, prev uint64, at logPos, changes []indexChange) (int64, error) {
	b := encodeIndexBlock(kind, n, prev, at, changes)
	final := filepath.Join(s.dir, indexName(n))
	tmp := final + ".tmp"
	f, err := s.fs.Create(tmp)
	if err != nil {
		return 0, err
	}
	if _, err := f.Write(b); err != nil {
		return 0, errors.Join(err, f.Close())
	}
	if err := f.Sync(); err != nil {
		return 0, errors.Join(err, f.Close())
	}
	if err := f.Close(); err != nil {
		return 0, err
	}
	if err := s.fs.Rename(tmp, final); err != nil {
		return 0, err
	}
	return int64(len(b)), s.fs.SyncDir(s.dir)
}

// indexRead is one block file read by readIndexFiles.
type indexRead struct {
	blk  indexBlock
	size int64
	err  error
}

// indexReadWorkers is how many block files readIndexFiles reads and
// decodes at once (a restart after a crash reads them from a cold disk:
// 51 files of 18 MB took ~100 ms one after the other).
const indexReadWorkers = 4

// readIndexFiles reads and decodes block files ns, several at once.
func (s *Store) readIndexFiles(ns []uint64) []indexRead {
	out := make([]indexRead, len(ns))
	raw := make([][]byte, len(ns))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(indexReadWorkers, len(ns)) {
		wg.Go(func() {
			for {
				k := int(next.Add(1) - 1)
				if k >= len(ns) {
					return
				}
				r := &out[k]
				raw[k], r.size, r.err = s.readIndexBytes(ns[k])
				if r.err == nil && k > 0 {
					r.blk, r.err = decodeIndexFile(ns[k], raw[k], 0)
					raw[k] = nil
				}
			}
		})
	}
	wg.Wait()
	// The first (a base, when loading a chain) is decoded last, with room
	// for the others' changes (mergeBlocks appends their puts to it).
	if out[0].err == nil {
		extra := 0
		for _, r := range out[1:] {
			extra += len(r.blk.changes)
		}
		out[0].blk, out[0].err = decodeIndexFile(ns[0], raw[0], extra)
	}
	return out
}

// indexReadChunk: a block file larger than this is read in chunks of it,
// all at once (a base of 1M keys is 18 MB).
const indexReadChunk = 2 << 20

// readIndexFile reads and decodes block file n.
func (s *Store) readIndexFile(n uint64) (indexBlock, int64, error) {
	b, size, err := s.readIndexBytes(n)
	if err != nil {
		return indexBlock{}, size, err
	}
	blk, err := decodeIndexFile(n, b, 0)
	return blk, size, err
}

// decodeIndexFile decodes block file n's bytes b, with room for extra more
// changes (see decodeIndexBlockCap), checking it is block n.
func decodeIndexFile(n uint64, b []byte, extra int) (indexBlock, error) {
	blk, err := decodeIndexBlockCap(b, extra)
	if err == nil && blk.n != n {
		err = fmt.Errorf("index file %d holds block %d: %w", n, blk.n, engines.ErrCorrupt)
	}
	return blk, err
}

// readIndexBytes reads block file n whole.
func (s *Store) readIndexBytes(n uint64) ([]byte, int64, error) {
	f, err := s.fs.Open(filepath.Join(s.dir, indexName(n)))
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return nil, 0, err
	}
	if size > indexMaxFileLen {
		return nil, 0, fmt.Errorf("index block of %d bytes: %w", size, engines.ErrCorrupt)
	}
	b := make([]byte, size)
	chunks := int((size + indexReadChunk - 1) / indexReadChunk)
	errs := make([]error, chunks)
	var wg sync.WaitGroup
	for c := range chunks {
		read := func() {
			p := b[int64(c)*indexReadChunk : min(int64(c+1)*indexReadChunk, size)]
			if k, err := f.ReadAt(p, int64(c)*indexReadChunk); k != len(p) {
				errs[c] = fmt.Errorf("read index block %d: %d of %d bytes at %d: %w", n, k, len(p), int64(c)*indexReadChunk, err)
			}
		}
		if c == chunks-1 {
			read()
		} else {
			wg.Go(read)
		}
	}
	wg.Wait()
	return b, size, errors.Join(errs...)
}

// indexFileIsBase reads block n's header only and reports whether it says
// it is a base (checked in full when read).
func (s *Store) indexFileIsBase(n uint64) bool {
	f, err := s.fs.Open(filepath.Join(s.dir, indexName(n)))
	if err != nil {
		return false
	}
	defer f.Close()
	var h [13]byte
	k, _ := f.ReadAt(h[:], 0)
	return k == len(h) && string(h[:8]) == indexMagic && h[12] == indexKindBase
}

// indexState is what the block chain says the index held at its position.
type indexState struct {
	// puts are the chain's put changes; those whose position is in
	// removed were replaced or deleted later. A position is put at most
	// once and removed at most once (segment numbers are never reused), so
	// the live records are puts minus removed, in any order.
	puts    []indexChange
	removed map[logPos]struct{}
	// live is, after resolveIndex, the puts not removed whose segments
	// remain (what a base block at the chain's position holds).
	live   []indexChange
	at     logPos
	blocks int
	bytes  int64
	// baseBytes and deltaBytes size the chain (to decide on compaction);
	// last is the last block's number.
	baseBytes, deltaBytes int64
	base, last            uint64
	stale                 int // entries dropped: their segment was freed
}

// loadIndexChain lists the block files, sets the next block number, removes
// temp files, and loads the newest base and the deltas that follow it in an
// unbroken chain. ok is false if there is no readable base.
func (s *Store) loadIndexChain() (st indexState, ok bool) {
	names, err := s.fs.List(s.dir)
	if err != nil {
		s.opts.Logger.Warn("diskstore: cannot list index blocks; scanning the whole log", "dir", s.dir, "err", err)
		return st, false
	}
	var nums []uint64
	for _, name := range names {
		if strings.HasSuffix(name, indexTmpExt) {
			_ = s.fs.Remove(filepath.Join(s.dir, name)) // an unfinished block
			continue
		}
		if n, ok := parseIndexName(name); ok {
			nums = append(nums, n)
		}
	}
	sort.Slice(nums, func(i, j int) bool { return nums[i] < nums[j] })
	s.ix.next = 1
	if len(nums) > 0 {
		s.ix.next = nums[len(nums)-1] + 1
	}
	have := map[uint64]bool{}
	for _, n := range nums {
		have[n] = true
	}
	var base indexBlock
	var deltas []indexRead // read ahead with the base
	for i := len(nums) - 1; i >= 0; i-- {
		if !s.indexFileIsBase(nums[i]) {
			continue
		}
		// The base and the deltas after it, read and decoded at once.
		want := []uint64{nums[i]}
		for n := nums[i] + 1; have[n]; n++ {
			want = append(want, n)
		}
		reads := s.readIndexFiles(want)
		r := reads[0]
		st.bytes += r.size
		if r.err != nil {
			s.opts.Logger.Warn("diskstore: unreadable index block", "dir", s.dir, "block", nums[i], "err", r.err)
			continue
		}
		if r.blk.kind == indexKindBase {
			base, ok = r.blk, true
			st.baseBytes = r.size
			deltas = reads[1:]
			break
		}
	}
	if !ok {
		return st, false
	}
	chain := []indexBlock{base}
	for i, r := range deltas {
		n := base.n + 1 + uint64(i)
		blk, size, err := r.blk, r.size, r.err
		st.bytes += size
		if err == nil && (blk.kind != indexKindDelta || blk.prev != n-1) {
			err = fmt.Errorf("block %d (kind %d, prev %d) does not continue the chain: %w", n, blk.kind, blk.prev, engines.ErrCorrupt)
		}
		if err != nil {
			s.opts.Logger.Warn("diskstore: index chain ends at a bad block; scanning the log from the block before", "dir", s.dir, "block", n, "err", err)
			break
		}
		chain = append(chain, blk)
		st.deltaBytes += size
	}
	st.puts, st.removed = mergeBlocks(chain)
	for _, blk := range chain {
		st.at = blk.at
		st.last = blk.n
		st.blocks++
	}
	st.base = base.n
	return st, true
}
