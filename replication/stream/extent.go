package stream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/vfs"
)

// Extent is one replica of an extent: a file of blocks (format in the
// package comment) and its commit length. It is safe for concurrent use:
// writers (AppendEntries, AppendRaw, Sync, Freeze, Seal) are serialised;
// reads run in parallel with them and with each other.
//
// Durability: AppendEntries and AppendRaw only write; the bytes are durable
// once a later Sync, Freeze or Seal returned. Length reports the durable
// length, which is what a reader may read and what a replica reports as its
// commit length. In a store with a journal (a node's), the writes also
// queue a journal record and Sync waits for the journal's shared fsync;
// the extent file itself is fsynced by checkpoints and by Seal.
type Extent struct {
	id      uint64
	primary bool
	cfg     ReplicaConfig // from the file header
	version uint32        // the file's format version
	base    int64         // file offset of extent offset 0 (the header's size)
	fs      vfs.FS
	path    string
	jr      *journal // nil: Sync fsyncs the file

	// wmu serialises the writers.
	wmu sync.Mutex

	// io is held shared around every use of f and exclusively by Close, so
	// the file is closed only once no read is inside it.
	io sync.RWMutex
	f  vfs.File // nil once closed

	mu sync.Mutex
	// Guarded by mu.
	written    int64   // extent bytes written: blocks [0, written)
	durable    int64   // extent bytes synced
	starts     []int64 // offset of every block below written
	lastSeq    uint64  // seq of the last block below written
	durableSeq uint64  // seq of the last block below durable
	sealed     bool
	frozen     bool
	closed     bool  // f is nil or about to be: Close ran
	broken     error // a failed write or fsync: no more writes
	corrupt    error // the first corruption a recovery, read or scrub met
	// committed is the commit point: on a primary the length
	// acknowledged, on a secondary the last commit length its primary
	// told it (CommittedLength caps it at durable). Memory only.
	committed int64
	// heardAt is when committed was last told (a secondary) or raised.
	heardAt time.Time
	// changed, if not nil, is closed (and cleared) when committed,
	// durable or sealed change: WaitCommitted's wake-up.
	changed chan struct{}
	// wch is closed (and set to nil) when written rises or the replica
	// can no longer be written (waitWritten).
	wch chan struct{}
	// With a journal: the ticket of the last record queued, and written
	// and lastSeq after it (what Sync makes durable).
	jticket uint64
	jend    int64
	jseq    uint64
	// dirty: bytes written to the file since its last fsync (a
	// checkpoint's). fileErr: an fsync of the file failed, so its content
	// is unknown and only the journal holds the writes.
	dirty   bool
	fileErr error
}

// EntryData is an entry to append: its sequence number and block payloads.
type EntryData struct {
	Seq    uint64
	Blocks [][]byte
}

// EntryLoc is where an appended entry landed.
type EntryLoc struct {
	Offset int64
	// Sizes are the encoded sizes of its blocks.
	Sizes []int64
}

// ReplicaInfo describes the state of one replica on its node.
type ReplicaInfo struct {
	ID      uint64
	Primary bool
	// Length is the durable length (the sealed length once sealed).
	Length  int64
	LastSeq uint64
	Sealed  bool
	Frozen  bool
	// Broken: a write or fsync failed; the replica takes no more appends.
	Broken bool
	// Corrupt: a block failed its CRC (at recovery, a read or a scrub).
	Corrupt bool
}

// createExtentFile durably creates an empty extent file at path: header,
// fsync, directory fsync.
func createExtentFile(fs vfs.FS, path string, id uint64, cfg ReplicaConfig) error {
	h, err := appendFileHeader(nil, id, cfg)
	if err != nil {
		return fmt.Errorf("create extent %d: %w", id, err)
	}
	f, err := fs.Create(path)
	if err != nil {
		return fmt.Errorf("create extent %d: %w", id, err)
	}
	if _, err := f.Write(h); err != nil {
		return errors.Join(fmt.Errorf("write extent %d header: %w", id, err), f.Close())
	}
	if err := f.Sync(); err != nil {
		return errors.Join(fmt.Errorf("sync extent %d: %w", id, err), f.Close())
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close extent %d: %w", id, err)
	}
	if err := fs.SyncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("sync directory of extent %d: %w", id, err)
	}
	return nil
}

