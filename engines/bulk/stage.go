package bulk

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"path/filepath"
	"slices"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/vfs"
)

// stageSyncEvery is how much of a stage is written between fsyncs: what an
// interrupted stage may have to write again.
const stageSyncEvery = 64 << 20

// Stage is a version's file being written into the engine's directory (an
// upload, or a copy from elsewhere), as v<version>-<crc>.part; Finish makes
// it a loaded version. A Stage claims its version: a second Stage of it
// fails with ErrStageBusy until this one is closed, aborted or finished.
// It is not safe for concurrent use.
type Stage struct {
	e       *Engine
	version uint64
	want    uint64 // the file's size
	crc     uint32 // the file's announced CRC32C
	path    string
	f       vfs.File
	w       *HugeWriter // to f: the served file's page cache then maps with huge pages
	sum     uint32      // CRC32C of the bytes written
	n       uint64      // bytes written
	synced  uint64
	done    bool
}

// Staging reports whether a Stage of version is open.
func (e *Engine) Staging(version uint64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.staging[version]
}

// StagedBytes returns how many bytes of version's file an earlier,
// interrupted stage left (0: none), where a new Stage may resume.
func (e *Engine) StagedBytes(version uint64) uint64 {
	names, err := e.fs.List(e.dir)
	if err != nil {
		return 0
	}
	for _, name := range names {
		if v, _, ext, ok := parseVersionFileName(name); ok && v == version && ext == ".part" {
			if n, err := e.fs.Stat(filepath.Join(e.dir, name)); err == nil {
				return uint64(n)
			}
		}
	}
	return 0
}

// Stage starts (or resumes at offset, which must not be past the bytes
// an earlier stage of the same file left) writing version's file of size
// bytes and whole-file CRC32C crc. The CRC of the bytes before offset is
// recomputed from disk. Errors: engines.ErrClosed, ErrStageBusy, and
// ErrStageOffset (wrapped in a *StageOffsetError saying what is held).
func (e *Engine) Stage(version, size uint64, crc uint32, offset uint64) (*Stage, error) {
	e.mu.Lock()
	switch {
	case e.closed.Load():
		e.mu.Unlock()
		return nil, engines.ErrClosed
	case e.staging[version]:
		e.mu.Unlock()
		return nil, fmt.Errorf("bulk: stage version %d: %w", version, ErrStageBusy)
	}
	e.staging[version] = true
	e.mu.Unlock()
	s := &Stage{e: e, version: version, want: size, crc: crc, path: filepath.Join(e.dir, versionFileName(version, crc, ".part"))}
	if err := s.open(offset); err != nil {
		s.release()
		return nil, err
	}
	return s, nil
}

// StageOffsetError is a Stage resuming past the bytes held.
type StageOffsetError struct{ Offset, Held uint64 }

func (e *StageOffsetError) Error() string {
	return fmt.Sprintf("bulk: stage resumes at offset %d, past the %d bytes held", e.Offset, e.Held)
}

// Unwrap returns ErrStageOffset.
func (e *StageOffsetError) Unwrap() error { return ErrStageOffset }

func (s *Stage) open(offset uint64) error {
	fsys := s.e.fs
	var f vfs.File
	held, err := fsys.Stat(s.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		held = 0
		f, err = fsys.Create(s.path)
	case err == nil:
		f, err = fsys.OpenReadWrite(s.path) // writes go to the end
	}
	if err != nil {
		return fmt.Errorf("bulk: stage version %d: %w", s.version, err)
	}
	if offset > uint64(held) {
		return errors.Join(&StageOffsetError{Offset: offset, Held: uint64(held)}, f.Close())
	}
	if err := f.Truncate(int64(offset)); err != nil {
		return errors.Join(fmt.Errorf("bulk: stage version %d: %w", s.version, err), f.Close())
	}
	h := crc32.New(castagnoli)
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, int64(offset))); err != nil {
		return errors.Join(fmt.Errorf("bulk: stage version %d: read the bytes so far: %w", s.version, err), f.Close())
	}
	s.f, s.sum, s.n, s.synced = f, h.Sum32(), offset, offset
	s.w = NewHugeWriter(f, int64(offset))
	return nil
}

// release gives the version's claim back.
func (s *Stage) release() {
	s.e.mu.Lock()
	delete(s.e.staging, s.version)
	s.e.mu.Unlock()
}

// Received is how many bytes of the file the stage holds.
func (s *Stage) Received() uint64 { return s.n }

