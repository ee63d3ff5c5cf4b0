package raftnode

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path"
	"strings"
	"sync/atomic"

	"github.com/tabuladb/tabula/engines/vfs"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Storage is a member's durable raft state on a vfs.FS: the log, the
// HardState and the latest snapshot. It implements raft.Storage, read from
// a raft.MemoryStorage that mirrors what is on disk.
//
// The log is one file, wal-<gen>.log, rewritten into the next generation
// whenever a snapshot lets it shrink (see doc.go); the snapshot is
// snap-<index>.snap.
//
// Concurrency: the raft.Storage methods are safe for concurrent use.
// Save, SaveSnapshot, Compact and Close are called by one goroutine (the
// node's); WriteSnapshotFile may run concurrently with them on another.
type Storage struct {
	fs     vfs.FS
	dir    string
	logger *slog.Logger
	mem    *raft.MemoryStorage
	tmpSeq atomic.Uint64

	// Owned by the writer goroutine.
	gen    uint64
	f      vfs.File
	buf    []byte
	closed bool
}

var _ raft.Storage = (*Storage)(nil)

func walName(gen uint64) string    { return fmt.Sprintf("wal-%016x.log", gen) }
func snapName(index uint64) string { return fmt.Sprintf("snap-%016x.snap", index) }

// OpenStorage opens (creating it if absent) the storage in dir on fs and
// loads it into memory. A torn final record of the log is dropped; any
// other damage fails with an error that errors.Is ErrCorrupt. The log is
// rewritten into a fresh generation on open, which also drops the torn
// tail and the files a crash in the middle of a compaction left.
func OpenStorage(fs vfs.FS, dir string, logger *slog.Logger) (*Storage, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("raftnode: create %s: %w", dir, err)
	}
	if err := fs.SyncDir(path.Dir(path.Clean(dir))); err != nil {
		return nil, fmt.Errorf("raftnode: sync parent of %s: %w", dir, err)
	}
	names, err := fs.List(dir)
	if err != nil {
		return nil, fmt.Errorf("raftnode: list %s: %w", dir, err)
	}
	s := &Storage{fs: fs, dir: dir, logger: logger, mem: raft.NewMemoryStorage()}
	var gens, snaps []uint64
	for _, name := range names {
		var n uint64
		switch {
		case strings.HasSuffix(name, ".tmp"):
			if err := fs.Remove(path.Join(dir, name)); err != nil {
				return nil, fmt.Errorf("raftnode: remove leftover %s: %w", name, err)
			}
		case scanName(name, "wal-%016x.log", &n):
			gens = append(gens, n)
		case scanName(name, "snap-%016x.snap", &n):
			snaps = append(snaps, n)
		}
	}
	rp := replay{}
	for _, gen := range gens {
		if err := s.replayFile(&rp, gen); err != nil {
			return nil, err
		}
	}
	if len(gens) > 0 {
		s.gen = gens[len(gens)-1]
	}
	if rp.base.index > 0 {
		snap, err := s.readSnapshotFile(rp.base.index)
		if err != nil {
			return nil, err
		}
		if snap.Metadata.Term != rp.base.term {
			return nil, fmt.Errorf("%w: snapshot at %d has term %d, the log says %d", ErrCorrupt, rp.base.index, snap.Metadata.Term, rp.base.term)
		}
		if err := s.mem.ApplySnapshot(snap); err != nil {
			return nil, fmt.Errorf("raftnode: load snapshot: %w", err)
		}
	}
	if err := s.mem.Append(rp.ents); err != nil {
		return nil, fmt.Errorf("raftnode: load log: %w", err)
	}
	hs := rp.hs
	// A snapshot received from the leader is durable before the HardState
	// that came with it; after a crash in between, the snapshot's index is
	// committed by definition and its term the newest this member saw (it
	// voted in no later term, or that vote would be on disk).
	if hs.Commit < rp.base.index {
		hs.Commit = rp.base.index
	}
	if hs.Term < rp.base.term {
		hs.Term, hs.Vote = rp.base.term, 0
	}
	last, _ := s.mem.LastIndex()
	if hs.Commit > last {
		return nil, fmt.Errorf("%w: commit index %d past the last log entry %d", ErrCorrupt, hs.Commit, last)
	}
	if err := s.mem.SetHardState(hs); err != nil {
		return nil, err
	}
	if err := s.rewrite(snapMark{rp.base.index, rp.base.term, markCompact}); err != nil {
		return nil, err
	}
	// Snapshot files newer than the base are orphans of a crash before the
	// log named them.
	for _, index := range snaps {
		if index > rp.base.index {
			if err := fs.Remove(path.Join(dir, snapName(index))); err != nil {
				return nil, fmt.Errorf("raftnode: remove orphan snapshot: %w", err)
			}
		}
	}
	return s, nil
}