// openExtent opens the extent file at path and recovers it: every block is
// read and checked; an unfinished entry or a torn block at the end (with no
// valid block after it) is cut off, durably. A bad block followed by a valid
// one is corruption, not a torn tail: the extent opens, marked corrupt, and
// reads of that block fail. want is the extent id the file must carry.
func openExtent(fs vfs.FS, path string, want uint64) (*Extent, error) {
	f, err := fs.OpenReadWrite(path)
	if err != nil {
		return nil, fmt.Errorf("open extent %d: %w", want, err)
	}
	e := &Extent{fs: fs, path: path, f: f}
	if err := e.recover(want); err != nil {
		return nil, errors.Join(fmt.Errorf("recover extent %d: %w", want, err), f.Close())
	}
	return e, nil
}

// scanner reads an extent file sequentially through a window.
type scanner struct {
	f      vfs.File
	base   int64 // file offset of extent offset 0
	size   int64 // extent bytes in the file
	buf    []byte
	bufOff int64
}

// peek returns the bytes at extent offset off: at least n of them, or all
// that remain if fewer.
func (s *scanner) peek(off int64, n int) ([]byte, error) {
	want := min(int64(n), s.size-off)
	if off >= s.bufOff && off+want <= s.bufOff+int64(len(s.buf)) {
		return s.buf[off-s.bufOff:], nil
	}
	m := min(max(int64(n), 1<<20), s.size-off)
	if int64(cap(s.buf)) < m {
		s.buf = make([]byte, m)
	}
	s.buf = s.buf[:m]
	if _, err := s.f.ReadAt(s.buf, s.base+off); err != nil && !(errors.Is(err, io.EOF)) {
		return nil, err
	}
	s.bufOff = off
	return s.buf, nil
}

// block decodes the block at off.
func (s *scanner) block(id uint64, off int64) (block, error) {
	h, err := s.peek(off, BlockHeaderLen)
	if err != nil {
		return block{}, err
	}
	if len(h) < BlockHeaderLen {
		return block{}, fmt.Errorf("block header at %d cut at %d bytes: %w", off, len(h), engines.ErrCorrupt)
	}
	_, _, n, _, err := parseBlockHeader(h)
	if err != nil {
		return block{}, fmt.Errorf("block at %d: %w", off, err)
	}
	b, err := s.peek(off, BlockHeaderLen+n)
	if err != nil {
		return block{}, err
	}
	return decodeBlock(b, id, off)
}

// resync finds the first offset at or after from where a valid block
// starts, or -1.
func (s *scanner) resync(id uint64, from int64) (int64, error) {
	for q := from; q+BlockHeaderLen <= s.size; q++ {
		h, err := s.peek(q, BlockHeaderLen)
		if err != nil {
			return -1, err
		}
		if _, _, _, _, err := parseBlockHeader(h); err != nil {
			continue
		}
		if _, err := s.block(id, q); err == nil {
			return q, nil
		} else if !errors.Is(err, engines.ErrCorrupt) {
			return -1, err
		}
	}
	return -1, nil
}

func (e *Extent) recover(want uint64) error {
	size, err := e.f.Size()
	if err != nil {
		return err
	}
	var h [fileHeaderLen]byte
	if size < fileHeaderLen {
		return fmt.Errorf("extent file of %d bytes: %w", size, engines.ErrCorrupt)
	}
	if _, err := e.f.ReadAt(h[:], 0); err != nil {
		return err
	}
	hd, trailer, err := parseFileHeader(h[:])
	if err != nil {
		return err
	}
	if trailer > 0 {
		if size < hd.size {
			return fmt.Errorf("extent file of %d bytes, header of %d: %w", size, hd.size, engines.ErrCorrupt)
		}
		t := make([]byte, trailer)
		if _, err := e.f.ReadAt(t, fileHeaderLen); err != nil {
			return err
		}
		if err := parseHeaderTrailer(&hd, t); err != nil {
			return err
		}
	}
	id := hd.extent
	if id != want {
		return fmt.Errorf("extent file holds extent %d: %w", id, engines.ErrCorrupt)
	}
	if hd.cfg.Ack == "" {
		hd.cfg.Ack = AckAll
	}
	e.id, e.primary, e.cfg, e.version, e.base = id, hd.cfg.Primary, hd.cfg, hd.version, hd.size
	s := &scanner{f: e.f, base: e.base, size: size - e.base}
	var (
		pos        int64 // next block
		entryStart int64 // start of the entry pos is in
		seq        uint64
		cut        = int64(-1)
	)
	for pos < s.size {
		blk, err := s.block(id, pos)
		if err != nil {
			if !errors.Is(err, engines.ErrCorrupt) {
				return err
			}
			next, rerr := s.resync(id, pos+1)
			if rerr != nil {
				return rerr
			}
			if next < 0 {
				cut = entryStart // a torn tail: drop the unfinished entry
				break
			}
			// Damage in the middle: keep the span as one unreadable block.
			if e.corrupt == nil {
				e.corrupt = err
			}
			e.starts = append(e.starts, pos)
			pos, entryStart = next, next
			continue
		}
		if blk.kind == kindSeal {
			if entryStart != pos {
				return fmt.Errorf("seal block at %d inside an entry: %w", pos, engines.ErrCorrupt)
			}
			e.sealed = true
			e.wroteLocked() // waitWritten callers see it cannot be written
			if end := pos + blk.size(); end < s.size {
				// Bytes after a seal were never acknowledged: drop them.
				if err := e.truncateFile(end); err != nil {
					return err
				}
			}
			break
		}
		e.starts = append(e.starts, pos)
		pos += blk.size()
		if !blk.continues() {
			entryStart, seq = pos, blk.seq
		}
	}
	if !e.sealed && entryStart < pos {
		cut = entryStart
	}
	if cut >= 0 {
		i, _ := slices.BinarySearch(e.starts, cut)
		e.starts = e.starts[:i]
		if err := e.truncateFile(cut); err != nil {
			return err
		}
		pos = cut
	}
	e.written, e.durable = entryStart, entryStart
	if cut >= 0 {
		e.written, e.durable = cut, cut
	}
	e.lastSeq, e.durableSeq = seq, seq
	return nil
}

