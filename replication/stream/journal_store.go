package stream

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"

	"github.com/tabuladb/tabula/engines"
)

// The store's side of the journal: recovery (replaying the journal into
// the extent files at open) and checkpoints (fsyncing the extent files so
// that older journal files can go).

// startJournal replays the journal in the store's journal directory into
// the extent files, syncs them, removes the old journal files and starts
// a new journal and the checkpointer.
func (s *Store) startJournal(o JournalOptions) error {
	dir := filepath.Join(s.dir, journalDir)
	if err := s.fs.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("make journal directory: %w", err)
	}
	if err := s.fs.SyncDir(s.dir); err != nil {
		return fmt.Errorf("sync store directory: %w", err)
	}
	recs, newest, batch, err := readJournal(s.fs, dir)
	if err != nil {
		return err
	}
	if err := s.replay(recs); err != nil {
		return err
	}
	// Every record is now durable in its extent file: the old files go.
	old, err := listJournal(s.fs, dir)
	if err != nil {
		return fmt.Errorf("list journal: %w", err)
	}
	ckWake := make(chan struct{}, 1)
	jr, err := openJournal(s.fs, dir, newest+1, batch, o, s.log, func() {
		select {
		case ckWake <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.jr = jr
	for _, e := range s.extents {
		e.jr = jr
	}
	s.ckWake, s.ckStop, s.ckDone = ckWake, make(chan struct{}), make(chan struct{})
	s.mu.Unlock()
	go s.checkpointLoop()
	jr.mu.Lock()
	jr.files = append(old, jr.files...)
	jr.mu.Unlock()
	if err := jr.remove(old); err != nil {
		// Kept: the next checkpoint removes them, and a replay of them
		// is a no-op.
		s.log.Warn("remove replayed journal files", "err", err)
	}
	return nil
}

// replay applies the journal's records to the extent files, extent by
// extent, in journal order. Records of an extent the store does not have
// (deleted since) or of a sealed one (its file was synced when sealed)
// are skipped. For the others the journal is authoritative from its first
// record of the extent on: a record whose bytes the file already holds is
// skipped; otherwise the file is cut at the record's offset and the
// record written (a torn or never-synced tail, a hole); a record beyond
// the file's end is data the file lost although it was synced:
// engines.ErrCorrupt. A seal record cuts the file at its length and
// writes the seal block. Then the file is synced and the extent recovered
// again.
func (s *Store) replay(recs []journalRecord) error {
	byExtent := map[uint64][]journalRecord{}
	for _, r := range recs {
		byExtent[r.extent] = append(byExtent[r.extent], r)
	}
	skipped := 0
	for _, id := range slices.Sorted(maps.Keys(byExtent)) {
		rs := byExtent[id]
		e := s.extents[id]
		if e == nil || e.Info().Sealed {
			skipped += len(rs)
			continue
		}
		if err := s.replayExtent(e, rs); err != nil {
			return fmt.Errorf("replay journal into extent %d: %w", id, err)
		}
	}
	if len(recs) > 0 {
		s.log.Info("journal replayed", "records", len(recs), "extents", len(byExtent), "skipped", skipped)
	}
	return nil
}

func (s *Store) replayExtent(e *Extent, rs []journalRecord) error {
	id, base, path := e.id, e.base, e.path
	sealAt := int64(-1)
	for _, r := range rs {
		if r.kind != journalKindSeal {
			continue
		}
		if sealAt >= 0 && r.off != sealAt {
			return fmt.Errorf("sealed at %d and at %d: %w", sealAt, r.off, engines.ErrCorrupt)
		}
		sealAt = r.off
	}
	if err := e.Close(); err != nil {
		return err
	}
	delete(s.extents, id)
	f, err := s.fs.OpenReadWrite(path)
	if err != nil {
		return err
	}
	err = func() error {
		size, err := f.Size()
		if err != nil {
			return err
		}
		length := size - base // the file's extent bytes, valid or not
		changed := false
		put := func(off int64, b []byte) error {
			if err := f.Truncate(base + off); err != nil {
				return fmt.Errorf("cut at %d: %w", off, err)
			}
			if _, err := f.Write(b); err != nil {
				return fmt.Errorf("write at %d: %w", off, err)
			}
			length, changed = off+int64(len(b)), true
			return nil
		}
		for _, r := range rs {
			if r.kind != journalKindData {
				continue
			}
			off, data := r.off, r.data
			if sealAt >= 0 {
				if off >= sealAt {
					continue
				}
				data = data[:min(int64(len(data)), sealAt-off)]
			}
			if err := DecodeBlocks(data, id, off, func(int64, uint64, bool, []byte) error { return nil }); err != nil {
				return fmt.Errorf("journal record at %d: %w", off, err)
			}
			if off > length {
				return fmt.Errorf("journal record at %d, the file holds %d: synced data lost: %w", off, length, engines.ErrCorrupt)
			}
			end := off + int64(len(data))
			if end <= length {
				have := make([]byte, len(data))
				if _, err := f.ReadAt(have, base+off); err != nil {
					return fmt.Errorf("read at %d: %w", off, err)
				}
				if bytes.Equal(have, data) {
					continue
				}
			}
			if err := put(off, data); err != nil {
				return err
			}
		}
		if sealAt >= 0 {
			if sealAt > length {
				return fmt.Errorf("sealed at %d, the file holds %d: synced data lost: %w", sealAt, length, engines.ErrCorrupt)
			}
			if err := put(sealAt, sealBlock(id, sealAt)); err != nil {
				return err
			}
		}
		if changed {
			if err := f.Sync(); err != nil {
				return fmt.Errorf("sync: %w", err)
			}
		}
		return nil
	}()
	if cerr := f.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	ne, err := openExtent(s.fs, path, id)
	if err != nil {
		return err
	}
	s.extents[id] = ne
	return nil
}

// checkpointLoop runs a checkpoint each time the journal moved to a new
// file, until Close.
func (s *Store) checkpointLoop() {
	defer close(s.ckDone)
	for {
		select {
		case <-s.ckStop:
			return
		case <-s.ckWake:
		}
		if err := s.checkpoint(); err != nil {
			s.ckErr.Store(&err)
			s.log.Error("journal checkpoint failed; the journal keeps its files", "err", err)
		} else {
			s.ckErr.Store(nil)
		}
	}
}

// checkpoint fsyncs every extent file written since its last fsync, then
// removes the journal files before the current one. Every record in them
// was queued after its bytes were written to the extent file, and before
// the journal moved on, which happened before the fsyncs: so the fsyncs
// cover them. An extent whose file fsync ever failed keeps the journal.
func (s *Store) checkpoint() error {
	s.ckMu.Lock()
	defer s.ckMu.Unlock()
	old := s.jr.older()
	if len(old) == 0 {
		return nil
	}
	s.mu.Lock()
	es := slices.Collect(maps.Values(s.extents))
	s.mu.Unlock()
	var errs []error
	for _, e := range es {
		if err := e.syncFile(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return s.jr.remove(old)
}

// Checkpoint fsyncs the extent files and removes the journal files the
// fsyncs made unnecessary (the journal moves to a new file first). The
// checkpointer does this by itself whenever the journal fills a file;
// this is for tests and a clean shutdown. No-op without a journal.
func (s *Store) Checkpoint() error {
	if s.jr == nil {
		return nil
	}
	if err := s.jr.forceRotate(); err != nil {
		return err
	}
	return s.checkpoint()
}