func scanName(name, format string, n *uint64) bool {
	_, err := fmt.Sscanf(name, format, n)
	return err == nil && name == fmt.Sprintf(format, *n)
}

// replay is the log being rebuilt from the records of the log files.
type replay struct {
	base snapMark
	ents []raftpb.Entry
	hs   raftpb.HardState
}

func (rp *replay) lastIndex() uint64 { return rp.base.index + uint64(len(rp.ents)) }

func (s *Storage) replayFile(rp *replay, gen uint64) error {
	name := path.Join(s.dir, walName(gen))
	data, err := readFile(s.fs, name)
	if err != nil {
		return fmt.Errorf("raftnode: read %s: %w", name, err)
	}
	body, err := checkFileHeader(data, walMagic)
	if err != nil {
		return fmt.Errorf("raftnode: %s: %w", name, err)
	}
	recs, torn, err := decodeRecords(body)
	if err != nil {
		return fmt.Errorf("raftnode: %s: %w", name, err)
	}
	// Any generation may end torn: a Save without sync (raft allows it for
	// commit-only changes) leaves an unsynced tail, and a rewrite that
	// follows copies the whole log into the next generation from memory
	// without syncing the old one, whose name a crash may keep.
	if torn {
		s.logger.Warn("raftnode: dropped the torn tail of the log (a crash during an append; it was never acknowledged)", "file", name)
	}
	for i, r := range recs {
		if err := rp.apply(r); err != nil {
			return fmt.Errorf("raftnode: %s record %d: %w", name, i, err)
		}
	}
	return nil
}

func (rp *replay) apply(r record) error {
	switch r.typ {
	case recHardState:
		var hs raftpb.HardState
		if err := hs.Unmarshal(r.payload); err != nil {
			return fmt.Errorf("%w: hard state: %v", ErrCorrupt, err)
		}
		rp.hs = hs
	case recSnapMark:
		m, err := decodeSnapMark(r.payload)
		if err != nil {
			return err
		}
		if m.kind == markReset || m.index > rp.lastIndex() {
			rp.ents = nil
		} else if m.index > rp.base.index {
			if t := rp.ents[m.index-rp.base.index-1].Term; t != m.term {
				return fmt.Errorf("%w: snapshot mark at %d term %d, log entry has term %d", ErrCorrupt, m.index, m.term, t)
			}
			rp.ents = append([]raftpb.Entry(nil), rp.ents[m.index-rp.base.index:]...)
		} else if m.index < rp.base.index {
			return fmt.Errorf("%w: snapshot mark at %d behind the base %d", ErrCorrupt, m.index, rp.base.index)
		}
		rp.base = snapMark{index: m.index, term: m.term}
	case recEntries:
		ents, err := decodeEntries(r.payload)
		if err != nil {
			return err
		}
		for _, e := range ents {
			if e.Index <= rp.base.index {
				continue
			}
			if e.Index > rp.lastIndex()+1 {
				return fmt.Errorf("%w: entry %d after the last entry %d", ErrCorrupt, e.Index, rp.lastIndex())
			}
			rp.ents = append(rp.ents[:e.Index-rp.base.index-1], e)
		}
	default:
		return fmt.Errorf("%w: unknown record type %d", ErrCorrupt, r.typ)
	}
	return nil
}

func appendEntries(dst []byte, ents []raftpb.Entry) ([]byte, error) {
	for i := range ents {
		n := ents[i].Size()
		dst = binary.AppendUvarint(dst, uint64(n))
		start := len(dst)
		dst = append(dst, make([]byte, n)...)
		if _, err := ents[i].MarshalTo(dst[start:]); err != nil {
			return nil, fmt.Errorf("raftnode: encode entry %d: %w", ents[i].Index, err)
		}
	}
	return dst, nil
}

