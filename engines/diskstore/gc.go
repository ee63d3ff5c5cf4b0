package diskstore

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/tabuladb/tabula/engines"
)

// Mover is the owner's half of garbage collection: only the owner's index
// knows which records are live. Both methods must act atomically with
// respect to the owner's writers of the key (hold the key's write lock).
type Mover interface {
	// Relocate is called for each put record r at loc in a segment being
	// collected (r's slices are valid during the call only). If the index
	// points at loc, the owner re-appends r (Store.Append), points the
	// index at the copy (only if it still points at loc: a concurrent
	// overwrite wins) and Frees loc; if r is expired it may instead drop
	// it: Tombstone(r.Key, loc), remove the index entry, Free(loc). If the
	// index points elsewhere, r is garbage: do nothing.
	Relocate(loc uint64, r engines.Record) error
	// RelocateTombstone is called for each tombstone of a victim that an
	// older segment may still need (it shadows records there). If key is
	// absent from the index, the owner calls keep, which re-appends the
	// tombstone at the head; if key is present (written again since the
	// delete), the tombstone is garbage and must not be kept — it would
	// delete the newer record on the next restart.
	RelocateTombstone(key []byte, keep func() error) error
}

// StartGC starts the collector, a goroutine owned by the store (Close stops
// it). Call it once, after Recover.
//
// Victim choice is cost-benefit (Rosenblum and Ousterhout's LFS, as in
// FlashStore): among sealed segments, the one maximising
// (1-u)·age / (1+u), where u is the segment's live fraction (cost: read the
// segment, write u of it; benefit: 1-u freed, weighted by age = segments
// written since, as cold segments stay free longer). When it runs, see
// pickVictim: it keeps the store's files within MaxSpaceAmp × the live
// keys and values where the record headers and index allow. Between
// victims it rests so it uses at most GCDutyCycle of the time (none while
// the log is over twice its live bytes).
// Relocated records bypass the read cache (AppendRelocated).
func (s *Store) StartGC(m Mover) {
	s.wg.Add(1)
	go s.gcLoop(m)
}

func (s *Store) gcLoop(m Mover) {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.GCInterval)
	defer t.Stop()
	for {
		select {
		case <-s.closing:
			return
		case <-t.C:
		}
		s.warnLongSnapshots()
		for {
			g, amp := s.pickVictim()
			if g == nil {
				break
			}
			start := time.Now()
			if err := s.collect(g, m); err != nil {
				if !errors.Is(err, engines.ErrClosed) {
					s.opts.Logger.Error("diskstore: collect segment", "segment", g.seq, "err", err)
				}
				break
			}
			if amp >= 2 || s.opts.GCDutyCycle >= 1 {
				continue
			}
			rest := time.Duration(float64(time.Since(start)) * (1 - s.opts.GCDutyCycle) / s.opts.GCDutyCycle)
			select {
			case <-s.closing:
				return
			case <-time.After(rest):
			}
		}
	}
}

// GC runs one collection pass now, in the caller's goroutine, until the
// space amplification is under MaxSpaceAmp (no pacing). It first writes out
// what is buffered, so that sealed segments still in memory (lazy mode)
// can be collected. For tests and operators; the background collector does
// the same paced.
func (s *Store) GC(m Mover) (collected int, err error) {
	if err := s.Sync(); err != nil {
		return 0, fmt.Errorf("gc: %w", err)
	}
	for {
		g, _ := s.pickVictim()
		if g == nil {
			return collected, nil
		}
		if err := s.collect(g, m); err != nil {
			return collected, err
		}
		collected++
	}
}

// minGarbageFraction is the least garbage, as a fraction of the live
// bytes, the collector leaves: below it every victim is nearly full, and
// each byte freed costs many bytes copied.
const minGarbageFraction = 0.03

// gcHysteresis: once running, the collector goes on until the garbage is
// this fraction under what MaxSpaceAmp allows, so that a steady stream of
// overwrites finds it idle for a while instead of one segment at a time.
const gcHysteresis = 0.15

// pickVictim returns the segment to collect next, or nil if the log needs
// no collection, with the log's size over its live bytes (the pacing's
// pressure).
//
// The goal is the space amplification a user measures: every file of the
// store (segments and index blocks) over the stored keys and values of
// the live records, at most MaxSpaceAmp. Record headers and the index are
// overhead the collector cannot shed, so what it controls is the garbage:
// it starts when the garbage exceeds what MaxSpaceAmp leaves room for
// (never less than minGarbageFraction of the live bytes, nor one segment)
// and stops gcHysteresis under it.
func (s *Store) pickVictim() (*segment, float64) {
	s.ix.mu.Lock()
	indexBytes := s.ix.baseBytes + s.ix.deltaBytes
	s.ix.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed != nil || !s.recovered || s.closed.Load() {
		return nil, 0
	}
	var logBytes, live, payload int64
	now := s.opts.Now()
	for _, g := range s.segs {
		logBytes += g.size.Load()
		live += g.liveAt(now)
		payload += g.payloadAt(now)
	}
	pressure := float64(logBytes) / float64(max(live, 1))
	garbage := logBytes - live
	allowed := max(int64(s.opts.MaxSpaceAmp*float64(payload))-live-indexBytes, int64(minGarbageFraction*float64(live)))
	if s.gcActive {
		allowed = int64(float64(allowed) * (1 - gcHysteresis))
	}
	if garbage <= allowed || garbage < s.opts.SegmentSize {
		s.gcActive = false
		return nil, pressure
	}
	s.gcActive = true
	var best *segment
	bestScore := 0.0
	for _, g := range s.segs {
		if g == s.head || !g.sealed || g.queued || g.written.Load() != g.size.Load() {
			continue
		}
		u := float64(g.liveAt(now)) / float64(max(g.size.Load()-segmentHeaderLen, 1))
		if u >= 0.98 {
			continue
		}
		age := float64(s.nextSeq - g.seq)
		if score := (1 - u) * age / (1 + u); score > bestScore {
			best, bestScore = g, score
		}
	}
	if best == nil {
		s.gcActive = false
	}
	return best, pressure
}

