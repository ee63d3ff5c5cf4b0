package stream

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/vfs"
)

// The node's journal (see the package comment, "Journal"): every write of
// every extent of a node, appends on primaries and replicates on
// secondaries alike, is queued as a record; a waiter writes everything
// queued as one frame and fsyncs once, then releases the other waiters.
// The extent files get the same bytes (written before the record
// is queued) and are fsynced only by checkpoints, after which the journal
// files before the current one are removed.

// Journal constants: on-disk format, never change or reuse.
const (
	journalMagic       = "TABJOURN"
	journalVersion     = 1  // the file header's version
	journalHeaderLen   = 32 // magic (8) | version (4) | file number (8) | salt (8) | crc32c (4)
	journalFrameVer    = 1  // the frame header's version byte
	journalFrameHdrLen = 20 // crc32c (4) | len (4) | version (1) | 0 (3) | batch (8)
	journalRecHdrLen   = 24 // kind (1) | 0 (3) | len (4) | extent (8) | offset (8)

	journalKindData = 1 // data: the encoded blocks at offset of extent
	journalKindSeal = 2 // seal: extent sealed at offset; len 0

	journalSuffix = ".jnl"
	journalDir    = "journal"
)

const (
	// maxJournalFrame bounds a frame's length when decoding: a commit
	// writes at most journalBatchBytes plus one record, and one record is
	// at most one Replicate (MaxAppendBytes and its block headers).
	maxJournalFrame = 128 << 20
	// journalBatchBytes: a commit stops adding records to a frame
	// past this many bytes (a single larger record goes alone).
	journalBatchBytes = 16 << 20
	// defaultJournalFileBytes is JournalOptions.FileBytes's default.
	defaultJournalFileBytes = 32 << 20
)

// JournalOptions configure a node's journal. The zero value works.
type JournalOptions struct {
	// Disabled turns the journal off: every commit fsyncs its extent's own
	// file (one fsync per extent per commit, the layout before the
	// journal). For measurements.
	Disabled bool
	// FileBytes is the size past which the journal moves to a new file;
	// the move starts a checkpoint (every extent file fsynced), after
	// which the older files are removed, so the journal holds about
	// 2×FileBytes. Default 32 MiB.
	FileBytes int64
}

// journalRecord is one record: what one write put in one extent file.
type journalRecord struct {
	kind   byte
	extent uint64
	off    int64
	data   []byte // the encoded blocks (kind data); aliases the frame when decoded
}

func (r journalRecord) size() int { return journalRecHdrLen + len(r.data) }

// journalCRC is a frame's checksum: it covers the file's salt and the
// frame's file offset (neither stored in the frame, so a frame of another
// file, or one embedded in a payload, never checks), then the frame from
// byte 4.
func journalCRC(salt uint64, pos int64, rest []byte) uint32 {
	var pre [16]byte
	binary.LittleEndian.PutUint64(pre[0:], salt)
	binary.LittleEndian.PutUint64(pre[8:], uint64(pos))
	c := crc32.Update(0, castagnoli, pre[:])
	return crc32.Update(c, castagnoli, rest)
}

// appendJournalHeader appends a journal file's header.
func appendJournalHeader(dst []byte, num, salt uint64) []byte {
	var h [journalHeaderLen]byte
	copy(h[:], journalMagic)
	binary.LittleEndian.PutUint32(h[8:], journalVersion)
	binary.LittleEndian.PutUint64(h[12:], num)
	binary.LittleEndian.PutUint64(h[20:], salt)
	binary.LittleEndian.PutUint32(h[28:], crc32c(h[:28]))
	return append(dst, h[:]...)
}

