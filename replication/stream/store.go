package stream

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tabuladb/tabula/engines/vfs"
)

// Store is the directory of extent replicas of one extent node: one file
// per extent, "%016x.ext" (see the package comment), and, for a node, the
// journal of their writes in "journal/". It is safe for concurrent use.
type Store struct {
	fs  vfs.FS
	dir string
	jr  *journal // nil: every extent fsyncs its own file
	log *slog.Logger

	// The checkpointer (with a journal): woken by the journal moving to a
	// new file, stopped by Close.
	ckWake chan struct{}
	ckStop chan struct{}
	ckDone chan struct{}
	ckErr  atomic.Pointer[error] // the last checkpoint's failure, for tests
	ckMu   sync.Mutex            // serialises checkpoints

	mu sync.Mutex
	// Guarded by mu.
	extents map[uint64]*Extent
	busy    map[uint64]bool // ids being created or installed
	closed  bool
}

const (
	extentSuffix = ".ext"
	tmpSuffix    = ".ext.tmp"
)

func (s *Store) path(id uint64) string {
	return filepath.Join(s.dir, fmt.Sprintf("%016x%s", id, extentSuffix))
}

// OpenStore opens (creating it if needed) the store in dir and recovers
// every extent in it (see Extent). Unfinished copies ("*.ext.tmp") are
// removed. An extent file that cannot be opened fails the open. The store
// has no journal: every Sync fsyncs its extent's file (OpenJournaledStore
// is what a node uses).
func OpenStore(fs vfs.FS, dir string) (*Store, error) {
	return openStore(fs, dir)
}

// OpenJournaledStore opens the store in dir as OpenStore does, then
// replays its journal ("journal/" in dir; see the package comment,
// "Journal") into the extent files and starts a new one: the extents'
// writes are then journaled and Sync waits for the journal's shared
// fsync. A journal damaged anywhere but at its torn tail fails the open
// with engines.ErrCorrupt, as does a journal record for data an extent
// file lost. log may be nil.
func OpenJournaledStore(fs vfs.FS, dir string, o JournalOptions, log *slog.Logger) (*Store, error) {
	if o.FileBytes < 0 {
		return nil, fmt.Errorf("stream: JournalOptions.FileBytes %d is negative", o.FileBytes)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s, err := openStore(fs, dir)
	if err != nil {
		return nil, err
	}
	s.log = log
	if err := s.startJournal(o); err != nil {
		return nil, errors.Join(fmt.Errorf("stream: %w", err), s.Close())
	}
	return s, nil
}

func openStore(fs vfs.FS, dir string) (*Store, error) {
	if fs == nil {
		fs = vfs.Default
	}
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("stream: make store directory: %w", err)
	}
	if err := fs.SyncDir(filepath.Dir(filepath.Clean(dir))); err != nil {
		return nil, fmt.Errorf("stream: sync store parent directory: %w", err)
	}
	names, err := fs.List(dir)
	if err != nil {
		return nil, fmt.Errorf("stream: list store: %w", err)
	}
	s := &Store{fs: fs, dir: dir, extents: map[uint64]*Extent{}, busy: map[uint64]bool{}}
	removed := false
	for _, name := range names {
		switch {
		case strings.HasSuffix(name, tmpSuffix):
			if err := fs.Remove(filepath.Join(dir, name)); err != nil {
				return nil, errors.Join(fmt.Errorf("stream: remove %s: %w", name, err), s.Close())
			}
			removed = true
		case strings.HasSuffix(name, extentSuffix):
			id, err := strconv.ParseUint(strings.TrimSuffix(name, extentSuffix), 16, 64)
			if err != nil {
				continue // not ours
			}
			e, err := openExtent(fs, filepath.Join(dir, name), id)
			if err != nil {
				return nil, errors.Join(fmt.Errorf("stream: %w", err), s.Close())
			}
			s.extents[id] = e
		}
	}
	if removed {
		if err := fs.SyncDir(dir); err != nil {
			return nil, errors.Join(fmt.Errorf("stream: sync store: %w", err), s.Close())
		}
	}
	return s, nil
}

// Create durably creates an empty replica of extent id: a primary with no
// secondaries (one copy), or a secondary. See CreateReplica.
func (s *Store) Create(id uint64, primary bool) (*Extent, error) {
	return s.CreateReplica(id, ReplicaConfig{Primary: primary})
}

// CreateReplica durably creates an empty replica of extent id with cfg
// recorded in its header. Creating an extent that exists empty, unsealed
// and with the same configuration is a no-op (a retried create);
// otherwise it fails with ErrExists.
func (s *Store) CreateReplica(id uint64, cfg ReplicaConfig) (*Extent, error) {
	if !cfg.Ack.Valid() {
		return nil, fmt.Errorf("create extent %d: ack policy %q: %w", id, cfg.Ack, ErrBadCommand)
	}
	if cfg.Ack == "" {
		cfg.Ack = AckAll
	}
	if !cfg.Primary && (len(cfg.Secondaries) > 0 || cfg.Ack != AckAll) {
		return nil, fmt.Errorf("create extent %d: a secondary with secondaries or an ack policy: %w", id, ErrBadCommand)
	}
	s.mu.Lock()
	if err := s.reserveLocked(id); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	if e := s.extents[id]; e != nil {
		delete(s.busy, id)
		s.mu.Unlock()
		if info := e.Info(); info.Length == 0 && !info.Sealed && sameConfig(e.Config(), cfg) {
			return e, nil
		}
		return nil, fmt.Errorf("create extent %d: %w", id, ErrExists)
	}
	s.mu.Unlock()
	e, err := func() (*Extent, error) {
		if err := createExtentFile(s.fs, s.path(id), id, cfg); err != nil {
			return nil, err
		}
		return s.openExtent(id)
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.busy, id)
	if err != nil {
		return nil, err
	}
	if s.closed {
		return nil, errors.Join(ErrClosed, e.Close())
	}
	s.extents[id] = e
	return e, nil
}

