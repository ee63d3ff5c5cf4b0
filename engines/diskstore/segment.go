package diskstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/vfs"
)

// Segment file constants: never change or reuse.
const (
	segmentMagic     = "TABLOGSG"
	segmentHeaderLen = 32
	// FormatVersion is the segment format this package writes and reads.
	FormatVersion = 1
	segmentExt    = ".log"
)

// ErrFormatVersion: a segment was written by another format version.
var ErrFormatVersion = errors.New("diskstore: unsupported format version")

func segmentName(seq uint64) string { return fmt.Sprintf("%016x%s", seq, segmentExt) }

// parseSegmentName returns the sequence number a segment file name carries.
func parseSegmentName(name string) (uint64, bool) {
	base, ok := strings.CutSuffix(name, segmentExt)
	if !ok || len(base) != 16 {
		return 0, false
	}
	seq, err := strconv.ParseUint(base, 16, 64)
	return seq, err == nil
}

func encodeSegmentHeader(slot uint32, gen uint8, seq uint64) []byte {
	b := make([]byte, segmentHeaderLen)
	copy(b, segmentMagic)
	binary.LittleEndian.PutUint32(b[8:], FormatVersion)
	binary.LittleEndian.PutUint16(b[12:], uint16(slot))
	b[14] = gen
	binary.LittleEndian.PutUint64(b[16:], seq)
	binary.LittleEndian.PutUint32(b[28:], crc32.Checksum(b[:28], castagnoli))
	return b
}