func decodeEntries(p []byte) ([]raftpb.Entry, error) {
	var ents []raftpb.Entry
	for len(p) > 0 {
		n, k := binary.Uvarint(p)
		if k <= 0 || n > uint64(len(p)-k) {
			return nil, fmt.Errorf("%w: bad entry length", ErrCorrupt)
		}
		var e raftpb.Entry
		if err := e.Unmarshal(p[k : k+int(n)]); err != nil {
			return nil, fmt.Errorf("%w: entry: %v", ErrCorrupt, err)
		}
		if len(ents) > 0 && e.Index != ents[len(ents)-1].Index+1 {
			return nil, fmt.Errorf("%w: entry %d follows %d", ErrCorrupt, e.Index, ents[len(ents)-1].Index)
		}
		ents = append(ents, e)
		p = p[k+int(n):]
	}
	return ents, nil
}

func readFile(fs vfs.FS, name string) ([]byte, error) {
	f, err := fs.Open(name)
	if err != nil {
		return nil, err
	}
	size, err := f.Size()
	if err != nil {
		return nil, errors.Join(err, f.Close())
	}
	data := make([]byte, size)
	if _, err := f.ReadAt(data, 0); err != nil && !errors.Is(err, io.EOF) {
		return nil, errors.Join(err, f.Close())
	}
	return data, f.Close()
}

// readSnapshotFile reads and verifies the snapshot file at index.
func (s *Storage) readSnapshotFile(index uint64) (raftpb.Snapshot, error) {
	name := path.Join(s.dir, snapName(index))
	data, err := readFile(s.fs, name)
	if err != nil {
		return raftpb.Snapshot{}, fmt.Errorf("%w: the log's base is the snapshot at %d: %w", ErrCorrupt, index, err)
	}
	snap, err := decodeSnapshotFile(data)
	if err != nil {
		return raftpb.Snapshot{}, fmt.Errorf("raftnode: %s: %w", name, err)
	}
	if snap.Metadata.Index != index {
		return raftpb.Snapshot{}, fmt.Errorf("%w: %s holds the snapshot at %d", ErrCorrupt, name, snap.Metadata.Index)
	}
	return snap, nil
}

// decodeSnapshotFile decodes a snapshot file. Snapshot files are replaced
// atomically, so any damage, a torn record included, is ErrCorrupt.
func decodeSnapshotFile(data []byte) (raftpb.Snapshot, error) {
	body, err := checkFileHeader(data, snapMagic)
	if err != nil {
		return raftpb.Snapshot{}, err
	}
	r, n, ok := parseRecord(body)
	if !ok || n != len(body) || r.typ != recSnapshot {
		return raftpb.Snapshot{}, fmt.Errorf("%w: snapshot file does not hold exactly one intact snapshot record", ErrCorrupt)
	}
	var snap raftpb.Snapshot
	if err := snap.Unmarshal(r.payload); err != nil {
		return raftpb.Snapshot{}, fmt.Errorf("%w: snapshot: %v", ErrCorrupt, err)
	}
	return snap, nil
}

// WriteSnapshotFile durably writes snap as snap-<index>.snap (write a
// temporary file, fsync, rename, fsync the directory). The log does not
// name it yet: until Compact (or SaveSnapshot) does, a reopen ignores and
// removes it. Safe to call concurrently with the other methods.
func (s *Storage) WriteSnapshotFile(snap raftpb.Snapshot) error {
	payload, err := snap.Marshal()
	if err != nil {
		return fmt.Errorf("raftnode: encode snapshot: %w", err)
	}
	data := appendRecord(appendFileHeader(nil, snapMagic), recSnapshot, payload)
	name := path.Join(s.dir, snapName(snap.Metadata.Index))
	if err := writeFileAtomic(s.fs, name, fmt.Sprintf("%s.%d.tmp", name, s.tmpSeq.Add(1)), data); err != nil {
		return fmt.Errorf("raftnode: write snapshot at %d: %w", snap.Metadata.Index, err)
	}
	return nil
}

