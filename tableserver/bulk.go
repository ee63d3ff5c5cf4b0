package tableserver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/bulk"
	"github.com/tabuladb/tabula/engines/vfs"
	"github.com/tabuladb/tabula/internal/atomicfile"
)

// A bulk partition keeps its version files in its partition directory:
//
//	v<version>-<crc32c as 8 hex digits>.bulk   a loaded (verified) version
//	v<version>-<crc32c as 8 hex digits>.part   an upload in progress
//
// The name carries what the master checks a loaded file against (the CRC32C
// of the whole file; the size is the file's), so nothing else is stored.
// A .bulk file is only ever made by renaming a complete, verified .part.

// bulkPart is a bulk partition hosted here: its loaded versions (an
// immutable view swapped atomically, so reads never wait on a load or an
// unload) and its uploads. It implements engines.Engine over the serving
// version, for the paths every replica shares (stats, scan, close). Safe for
// concurrent use.
type bulkPart struct {
	id           uint64
	index, parts int
	dir          string
	log          *slog.Logger

	view    atomic.Pointer[bulkView]
	current atomic.Uint64 // the serving version by the last map applied
	reads   atomic.Uint64

	// mu guards the fields below and serialises loads and unloads (not
	// reads).
	mu      sync.Mutex
	uploads map[uint64]bool // versions with an upload (or a fetch) running
	closed  bool
	// fetching: a fetch of missing versions from streams is running.
	fetching bool
	// rejected are the retained versions whose file, fetched from its
	// stream, is bad: not fetched again, reported in heartbeats.
	rejected map[uint64]*api.BulkLoaded
	// synced is the retained list of the last sync that read the
	// directory: a map change that keeps it (a switch, a rollback) only
	// records the serving version, with no I/O.
	synced []uint64
}

var _ engines.Engine = (*bulkPart)(nil)

// bulkView is the set of loaded versions.
type bulkView struct {
	versions map[uint64]*bulkVersion
}

// bulkVersion is one loaded version: its own file and, for a delta, the
// overlay of it on its base chain.
type bulkVersion struct {
	version, base uint64
	size          uint64
	crc           uint32
	path          string
	file          *bulk.File
	overlay       *bulk.Overlay // deltas only
}

func (v *bulkVersion) appendGet(dst, key []byte) ([]byte, bool, error) {
	if v.overlay != nil {
		return v.overlay.AppendGet(dst, key)
	}
	return v.file.AppendGet(dst, key)
}

func (v *bulkVersion) appendGetBatch(dst []byte, keys, vals [][]byte, found []bool) ([]byte, error) {
	if v.overlay != nil {
		return v.overlay.AppendGetBatch(dst, keys, vals, found)
	}
	return v.file.AppendGetBatch(dst, keys, vals, found)
}

// scan calls fn for every live key of the version with the value Get
// returns for it, each once; a delta is scanned over its base chain with
// no per-key state (bulk.Overlay.Scan).
func (v *bulkVersion) scan(ctx context.Context, fn func(engines.Record) error) error {
	if v.overlay != nil {
		return v.overlay.Scan(ctx, func(key, value []byte) error {
			return fn(engines.Record{Key: key, Value: value})
		})
	}
	return v.file.Scan(ctx, func(key, value []byte, deleted bool) error {
		if deleted {
			return nil
		}
		return fn(engines.Record{Key: key, Value: value})
	})
}

func bulkFileName(version uint64, crc uint32, ext string) string {
	return fmt.Sprintf("v%d-%08x%s", version, crc, ext)
}

// parseBulkFileName reverses bulkFileName.
func parseBulkFileName(name string) (version uint64, crc uint32, ext string, ok bool) {
	ext = filepath.Ext(name)
	if ext != ".bulk" && ext != ".part" {
		return 0, 0, "", false
	}
	v, c, found := strings.Cut(strings.TrimSuffix(strings.TrimPrefix(name, "v"), ext), "-")
	if !found || !strings.HasPrefix(name, "v") {
		return 0, 0, "", false
	}
	version, err1 := strconv.ParseUint(v, 10, 64)
	c32, err2 := strconv.ParseUint(c, 16, 32)
	if err1 != nil || err2 != nil || len(c) != 8 {
		return 0, 0, "", false
	}
	return version, uint32(c32), ext, true
}

func newBulkPart(id uint64, index, parts int, dir string, log *slog.Logger) *bulkPart {
	b := &bulkPart{id: id, index: index, parts: parts, dir: dir, log: log, uploads: map[uint64]bool{}, rejected: map[uint64]*api.BulkLoaded{}}
	b.view.Store(&bulkView{versions: map[uint64]*bulkVersion{}})
	return b
}