func decodeSegmentHeader(b []byte) (slot uint32, gen uint8, seq uint64, err error) {
	if len(b) < segmentHeaderLen {
		return 0, 0, 0, fmt.Errorf("segment header cut at %d bytes: %w", len(b), engines.ErrCorrupt)
	}
	if string(b[:8]) != segmentMagic {
		return 0, 0, 0, fmt.Errorf("segment magic %q: %w", b[:8], engines.ErrCorrupt)
	}
	if got := crc32.Checksum(b[:28], castagnoli); got != binary.LittleEndian.Uint32(b[28:]) {
		return 0, 0, 0, fmt.Errorf("segment header crc: %w", engines.ErrCorrupt)
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != FormatVersion {
		return 0, 0, 0, fmt.Errorf("segment format version %d, this build reads %d: %w", v, FormatVersion, ErrFormatVersion)
	}
	if b[15] != 0 || binary.LittleEndian.Uint32(b[24:]) != 0 || b[14] > genMask {
		return 0, 0, 0, fmt.Errorf("segment header reserved bits set: %w", engines.ErrCorrupt)
	}
	return uint32(binary.LittleEndian.Uint16(b[12:])), b[14], binary.LittleEndian.Uint64(b[16:]), nil
}

// segment is one log file. Bytes [0, written) are in the file and never
// change; bytes [written, size) are still in memory (flushing, then buf).
type segment struct {
	seq  uint64
	slot uint32
	gen  uint8
	path string

	// f is set before written first grows past 0 and never changes after.
	f vfs.File
	// size is the logical end: every byte appended, written or not.
	size atomic.Int64
	// written is how many bytes are in the file (readable with ReadAt).
	written atomic.Int64
	// live is the bytes of records the index points at (exact: added by
	// Append, subtracted by Free).
	live atomic.Int64
	// ttlBytes are the live bytes of records with an expiry, the latest of
	// which is maxExpiry: once the clock passes it they are all garbage
	// awaiting collection (Free subtracts them as they go).
	ttlBytes  atomic.Int64
	maxExpiry atomic.Int64
	// recs and ttlRecs count the records in live and ttlBytes, so that
	// the collector can tell stored payload (keys and values) from record
	// headers.
	recs, ttlRecs atomic.Int64
	// dead is set once the segment is freed; reads that fail on a dead
	// segment report "no record", not corruption.
	dead atomic.Bool

	// A sealed segment whose bytes are all in its file is read through a
	// read-only mapping of it (when the file system can map): no system
	// call per read. full is set once it is sealed and written whole;
	// mapped holds the mapping; readers counts reads inside it, which
	// unmapping (set unmapping first, then wait for readers to leave) must
	// not pull the pages from under. mapTried is set once mapping was
	// attempted (it is never retried). mapMu serialises mapping and
	// unmapping; unmap is guarded by it.
	full      atomic.Bool
	mapped    atomic.Pointer[[]byte]
	readers   atomic.Int64
	unmapping atomic.Bool
	mapTried  atomic.Bool
	mapMu     sync.Mutex
	unmap     func() error

	// Guarded by Store.mu.
	flushing []byte // bytes [written, written+len(flushing)) being written
	buf      []byte // bytes after flushing
	sealed   bool   // no more appends
	queued   bool   // in Store.pending
	created  bool   // file exists (set by the sync leader, under syncMu)
	// pins counts the snapshots that will still read the segment (see
	// Snapshot); obsolete is set once the collector freed it while pinned
	// (it is then in Store.obsolete, out of the location table, and its
	// file goes with the last pin); retired once its file is durably
	// renamed "<seq>.obsolete", which recovery deletes.
	pins     int
	obsolete bool
	retired  bool

	// removed is set once the file was closed and deleted (or that was
	// tried); guarded by Store.syncMu, as path is after creation.
	removed bool
}

func (g *segment) loc(off int64) uint64 { return packLoc(g.slot, g.gen, off) }

// pin returns g's mapping and holds it until unpin, or nil if g is not
// mapped (then the caller reads the file).
func (g *segment) pin() []byte {
	if !g.full.Load() {
		return nil
	}
	g.readers.Add(1)
	if g.unmapping.Load() {
		g.readers.Add(-1)
		return nil
	}
	if m := g.mapped.Load(); m != nil {
		return *m
	}
	g.readers.Add(-1)
	return nil
}

func (g *segment) unpin() { g.readers.Add(-1) }

// mapSegment maps a full segment's file if the file system can; a failure
// only means reads keep using ReadAt. Called at most once per segment.
func (s *Store) mapSegment(g *segment) {
	g.mapMu.Lock()
	defer g.mapMu.Unlock()
	if g.mapTried.Load() || g.unmapping.Load() || g.f == nil {
		return
	}
	g.mapTried.Store(true)
	mf, ok := g.f.(vfs.Mapper)
	size := g.size.Load()
	if !ok || size != g.written.Load() {
		return
	}
	data, unmap, err := mf.Map(size)
	if err != nil {
		s.opts.Logger.Warn("diskstore: cannot map segment; reading it with system calls", "segment", g.seq, "err", err)
		return
	}
	g.unmap = unmap
	g.mapped.Store(&data)
}

// unmapSegment stops reads through g's mapping, waits for those inside it,
// and unmaps it. Idempotent.
func (s *Store) unmapSegment(g *segment) error {
	g.unmapping.Store(true)
	for spins := 0; g.readers.Load() > 0; spins++ {
		if spins < 100 {
			runtime.Gosched()
		} else {
			time.Sleep(10 * time.Microsecond)
		}
	}
	g.mapMu.Lock()
	defer g.mapMu.Unlock()
	g.mapped.Store(nil)
	if g.unmap == nil {
		return nil
	}
	err := g.unmap()
	g.unmap = nil
	if err != nil {
		return fmt.Errorf("unmap segment %d: %w", g.seq, err)
	}
	return nil
}

// markFull records that g is sealed with all its bytes in its file, so
// reads may map it. Caller holds s.mu.
func (g *segment) markFullLocked() {
	if g.sealed && g.flushing == nil && len(g.buf) == 0 && g.written.Load() == g.size.Load() {
		g.full.Store(true)
	}
}

// readAt fills p with the segment's bytes at off, from the file or the
// in-memory tail. It returns io.ErrUnexpectedEOF past the logical end.
func (s *Store) readAt(g *segment, p []byte, off int64) error {
	return s.readAtVia(g, p, off, true)
}

// readAtVia is readAt that reads a mapped segment through its mapping only
// if viaMap (else with a positioned read of the file).
func (s *Store) readAtVia(g *segment, p []byte, off int64, viaMap bool) error {
	end := off + int64(len(p))
	if end > g.size.Load() {
		return io.ErrUnexpectedEOF
	}
	if viaMap && g.full.Load() {
		if m := s.pinMapped(g); m != nil {
			copy(p, m[off:end])
			g.unpin()
			return nil
		}
	}
	w := g.written.Load()
	if end > w {
		s.mu.Lock()
		w = g.written.Load()
		if end > w {
			// Copy the part past w from memory; the part before w is in
			// the file, which never changes, so it can be read unlocked.
			from := max(off, w)
			mem := w
			for _, chunk := range [][]byte{g.flushing, g.buf} {
				lo, hi := max(from, mem), min(end, mem+int64(len(chunk)))
				if lo < hi {
					copy(p[lo-off:hi-off], chunk[lo-mem:hi-mem])
				}
				mem += int64(len(chunk))
			}
			s.mu.Unlock()
			if off >= w {
				return nil
			}
			p = p[:w-off]
		} else {
			s.mu.Unlock()
		}
	}
	n, err := g.f.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// pinMapped is pin, mapping g first if it was never tried.
func (s *Store) pinMapped(g *segment) []byte {
	if m := g.pin(); m != nil || g.mapTried.Load() {
		return m
	}
	s.mapSegment(g)
	return g.pin()
}

// mappedRecordLen checks that a record starts at off of mapping m (its
// header fits and parses, and its length stays inside m) and returns its
// header.
func mappedRecordLen(m []byte, off int64) (header, error) {
	size := int64(len(m))
	if off < segmentHeaderLen || off+recordHeaderLen > size {
		return header{}, fmt.Errorf("record offset %d outside segment of %d bytes: %w", off, size, engines.ErrCorrupt)
	}
	h, err := parseHeader(m[off:])
	if err == nil && off+h.total() > size {
		err = fmt.Errorf("record of %d bytes at %d past segment end %d: %w", h.total(), off, size, engines.ErrCorrupt)
	}
	return h, err
}

// readMapped is readRecord from g's mapping; mapped is false if g is not
// mapped (nothing was read). off is inside the segment.
func (s *Store) readMapped(g *segment, off int64, buf []byte) (h header, raw, key, value []byte, mapped bool, err error) {
	if !g.full.Load() {
		return h, nil, nil, nil, false, nil
	}
	m := s.pinMapped(g)
	if m == nil {
		return h, nil, nil, nil, false, nil
	}
	defer g.unpin()
	if h, err = mappedRecordLen(m, off); err != nil {
		return h, nil, nil, nil, true, err
	}
	n := h.total()
	if int64(cap(buf)) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	copy(buf, m[off:off+n])
	h, key, value, err = decodeRecord(buf)
	return h, buf, key, value, true, err
}

// readRecord reads and verifies the record at off with ReadAt (or from the
// unwritten tail; readMapped serves mapped segments); buf is reused if large
// enough. The first read guesses 4 KiB so most records take one read.
func (s *Store) readRecord(g *segment, off int64, buf []byte) (h header, raw, key, value []byte, err error) {
	size := g.size.Load()
	if off < segmentHeaderLen || off+recordHeaderLen > size {
		return header{}, nil, nil, nil, fmt.Errorf("record offset %d outside segment of %d bytes: %w", off, size, engines.ErrCorrupt)
	}
	guess := min(max(int64(cap(buf)), 4096), size-off)
	if int64(cap(buf)) < guess {
		buf = make([]byte, guess)
	}
	buf = buf[:guess]
	if err := s.readAt(g, buf, off); err != nil {
		return header{}, nil, nil, nil, err
	}
	return s.finishRecord(g, off, buf)
}

// finishRecord decodes the record at off whose first len(buf) bytes (at
// least its header, or up to the segment end) are in buf, reading the rest
// if the record is longer, and verifies it. raw is the whole record.
func (s *Store) finishRecord(g *segment, off int64, buf []byte) (h header, raw, key, value []byte, err error) {
	size := g.size.Load()
	if len(buf) < recordHeaderLen {
		return h, nil, nil, nil, fmt.Errorf("record at %d cut at %d bytes: %w", off, len(buf), engines.ErrCorrupt)
	}
	if h, err = parseHeader(buf); err != nil {
		return h, nil, nil, nil, err
	}
	n := h.total()
	if off+n > size {
		return h, nil, nil, nil, fmt.Errorf("record of %d bytes at %d past segment end %d: %w", n, off, size, engines.ErrCorrupt)
	}
	if n > int64(len(buf)) {
		nb := make([]byte, n)
		copy(nb, buf)
		if err := s.readAt(g, nb[len(buf):], off+int64(len(buf))); err != nil {
			return h, nil, nil, nil, err
		}
		buf = nb
	}
	h, key, value, err = decodeRecord(buf[:n])
	return h, buf[:n:n], key, value, err
}

// segReader reads a segment's records in order through a window buffer.
type segReader struct {
	s    *Store
	g    *segment
	end  int64 // stop here
	off  int64 // next record
	win  []byte
	wOff int64 // file offset of win[0]
}

// next returns the record at r.off, or io.EOF at r.end. Errors wrap
// engines.ErrCorrupt when the bytes are not a valid record.
func (r *segReader) next() (off int64, h header, key, value []byte, err error) {
	if r.off >= r.end {
		return r.off, h, nil, nil, io.EOF
	}
	off = r.off
	if err := r.fill(off, recordHeaderLen); err != nil {
		return off, h, nil, nil, err
	}
	if h, err = parseHeader(r.win[off-r.wOff:]); err != nil {
		return off, h, nil, nil, err
	}
	n := h.total()
	if off+n > r.end {
		return off, h, nil, nil, fmt.Errorf("record of %d bytes at %d past end %d: %w", n, off, r.end, engines.ErrCorrupt)
	}
	if err := r.fill(off, n); err != nil {
		return off, h, nil, nil, err
	}
	h, key, value, err = decodeRecord(r.win[off-r.wOff : off-r.wOff+n])
	if err != nil {
		return off, h, nil, nil, err
	}
	r.off = off + n
	return off, h, key, value, nil
}

// fill makes the window hold [off, off+n).
func (r *segReader) fill(off, n int64) error {
	if off >= r.wOff && off+n <= r.wOff+int64(len(r.win)) {
		return nil
	}
	if off+n > r.end {
		return fmt.Errorf("record header at %d past end %d: %w", off, r.end, engines.ErrCorrupt)
	}
	want := min(max(n, 256<<10), r.end-off)
	if int64(cap(r.win)) < want {
		r.win = make([]byte, want)
	}
	r.win = r.win[:want]
	r.wOff = off
	if err := r.s.readAt(r.g, r.win, off); err != nil {
		r.win = r.win[:0]
		return fmt.Errorf("read segment %d at %d: %w", r.g.seq, off, err)
	}
	return nil
}

func (s *Store) segPath(seq uint64) string { return filepath.Join(s.dir, segmentName(seq)) }

// addLive counts a live record of n bytes expiring at exp (0: never).
func (g *segment) addLive(n, exp int64) {
	g.live.Add(n)
	g.recs.Add(1)
	if exp > 0 {
		g.ttlBytes.Add(n)
		g.ttlRecs.Add(1)
		for {
			m := g.maxExpiry.Load()
			if exp <= m || g.maxExpiry.CompareAndSwap(m, exp) {
				break
			}
		}
	}
}

// segLive sums what addLive would add for many records.
type segLive struct {
	live, recs, ttlBytes, ttlRecs, maxExp int64
}

func (l *segLive) add(n, exp int64) {
	l.live += n
	l.recs++
	if exp > 0 {
		l.ttlBytes += n
		l.ttlRecs++
		l.maxExp = max(l.maxExp, exp)
	}
}

func (l segLive) plus(m segLive) segLive {
	return segLive{l.live + m.live, l.recs + m.recs, l.ttlBytes + m.ttlBytes, l.ttlRecs + m.ttlRecs, max(l.maxExp, m.maxExp)}
}

// addLiveBulk is addLive of the records l sums.
func (g *segment) addLiveBulk(l segLive) {
	g.live.Add(l.live)
	g.recs.Add(l.recs)
	g.ttlBytes.Add(l.ttlBytes)
	g.ttlRecs.Add(l.ttlRecs)
	for {
		m := g.maxExpiry.Load()
		if l.maxExp <= m || g.maxExpiry.CompareAndSwap(m, l.maxExp) {
			break
		}
	}
}

// subLive uncounts a record added with addLive.
func (g *segment) subLive(n, exp int64) {
	g.live.Add(-n)
	g.recs.Add(-1)
	if exp > 0 {
		g.ttlBytes.Add(-n)
		g.ttlRecs.Add(-1)
	}
}

// liveAt is the segment's live bytes with every record expired by now
// counted as garbage (exact once all its TTL records expired).
func (g *segment) liveAt(now int64) int64 {
	live := g.live.Load()
	if m := g.maxExpiry.Load(); m > 0 && m <= now {
		live -= g.ttlBytes.Load()
	}
	return max(live, 0)
}

// payloadAt is liveAt without the record headers: the stored key and
// value bytes of the live records.
func (g *segment) payloadAt(now int64) int64 {
	live, recs := g.live.Load(), g.recs.Load()
	if m := g.maxExpiry.Load(); m > 0 && m <= now {
		live -= g.ttlBytes.Load()
		recs -= g.ttlRecs.Load()
	}
	return max(live-recs*recordHeaderLen, 0)
}
