package bulk

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/vfs"
)

func init() {
	engines.Register(engines.KindBulk, func(opts engines.Options) (engines.Engine, error) {
		return OpenEngine(vfs.Default, opts)
	})
}

// Errors of the serving engine, for errors.Is.
var (
	// ErrNoVersion: a read of the serving version before any was set.
	ErrNoVersion = errors.New("bulk: no serving version")
	// ErrVersionNotLoaded: the version is retained (or newer than every
	// retained one) but its file is not loaded here yet.
	ErrVersionNotLoaded = errors.New("bulk: version not loaded")
	// ErrVersionGone: the version is no longer held (see VersionGoneError).
	ErrVersionGone = errors.New("bulk: version gone")
	// ErrStageBusy: the version is already being staged.
	ErrStageBusy = errors.New("bulk: version already being staged")
	// ErrStageOffset: a stage resumes past the bytes held.
	ErrStageOffset = errors.New("bulk: stage offset past the bytes held")
	// ErrStageTooLong: the bytes staged run past the file's size.
	ErrStageTooLong = errors.New("bulk: staged bytes run past the file's size")
	// ErrChecksum: a staged file's CRC32C is not the one announced.
	ErrChecksum = errors.New("bulk: staged file checksum mismatch")
	// ErrRefused: a staged file is not a valid version file of this
	// partition (format, partition, version, base, or contents).
	ErrRefused = errors.New("bulk: version file refused")
	// ErrBaseNotLoaded: a delta's base version is not loaded here (yet);
	// the file itself may be fine.
	ErrBaseNotLoaded = errors.New("bulk: delta base not loaded")
)

// VersionGoneError is a read of a version the engine no longer holds: it
// was unloaded (retired by Retain), possibly under the read.
type VersionGoneError struct {
	// Version is the version read; Current the serving one now.
	Version, Current uint64
}

func (e *VersionGoneError) Error() string {
	return fmt.Sprintf("bulk: version %d is no longer held; the serving version is %d", e.Version, e.Current)
}

// Unwrap returns ErrVersionGone.
func (e *VersionGoneError) Unwrap() error { return ErrVersionGone }

// Engine serves one bulk partition: the versions of it loaded from files
// in its directory, one of them serving. It is read-only: versions come in
// whole, as files written through Stage (an upload or a copy from
// elsewhere) or found in the directory, and leave by Retain.
//
// Through engines.Engine (and engines.BatchGetter) it serves the serving
// version; Version gives any loaded one, for reads that name theirs.
//
// Engine is safe for concurrent use. Reads never wait on a load, an unload
// or a stage: the loaded versions are an immutable set swapped atomically,
// and a version unloaded under a read fails it with a *VersionGoneError.
type Engine struct {
	fs                    vfs.FS
	dir                   string
	partition, partitions int
	log                   *slog.Logger

	set    atomic.Pointer[versionSet]
	reads  atomic.Uint64
	closed atomic.Bool

	// mu serialises loads, unloads and stage claims (not reads) and
	// guards the fields below.
	mu sync.Mutex
	// staging are the versions with a Stage open.
	staging map[uint64]bool
	// listed: a Retain read the directory for the retained list of set;
	// a later Retain with the same list only moves the serving version.
	listed bool
}

var (
	_ engines.Engine      = (*Engine)(nil)
	_ engines.BatchGetter = (*Engine)(nil)
)

// versionSet is what the engine serves: immutable once published.
type versionSet struct {
	versions map[uint64]*Version
	// retained are the versions the owner keeps (Retain), current the
	// serving one (0: none).
	retained []uint64
	current  uint64
}

// OpenEngine opens the serving engine of one bulk partition over opts.Dir
// (required; created if absent) on fs (nil: vfs.Default). It loads nothing:
// the first Retain loads the retained versions whose files are in the
// directory (a restart). opts.Partition and opts.Partitions, when
// Partitions > 0, are checked against every file loaded.
func OpenEngine(fs vfs.FS, opts engines.Options) (*Engine, error) {
	opts = opts.WithDefaults()
	if fs == nil {
		fs = vfs.Default
	}
	if opts.Dir == "" {
		return nil, fmt.Errorf("bulk: open engine: Options.Dir is required (a bulk partition keeps its versions in files)")
	}
	if opts.Partitions < 0 || opts.Partition < 0 || (opts.Partitions > 0 && opts.Partition >= opts.Partitions) {
		return nil, fmt.Errorf("bulk: open engine: partition %d of %d", opts.Partition, opts.Partitions)
	}
	if err := fs.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("bulk: open engine: %w", err)
	}
	e := &Engine{fs: fs, dir: opts.Dir, partition: opts.Partition, partitions: opts.Partitions, log: opts.Logger, staging: map[uint64]bool{}}
	e.set.Store(&versionSet{versions: map[uint64]*Version{}})
	return e, nil
}