// sync makes the loaded versions those of retained, loading from disk any
// retained version whose file is there (a restart) and unloading (and
// deleting) the others, then records current. Only the watch goroutine
// calls it.
func (b *bulkPart) sync(retained []uint64, current uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	if b.synced != nil && slices.Equal(b.synced, retained) {
		b.current.Store(current)
		return
	}
	b.synced = slices.Clone(retained)
	for v := range b.rejected {
		if !slices.Contains(retained, v) {
			delete(b.rejected, v)
		}
	}
	old := b.view.Load()
	next := &bulkView{versions: make(map[uint64]*bulkVersion, len(retained))}
	var gone []*bulkVersion
	for v, lv := range old.versions {
		if slices.Contains(retained, v) {
			next.versions[v] = lv
		} else {
			gone = append(gone, lv)
		}
	}
	// Files on disk: load retained versions not loaded yet (in version
	// order, so a delta's base comes first); delete what is not retained.
	names, err := os.ReadDir(b.dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		b.log.Error("list bulk partition directory", "dir", b.dir, "err", err)
	}
	type onDisk struct {
		version uint64
		crc     uint32
		name    string
	}
	var load []onDisk
	for _, de := range names {
		v, crc, ext, ok := parseBulkFileName(de.Name())
		if !ok {
			continue
		}
		keep := slices.Contains(retained, v)
		switch {
		case !keep:
			if b.uploads[v] {
				continue // its upload fails when it renames or loads
			}
			if err := os.Remove(filepath.Join(b.dir, de.Name())); err != nil {
				b.log.Warn("delete unretained bulk file", "file", de.Name(), "err", err)
			}
		case ext == ".bulk" && next.versions[v] == nil:
			load = append(load, onDisk{v, crc, de.Name()})
		}
	}
	slices.SortFunc(load, func(a, c onDisk) int { return cmp.Compare(a.version, c.version) })
	for _, f := range load {
		lv, err := b.openVersion(next, filepath.Join(b.dir, f.name), f.version, f.crc, nil)
		if err != nil {
			b.log.Error("bulk version file on disk does not load; deleted", "file", f.name, "err", err)
			_ = os.Remove(filepath.Join(b.dir, f.name))
			continue
		}
		next.versions[f.version] = lv
	}
	b.view.Store(next)
	b.current.Store(current)
	for _, lv := range gone {
		b.unload(lv)
	}
}

// unload closes a version no longer in the view (Close waits for the reads
// in flight; later ones get ErrClosed, answered VERSION_GONE) and deletes
// its file.
func (b *bulkPart) unload(lv *bulkVersion) {
	if err := lv.file.Close(); err != nil {
		b.log.Warn("close bulk version", "version", lv.version, "err", err)
	}
	if err := os.Remove(lv.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		b.log.Warn("delete bulk version file", "version", lv.version, "err", err)
	}
	b.log.Info("bulk version unloaded", "version", lv.version)
}

// openVersion opens path as version (a delta of the version its file names)
// of this partition, checking what the file says about itself against what
// it should be, and (when ctx is not nil) verifying every record. A delta
// is overlaid on its base chain from view.
func (b *bulkPart) openVersion(view *bulkView, path string, version uint64, crc uint32, ctx context.Context) (*bulkVersion, error) {
	f, err := bulk.Open(vfs.Default, path, bulk.OpenOptions{})
	if err != nil {
		return nil, err
	}
	lv := &bulkVersion{version: version, crc: crc, path: path, file: f, size: uint64(f.Stats().FileBytes)}
	fail := func(format string, args ...any) (*bulkVersion, error) {
		return nil, errors.Join(fmt.Errorf(format, args...), f.Close())
	}
	if fv := f.Version(); fv != version {
		return fail("the file is version %d, published as version %d", fv, version)
	}
	if i, n := f.Partition(); i != b.index || n != b.parts {
		return fail("the file is partition %d of %d; this is partition %d of %d", i, n, b.index, b.parts)
	}
	if ctx != nil {
		if err := f.Verify(ctx); err != nil {
			return fail("verify: %w", err)
		}
	}
	if base, ok := f.Delta(); ok {
		lv.base = base
		// The chain: base full version, then each delta up to this one.
		chain := []*bulk.File{f}
		for cur := base; ; {
			bv := view.versions[cur]
			if bv == nil {
				return fail("delta over version %d, which is not loaded here", cur)
			}
			chain = append(chain, bv.file)
			if bv.base == 0 {
				break
			}
			cur = bv.base
		}
		slices.Reverse(chain)
		o, err := bulk.NewOverlay(chain[0], chain[1:]...)
		if err != nil {
			return fail("%w", err)
		}
		lv.overlay = o
	}
	return lv, nil
}