// truncateFile cuts the file after extent offset end, durably.
func (e *Extent) truncateFile(end int64) error {
	if err := e.f.Truncate(e.base + end); err != nil {
		return fmt.Errorf("cut extent %d at %d: %w", e.id, end, err)
	}
	if err := e.f.Sync(); err != nil {
		return fmt.Errorf("sync extent %d: %w", e.id, err)
	}
	return nil
}

// ID is the extent's id.
func (e *Extent) ID() uint64 { return e.id }

// Config is what the replica was created with (its file header). A
// replica of format version 1 reports no secondaries.
func (e *Extent) Config() ReplicaConfig {
	c := e.cfg
	c.Secondaries = slices.Clone(c.Secondaries)
	return c
}

// Info reports the replica's state.
func (e *Extent) Info() ReplicaInfo {
	e.mu.Lock()
	defer e.mu.Unlock()
	return ReplicaInfo{
		ID: e.id, Primary: e.primary, Length: e.durable, LastSeq: e.durableSeq,
		Sealed: e.sealed, Frozen: e.frozen, Broken: e.broken != nil, Corrupt: e.corrupt != nil,
	}
}

// Length is the durable length.
func (e *Extent) Length() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.durable
}

// writableLocked says why the extent takes no writes, or nil.
func (e *Extent) writableLocked() error {
	switch {
	case e.closed:
		return fmt.Errorf("extent %d: %w", e.id, ErrClosed)
	case e.sealed:
		return fmt.Errorf("extent %d: %w", e.id, ErrSealed)
	case e.broken != nil:
		return fmt.Errorf("extent %d: %w (%v)", e.id, ErrBroken, e.broken)
	case e.frozen:
		return fmt.Errorf("extent %d: %w", e.id, ErrFrozen)
	}
	return nil
}

// checkEntries validates entries against the block and append limits.
func checkEntries(entries []EntryData) error {
	var total int64
	for i, en := range entries {
		if len(en.Blocks) == 0 {
			return fmt.Errorf("entry %d has no blocks: %w", i, ErrTooLarge)
		}
		for _, b := range en.Blocks {
			if len(b) > MaxBlockBytes {
				return fmt.Errorf("block of %d bytes (max %d): %w", len(b), MaxBlockBytes, ErrTooLarge)
			}
			total += int64(len(b))
		}
	}
	if total > MaxAppendBytes {
		return fmt.Errorf("append of %d bytes (max %d): %w", total, MaxAppendBytes, ErrTooLarge)
	}
	return nil
}

// AppendEntries writes entries after the last one, each atomically, and
// returns where they landed and their encoding (the bytes a primary
// replicates). Nothing is durable until Sync. A failed write breaks the
// extent.
func (e *Extent) AppendEntries(entries []EntryData) (locs []EntryLoc, start int64, raw []byte, err error) {
	locs, start, raw, _, err = e.appendEntries(entries)
	return locs, start, raw, err
}

// syncPoint is where one write left an extent: what a sync of that write
// alone waits for (syncTo).
type syncPoint struct {
	ticket uint64 // its journal ticket (0 without a journal)
	end    int64  // the written length after it
	seq    uint64 // its last entry's sequence number
}