// Write appends p to the file; bytes past its size fail with
// ErrStageTooLong, and any once the engine is closed engines.ErrClosed. Every 64 MiB it syncs what was written.
func (s *Stage) Write(p []byte) (int, error) {
	if s.done {
		return 0, fmt.Errorf("bulk: write to a finished stage of version %d", s.version)
	}
	if s.e.closed.Load() {
		return 0, engines.ErrClosed // the partition closed: the file would not load
	}
	if s.n+uint64(len(p)) > s.want {
		return 0, fmt.Errorf("bulk: stage of version %d: %d bytes: %w (%d)", s.version, s.n+uint64(len(p)), ErrStageTooLong, s.want)
	}
	if _, err := s.w.Write(p); err != nil {
		return 0, err
	}
	s.sum = crc32.Update(s.sum, castagnoli, p)
	s.n += uint64(len(p))
	if s.n-s.synced >= stageSyncEvery {
		if err := s.Sync(); err != nil {
			return len(p), err
		}
	}
	return len(p), nil
}

// Sync makes the bytes written durable: an interrupted stage resumes after
// them.
func (s *Stage) Sync() error {
	if s.done {
		return nil
	}
	if err := s.w.Flush(); err != nil {
		return err
	}
	if err := s.f.Sync(); err != nil {
		return err
	}
	s.synced = s.n
	return nil
}

// Close ends the stage keeping the bytes written (a later Stage resumes
// from StagedBytes) and releases the version. It is idempotent and does
// nothing after Finish or Abort.
func (s *Stage) Close() error {
	if s.done {
		return nil
	}
	s.done = true
	defer s.release()
	return errors.Join(s.w.Flush(), s.f.Close())
}

// Abort ends the stage deleting its bytes and releases the version.
func (s *Stage) Abort() error {
	if s.done {
		return nil
	}
	s.done = true
	defer s.release()
	err := s.f.Close()
	if rerr := s.e.fs.Remove(s.path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	return err
}

// Finish checks the complete file's CRC32C against the one announced,
// makes it durable as the version's .bulk file, verifies every record and
// loads it beside the versions served (it serves once a Retain names it
// current), then releases the version. A file that fails is deleted
// (ErrChecksum, or ErrRefused for a file that is not a valid version of
// this partition); the versions served are untouched. When a Retain has
// run and no longer retains the version, the file is deleted and the
// error is a *VersionGoneError. If the version was loaded meanwhile, that
// version is returned. An incomplete stage is an error that keeps the
// bytes.
func (s *Stage) Finish(ctx context.Context) (*Version, error) {
	if s.done {
		return nil, fmt.Errorf("bulk: finish of an ended stage of version %d", s.version)
	}
	if s.n != s.want {
		err := fmt.Errorf("bulk: finish of version %d with %d of its %d bytes", s.version, s.n, s.want)
		return nil, errors.Join(err, s.Close())
	}
	if s.sum != s.crc {
		err := fmt.Errorf("bulk: version %d: the file's CRC32C is %08x, %08x was announced: %w", s.version, s.sum, s.crc, ErrChecksum)
		return nil, errors.Join(err, s.Abort())
	}
	if err := s.Sync(); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	s.done = true
	defer s.release()
	e := s.e
	if err := s.f.Close(); err != nil {
		return nil, err
	}
	final := filepath.Join(e.dir, versionFileName(s.version, s.crc, ".bulk"))
	if err := e.fs.Rename(s.path, final); err != nil {
		return nil, err
	}
	if err := e.fs.SyncDir(e.dir); err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	set := e.set.Load()
	switch {
	case e.closed.Load():
		return nil, engines.ErrClosed
	case set.versions[s.version] != nil:
		if lv := set.versions[s.version]; lv.path != final {
			_ = e.fs.Remove(final)
		}
		return set.versions[s.version], nil
	case e.listed && !slices.Contains(set.retained, s.version):
		_ = e.fs.Remove(final)
		return nil, &VersionGoneError{Version: s.version, Current: set.current}
	}
	lv, err := e.openVersion(ctx, set, final, s.version, s.crc)
	if err != nil {
		_ = e.fs.Remove(final)
		return nil, err
	}
	next := &versionSet{versions: make(map[uint64]*Version, len(set.versions)+1), retained: set.retained, current: set.current}
	for v, x := range set.versions {
		next.versions[v] = x
	}
	next.versions[s.version] = lv
	e.set.Store(next)
	e.log.Info("bulk version loaded", "version", s.version, "bytes", lv.size, "records", lv.file.Stats().Records)
	return lv, nil
}
