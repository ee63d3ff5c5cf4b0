package diskstore

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tabuladb/tabula/engines"
)

// ErrSnapshotScanned: a Snapshot's Scan was called a second time (a scan
// releases each segment once it has read it, so it can run only once).
var ErrSnapshotScanned = errors.New("diskstore: snapshot already scanned")

// A segment the collector freed while a snapshot still pinned it is renamed
// "%016x.obsolete" (same number) until its last pin goes; Open removes
// such files: every record in them was re-appended (and synced) or garbage
// before the rename. Never change or reuse.
const obsoleteExt = ".obsolete"

func obsoleteName(seq uint64) string { return fmt.Sprintf("%016x%s", seq, obsoleteExt) }

func parseObsoleteName(name string) (uint64, bool) {
	base, ok := strings.CutSuffix(name, obsoleteExt)
	if !ok || len(base) != 16 {
		return 0, false
	}
	seq, err := strconv.ParseUint(base, 16, 64)
	return seq, err == nil
}

// Snapshot is a fixed position P of the log and a pin on every segment at
// or before it: its Scan reads exactly the records before P, in log order,
// from the very segments that held them at P, while writes and the
// collector go on. The collector may collect a pinned segment (its live
// records move past P, where the snapshot does not look); it only defers
// removing (and unmapping) the file until the segment's last pin is
// released. Scan releases each segment as soon as it has read it, and
// everything when it returns; Close releases whatever is left. An owner
// decides which records were live at P (engines/point keeps, for every open
// snapshot, the locations its writers and the collector take the index
// away from; see Needs).
//
// Safe for concurrent use: Needs from any goroutine; Scan once; Close is
// idempotent and may run during Scan (the Scan then returns
// engines.ErrClosed).
type Snapshot struct {
	s     *Store
	at    logPos
	taken int64 // Options.Now when taken, Unix ms
	// segs are the segments pinned when taken, in sequence order; fixed.
	segs []*segment
	// progress is where Scan is: the index in segs of the segment being
	// read <<32 | the offset of the record being handed out. Records at or
	// after it are still to be read.
	progress atomic.Int64
	closed   atomic.Bool

	mu sync.Mutex
	// Guarded by mu: held[i] while segs[i] is pinned by this snapshot;
	// scanning while Scan runs; done once Scan has started (it runs once).
	held     []bool
	scanning bool
	done     bool

	// lastWarn is when a long hold was last logged (Options.Now, ms);
	// guarded by Store.mu.
	lastWarn int64
}

// Snapshot fixes the log's current end as the snapshot's position and pins
// the segments at or before it. The owner calls it with its writers
// excluded (engines/point holds every key stripe) when the position must
// match its index. It fails only on a closed store.
func (s *Store) Snapshot() (*Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return nil, fmt.Errorf("snapshot: %w", engines.ErrClosed)
	}
	sn := &Snapshot{s: s, taken: s.opts.Now()}
	if s.head != nil {
		sn.at = logPos{s.head.seq, s.head.size.Load()}
	} else {
		sn.at = logPos{s.nextSeq, 0}
	}
	for _, g := range s.segs { // in sequence order
		if g.seq > sn.at.seq {
			break
		}
		g.pins++
		sn.segs = append(sn.segs, g)
	}
	sn.held = make([]bool, len(sn.segs))
	for i := range sn.held {
		sn.held[i] = true
	}
	sn.lastWarn = sn.taken
	s.snaps[sn] = struct{}{}
	return sn, nil
}

// Needs reports whether the record at loc lies before the snapshot's
// position and its Scan has not reached it yet: an owner that takes its
// index away from loc (overwrite, delete, relocation) must then remember
// that loc was live, since the Scan, when it gets there, will ask. False
// for a location that names no live segment, and once Scan has passed it,
// returned or the snapshot was closed.
func (sn *Snapshot) Needs(loc uint64) bool {
	p, ok := sn.s.posOf(loc)
	if !ok || !p.before(sn.at) {
		return false
	}
	i := sort.Search(len(sn.segs), func(i int) bool { return sn.segs[i].seq >= p.seq })
	if i == len(sn.segs) || sn.segs[i].seq != p.seq {
		return false
	}
	prog := sn.progress.Load()
	pi, poff := int(prog>>32), prog&(1<<32-1)
	return i > pi || i == pi && p.off >= poff
}

func (p logPos) before(q logPos) bool { return p.seq < q.seq || p.seq == q.seq && p.off < q.off }