// parseJournalHeader checks a journal file's header and returns its file
// number and salt.
func parseJournalHeader(b []byte) (num, salt uint64, err error) {
	switch {
	case len(b) < journalHeaderLen:
		return 0, 0, fmt.Errorf("journal header cut at %d bytes: %w", len(b), engines.ErrCorrupt)
	case string(b[:8]) != journalMagic:
		return 0, 0, fmt.Errorf("journal magic %q: %w", b[:8], engines.ErrCorrupt)
	case crc32c(b[:28]) != binary.LittleEndian.Uint32(b[28:]):
		return 0, 0, fmt.Errorf("journal header crc: %w", engines.ErrCorrupt)
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != journalVersion {
		return 0, 0, fmt.Errorf("journal version %d: %w", v, ErrFormatVersion)
	}
	return binary.LittleEndian.Uint64(b[12:]), binary.LittleEndian.Uint64(b[20:]), nil
}

// appendJournalFrame appends the frame of batch holding recs, to sit at
// file offset pos of a file with salt.
func appendJournalFrame(dst []byte, salt uint64, pos int64, batch uint64, recs []journalRecord) []byte {
	start := len(dst)
	n := 0
	for _, r := range recs {
		n += r.size()
	}
	var h [journalFrameHdrLen]byte
	binary.LittleEndian.PutUint32(h[4:], uint32(n))
	h[8] = journalFrameVer
	binary.LittleEndian.PutUint64(h[12:], batch)
	dst = append(dst, h[:]...)
	for _, r := range recs {
		var rh [journalRecHdrLen]byte
		rh[0] = r.kind
		binary.LittleEndian.PutUint32(rh[4:], uint32(len(r.data)))
		binary.LittleEndian.PutUint64(rh[8:], r.extent)
		binary.LittleEndian.PutUint64(rh[16:], uint64(r.off))
		dst = append(dst, rh[:]...)
		dst = append(dst, r.data...)
	}
	binary.LittleEndian.PutUint32(dst[start:], journalCRC(salt, pos, dst[start+4:]))
	return dst
}

// frameLen sanity-checks the frame header at the start of b (at least
// journalFrameHdrLen bytes) and returns the frame's total length.
func frameLen(b []byte) (int, error) {
	n := int64(binary.LittleEndian.Uint32(b[4:]))
	switch {
	case b[8] != journalFrameVer:
		return 0, fmt.Errorf("journal frame version %d: %w", b[8], engines.ErrCorrupt)
	case b[9] != 0 || b[10] != 0 || b[11] != 0:
		return 0, fmt.Errorf("journal frame reserved bytes: %w", engines.ErrCorrupt)
	case n > maxJournalFrame:
		return 0, fmt.Errorf("journal frame of %d bytes: %w", n, engines.ErrCorrupt)
	}
	return journalFrameHdrLen + int(n), nil
}

// decodeJournalFrame decodes the frame at the start of b, which sits at
// file offset pos of a file with salt, checking its CRC and every record's
// framing. It returns the records (data aliases b), the batch number and
// the frame's length. A bad or cut frame fails with engines.ErrCorrupt.
func decodeJournalFrame(b []byte, salt uint64, pos int64) (recs []journalRecord, batch uint64, n int, err error) {
	if len(b) < journalFrameHdrLen {
		return nil, 0, 0, fmt.Errorf("journal frame at %d cut at %d bytes: %w", pos, len(b), engines.ErrCorrupt)
	}
	n, err = frameLen(b)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("journal frame at %d: %w", pos, err)
	}
	if len(b) < n {
		return nil, 0, 0, fmt.Errorf("journal frame at %d of %d bytes cut at %d: %w", pos, n, len(b), engines.ErrCorrupt)
	}
	if got, want := journalCRC(salt, pos, b[4:n]), binary.LittleEndian.Uint32(b); got != want {
		return nil, 0, 0, fmt.Errorf("journal frame at %d: crc %#08x, stored %#08x: %w", pos, got, want, engines.ErrCorrupt)
	}
	batch = binary.LittleEndian.Uint64(b[12:])
	for p := journalFrameHdrLen; p < n; {
		if n-p < journalRecHdrLen {
			return nil, 0, 0, fmt.Errorf("journal frame at %d: record header at %d cut: %w", pos, p, engines.ErrCorrupt)
		}
		rh := b[p : p+journalRecHdrLen]
		r := journalRecord{kind: rh[0], extent: binary.LittleEndian.Uint64(rh[8:]), off: int64(binary.LittleEndian.Uint64(rh[16:]))}
		dl := int64(binary.LittleEndian.Uint32(rh[4:]))
		switch {
		case rh[1] != 0 || rh[2] != 0 || rh[3] != 0:
			return nil, 0, 0, fmt.Errorf("journal frame at %d: record reserved bytes: %w", pos, engines.ErrCorrupt)
		case r.kind != journalKindData && r.kind != journalKindSeal:
			return nil, 0, 0, fmt.Errorf("journal frame at %d: record kind %d: %w", pos, r.kind, engines.ErrCorrupt)
		case r.kind == journalKindSeal && dl != 0, r.kind == journalKindData && dl == 0:
			return nil, 0, 0, fmt.Errorf("journal frame at %d: record of kind %d with %d bytes: %w", pos, r.kind, dl, engines.ErrCorrupt)
		case r.off < 0:
			return nil, 0, 0, fmt.Errorf("journal frame at %d: record at offset %d: %w", pos, r.off, engines.ErrCorrupt)
		case dl > int64(n-p-journalRecHdrLen):
			return nil, 0, 0, fmt.Errorf("journal frame at %d: record of %d bytes past the frame: %w", pos, dl, engines.ErrCorrupt)
		}
		p += journalRecHdrLen
		if dl > 0 {
			r.data = b[p : p+int(dl) : p+int(dl)]
		}
		p += int(dl)
		recs = append(recs, r)
	}
	return recs, batch, n, nil
}