// Dir is the engine's directory.
func (e *Engine) Dir() string { return e.dir }

// Serving returns the serving version (0: none).
func (e *Engine) Serving() uint64 { return e.set.Load().current }

// Version returns loaded version v (0: the serving one) for reads that
// name their version. The errors: engines.ErrClosed; ErrNoVersion (v 0
// and none serving); ErrVersionNotLoaded (v retained, or newer than every
// retained version, but not loaded); a *VersionGoneError (anything else).
func (e *Engine) Version(v uint64) (*Version, error) {
	if e.closed.Load() {
		return nil, engines.ErrClosed
	}
	set := e.set.Load()
	if v == 0 {
		if v = set.current; v == 0 {
			return nil, ErrNoVersion
		}
	}
	if lv := set.versions[v]; lv != nil {
		return lv, nil
	}
	if slices.Contains(set.retained, v) || v > slices.Max(append(set.retained, 0)) {
		return nil, fmt.Errorf("bulk: version %d: %w", v, ErrVersionNotLoaded)
	}
	return nil, &VersionGoneError{Version: v, Current: set.current}
}

// Loaded describes a loaded version.
type Loaded struct {
	// Version and Base (0: a full version) are what the file records.
	Version, Base uint64
	// Size and CRC are the file's size and whole-file CRC32C.
	Size uint64
	CRC  uint32
}

// Loaded lists the loaded versions in version order.
func (e *Engine) Loaded() []Loaded {
	set := e.set.Load()
	out := make([]Loaded, 0, len(set.versions))
	for _, lv := range set.versions {
		out = append(out, lv.Describe())
	}
	slices.SortFunc(out, func(a, b Loaded) int { return cmp.Compare(a.Version, b.Version) })
	return out
}

// serving runs read on the serving version (nil when none is loaded). A
// serving version unloaded under the read (a switch retired it) is read
// again at the new serving version, unless read says it already returned
// data (retry false).
func (e *Engine) serving(read func(lv *Version) (retry bool, err error)) error {
	for {
		if e.closed.Load() {
			return engines.ErrClosed
		}
		set := e.set.Load()
		retry, err := read(set.versions[set.current])
		if !retry || !errors.Is(err, ErrVersionGone) || e.set.Load() == set {
			return err
		}
	}
}

// Get implements engines.Engine over the serving version (absent keys, and
// every key while no version serves, are engines.ErrNotFound).
func (e *Engine) Get(key []byte) (value []byte, expiresAt int64, err error) {
	err = e.serving(func(lv *Version) (bool, error) {
		if lv == nil {
			return false, engines.ErrNotFound
		}
		v, ok, err := lv.AppendGet(nil, key)
		switch {
		case err != nil:
			return true, err
		case !ok:
			return false, engines.ErrNotFound
		}
		value = v
		return false, nil
	})
	return value, 0, err
}

// GetBatch implements engines.BatchGetter over the serving version: every
// key from one version.
func (e *Engine) GetBatch(keys [][]byte, values [][]byte, expires []int64, found []bool) error {
	clear(expires)
	return e.serving(func(lv *Version) (bool, error) {
		if lv == nil {
			clear(values)
			clear(found)
			return false, nil
		}
		_, err := lv.AppendGetBatch(nil, keys, values, found)
		return true, err
	})
}

// Scan implements engines.Engine over the serving version, held for the
// whole scan.
func (e *Engine) Scan(fn func(engines.Record) error) error {
	return e.serving(func(lv *Version) (bool, error) {
		if lv == nil {
			return false, nil
		}
		called := false
		err := lv.Scan(context.Background(), func(r engines.Record) error {
			called = true
			return fn(r)
		})
		return !called, err
	})
}