// appendEntries is AppendEntries, also returning the write's sync point.
func (e *Extent) appendEntries(entries []EntryData) (locs []EntryLoc, start int64, raw []byte, sp syncPoint, err error) {
	if err := checkEntries(entries); err != nil {
		return nil, 0, nil, sp, err
	}
	e.wmu.Lock()
	defer e.wmu.Unlock()
	e.mu.Lock()
	err = e.writableLocked()
	start = e.written
	e.mu.Unlock()
	if err != nil {
		return nil, 0, nil, sp, err
	}
	size := 0
	for _, en := range entries {
		for _, b := range en.Blocks {
			size += BlockHeaderLen + len(b)
		}
	}
	raw = make([]byte, 0, size)
	locs = make([]EntryLoc, len(entries))
	var starts []int64
	off := start
	for i, en := range entries {
		locs[i] = EntryLoc{Offset: off, Sizes: make([]int64, len(en.Blocks))}
		for j, b := range en.Blocks {
			var flags byte
			if j < len(en.Blocks)-1 {
				flags = flagContinues
			}
			raw = appendBlock(raw, e.id, off, kindData, flags, en.Seq, b)
			starts = append(starts, off)
			locs[i].Sizes[j] = blockSize(len(b))
			off += blockSize(len(b))
		}
	}
	if err := e.write(raw); err != nil {
		return nil, 0, nil, sp, err
	}
	t, err := e.journal(start, raw)
	if err != nil {
		return nil, 0, nil, sp, err
	}
	e.mu.Lock()
	e.starts = append(e.starts, starts...)
	e.written = off
	e.lastSeq = entries[len(entries)-1].Seq
	e.jticket, e.jend, e.jseq = t, e.written, e.lastSeq
	e.wroteLocked()
	e.mu.Unlock()
	return locs, start, raw, syncPoint{ticket: t, end: off, seq: entries[len(entries)-1].Seq}, nil
}

// write writes raw at the end of the file, breaking the extent on failure.
// The caller holds wmu.
func (e *Extent) write(raw []byte) error {
	e.io.RLock()
	var err error
	if e.f == nil {
		err = ErrClosed
	} else {
		_, err = e.f.Write(raw)
	}
	e.io.RUnlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		err = fmt.Errorf("write extent %d: %w", e.id, err)
		if e.broken == nil {
			e.broken = err
			e.wroteLocked() // waitWritten callers see it cannot be written
		}
		return err
	}
	e.dirty = true
	return nil
}

// journal queues the record of raw, just written at off, in the journal
// (if any) and returns its ticket. A failure breaks the extent: the file
// holds bytes the journal does not. The caller holds wmu, so an extent's
// records are queued in offset order.
func (e *Extent) journal(off int64, raw []byte) (uint64, error) {
	if e.jr == nil {
		return 0, nil
	}
	t, err := e.jr.add(journalRecord{kind: journalKindData, extent: e.id, off: off, data: raw})
	if err != nil {
		err = fmt.Errorf("journal extent %d: %w", e.id, err)
		e.Break(err)
		return 0, err
	}
	return t, nil
}

// AppendRaw writes encoded blocks at offset off, which must be the
// replica's written length (a secondary taking a primary's entries, or a
// copy being filled). Every block is checked first; with entryEnd the last
// must end an entry. Nothing is durable until Sync.
func (e *Extent) AppendRaw(off int64, raw []byte, entryEnd bool) (end int64, err error) {
	end, _, err = e.appendRaw(off, raw, entryEnd)
	return end, err
}

// appendRaw is AppendRaw, also returning the write's sync point.
func (e *Extent) appendRaw(off int64, raw []byte, entryEnd bool) (end int64, sp syncPoint, err error) {
	if len(raw) > MaxAppendBytes+MaxAppendBytes/8 {
		return 0, sp, fmt.Errorf("replicate of %d bytes: %w", len(raw), ErrTooLarge)
	}
	var starts []int64
	var seq uint64
	cont := false
	end = off
	if err := DecodeBlocks(raw, e.id, off, func(o int64, s uint64, c bool, p []byte) error {
		starts = append(starts, o)
		seq, cont = s, c
		end = o + blockSize(len(p))
		return nil
	}); err != nil {
		return 0, sp, fmt.Errorf("replicate to extent %d: %w", e.id, err)
	}
	if end-off != int64(len(raw)) {
		return 0, sp, fmt.Errorf("replicate to extent %d: a seal block in the data: %w", e.id, engines.ErrCorrupt)
	}
	if entryEnd && cont {
		return 0, sp, fmt.Errorf("replicate to extent %d: data ends inside an entry: %w", e.id, ErrBadRange)
	}
	e.wmu.Lock()
	defer e.wmu.Unlock()
	e.mu.Lock()
	err = e.writableLocked()
	written := e.written
	e.mu.Unlock()
	if err != nil {
		return 0, sp, err
	}
	if off != written {
		return 0, sp, fmt.Errorf("replicate to extent %d at %d, its length is %d: %w", e.id, off, written, ErrOffset)
	}
	if len(raw) == 0 {
		return off, sp, nil
	}
	if err := e.write(raw); err != nil {
		return 0, sp, err
	}
	t, err := e.journal(off, raw)
	if err != nil {
		return 0, sp, err
	}
	e.mu.Lock()
	e.starts = append(e.starts, starts...)
	e.written = end
	if !cont {
		e.lastSeq = seq
	}
	e.jticket, e.jend, e.jseq = t, e.written, e.lastSeq
	sp = syncPoint{ticket: t, end: e.written, seq: e.lastSeq}
	e.wroteLocked()
	e.mu.Unlock()
	return end, sp, nil
}