// scanJournalFile decodes the bytes of journal file num: its header and
// frames, in order, batch numbers increasing from after. In the newest
// file (last) a bad frame with no valid frame after it is a torn tail —
// the frame being written when the node stopped, never acknowledged — and
// ends the scan; so do zeros to the end (the file's preallocated rest),
// and a header cut or garbled before its first sync. Anywhere else a bad
// frame is corruption of acknowledged data: engines.ErrCorrupt. It
// returns the records, the last batch number and the length of the
// file's valid part (its header and whole frames; 0 if the header is not
// whole).
func scanJournalFile(b []byte, num uint64, last bool, after uint64) (recs []journalRecord, batch uint64, end int64, err error) {
	batch = after
	hnum, salt, err := parseJournalHeader(b)
	if err != nil {
		if last && allZero(b[min(len(b), journalHeaderLen):]) && !errors.Is(err, ErrFormatVersion) {
			return nil, batch, 0, nil // created, not yet synced: nothing was written to it
		}
		return nil, batch, 0, err
	}
	if hnum != num {
		return nil, batch, 0, fmt.Errorf("journal file %d says it is %d: %w", num, hnum, engines.ErrCorrupt)
	}
	pos := journalHeaderLen
	for pos < len(b) {
		if last && allZero(b[pos:]) {
			break // the preallocated rest of the file
		}
		rs, fb, n, err := decodeJournalFrame(b[pos:], salt, int64(pos))
		if err == nil && fb <= batch {
			err = fmt.Errorf("journal frame at %d: batch %d after %d: %w", pos, fb, batch, engines.ErrCorrupt)
		}
		if err != nil {
			if next := resyncJournal(b, salt, pos+1); next >= 0 {
				return nil, batch, 0, fmt.Errorf("%w (a valid frame follows at %d)", err, next)
			}
			if !last {
				return nil, batch, 0, fmt.Errorf("%w (in a journal file that was complete)", err)
			}
			break // torn tail
		}
		recs = append(recs, rs...)
		batch = fb
		pos += n
	}
	return recs, batch, int64(pos), nil
}

// allZero reports whether b holds only zero bytes.
func allZero(b []byte) bool {
	for len(b) >= 8 {
		if binary.LittleEndian.Uint64(b) != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// resyncJournal returns the first offset at or after from where a valid
// frame starts, or -1.
func resyncJournal(b []byte, salt uint64, from int) int {
	for q := from; q+journalFrameHdrLen <= len(b); q++ {
		n, err := frameLen(b[q:])
		if err != nil || q+n > len(b) {
			continue
		}
		if _, _, _, err := decodeJournalFrame(b[q:], salt, int64(q)); err == nil {
			return q
		}
	}
	return -1
}

func journalName(num uint64) string { return fmt.Sprintf("%016x%s", num, journalSuffix) }

// listJournal returns the numbers of the journal files in dir, sorted.
func listJournal(fs vfs.FS, dir string) ([]uint64, error) {
	names, err := fs.List(dir)
	if err != nil {
		return nil, err
	}
	var nums []uint64
	for _, name := range names {
		if !strings.HasSuffix(name, journalSuffix) {
			continue
		}
		num, err := strconv.ParseUint(strings.TrimSuffix(name, journalSuffix), 16, 64)
		if err != nil {
			continue // not ours
		}
		nums = append(nums, num)
	}
	slices.Sort(nums)
	return nums, nil
}

// readJournal reads and decodes every journal file in dir, oldest first.
// It returns the records in journal order, the newest file's number (0 if
// none) and the last batch number. It cuts the newest file to its valid
// part (a torn frame, the preallocated zeros) and syncs it, so that it is
// whole before a newer file exists: in a file that is not the newest a
// bad tail is corruption.
func readJournal(fs vfs.FS, dir string) (recs []journalRecord, newest, batch uint64, err error) {
	nums, err := listJournal(fs, dir)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("list journal: %w", err)
	}
	for i, num := range nums {
		path := filepath.Join(dir, journalName(num))
		b, err := readWholeFile(fs, path)
		if err != nil {
			return nil, 0, 0, fmt.Errorf("read journal file %s: %w", journalName(num), err)
		}
		isLast := i == len(nums)-1
		rs, last, end, err := scanJournalFile(b, num, isLast, batch)
		if err != nil {
			return nil, 0, 0, fmt.Errorf("journal file %s: %w", journalName(num), err)
		}
		switch {
		case isLast && end == 0:
			// Created but never synced whole: it holds nothing.
			if err := fs.Remove(path); err != nil {
				return nil, 0, 0, fmt.Errorf("remove empty journal file %s: %w", journalName(num), err)
			}
			if err := fs.SyncDir(dir); err != nil {
				return nil, 0, 0, fmt.Errorf("sync journal directory: %w", err)
			}
		case isLast && end < int64(len(b)):
			if err := cutFile(fs, path, end); err != nil {
				return nil, 0, 0, fmt.Errorf("cut journal file %s to its %d valid bytes: %w", journalName(num), end, err)
			}
		}
		recs, batch = append(recs, rs...), last
	}
	if len(nums) > 0 {
		newest = nums[len(nums)-1]
	}
	return recs, newest, batch, nil
}

// cutFile durably truncates the file at path to size.
func cutFile(fs vfs.FS, path string, size int64) error {
	f, err := fs.OpenReadWrite(path)
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		return errors.Join(err, f.Close())
	}
	if err := f.Sync(); err != nil {
		return errors.Join(err, f.Close())
	}
	return f.Close()
}