// writeFileAtomic durably replaces name with data.
// The temporary name is unique: the node's goroutine and the snapshot
// writer may write a file of the same index at once.
func writeFileAtomic(fs vfs.FS, name, tmp string, data []byte) error {
	f, err := fs.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		return errors.Join(err, f.Close())
	}
	if err := f.Sync(); err != nil {
		return errors.Join(err, f.Close())
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := fs.Rename(tmp, name); err != nil {
		return err
	}
	return fs.SyncDir(path.Dir(name))
}

// Save appends ents and hs (either may be empty) to the log, as raft's
// Ready hands them over, then to the in-memory read side. With sync, they
// are durable when Save returns, so the Ready's messages may go out. An
// error leaves the log in an unknown state: the caller must stop.
func (s *Storage) Save(hs raftpb.HardState, ents []raftpb.Entry, sync bool) error {
	if s.closed {
		return ErrStopped
	}
	buf := s.buf[:0]
	if len(ents) > 0 {
		p, err := appendEntries(nil, ents)
		if err != nil {
			return err
		}
		buf = appendRecord(buf, recEntries, p)
	}
	if !raft.IsEmptyHardState(hs) {
		p, err := hs.Marshal()
		if err != nil {
			return fmt.Errorf("raftnode: encode hard state: %w", err)
		}
		buf = appendRecord(buf, recHardState, p)
	}
	s.buf = buf
	if len(buf) == 0 {
		return nil
	}
	if _, err := s.f.Write(buf); err != nil {
		return fmt.Errorf("raftnode: append to %s: %w", walName(s.gen), err)
	}
	if sync {
		if err := s.f.Sync(); err != nil {
			return fmt.Errorf("raftnode: sync %s: %w", walName(s.gen), err)
		}
	}
	if len(ents) > 0 {
		if err := s.mem.Append(ents); err != nil {
			return fmt.Errorf("raftnode: append to memory: %w", err)
		}
	}
	if !raft.IsEmptyHardState(hs) {
		if err := s.mem.SetHardState(hs); err != nil {
			return err
		}
	}
	return nil
}

// SaveSnapshot durably installs snap, a snapshot received from the leader,
// with the HardState of its Ready: it writes the snapshot file, then
// starts a log that holds nothing before it. Durable when it returns.
func (s *Storage) SaveSnapshot(snap raftpb.Snapshot, hs raftpb.HardState) error {
	if s.closed {
		return ErrStopped
	}
	if err := s.WriteSnapshotFile(snap); err != nil {
		return err
	}
	if err := s.mem.ApplySnapshot(snap); err != nil {
		return fmt.Errorf("raftnode: apply snapshot at %d: %w", snap.Metadata.Index, err)
	}
	if !raft.IsEmptyHardState(hs) {
		if err := s.mem.SetHardState(hs); err != nil {
			return err
		}
	}
	return s.rewrite(snapMark{snap.Metadata.Index, snap.Metadata.Term, markReset})
}

// Compact makes snap, a snapshot this member took whose file
// WriteSnapshotFile made durable, the base of the log: the log is rewritten
// without the entries it covers, and older snapshot files are removed. The
// in-memory log keeps the keep entries before it, for followers that lag a
// little. A snapshot older than the current base (one received from the
// leader meanwhile) is discarded. Durable when it returns.
func (s *Storage) Compact(snap raftpb.Snapshot, keep uint64) error {
	if s.closed {
		return ErrStopped
	}
	m := snap.Metadata
	if _, err := s.mem.CreateSnapshot(m.Index, &m.ConfState, snap.Data); err != nil {
		if errors.Is(err, raft.ErrSnapOutOfDate) {
			if cur, _ := s.mem.Snapshot(); cur.Metadata.Index == m.Index {
				return nil // the leader's snapshot at the same index holds the file
			}
			if err := s.fs.Remove(path.Join(s.dir, snapName(m.Index))); err != nil {
				s.logger.Warn("raftnode: remove outdated snapshot file", "index", m.Index, "err", err)
			}
			return nil
		}
		return fmt.Errorf("raftnode: snapshot at %d: %w", m.Index, err)
	}
	if err := s.rewrite(snapMark{m.Index, m.Term, markCompact}); err != nil {
		return err
	}
	if m.Index > keep {
		if err := s.mem.Compact(m.Index - keep); err != nil && !errors.Is(err, raft.ErrCompacted) {
			return fmt.Errorf("raftnode: compact memory log to %d: %w", m.Index-keep, err)
		}
	}
	return nil
}