// Scan calls fn for every put record before the snapshot's position, in
// log order (sequential reads), stopping at fn's first error. It holds no
// lock while fn runs, only its pins, and releases each segment once read
// (a collected one is deleted then; a failure to is logged, not returned),
// and every pin when it returns. It
// runs once: a second call returns ErrSnapshotScanned; after Close it
// returns engines.ErrClosed.
func (sn *Snapshot) Scan(fn func(loc uint64, r engines.Record) error) error {
	sn.mu.Lock()
	switch {
	case sn.closed.Load():
		sn.mu.Unlock()
		return fmt.Errorf("scan snapshot: %w", engines.ErrClosed)
	case sn.done:
		sn.mu.Unlock()
		return fmt.Errorf("scan snapshot: %w", ErrSnapshotScanned)
	}
	sn.scanning, sn.done = true, true
	sn.mu.Unlock()
	err := sn.scan(fn)
	sn.mu.Lock()
	sn.scanning = false
	sn.mu.Unlock()
	_ = sn.release() // a failed delete is logged (unpin); the scan is right
	return err
}

func (sn *Snapshot) scan(fn func(loc uint64, r engines.Record) error) error {
	s := sn.s
	closed := func() bool { return sn.closed.Load() || s.closed.Load() }
	for i, g := range sn.segs {
		r := &segReader{s: s, g: g, end: g.size.Load(), off: segmentHeaderLen}
		if g.seq == sn.at.seq {
			r.end = sn.at.off // the head when taken: later appends are past P
		}
		for {
			if closed() {
				return fmt.Errorf("scan snapshot: %w", engines.ErrClosed)
			}
			off, h, key, value, err := r.next()
			if err == io.EOF {
				break
			}
			if err != nil {
				if closed() {
					return fmt.Errorf("scan snapshot: %w", engines.ErrClosed)
				}
				return fmt.Errorf("scan segment %d at offset %d: %w", g.seq, off, err)
			}
			if h.kind != kindPut {
				continue
			}
			sn.progress.Store(int64(i)<<32 | off)
			v, err := s.decodeValue(h, value)
			if err != nil {
				return fmt.Errorf("scan segment %d at offset %d: %w", g.seq, off, err)
			}
			if err := fn(g.loc(off), engines.Record{Key: key, Value: v, ExpiresAt: h.aux}); err != nil {
				return err
			}
		}
		sn.progress.Store(int64(i+1) << 32)
		_ = sn.releaseSeg(i) // a failed delete is logged; the scan is right
	}
	if closed() {
		// Closed while fn judged the last records: the owner may have
		// dropped what it kept for them.
		return fmt.Errorf("scan snapshot: %w", engines.ErrClosed)
	}
	return nil
}

// releaseSeg drops the snapshot's pin on segs[i], if it still holds it.
func (sn *Snapshot) releaseSeg(i int) error {
	sn.mu.Lock()
	held := sn.held[i]
	sn.held[i] = false
	sn.mu.Unlock()
	if !held {
		return nil
	}
	return sn.s.unpin(sn.segs[i])
}

// release drops every pin the snapshot still holds (unless a Scan is
// running: it releases them when it returns) and forgets the snapshot.
func (sn *Snapshot) release() error {
	sn.mu.Lock()
	if sn.scanning {
		sn.mu.Unlock()
		return nil
	}
	sn.progress.Store(int64(len(sn.segs)) << 32) // Needs is false from now on
	var rel []*segment
	for i, h := range sn.held {
		if h {
			rel = append(rel, sn.segs[i])
			sn.held[i] = false
		}
	}
	sn.mu.Unlock()
	s := sn.s
	s.mu.Lock()
	delete(s.snaps, sn)
	s.mu.Unlock()
	var errs []error
	for _, g := range rel {
		errs = append(errs, s.unpin(g))
	}
	return errors.Join(errs...)
}

// Close releases the snapshot's pins; segments the collector freed in the
// meantime are deleted now (the error is that of deleting them). A Scan
// running meanwhile stops with engines.ErrClosed and releases its pins as
// it returns. Idempotent.
func (sn *Snapshot) Close() error {
	if !sn.closed.CompareAndSwap(false, true) {
		return nil
	}
	return sn.release()
}

// unpin drops one pin of g; the last pin of a segment the collector has
// freed deletes its file.
func (s *Store) unpin(g *segment) error {
	s.mu.Lock()
	g.pins--
	drop := g.pins == 0 && g.obsolete
	s.mu.Unlock()
	if !drop {
		return nil
	}
	if err := s.dropSegment(g); err != nil {
		s.opts.Logger.Error("diskstore: delete a collected segment after its last snapshot", "segment", g.seq, "err", err)
		return err
	}
	return nil
}