func readWholeFile(fs vfs.FS, path string) ([]byte, error) {
	f, err := fs.Open(path)
	if err != nil {
		return nil, err
	}
	size, err := f.Size()
	if err != nil {
		return nil, errors.Join(err, f.Close())
	}
	b := make([]byte, size)
	if n, err := f.ReadAt(b, 0); err != nil && n < len(b) {
		return nil, errors.Join(err, f.Close())
	}
	return b, f.Close()
}

// journal is a node's running journal. Safe for concurrent use. There
// is no committer goroutine: a waiter that finds records queued and no
// commit running commits them itself (the leader) and wakes the others,
// one of which leads the next batch, which formed meanwhile. That saves
// a goroutine hand-off per batch on the append's path.
type journal struct {
	fs        vfs.FS
	dir       string
	fileBytes int64
	log       *slog.Logger
	onRotate  func() // called (from a leader) after a move to a new file

	mu sync.Mutex
	// Guarded by mu.
	queue   []journalRecord // records not yet taken by a leader
	spare   []journalRecord // a previous queue, reused
	next    uint64          // ticket of the last record queued (tickets count from 1)
	taken   uint64          // ticket of the last record a leader took
	done    uint64          // records with tickets up to done are durable
	leading bool            // a leader is committing
	err     error           // a commit failed (or closed): no more records are taken
	closing bool
	changed chan struct{} // closed and replaced when done, leading or err change
	cur     uint64        // number of the file being written
	files   []uint64      // journal files on disk, oldest first (cur last)

	// fmu is held by the leader around its file operations, and by
	// forceRotate and close.
	fmu sync.Mutex
	// Guarded by fmu.
	f     vfs.File // nil once closed
	size  int64    // bytes in f
	salt  uint64   // f's salt
	batch uint64   // last batch number written
	buf   []byte
	// prealloc: f was preallocated (createFile), so it ends in zeros
	// until rotate cuts it.
	prealloc bool

	stats journalCounters // stats.go
}

// openJournal starts a journal in dir with a new file numbered num, its
// batches numbered from batch+1 (batch numbers increase across files).
func openJournal(fs vfs.FS, dir string, num, batch uint64, o JournalOptions, log *slog.Logger, onRotate func()) (*journal, error) {
	j := &journal{
		fs: fs, dir: dir, fileBytes: o.FileBytes, log: log, onRotate: onRotate, batch: batch,
		changed: make(chan struct{}),
	}
	if j.fileBytes <= 0 {
		j.fileBytes = defaultJournalFileBytes
	}
	f, salt, prealloc, err := j.createFile(num)
	if err != nil {
		return nil, err
	}
	j.f, j.salt, j.prealloc, j.size, j.cur, j.files = f, salt, prealloc, journalHeaderLen, num, []uint64{num}
	return j, nil
}