// wroteLocked wakes the waitWritten callers; the caller holds mu and
// has raised written.
func (e *Extent) wroteLocked() {
	if e.wch != nil {
		close(e.wch)
		e.wch = nil
	}
}

// overtakeWait bounds waitWritten: a call sent before arrives within
// milliseconds, and a gap nothing fills (a replica that lost data) fails
// its Replicate soon.
const overtakeWait = time.Second

// waitWritten blocks until the replica's written length reaches off, or it
// cannot (sealed, broken, closed, frozen), or ctx ends, or overtakeWait
// passed: a secondary's Replicate that overtook the one before it (a
// primary keeps several in flight) waits for it rather than fail at a
// gap. It does not say whether off was reached: the write that follows
// checks.
func (e *Extent) waitWritten(ctx context.Context, off int64) {
	var timeout <-chan time.Time
	for {
		e.mu.Lock()
		if e.written >= off || e.writableLocked() != nil {
			e.mu.Unlock()
			return
		}
		if e.wch == nil {
			e.wch = make(chan struct{})
		}
		ch := e.wch
		e.mu.Unlock()
		if timeout == nil {
			t := time.NewTimer(overtakeWait)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return
		case <-timeout:
			return
		}
	}
}

// Sync makes everything written durable. A failed fsync breaks the extent.
func (e *Extent) Sync() error {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	return e.syncLocked()
}

// syncTo makes the write that left sp durable, and every one before it.
// With a journal it waits for that write's journal ticket alone, without
// the writers' lock, so later appends go on meanwhile (an appender syncs
// one batch while writing the next); a later write is not waited for.
// Without a journal it is Sync.
func (e *Extent) syncTo(sp syncPoint) error {
	if e.jr == nil {
		return e.Sync()
	}
	e.mu.Lock()
	done, broken, sealed := e.durable >= sp.end, e.broken, e.sealed
	e.mu.Unlock()
	if broken != nil {
		return fmt.Errorf("extent %d: %w (%v)", e.id, ErrBroken, broken)
	}
	if done || sealed {
		return nil
	}
	if err := e.jr.wait(sp.ticket); err != nil {
		err = fmt.Errorf("sync extent %d: %w", e.id, err)
		e.Break(err)
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.sealed && sp.end > e.durable {
		e.durable, e.durableSeq = sp.end, sp.seq
		e.notifyLocked()
	}
	return nil
}

// syncLocked is Sync; the caller holds wmu.
func (e *Extent) syncLocked() error {
	if e.jr != nil {
		return e.syncJournalLocked()
	}
	e.mu.Lock()
	written, seq, broken, sealed := e.written, e.lastSeq, e.broken, e.sealed
	done := e.durable == written
	e.mu.Unlock()
	if broken != nil {
		return fmt.Errorf("extent %d: %w (%v)", e.id, ErrBroken, broken)
	}
	if done || sealed {
		return nil
	}
	e.io.RLock()
	var err error
	if e.f == nil {
		err = ErrClosed
	} else {
		err = e.f.Sync()
	}
	e.io.RUnlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		err = fmt.Errorf("sync extent %d: %w", e.id, err)
		if e.broken == nil {
			e.broken = err
			e.wroteLocked() // waitWritten callers see it cannot be written
		}
		return err
	}
	e.durable, e.durableSeq = written, seq
	e.dirty = false
	e.notifyLocked()
	return nil
}

// syncJournalLocked is syncLocked with a journal: it waits until the
// extent's last journal record is durable. The caller holds wmu.
func (e *Extent) syncJournalLocked() error {
	e.mu.Lock()
	sp := syncPoint{ticket: e.jticket, end: e.jend, seq: e.jseq}
	e.mu.Unlock()
	return e.syncTo(sp)
}