// collect moves g's live records and needed tombstones to the head, makes
// them durable, and frees g.
func (s *Store) collect(g *segment, m Mover) error {
	s.collectMu.Lock()
	defer s.collectMu.Unlock()
	if g.dead.Load() {
		return nil // another collection (GC beside the background loop) took it
	}
	r := &segReader{s: s, g: g, end: g.size.Load(), off: segmentHeaderLen}
	var moved int64
	// The collector does not yield its processor between records: with
	// readers busy on every processor, each yield waited for the
	// scheduler's next preemption (~10 ms), and a yield every 32 records
	// slowed collection ~20× (space amplification 1.43 instead of 1.13
	// after the benchmark's 15 s window) while the reads' p99.9 stayed the
	// same (74 µs against 76 µs without yields): a preempted reader is one
	// slow read per 10 ms, far fewer than 0.1% of them.
	for {
		select {
		case <-s.closing:
			return engines.ErrClosed
		default:
		}
		off, h, key, value, err := r.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("collect segment %d at offset %d: %w", g.seq, off, err)
		}
		if s.hidesKey(g.seq, key) {
			continue // the other child's, since a split: garbage here
		}
		switch h.kind {
		case kindPut:
			v, err := s.decodeValue(h, value)
			if err != nil {
				return fmt.Errorf("collect segment %d at offset %d: %w", g.seq, off, err)
			}
			before := g.live.Load()
			if err := m.Relocate(g.loc(off), engines.Record{Key: key, Value: v, ExpiresAt: h.aux}); err != nil {
				return fmt.Errorf("collect segment %d: relocate record at %d: %w", g.seq, off, err)
			}
			moved += before - g.live.Load()
		case kindTombstone:
			if !s.olderSegmentUpTo(g, uint64(h.aux)) {
				continue // nothing older left for it to shadow
			}
			aux := h.aux
			keep := func() error {
				_, err := s.append(kindTombstone, 0, key, nil, aux, false)
				return err
			}
			if err := m.RelocateTombstone(key, keep); err != nil {
				return fmt.Errorf("collect segment %d: tombstone at %d: %w", g.seq, off, err)
			}
		}
	}
	// Every copy and every tombstone that shadows g's garbage must be
	// durable before g's file goes.
	if err := s.Sync(); err != nil {
		return fmt.Errorf("collect segment %d: %w", g.seq, err)
	}
	if live := g.live.Load(); live != 0 {
		s.opts.Logger.Warn("diskstore: collected segment still counts live bytes", "segment", g.seq, "live", live)
	}
	s.mu.Lock()
	s.uninstallLocked(g)
	g.dead.Store(true)
	// A snapshot that pins g will still read it: its file stays until the
	// last pin goes (renamed, so that a crash meanwhile leaves nothing
	// recovery reads). Pins are taken under mu, so none comes after this.
	pinned := g.pins > 0
	if pinned {
		g.obsolete = true
		s.obsolete = append(s.obsolete, g)
	}
	s.mu.Unlock()
	s.stats.gcRuns.Add(1)
	s.stats.gcBytesMoved.Add(moved)
	s.stats.gcSegmentsFreed.Add(1)
	if pinned {
		s.stats.gcSegmentsDeferred.Add(1)
		if err := s.retireSegment(g); err != nil {
			// The file keeps its name: harmless (its records are all
			// garbage or copied), but recovery reads it, so tombstones that
			// shadow it are kept meanwhile (olderSegmentUpTo).
			s.opts.Logger.Warn("diskstore: rename of a collected segment a snapshot holds", "segment", g.seq, "err", err)
		}
		return nil
	}
	return s.dropSegment(g)
}

// olderSegmentUpTo reports whether a segment other than g with sequence
// number <= seq is still live (and may hold records a tombstone shadows).
func (s *Store) olderSegmentUpTo(g *segment, seq uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, x := range s.segs {
		if x != g && x.seq <= seq {
			return true
		}
	}
	// A collected segment whose file still bears its segment name (a
	// snapshot pins it and the rename failed) would be replayed after a
	// crash: what it shadows must stay shadowed.
	for _, x := range s.obsolete {
		if x != g && x.seq <= seq && !x.retired {
			return true
		}
	}
	return false
}