// createFile durably creates journal file num with its header.
func (j *journal) createFile(num uint64) (f vfs.File, salt uint64, prealloc bool, err error) {
	salt = rand.Uint64()
	path := filepath.Join(j.dir, journalName(num))
	f, err = j.fs.Create(path)
	if err != nil {
		return nil, 0, false, fmt.Errorf("create journal file %s: %w", journalName(num), err)
	}
	if _, err := f.Write(appendJournalHeader(nil, num, salt)); err != nil {
		return nil, 0, false, errors.Join(fmt.Errorf("write journal header: %w", err), f.Close())
	}
	// The file's blocks are allocated now, so each commit overwrites
	// allocated zeros and its sync changes no metadata (DataSync). The
	// zeros past the last frame read as the end of the journal; a file
	// the journal moves on from is cut to its frames first (rotate).
	if prealloc, err = vfs.Preallocate(f, j.fileBytes); err != nil {
		// A disk too full for the whole file costs the faster syncs, not
		// the journal: a node must still open to be drained. Whatever the
		// failed call allocated goes; the file grows as it is written.
		j.log.Warn("journal file not preallocated; its syncs also write its length", "file", journalName(num), "err", err)
		if err := f.Truncate(journalHeaderLen); err != nil {
			return nil, 0, false, errors.Join(fmt.Errorf("cut journal file after a failed preallocation: %w", err), f.Close())
		}
		prealloc = false
	}
	if err := f.Sync(); err != nil {
		return nil, 0, false, errors.Join(fmt.Errorf("sync journal file: %w", err), f.Close())
	}
	if err := j.fs.SyncDir(j.dir); err != nil {
		return nil, 0, false, errors.Join(fmt.Errorf("sync journal directory: %w", err), f.Close())
	}
	return f, salt, prealloc, nil
}

// add queues r and returns its ticket, for wait. It does not block; r is
// durable once a wait for its ticket (or a later one) returned nil.
func (j *journal) add(r journalRecord) (uint64, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	switch {
	case j.err != nil:
		return 0, j.err
	case j.closing:
		return 0, fmt.Errorf("journal: %w", ErrClosed)
	}
	j.queue = append(j.queue, r)
	j.next++
	return j.next, nil
}

// wait blocks until the record with ticket t is durable, or the journal
// failed before writing it. It commits queued records itself when no
// other waiter is.
func (j *journal) wait(t uint64) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.done < t {
		if j.err != nil {
			return j.err
		}
		if !j.leading && len(j.queue) > 0 {
			j.leadLocked()
			continue
		}
		ch := j.changed
		j.mu.Unlock()
		<-ch
		j.mu.Lock()
	}
	return nil
}

// leadLocked commits a batch of the queue: everything queued up to
// journalBatchBytes, as one frame, one write and one fsync. The caller
// holds mu, which is released during the I/O.
func (j *journal) leadLocked() {
	j.leading = true
	size, k := 0, 0
	for k < len(j.queue) && (k == 0 || size+j.queue[k].size() <= journalBatchBytes) {
		size += j.queue[k].size()
		k++
	}
	var recs []journalRecord
	if k == len(j.queue) {
		recs, j.queue, j.spare = j.queue, j.spare[:0], nil
	} else {
		recs = slices.Clone(j.queue[:k])
		clear(j.queue[:k])
		j.queue = j.queue[k:]
	}
	j.taken += uint64(k)
	last := j.taken
	j.mu.Unlock()

	j.fmu.Lock()
	err := j.commit(recs)
	j.fmu.Unlock()
	clear(recs)

	j.mu.Lock()
	j.leading = false
	if j.spare == nil {
		j.spare = recs[:0]
	}
	if err != nil {
		if j.err == nil {
			if !errors.Is(err, ErrClosed) {
				j.log.Error("journal write failed; the node takes no more writes", "err", err)
			}
			j.err = fmt.Errorf("journal: %w: %w", ErrBroken, err)
		}
		j.queue = nil
	} else {
		j.done = last
	}
	close(j.changed)
	j.changed = make(chan struct{})
}