// syncFile fsyncs the extent file if written since its last fsync: a
// checkpoint, after which the journal no longer needs to hold the writes.
// A closed extent (deleted, or replaced by a sealed copy) needs none. A
// failed fsync breaks the extent and is remembered: its file can no
// longer be trusted, so no checkpoint passes it.
func (e *Extent) syncFile() error {
	e.mu.Lock()
	dirty, ferr := e.dirty, e.fileErr
	e.dirty = false
	e.mu.Unlock()
	if ferr != nil {
		return ferr
	}
	if !dirty {
		return nil
	}
	e.io.RLock()
	var err error
	if e.f != nil {
		err = e.f.Sync()
	}
	e.io.RUnlock()
	if err != nil {
		err = fmt.Errorf("checkpoint extent %d: %w", e.id, err)
		e.mu.Lock()
		e.fileErr = err
		if e.broken == nil {
			e.broken = err
			e.wroteLocked() // waitWritten callers see it cannot be written
		}
		e.mu.Unlock()
	}
	return err
}

// Freeze stops the replica taking appends (the first step of a seal) and
// returns its durable length and last sequence number once everything
// written is synced. A sealed replica reports its sealed length.
func (e *Extent) Freeze() (length int64, lastSeq uint64, sealed bool, err error) {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	e.mu.Lock()
	e.frozen = true
	e.wroteLocked() // waitWritten callers see it cannot be written
	sealed, broken := e.sealed, e.broken
	e.mu.Unlock()
	if !sealed && broken == nil {
		if err := e.syncLocked(); err != nil {
			return 0, 0, false, err
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.durable, e.durableSeq, e.sealed, nil
}

// Seal cuts the replica at length (an entry boundary not beyond what it
// holds), writes the seal block and syncs: when it returns the replica is
// durably sealed and takes no more appends. Sealing again at the same
// length is a no-op; at another length it fails with ErrSealConflict. It
// returns the sequence number of the last entry kept.
func (e *Extent) Seal(length int64) (lastSeq uint64, err error) {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	e.mu.Lock()
	sealed, written, durable, broken, closed := e.sealed, e.written, e.durable, e.broken, e.closed
	e.mu.Unlock()
	switch {
	case closed:
		return 0, fmt.Errorf("seal extent %d: %w", e.id, ErrClosed)
	case sealed && length == written:
		return e.Info().LastSeq, nil
	case sealed:
		return 0, fmt.Errorf("seal extent %d at %d, sealed at %d: %w", e.id, length, written, ErrSealConflict)
	case broken != nil && length > durable:
		// A broken replica (a failed write or replication) vouches only
		// for what it synced.
		return 0, fmt.Errorf("seal extent %d at %d, it holds %d durably: %w (%v)", e.id, length, durable, ErrBroken, broken)
	case length > written || length < 0:
		return 0, fmt.Errorf("seal extent %d at %d, it holds %d: %w", e.id, length, written, ErrShort)
	}
	// A broken replica is sealed within its durable bytes: they are
	// intact (a primary breaks its extent when a secondary fails, and may
	// hold the only complete copy of what a quorum acknowledged).
	e.mu.Lock()
	i, found := slices.BinarySearch(e.starts, length)
	e.mu.Unlock()
	if !found && length != written {
		return 0, fmt.Errorf("seal extent %d at %d: not a block boundary: %w", e.id, length, ErrBadRange)
	}
	if i > 0 {
		e.mu.Lock()
		prev := e.starts[i-1]
		e.mu.Unlock()
		var h [BlockHeaderLen]byte
		if err := e.readAt(h[:], prev); err != nil {
			return 0, err
		}
		_, flags, _, seq, err := parseBlockHeader(h[:])
		if err != nil {
			return 0, fmt.Errorf("seal extent %d: %w", e.id, err)
		}
		if flags&flagContinues != 0 {
			return 0, fmt.Errorf("seal extent %d at %d: inside an entry: %w", e.id, length, ErrBadRange)
		}
		lastSeq = seq
	}
	if e.jr != nil {
		// The seal goes through the journal first: the file is cut below
		// data the journal holds, and a crash may keep that cut without
		// the seal block; the replay then finishes the seal.
		t, err := e.jr.add(journalRecord{kind: journalKindSeal, extent: e.id, off: length})
		if err == nil {
			err = e.jr.wait(t)
		}
		if err != nil {
			err = fmt.Errorf("seal extent %d: %w", e.id, err)
			e.Break(err)
			return 0, err
		}
	}
	e.io.RLock()
	err = func() error {
		if e.f == nil {
			return ErrClosed
		}
		if length < written {
			if err := e.f.Truncate(e.base + length); err != nil {
				return err
			}
		}
		if _, err := e.f.Write(sealBlock(e.id, length)); err != nil {
			return err
		}
		return e.f.Sync()
	}()
	e.io.RUnlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		err = fmt.Errorf("seal extent %d: %w", e.id, err)
		if e.broken == nil {
			e.broken = err
			e.wroteLocked() // waitWritten callers see it cannot be written
		}
		if e.fileErr == nil {
			e.fileErr = err // keep the journal's seal record for the replay
		}
		return 0, err
	}
	e.dirty = false
	e.starts = e.starts[:i]
	e.written, e.durable = length, length
	e.lastSeq, e.durableSeq = lastSeq, lastSeq
	e.sealed, e.frozen = true, true
	e.wroteLocked() // waitWritten callers see it cannot be written
	e.broken = nil  // sealed and synced: whole again, and immutable
	e.notifyLocked()
	return lastSeq, nil
}

// readAt reads len(p) bytes at extent offset off.
func (e *Extent) readAt(p []byte, off int64) error {
	e.io.RLock()
	defer e.io.RUnlock()
	if e.f == nil {
		return fmt.Errorf("read extent %d: %w", e.id, ErrClosed)
	}
	if _, err := e.f.ReadAt(p, e.base+off); err != nil {
		return fmt.Errorf("read extent %d at %d: %w", e.id, off, err)
	}
	return nil
}

// Read returns whole encoded blocks starting at block boundary off: those
// that end within off+maxLen, but at least one, and none past the durable
// length end (also returned). Every block is checked; a bad one fails the
// read with engines.ErrCorrupt and marks the replica corrupt. A read at end
// returns no data.
func (e *Extent) Read(off, maxLen int64) (raw []byte, end int64, sealed bool, err error) {
	e.mu.Lock()
	end, sealed = e.durable, e.sealed
	i, found := slices.BinarySearch(e.starts, off)
	var stop int64
	if found && off < end {
		last := i
		for last+1 < len(e.starts) {
			next := blockEnd(e.starts, last+1, e.written)
			if next > end || next-off > maxLen {
				break
			}
			last++
		}
		stop = blockEnd(e.starts, last, e.written)
	}
	e.mu.Unlock()
	if off == end {
		return nil, end, sealed, nil
	}
	if !found || off > end || stop > end {
		return nil, end, sealed, fmt.Errorf("read extent %d at %d (length %d): %w", e.id, off, end, ErrBadRange)
	}
	raw = make([]byte, stop-off)
	if err := e.readAt(raw, off); err != nil {
		return nil, end, sealed, err
	}
	if err := DecodeBlocks(raw, e.id, off, func(int64, uint64, bool, []byte) error { return nil }); err != nil {
		err = fmt.Errorf("read extent %d: %w", e.id, err)
		e.markCorrupt(err)
		return nil, end, sealed, err
	}
	return raw, end, sealed, nil
}

// blockEnd is where block i of starts ends: the next block's start, or end.
func blockEnd(starts []int64, i int, end int64) int64 {
	if i+1 < len(starts) {
		return starts[i+1]
	}
	return end
}

func (e *Extent) markCorrupt(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.corrupt == nil {
		e.corrupt = err
	}
}

// Scrub re-reads and checks every durable block (and the seal block of a
// sealed replica). The first bad one is returned (wrapping
// engines.ErrCorrupt) and marks the replica corrupt. stop, if it returns
// true between chunks, ends the scrub early with a nil error.
func (e *Extent) Scrub(stop func() bool) error {
	var off int64
	for {
		if stop != nil && stop() {
			return nil
		}
		raw, end, sealed, err := e.Read(off, 4<<20)
		if err != nil {
			return err
		}
		if len(raw) == 0 {
			if sealed {
				var b [BlockHeaderLen + 8]byte
				if err := e.readAt(b[:], end); err != nil {
					return err
				}
				if blk, err := decodeBlock(b[:], e.id, end); err != nil || blk.kind != kindSeal {
					if err == nil {
						err = fmt.Errorf("no seal block at %d: %w", end, engines.ErrCorrupt)
					}
					err = fmt.Errorf("scrub extent %d: %w", e.id, err)
					e.markCorrupt(err)
					return err
				}
			}
			return nil
		}
		off += int64(len(raw))
	}
}

// Close closes the file once no read is inside it. Idempotent.
func (e *Extent) Close() error {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	e.io.Lock()
	defer e.io.Unlock()
	if e.f == nil {
		return nil
	}
	e.mu.Lock()
	e.closed = true // before f goes: readers under mu alone see it
	e.wroteLocked() // waitWritten callers see it cannot be written
	e.mu.Unlock()
	err := e.f.Close()
	e.f = nil
	e.mu.Lock()
	e.notifyLocked()
	e.mu.Unlock()
	if err != nil {
		return fmt.Errorf("close extent %d: %w", e.id, err)
	}
	return nil
}

// Break makes the replica refuse further appends: a primary whose
// replication failed no longer knows what its secondaries hold, so the
// extent must be sealed.
func (e *Extent) Break(cause error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.broken == nil {
		e.broken = cause
		e.wroteLocked() // waitWritten callers see it cannot be written
	}
}

// notifyLocked wakes the WaitCommitted callers; the caller holds mu.
func (e *Extent) notifyLocked() {
	if e.changed != nil {
		close(e.changed)
		e.changed = nil
	}
}

// setCommitted raises the commit point to n (never lowers it): a
// primary's acknowledged length, or the commit length a secondary's
// primary told it.
func (e *Extent) setCommitted(n int64) {
	now := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	if n >= e.committed {
		e.heardAt = now
	}
	if n > e.committed {
		e.committed = n
		e.notifyLocked()
	}
}

// CommittedLength is the replica's commit point: the length up to which
// its entries are acknowledged, so a replica may apply them. A sealed
// replica reports its sealed length; a primary the length it
// acknowledged; a secondary the last commit length its primary told it
// (in every Replicate, and in a data-less one ~1 ms after an
// acknowledgement no further append followed), never beyond its own
// durable length. It is memory only: after a restart it is 0 until told
// (or sealed).
func (e *Extent) CommittedLength() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.committedLocked()
}