// retireSegment is the collector's end of a segment that a snapshot still
// pins: its file is renamed to "<seq>.obsolete" (durably) so that a crash
// before the last pin goes leaves nothing recovery would read, and is
// deleted by the last unpin. If the last pin went already, the file is gone.
func (s *Store) retireSegment(g *segment) error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	if g.removed {
		return nil
	}
	to := filepath.Join(s.dir, obsoleteName(g.seq))
	if err := s.fs.Rename(g.path, to); err != nil {
		return fmt.Errorf("retire segment %d: %w", g.seq, err)
	}
	g.path = to
	if err := s.fs.SyncDir(s.dir); err != nil {
		return fmt.Errorf("retire segment %d: %w", g.seq, err)
	}
	s.mu.Lock()
	g.retired = true
	s.mu.Unlock()
	return nil
}

// dropSegment unmaps, closes and deletes a collected segment's file
// (durably), then frees its slot. Only once nothing reads the segment: it
// is out of the location table and unpinned. Idempotent.
func (s *Store) dropSegment(g *segment) error {
	s.syncMu.Lock()
	if g.removed {
		s.syncMu.Unlock()
		return nil
	}
	g.removed = true
	// Wait for reads inside its mapping (Read and ReadBatch may hold a
	// location of it from before it left the table), then drop the file.
	err := errors.Join(s.unmapSegment(g), g.f.Close(), s.fs.Remove(g.path), s.fs.SyncDir(s.dir))
	s.syncMu.Unlock()
	s.mu.Lock()
	for i, x := range s.obsolete {
		if x == g {
			s.obsolete = append(s.obsolete[:i:i], s.obsolete[i+1:]...)
			break
		}
	}
	if err == nil {
		// Only now may a new segment take g's slot (see uninstallLocked);
		// after a failure the slot stays unused until the store reopens.
		s.freeSlotLocked(g.slot)
	}
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("free segment %d: %w", g.seq, err)
	}
	return nil
}

// removeObsoleteFiles deletes the segments that were collected while a
// snapshot pinned them, left by a crash (Open).
func (s *Store) removeObsoleteFiles(names []string) error {
	removed := false
	for _, n := range names {
		seq, ok := parseObsoleteName(n)
		if !ok {
			continue
		}
		s.opts.Logger.Info("diskstore: removing a collected segment a snapshot held before the restart", "dir", s.dir, "segment", seq)
		if err := s.fs.Remove(filepath.Join(s.dir, n)); err != nil {
			return fmt.Errorf("remove obsolete segment %d: %w", seq, err)
		}
		removed = true
	}
	if removed {
		if err := s.fs.SyncDir(s.dir); err != nil {
			return fmt.Errorf("remove obsolete segments: %w", err)
		}
	}
	return nil
}

// warnLongSnapshots logs every snapshot held longer than
// Options.SnapshotWarnAge (again every SnapshotWarnAge while it is held):
// the collected segments it pins are disk space nobody can reclaim until
// it is released. The collector calls it on each tick.
func (s *Store) warnLongSnapshots() {
	if s.opts.SnapshotWarnAge < 0 {
		return
	}
	limit := s.opts.SnapshotWarnAge.Milliseconds()
	now := s.opts.Now()
	type hold struct {
		age, pinned, obsoleteBytes int64
	}
	var holds []hold
	s.mu.Lock()
	for sn := range s.snaps {
		if now-sn.taken < limit || now-sn.lastWarn < limit {
			continue
		}
		sn.lastWarn = now
		h := hold{age: now - sn.taken}
		for _, g := range sn.segs {
			if g.pins > 0 {
				h.pinned++
				if g.obsolete {
					h.obsoleteBytes += g.size.Load()
				}
			}
		}
		holds = append(holds, h)
	}
	s.mu.Unlock()
	for _, h := range holds {
		s.opts.Logger.Warn("diskstore: a snapshot has held its segments for long; collected ones cannot be deleted until it is closed",
			"dir", s.dir, "age_ms", h.age, "pinned_segments", h.pinned, "held_obsolete_bytes", h.obsoleteBytes)
	}
}

// Scan calls fn for every put record (live or garbage) before the log's
// end when it is called, in log order, stopping at fn's first error: it is
// a Snapshot's Scan. Records appended during the scan are not seen; a
// record the collector moves meanwhile is seen once, at its old location.
func (s *Store) Scan(fn func(loc uint64, r engines.Record) error) error {
	sn, err := s.Snapshot()
	if err != nil {
		return err
	}
	defer sn.Close()
	return sn.Scan(fn)
}