// commit writes recs as one frame and fsyncs, moving to a new file first
// if this one is full.
func (j *journal) commit(recs []journalRecord) error {
	if j.f == nil {
		return fmt.Errorf("journal: %w", ErrClosed)
	}
	n := journalFrameHdrLen
	for _, r := range recs {
		n += r.size()
	}
	if j.size+int64(n) > j.fileBytes && j.size > journalHeaderLen {
		if err := j.rotate(); err != nil {
			return err
		}
	}
	j.batch++
	j.buf = appendJournalFrame(j.buf[:0], j.salt, j.size, j.batch, recs)
	if _, err := j.f.Write(j.buf); err != nil {
		return fmt.Errorf("write journal: %w", err)
	}
	if err := vfs.DataSync(j.f); err != nil {
		return fmt.Errorf("sync journal: %w", err)
	}
	j.size += int64(len(j.buf))
	j.stats.committed(len(recs), len(j.buf))
	if cap(j.buf) > journalBatchBytes {
		j.buf = nil // a huge record: do not keep its buffer
	}
	return nil
}

// forceRotate moves to a new journal file unless the current one is
// empty, so that a checkpoint covers every record written so far.
func (j *journal) forceRotate() error {
	j.fmu.Lock()
	defer j.fmu.Unlock()
	j.mu.Lock()
	err := j.err
	j.mu.Unlock()
	switch {
	case err != nil:
		return err
	case j.f == nil:
		return fmt.Errorf("journal: %w", ErrClosed)
	case j.size == journalHeaderLen:
		return nil
	}
	if err := j.rotate(); err != nil {
		j.mu.Lock()
		if j.err == nil {
			j.err = fmt.Errorf("journal: %w: %w", ErrBroken, err)
		}
		close(j.changed)
		j.changed = make(chan struct{})
		j.mu.Unlock()
		return err
	}
	return nil
}

// rotate moves to a new journal file and asks for a checkpoint. The
// caller holds fmu.
func (j *journal) rotate() error {
	// A preallocated file is cut to its frames and synced before the
	// next one exists: only the newest file may end in zeros (or a torn
	// frame); in an older one a bad tail is corruption.
	if j.prealloc {
		if err := j.f.Truncate(j.size); err != nil {
			return fmt.Errorf("cut journal file %s: %w", journalName(j.cur), err)
		}
		if err := j.f.Sync(); err != nil {
			return fmt.Errorf("sync journal file %s: %w", journalName(j.cur), err)
		}
	}
	j.mu.Lock()
	num := j.cur + 1
	j.mu.Unlock()
	f, salt, prealloc, err := j.createFile(num)
	if err != nil {
		return err
	}
	if err := j.f.Close(); err != nil {
		j.log.Warn("close journal file", "err", err)
	}
	j.f, j.salt, j.prealloc, j.size = f, salt, prealloc, journalHeaderLen
	j.mu.Lock()
	j.cur = num
	j.files = append(j.files, num)
	j.mu.Unlock()
	if j.onRotate != nil {
		j.onRotate()
	}
	return nil
}

// older returns the journal files before the current one: those a
// checkpoint may remove once every extent file is synced.
func (j *journal) older() []uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	i := slices.Index(j.files, j.cur)
	return slices.Clone(j.files[:i])
}

// remove durably removes the journal files nums (a checkpoint covered
// them).
func (j *journal) remove(nums []uint64) error {
	var err error
	var removed []uint64
	for _, num := range nums {
		rerr := j.fs.Remove(filepath.Join(j.dir, journalName(num)))
		if rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			err = errors.Join(err, fmt.Errorf("remove journal file %s: %w", journalName(num), rerr))
			continue
		}
		removed = append(removed, num)
	}
	if serr := j.fs.SyncDir(j.dir); serr != nil {
		// The removals may not last; they are redone at the next
		// checkpoint (a replay of a covered file is a no-op anyway).
		return errors.Join(err, fmt.Errorf("sync journal directory: %w", serr))
	}
	j.mu.Lock()
	j.files = slices.DeleteFunc(j.files, func(n uint64) bool { return slices.Contains(removed, n) })
	j.mu.Unlock()
	return err
}

// stat reports the journal files on disk (for tests).
func (j *journal) stat() (files []uint64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.files)
}

// close writes what is queued and closes the file. Later adds fail with
// ErrClosed. Idempotent.
func (j *journal) close() error {
	j.mu.Lock()
	if j.closing {
		j.mu.Unlock()
		return nil
	}
	j.closing = true
	for j.done < j.next && j.err == nil {
		if !j.leading && len(j.queue) > 0 {
			j.leadLocked()
			continue
		}
		ch := j.changed
		j.mu.Unlock()
		<-ch
		j.mu.Lock()
	}
	j.mu.Unlock()
	j.fmu.Lock()
	defer j.fmu.Unlock()
	if j.f == nil {
		return nil
	}
	err := j.f.Close()
	j.f = nil
	if err != nil {
		return fmt.Errorf("close journal: %w", err)
	}
	return nil
}