// Stats implements engines.Engine: Keys and Bytes of the serving version
// (Bytes is its file's size; Keys is exact for a full version, and for a
// delta its base's count plus its puts minus its deletions, so a put that
// overwrites a key counts it again), IndexBytes and LiveBytes over every
// loaded version.
func (e *Engine) Stats() engines.Stats {
	st := engines.Stats{Reads: e.reads.Load()}
	set := e.set.Load()
	for _, lv := range set.versions {
		s := lv.file.Stats()
		st.IndexBytes += uint64(s.IndexBytes)
		st.LiveBytes += uint64(s.FileBytes)
	}
	if lv := set.versions[set.current]; lv != nil {
		st.Keys = lv.keys
		st.Bytes = lv.size
	}
	return st
}

// Close implements engines.Engine: it unloads every version (waiting for
// the reads in flight) and keeps the files. Later calls return
// engines.ErrClosed; Close is idempotent.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed.Swap(true) {
		return nil
	}
	old := e.set.Swap(&versionSet{versions: map[uint64]*Version{}})
	var errs []error
	for _, lv := range old.versions {
		errs = append(errs, lv.file.Close())
	}
	return errors.Join(errs...)
}

// Version is one loaded version of the partition: its own file and, for a
// delta, the overlay of it on its base chain. Safe for concurrent use; a
// read after the version was unloaded fails with a *VersionGoneError
// (engines.ErrClosed once the engine is closed).
type Version struct {
	e             *Engine
	version, base uint64
	size          uint64
	crc           uint32
	path          string
	file          *File
	overlay       *Overlay // deltas only
	// keys is the version's key count (see Engine.Stats).
	keys uint64
}

// Number is the version's number.
func (v *Version) Number() uint64 { return v.version }

// Describe returns what the version's file is.
func (v *Version) Describe() Loaded {
	return Loaded{Version: v.version, Base: v.base, Size: v.size, CRC: v.crc}
}

// Stats are the statistics of the version: its file's, or for a delta the
// sum over its chain.
func (v *Version) Stats() Stats {
	if v.overlay != nil {
		return v.overlay.Stats()
	}
	return v.file.Stats()
}

// err maps a read error: a closed file is a version unloaded under the
// read, or the engine closed.
func (v *Version) err(err error) error {
	if errors.Is(err, engines.ErrClosed) && !v.e.closed.Load() {
		return &VersionGoneError{Version: v.version, Current: v.e.Serving()}
	}
	return err
}

// ReadFileAt reads the version's own file (File.ReadFileAt): the bytes
// that were published, not a delta's overlay.
func (v *Version) ReadFileAt(p []byte, off int64) (int, error) {
	n, err := v.file.ReadFileAt(p, off)
	return n, v.err(err)
}

// AppendGet appends key's value in this version to dst and reports whether
// it is there (File.AppendGet).
func (v *Version) AppendGet(dst, key []byte) ([]byte, bool, error) {
	v.e.reads.Add(1)
	var (
		out []byte
		ok  bool
		err error
	)
	if v.overlay != nil {
		out, ok, err = v.overlay.AppendGet(dst, key)
	} else {
		out, ok, err = v.file.AppendGet(dst, key)
	}
	return out, ok, v.err(err)
}

// AppendGetBatch reads every key from this version (File.AppendGetBatch).
func (v *Version) AppendGetBatch(dst []byte, keys, vals [][]byte, found []bool) ([]byte, error) {
	v.e.reads.Add(uint64(len(keys)))
	var err error
	if v.overlay != nil {
		dst, err = v.overlay.AppendGetBatch(dst, keys, vals, found)
	} else {
		dst, err = v.file.AppendGetBatch(dst, keys, vals, found)
	}
	return dst, v.err(err)
}

// Scan calls fn for every live key of the version with the value
// AppendGet returns for it, each once, holding the version's files for the
// whole scan (a delta is scanned over its base chain with no per-key
// state: Overlay.Scan). The Record's slices are valid only during the call;
// fn's error stops the scan and is returned.
func (v *Version) Scan(ctx context.Context, fn func(engines.Record) error) error {
	v.e.reads.Add(1)
	var err error
	if v.overlay != nil {
		err = v.overlay.Scan(ctx, func(key, value []byte) error {
			return fn(engines.Record{Key: key, Value: value})
		})
	} else {
		err = v.file.Scan(ctx, func(key, value []byte, deleted bool) error {
			if deleted {
				return nil
			}
			return fn(engines.Record{Key: key, Value: value})
		})
	}
	return v.err(err)
}