// rewrite writes the next log generation: the mark of the current base,
// the HardState and every entry after the base, fsynced and named durably;
// then it removes the older generations and every snapshot file but the
// base's. A crash at any point leaves a log that replays to the same state.
func (s *Storage) rewrite(base snapMark) error {
	hs, _, err := s.mem.InitialState()
	if err != nil {
		return err
	}
	buf := appendRecord(appendFileHeader(nil, walMagic), recSnapMark, base.encode())
	first, _ := s.mem.FirstIndex()
	last, _ := s.mem.LastIndex()
	lo := max(first, base.index+1)
	if lo <= last {
		ents, err := s.mem.Entries(lo, last+1, ^uint64(0))
		if err != nil {
			return fmt.Errorf("raftnode: read log %d..%d: %w", lo, last, err)
		}
		p, err := appendEntries(nil, ents)
		if err != nil {
			return err
		}
		buf = appendRecord(buf, recEntries, p)
	}
	if !raft.IsEmptyHardState(hs) {
		p, err := hs.Marshal()
		if err != nil {
			return fmt.Errorf("raftnode: encode hard state: %w", err)
		}
		buf = appendRecord(buf, recHardState, p)
	}
	gen := s.gen + 1
	name := path.Join(s.dir, walName(gen))
	f, err := s.fs.Create(name)
	if err != nil {
		return fmt.Errorf("raftnode: create %s: %w", name, err)
	}
	if _, err := f.Write(buf); err != nil {
		return errors.Join(fmt.Errorf("raftnode: write %s: %w", name, err), f.Close())
	}
	if err := f.Sync(); err != nil {
		return errors.Join(fmt.Errorf("raftnode: sync %s: %w", name, err), f.Close())
	}
	if err := s.fs.SyncDir(s.dir); err != nil {
		return errors.Join(fmt.Errorf("raftnode: sync %s: %w", s.dir, err), f.Close())
	}
	old := s.f
	s.f, s.gen = f, gen
	// The new generation is durable; what follows only tidies up. A file
	// left behind replays to the same state (or is an orphan snapshot,
	// removed at the next open), so failures here are logged, not fatal.
	if old != nil {
		if err := old.Close(); err != nil {
			s.logger.Warn("raftnode: close previous log", "err", err)
		}
	}
	names, err := s.fs.List(s.dir)
	if err != nil {
		s.logger.Warn("raftnode: list log directory", "dir", s.dir, "err", err)
		return nil
	}
	for _, n := range names {
		var x uint64
		// Snapshot files newer than the base are orphans of a crash, or
		// one being written by the snapshot writer; both are left alone.
		if (scanName(n, "wal-%016x.log", &x) && x < gen) || (scanName(n, "snap-%016x.snap", &x) && x < base.index) {
			if err := s.fs.Remove(path.Join(s.dir, n)); err != nil {
				s.logger.Warn("raftnode: remove old file", "file", n, "err", err)
			}
		}
	}
	if err := s.fs.SyncDir(s.dir); err != nil {
		s.logger.Warn("raftnode: sync log directory", "dir", s.dir, "err", err)
	}
	return nil
}

// Close closes the log file. Idempotent.
func (s *Storage) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	if s.f == nil {
		return nil
	}
	return s.f.Close()
}

// InitialState implements raft.Storage.
func (s *Storage) InitialState() (raftpb.HardState, raftpb.ConfState, error) {
	return s.mem.InitialState()
}

// Entries implements raft.Storage.
func (s *Storage) Entries(lo, hi, maxSize uint64) ([]raftpb.Entry, error) {
	return s.mem.Entries(lo, hi, maxSize)
}

// Term implements raft.Storage.
func (s *Storage) Term(i uint64) (uint64, error) { return s.mem.Term(i) }

// LastIndex implements raft.Storage.
func (s *Storage) LastIndex() (uint64, error) { return s.mem.LastIndex() }

// FirstIndex implements raft.Storage.
func (s *Storage) FirstIndex() (uint64, error) { return s.mem.FirstIndex() }

// Snapshot implements raft.Storage: the latest snapshot, data included.
func (s *Storage) Snapshot() (raftpb.Snapshot, error) { return s.mem.Snapshot() }