// version returns loaded version v (0: the serving one).
func (b *bulkPart) version(v uint64) (*bulkVersion, uint64) {
	if v == 0 {
		v = b.current.Load()
	}
	return b.view.Load().versions[v], v
}

// loaded lists the loaded versions for a heartbeat, and the rejected
// ones with their error.
func (b *bulkPart) loaded() []*api.BulkLoaded {
	vs := b.view.Load().versions
	out := make([]*api.BulkLoaded, 0, len(vs))
	for _, lv := range vs {
		out = append(out, &api.BulkLoaded{Version: lv.version, Size: lv.size, Crc32C: lv.crc})
	}
	b.mu.Lock()
	for _, r := range b.rejected {
		out = append(out, r)
	}
	b.mu.Unlock()
	slices.SortFunc(out, func(a, c *api.BulkLoaded) int { return cmp.Compare(a.GetVersion(), c.GetVersion()) })
	return out
}

// Get implements engines.Engine over the serving version.
func (b *bulkPart) Get(key []byte) ([]byte, int64, error) {
	lv, _ := b.version(0)
	if lv == nil {
		return nil, 0, engines.ErrNotFound
	}
	b.reads.Add(1)
	v, ok, err := lv.appendGet(nil, key)
	switch {
	case err != nil:
		return nil, 0, err
	case !ok:
		return nil, 0, engines.ErrNotFound
	}
	return v, 0, nil
}

// Scan implements engines.Engine over the serving version.
func (b *bulkPart) Scan(fn func(engines.Record) error) error {
	lv, _ := b.version(0)
	if lv == nil {
		return nil
	}
	return lv.scan(context.Background(), fn)
}

// Stats implements engines.Engine: the serving version's file.
func (b *bulkPart) Stats() engines.Stats {
	st := engines.Stats{Reads: b.reads.Load()}
	var idx uint64
	for _, lv := range b.view.Load().versions {
		s := lv.file.Stats()
		idx += uint64(s.IndexBytes)
		st.LiveBytes += uint64(s.FileBytes)
	}
	st.IndexBytes = idx
	if lv, _ := b.version(0); lv != nil {
		s := lv.file.Stats()
		st.Keys = s.Records - s.Deleted
		st.Bytes = uint64(s.FileBytes)
	}
	return st
}

// Close implements engines.Engine: unloads every version (keeping files).
func (b *bulkPart) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	old := b.view.Swap(&bulkView{versions: map[uint64]*bulkVersion{}})
	var errs []error
	for _, lv := range old.versions {
		errs = append(errs, lv.file.Close())
	}
	return errors.Join(errs...)
}

// ---------------------------------------------------------------- upload

// uploadSyncEvery is how much of an upload is written between fsyncs: what
// an interrupted upload may have to send again.
const uploadSyncEvery = 64 << 20

// partSize returns how many bytes of version's upload the .part file
// holds (0 when there is none). The file's name carries the CRC, so the
// directory is listed to find it.
func (b *bulkPart) partSize(version uint64) uint64 {
	des, err := os.ReadDir(b.dir)
	if err != nil {
		return 0
	}
	for _, de := range des {
		if v, _, ext, ok := parseBulkFileName(de.Name()); ok && v == version && ext == ".part" {
			if fi, err := de.Info(); err == nil {
				return uint64(fi.Size())
			}
		}
	}
	return 0
}

// beginUpload claims version's upload; end releases it.
func (b *bulkPart) beginUpload(version uint64) (end func(), err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, engines.ErrClosed
	}
	if b.uploads[version] {
		return nil, api.Errorf(api.ErrorCode_ERROR_CODE_SERVER_BUSY, "upload_in_progress", "partition %d: an upload of version %d is already running", b.id, version)
	}
	b.uploads[version] = true
	return func() {
		b.mu.Lock()
		delete(b.uploads, version)
		b.mu.Unlock()
	}, nil
}

// upload is one running upload of a partition file.
type upload struct {
	b       *bulkPart
	version uint64
	file    *api.BulkFile
	path    string
	f       *os.File
	w       *bulk.HugeWriter // to f: the served file's page cache then maps with huge pages
	crc     uint32
	size    uint64 // bytes written
	synced  uint64
}

