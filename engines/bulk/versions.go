package bulk

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// The serving engine keeps its version files in its directory:
//
//	v<version>-<crc32c as 8 hex digits>.bulk   a loaded (verified) version
//	v<version>-<crc32c as 8 hex digits>.part   a stage in progress
//
// The name carries what the file is checked against (the CRC32C of the
// whole file; the size is the file's), so nothing else is stored. A .bulk
// file is only ever made by renaming a complete, verified .part.

// versionFileName names version's file with whole-file CRC32C crc; ext is
// ".bulk" or ".part".
func versionFileName(version uint64, crc uint32, ext string) string {
	return fmt.Sprintf("v%d-%08x%s", version, crc, ext)
}

// parseVersionFileName reverses versionFileName.
func parseVersionFileName(name string) (version uint64, crc uint32, ext string, ok bool) {
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

// Retain makes the loaded versions exactly those of retained that are
// loaded or whose file is in the directory (and the base chains of loaded
// deltas) (a restart: loaded in version
// order, so a delta's base comes first), unloads the others (Close waits
// for their reads in flight; later ones fail with a *VersionGoneError) and
// deletes their files (not those being staged: their Finish fails), and
// serves current. A Retain with the retained list of the previous one only
// moves the serving version, with no I/O. Problems with single files are
// logged (a file that does not load is deleted: it is fetched again) and
// do not stop the others.
func (e *Engine) Retain(retained []uint64, current uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed.Load() {
		return
	}
	old := e.set.Load()
	next := &versionSet{versions: make(map[uint64]*Version, len(retained)), retained: slices.Clone(retained), current: current}
	if e.listed && slices.Equal(old.retained, retained) {
		next.versions = old.versions
		e.set.Store(next)
		return
	}
	e.listed = true
	// A loaded delta keeps its base chain loaded, retained or not: its
	// reads go through it.
	keep := slices.Clone(retained)
	for _, v := range retained {
		for lv := old.versions[v]; lv != nil && lv.base != 0 && !slices.Contains(keep, lv.base); lv = old.versions[lv.base] {
			keep = append(keep, lv.base)
		}
	}
	var gone []*Version
	for v, lv := range old.versions {
		if slices.Contains(keep, v) {
			next.versions[v] = lv
		} else {
			gone = append(gone, lv)
		}
	}
	names, err := e.fs.List(e.dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		e.log.Error("list bulk partition directory", "dir", e.dir, "err", err)
	}
	type onDisk struct {
		version uint64
		crc     uint32
		name    string
	}
	var load []onDisk
	for _, name := range names {
		v, crc, ext, ok := parseVersionFileName(name)
		if !ok {
			continue
		}
		switch {
		case !slices.Contains(keep, v):
			if e.staging[v] {
				continue // its stage fails when it finishes
			}
			if err := e.fs.Remove(filepath.Join(e.dir, name)); err != nil {
				e.log.Warn("delete unretained bulk file", "file", name, "err", err)
			}
		case ext == ".bulk" && next.versions[v] == nil:
			load = append(load, onDisk{v, crc, name})
		}
	}
	slices.SortFunc(load, func(a, c onDisk) int { return cmp.Compare(a.version, c.version) })
	for _, f := range load {
		lv, err := e.openVersion(nil, next, filepath.Join(e.dir, f.name), f.version, f.crc)
		if err != nil {
			e.log.Error("bulk version file on disk does not load; deleted", "file", f.name, "err", err)
			_ = e.fs.Remove(filepath.Join(e.dir, f.name))
			continue
		}
		next.versions[f.version] = lv
	}
	e.set.Store(next)
	for _, lv := range gone {
		e.unload(lv)
	}
}

// unload closes a version no longer in the set and deletes its file.
func (e *Engine) unload(lv *Version) {
	if err := lv.file.Close(); err != nil {
		e.log.Warn("close bulk version", "version", lv.version, "err", err)
	}
	if err := e.fs.Remove(lv.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		e.log.Warn("delete bulk version file", "version", lv.version, "err", err)
	}
	e.log.Info("bulk version unloaded", "version", lv.version)
}

// openVersion opens path as version (a delta of the version its file
// names) of this partition, checking what the file says about itself
// against what it should be and, when ctx is not nil, verifying every
// record. A delta is overlaid on its base chain from set. Errors about the
// file itself wrap ErrRefused.
func (e *Engine) openVersion(ctx context.Context, set *versionSet, path string, version uint64, crc uint32) (*Version, error) {
	f, err := Open(e.fs, path, OpenOptions{})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrRefused, err)
	}
	st := f.Stats()
	lv := &Version{e: e, version: version, crc: crc, path: path, file: f, size: uint64(st.FileBytes), keys: st.Records - st.Deleted}
	fail := func(format string, args ...any) (*Version, error) {
		return nil, errors.Join(fmt.Errorf("%w: "+format, append([]any{ErrRefused}, args...)...), f.Close())
	}
	if fv := f.Version(); fv != version {
		return fail("the file is version %d, published as version %d", fv, version)
	}
	if i, n := f.Partition(); e.partitions > 0 && (i != e.partition || n != e.partitions) {
		return fail("the file is partition %d of %d; this is partition %d of %d", i, n, e.partition, e.partitions)
	}
	if ctx != nil {
		if err := f.Verify(ctx); err != nil {
			if ctx.Err() != nil {
				return nil, errors.Join(err, f.Close())
			}
			return fail("verify: %w", err)
		}
	}
	base, ok := f.Delta()
	if !ok {
		return lv, nil
	}
	lv.base = base
	// The chain: the base full version, then each delta up to this one.
	chain := []*File{f}
	for cur := base; ; {
		bv := set.versions[cur]
		if bv == nil {
			// Not the file's fault: the base is still being loaded
			// (fetched from its stream); try again once it is.
			return nil, errors.Join(fmt.Errorf("%w: delta over version %d, which is not loaded here yet", ErrBaseNotLoaded, cur), f.Close())
		}
		chain = append(chain, bv.file)
		if bv.base == 0 {
			break
		}
		cur = bv.base
	}
	slices.Reverse(chain)
	o, err := NewOverlay(chain[0], chain[1:]...)
	if err != nil {
		return fail("%w", err)
	}
	lv.overlay = o
	lv.keys = 0
	if k := int64(set.versions[base].keys) + int64(st.Records-st.Deleted) - int64(st.Deleted); k > 0 {
		lv.keys = uint64(k)
	}
	return lv, nil
}