func (e *Extent) committedLocked() int64 {
	if e.sealed {
		return e.durable
	}
	return min(e.committed, e.durable)
}

// WaitCommitted blocks until CommittedLength is above beyond or the
// replica is sealed, and returns CommittedLength; or until ctx is done
// (ctx's error) or the replica is closed (ErrClosed).
func (e *Extent) WaitCommitted(ctx context.Context, beyond int64) (int64, error) {
	e.mu.Lock()
	for {
		if c := e.committedLocked(); c > beyond || e.sealed {
			e.mu.Unlock()
			return c, nil
		}
		if e.closed {
			e.mu.Unlock()
			return 0, fmt.Errorf("extent %d: %w", e.id, ErrClosed)
		}
		if e.changed == nil {
			e.changed = make(chan struct{})
		}
		ch := e.changed
		e.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		e.mu.Lock()
	}
}

// ReadEntries decodes the entries in [from, to) of the replica's durable
// bytes and calls fn for each, in order (Entry.Extent is the replica's id,
// Blocks are copies; Payload joins them). Every block's CRC is checked.
// from and to must be entry boundaries (an offset an append returned or
// an entry's end, e.g. a CommittedLength) not beyond the durable length;
// otherwise it fails with ErrBadRange.
func (e *Extent) ReadEntries(from, to int64, fn func(Entry) error) error {
	e.mu.Lock()
	durable := e.durable
	i, found := slices.BinarySearch(e.starts, from)
	var prev int64 = -1
	if found && i > 0 {
		prev = e.starts[i-1]
	}
	e.mu.Unlock()
	if from < 0 || to < from || to > durable || (!found && from != durable) {
		return fmt.Errorf("read entries [%d, %d) of extent %d (length %d): %w", from, to, e.id, durable, ErrBadRange)
	}
	if prev >= 0 {
		var h [BlockHeaderLen]byte
		if err := e.readAt(h[:], prev); err != nil {
			return err
		}
		if _, flags, _, _, err := parseBlockHeader(h[:]); err != nil {
			return fmt.Errorf("read entries of extent %d: %w", e.id, err)
		} else if flags&flagContinues != 0 {
			return fmt.Errorf("read entries of extent %d at %d: inside an entry: %w", e.id, from, ErrBadRange)
		}
	}
	asm := entryAssembler{extent: e.id}
	for off := from; off < to; {
		raw, _, _, err := e.Read(off, min(to-off, 4<<20))
		if err != nil {
			return err
		}
		if len(raw) == 0 || off+int64(len(raw)) > to {
			return fmt.Errorf("read entries [%d, %d) of extent %d: a block crosses %d: %w", from, to, e.id, to, ErrBadRange)
		}
		if err := DecodeBlocks(raw, e.id, off, asm.block(fn)); err != nil {
			return err
		}
		off += int64(len(raw))
	}
	if asm.inside() {
		return fmt.Errorf("read entries [%d, %d) of extent %d: %d is inside an entry: %w", from, to, e.id, to, ErrBadRange)
	}
	return nil
}