// openUpload opens (or creates) the .part file and positions the upload at
// offset, which must not be past what the server holds; the CRC of the
// bytes before offset is recomputed from disk.
func (b *bulkPart) openUpload(version uint64, file *api.BulkFile, offset uint64) (*upload, error) {
	if err := os.MkdirAll(b.dir, 0o755); err != nil {
		return nil, err
	}
	path := filepath.Join(b.dir, bulkFileName(version, file.GetCrc32C(), ".part"))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, errors.Join(err, f.Close())
	}
	if offset > uint64(fi.Size()) {
		_ = f.Close()
		return nil, api.InvalidArgument("offset", "offset_past_end", uint64(fi.Size()), "upload offset %d is past the %d bytes held; resume from BulkUploadStatus", offset, fi.Size())
	}
	if err := f.Truncate(int64(offset)); err != nil {
		return nil, errors.Join(err, f.Close())
	}
	crc, err := crcPrefix(f, int64(offset))
	if err != nil {
		return nil, errors.Join(err, f.Close())
	}
	if _, err := f.Seek(int64(offset), io.SeekStart); err != nil {
		return nil, errors.Join(err, f.Close())
	}
	return &upload{b: b, version: version, file: file, path: path, f: f, w: bulk.NewHugeWriter(f, int64(offset)), crc: crc, size: offset, synced: offset}, nil
}

func crcPrefix(f *os.File, n int64) (uint32, error) {
	h := crc32.New(castagnoli)
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, n)); err != nil {
		return 0, fmt.Errorf("read the upload so far: %w", err)
	}
	return h.Sum32(), nil
}

func (u *upload) write(p []byte) error {
	if u.size+uint64(len(p)) > u.file.GetSize() {
		return api.InvalidArgument("data", "upload_too_long", u.file.GetSize(), "upload runs past the file's size %d", u.file.GetSize())
	}
	if _, err := u.w.Write(p); err != nil {
		return err
	}
	u.crc = crc32.Update(u.crc, castagnoli, p)
	u.size += uint64(len(p))
	if u.size-u.synced >= uploadSyncEvery {
		if err := u.sync(); err != nil {
			return err
		}
		u.synced = u.size
	}
	return nil
}

// sync makes what was received durable.
func (u *upload) sync() error {
	if err := u.w.Flush(); err != nil {
		return err
	}
	return u.f.Sync()
}

// close keeps what was received (an interrupted upload resumes from the
// file's length) and closes the file.
func (u *upload) close() error { return errors.Join(u.w.Flush(), u.f.Close()) }

// finish checks the complete upload's CRC, makes it a .bulk file, verifies
// and loads it. A file that fails is deleted; the versions served are
// untouched.
func (u *upload) finish(ctx context.Context) (*bulkVersion, error) {
	b := u.b
	if u.crc != u.file.GetCrc32C() {
		_ = u.f.Close()
		_ = os.Remove(u.path)
		return nil, api.InvalidArgument("file.crc32c", "checksum_mismatch", 0,
			"partition %d version %d: the uploaded file's CRC32C is %08x, the publisher said %08x; the upload was discarded, send it again", b.id, u.version, u.crc, u.file.GetCrc32C())
	}
	if err := u.sync(); err != nil {
		return nil, errors.Join(err, u.f.Close())
	}
	if err := u.f.Close(); err != nil {
		return nil, err
	}
	final := filepath.Join(b.dir, bulkFileName(u.version, u.file.GetCrc32C(), ".bulk"))
	if err := os.Rename(u.path, final); err != nil {
		return nil, err
	}
	if err := atomicfile.SyncDir(b.dir); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, engines.ErrClosed
	}
	view := b.view.Load()
	lv, err := b.openVersion(view, final, u.version, u.file.GetCrc32C(), ctx)
	if err != nil {
		_ = os.Remove(final)
		return nil, api.InvalidArgument("data", "bad_file", 0, "partition %d version %d: the file is rejected: %v", b.id, u.version, err)
	}
	next := &bulkView{versions: make(map[uint64]*bulkVersion, len(view.versions)+1)}
	for v, x := range view.versions {
		next.versions[v] = x
	}
	if old := next.versions[u.version]; old != nil {
		_ = lv.file.Close()
		return old, nil
	}
	next.versions[u.version] = lv
	b.view.Store(next)
	b.log.Info("bulk version loaded", "version", u.version, "bytes", lv.size, "records", lv.file.Stats().Records)
	return lv, nil
}