func sameConfig(a, b ReplicaConfig) bool {
	return a.Primary == b.Primary && a.Ack == b.Ack && slices.Equal(a.Secondaries, b.Secondaries)
}

// reserveLocked marks id busy, or says why it cannot be.
func (s *Store) reserveLocked(id uint64) error {
	if s.closed {
		return ErrClosed
	}
	if s.busy[id] {
		return fmt.Errorf("extent %d is being created or copied: %w", id, ErrExists)
	}
	s.busy[id] = true
	return nil
}

// Get returns the replica of extent id, or ErrNoExtent.
func (s *Store) Get(id uint64) (*Extent, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	e := s.extents[id]
	if e == nil {
		return nil, fmt.Errorf("extent %d: %w", id, ErrNoExtent)
	}
	return e, nil
}

// List returns the ids of the replicas, sorted.
func (s *Store) List() []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.extents))
}

// Delete removes the replica of extent id durably. Deleting an absent
// extent is a no-op.
func (s *Store) Delete(id uint64) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	e := s.extents[id]
	delete(s.extents, id)
	s.mu.Unlock()
	if e == nil {
		return nil
	}
	err := e.Close()
	if rerr := s.fs.Remove(s.path(id)); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, fmt.Errorf("remove extent %d: %w", id, rerr))
	}
	if serr := s.fs.SyncDir(s.dir); serr != nil {
		err = errors.Join(err, fmt.Errorf("sync store: %w", serr))
	}
	return err
}

// Install builds a sealed replica of extent id of the given length from
// the blocks fill hands to put (each call: whole encoded blocks at an
// offset, in order from 0), checking every block, then durably replaces
// any replica of id with it (temp file, fsync, rename, directory fsync). A
// copy that does not end exactly at length is refused.
func (s *Store) Install(id uint64, length int64, fill func(put func(off int64, raw []byte) error) error) (err error) {
	s.mu.Lock()
	err = s.reserveLocked(id)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	defer func() {
		s.mu.Lock()
		delete(s.busy, id)
		s.mu.Unlock()
	}()
	tmp := filepath.Join(s.dir, fmt.Sprintf("%016x%s", id, tmpSuffix))
	if err := createExtentFile(s.fs, tmp, id, ReplicaConfig{}); err != nil {
		return err
	}
	e, err := openExtent(s.fs, tmp, id)
	if err != nil {
		return err
	}
	abort := func(err error) error {
		return errors.Join(err, e.Close(), s.fs.Remove(tmp))
	}
	if err := fill(func(off int64, raw []byte) error {
		_, err := e.AppendRaw(off, raw, false)
		return err
	}); err != nil {
		return abort(fmt.Errorf("copy extent %d: %w", id, err))
	}
	if _, err := e.Seal(length); err != nil {
		return abort(fmt.Errorf("copy extent %d: %w", id, err))
	}
	if err := e.Close(); err != nil {
		return errors.Join(err, s.fs.Remove(tmp))
	}
	if err := s.fs.Rename(tmp, s.path(id)); err != nil {
		return fmt.Errorf("install extent %d: %w", id, err)
	}
	if err := s.fs.SyncDir(s.dir); err != nil {
		return fmt.Errorf("install extent %d: sync store: %w", id, err)
	}
	ne, err := s.openExtent(id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	old := s.extents[id]
	closed := s.closed
	if !closed {
		s.extents[id] = ne
	}
	s.mu.Unlock()
	if closed {
		return errors.Join(ErrClosed, ne.Close())
	}
	if old != nil {
		return old.Close()
	}
	return nil
}

// UsedBytes is the total durable length of the replicas.
func (s *Store) UsedBytes() int64 {
	s.mu.Lock()
	es := slices.Collect(maps.Values(s.extents))
	s.mu.Unlock()
	var n int64
	for _, e := range es {
		n += e.Length()
	}
	return n
}

// openExtent opens and recovers the file of extent id, journaled if the
// store is.
func (s *Store) openExtent(id uint64) (*Extent, error) {
	e, err := openExtent(s.fs, s.path(id), id)
	if err != nil {
		return nil, err
	}
	e.jr = s.jr
	return e, nil
}

// Close stops the checkpointer, writes what the journal has queued and
// closes it, and closes every replica. Idempotent.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	var err error
	if s.ckStop != nil {
		close(s.ckStop)
		<-s.ckDone
	}
	if s.jr != nil {
		err = s.jr.close()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.extents {
		err = errors.Join(err, e.Close())
	}
	return err
}
