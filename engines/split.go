package engines

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/engines/vfs"
)

// ErrSplitSpec: a SplitSpec an engine cannot honour (no split point of its
// kind, a child directory missing or equal to the parent's).
var ErrSplitSpec = errors.New("engines: bad split spec")

// SplitSpec says where a partition splits and where its children live.
type SplitSpec struct {
	// Hash is the split point of a point table: keys whose
	// keyspace.Hash is below it go left, the others right (the right
	// child's hash range starts at Hash). It must not be 0.
	Hash uint64
	// Key is the split point of an ordered table: keys bytewise below it
	// go left, the others right (the right child's key_start). It must
	// not be empty.
	Key []byte
	// Left and Right open the children. A disk-backed engine makes each
	// child in its Dir, which must be neither the parent's nor the
	// other's; whatever is there (a split that crashed half-way) is
	// removed first. Storage, FS and the like should match the parent's.
	Left, Right Options
}

// Splitter is the capability of engines whose partitions split (point
// and ordered).
type Splitter interface {
	// Split divides the engine's records between two new engines: user
	// keys by spec's split point, keys SharedKey reports to both, each
	// with its value and expiry. It must be called with no write in
	// flight nor to come (the owner quiesced the partition: every replica
	// calls it after applying the log up to the split record); reads
	// racing it may fail with ErrClosed.
	//
	// Split consumes the engine: it is closed when Split returns,
	// whatever the outcome. Disk-backed engines share the parent's files
	// with the children (hard links; see RATIONALE.md, "Splitting and
	// merging partitions") and copy no record; out-of-range records drop
	// out of each child's view at once and their space is reclaimed by
	// its garbage collection or compaction.
	//
	// Durability: when Split returns nil both children are complete and
	// durable, and the parent's directory holds the SPLIT marker
	// (SplitDone reports it); the parent's files are no longer needed
	// (RemoveDir). On an error the marker is absent: the parent's files
	// are intact (reopen it to go on) and the children's directories are
	// to be discarded. A crash leaves one of the two states; see
	// SplitDone for how a restart tells them apart.
	Split(spec SplitSpec) (left, right Engine, err error)
}

// Merger is the capability of engines whose adjacent partitions merge:
// the inverse of Split.
type Merger interface {
	// Merge makes one engine in opts.Dir of the receiver (the left
	// partition) and right, the adjacent partition of the same kind
	// (every user key of right hashes or sorts after the receiver's).
	// Keys SharedKey reports, present in both, take right's version (the
	// owner rewrites its applied LSN after a merge). Quiescing as for
	// Split. Merge consumes both engines (closed when it returns).
	// Disk-backed engines share the left's files (hard links) and copy
	// right's live records into the merged engine.
	//
	// Durability: when Merge returns nil, the merged engine is complete
	// and durable and opts.Dir holds the MERGED marker (MergeDone); the
	// children's files are no longer needed. On an error (or a crash
	// before the marker) both children's files are intact and opts.Dir
	// is to be discarded (the next Merge into it clears it).
	Merge(right Engine, opts Options) (Engine, error)
}

// SharedKey reports whether key goes to both children of a split: the
// platform's own records (api.ReservedKeyPrefix: a replica's applied
// LSN, kept request outcomes), which every partition has.
func SharedKey(key []byte) bool { return api.IsReservedKey(key) }

// SharedPrefix is the prefix of the keys SharedKey reports.
const SharedPrefix = api.ReservedKeyPrefix

// Marker files: on-disk, never change or reuse.
//
//	| magic (8) | version (4, =1) | left len (2) | left | right len (2) | right | crc32c (4) |
//
// magic is "TABSPLIT" in a split parent's directory (SplitMarkerName) and
// "TABMERGE" in a merged engine's (MergeMarkerName); left and right are
// the children's directories as the split or merge was given them;
// crc32c (Castagnoli) covers everything before it.
const (
	SplitMarkerName = "SPLIT"
	MergeMarkerName = "MERGED"
	splitMagic      = "TABSPLIT"
	mergeMagic      = "TABMERGE"
	markerVersion   = 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrMarkerVersion: a marker file of a version this build cannot read.
var ErrMarkerVersion = errors.New("engines: unknown split marker version")

func encodeMarker(magic, left, right string) []byte {
	b := make([]byte, 0, 8+4+4+len(left)+len(right)+4)
	b = append(b, magic...)
	b = binary.LittleEndian.AppendUint32(b, markerVersion)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(left)))
	b = append(b, left...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(right)))
	b = append(b, right...)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// decodeMarker decodes a marker file. Errors wrap ErrCorrupt or
// ErrMarkerVersion.
func decodeMarker(magic string, b []byte) (left, right string, err error) {
	if len(b) < 8+4+2+2+4 {
		return "", "", fmt.Errorf("marker of %d bytes: %w", len(b), ErrCorrupt)
	}
	body := b[:len(b)-4]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return "", "", fmt.Errorf("marker crc: %w", ErrCorrupt)
	}
	if string(body[:8]) != magic {
		return "", "", fmt.Errorf("marker magic %q, want %q: %w", body[:8], magic, ErrCorrupt)
	}
	if v := binary.LittleEndian.Uint32(body[8:]); v != markerVersion {
		return "", "", fmt.Errorf("marker version %d, this build reads %d: %w", v, markerVersion, ErrMarkerVersion)
	}
	p := body[12:]
	str := func() (string, bool) {
		if len(p) < 2 {
			return "", false
		}
		n := int(binary.LittleEndian.Uint16(p))
		if len(p) < 2+n {
			return "", false
		}
		s := string(p[2 : 2+n])
		p = p[2+n:]
		return s, true
	}
	l, ok1 := str()
	r, ok2 := str()
	if !ok1 || !ok2 || len(p) != 0 {
		return "", "", fmt.Errorf("marker fields: %w", ErrCorrupt)
	}
	return l, r, nil
}

// SplitDone reports whether the engine in dir was split: its SPLIT marker
// is there, so the children in left and right are complete and the
// parent must not be opened again (remove it with RemoveDir once the
// owner no longer needs it). done is false, with no error, when dir holds
// no marker: a split that did not finish (or none), so the parent is
// intact and any child directory made for it is to be discarded. A
// marker that fails its checksum is an error wrapping ErrCorrupt.
func SplitDone(fs vfs.FS, dir string) (left, right string, done bool, err error) {
	return markerDone(fs, dir, SplitMarkerName, splitMagic)
}

// MergeDone reports whether dir holds a finished merge (its MERGED
// marker) and of which children. done is false, with no error, when dir or
// the marker is absent: the children are intact and dir is to be
// discarded.
func MergeDone(fs vfs.FS, dir string) (left, right string, done bool, err error) {
	return markerDone(fs, dir, MergeMarkerName, mergeMagic)
}

func markerDone(fs vfs.FS, dir, name, magic string) (left, right string, done bool, err error) {
	if fs == nil {
		fs = vfs.Default
	}
	b, err := readFile(fs, filepath.Join(dir, name))
	if errors.Is(err, os.ErrNotExist) {
		return "", "", false, nil
	}
	if err != nil {
		return "", "", false, fmt.Errorf("read %s marker in %s: %w", name, dir, err)
	}
	left, right, err = decodeMarker(magic, b)
	if err != nil {
		return "", "", false, fmt.Errorf("read %s marker in %s: %w", name, dir, err)
	}
	return left, right, true, nil
}

// CommitSplit writes the SPLIT marker into the parent's directory,
// durably: the commit point of a split. Engines call it once both
// children are durable.
func CommitSplit(fs vfs.FS, parent, left, right string) error {
	if err := WriteFileAtomic(fs, filepath.Join(parent, SplitMarkerName), encodeMarker(splitMagic, left, right)); err != nil {
		return fmt.Errorf("commit split of %s: %w", parent, err)
	}
	return nil
}

// CommitMerge writes the MERGED marker into the merged engine's directory,
// durably: the commit point of a merge.
func CommitMerge(fs vfs.FS, dir, left, right string) error {
	if err := WriteFileAtomic(fs, filepath.Join(dir, MergeMarkerName), encodeMarker(mergeMagic, left, right)); err != nil {
		return fmt.Errorf("commit merge into %s: %w", dir, err)
	}
	return nil
}

// CheckSplitSpec refuses a spec whose children's directories are missing,
// equal or the parent's (dir), for disk-backed engines.
func CheckSplitSpec(dir string, spec SplitSpec) error {
	l, r, p := filepath.Clean(spec.Left.Dir), filepath.Clean(spec.Right.Dir), filepath.Clean(dir)
	switch {
	case spec.Left.Dir == "" || spec.Right.Dir == "":
		return fmt.Errorf("%w: a child's Dir is empty", ErrSplitSpec)
	case l == r || l == p || r == p:
		return fmt.Errorf("%w: directories %q, %q and parent %q must differ", ErrSplitSpec, spec.Left.Dir, spec.Right.Dir, dir)
	}
	return nil
}

// WriteFileAtomic durably replaces path with data on fs: temp file,
// fsync, close, rename, fsync the directory.
func WriteFileAtomic(fs vfs.FS, path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := fs.Create(tmp)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		return errors.Join(fmt.Errorf("write %s: %w", tmp, err), f.Close())
	}
	if err := f.Sync(); err != nil {
		return errors.Join(fmt.Errorf("sync %s: %w", tmp, err), f.Close())
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := fs.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s: %w", tmp, err)
	}
	if err := fs.SyncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("sync dir of %s: %w", path, err)
	}
	return nil
}

func readFile(fs vfs.FS, path string) ([]byte, error) {
	f, err := fs.Open(path)
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(f)
	return b, errors.Join(err, f.Close())
}

// RemoveDir removes dir and everything under it, durably (the removal of
// dir's name is synced in its parent). A missing dir is not an error. The
// marker files go last, so a crash half-way leaves a directory SplitDone
// and MergeDone still describe.
func RemoveDir(fs vfs.FS, dir string) error {
	if fs == nil {
		fs = vfs.Default
	}
	if err := removeTree(fs, dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	if err := fs.SyncDir(filepath.Dir(filepath.Clean(dir))); err != nil {
		return fmt.Errorf("remove %s: sync parent: %w", dir, err)
	}
	return nil
}

func removeTree(fs vfs.FS, dir string) error {
	names, err := fs.List(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	// Markers last.
	var last []string
	for _, n := range names {
		if n == SplitMarkerName || n == MergeMarkerName {
			last = append(last, n)
			continue
		}
		p := filepath.Join(dir, n)
		if err := fs.Remove(p); err != nil {
			// A directory with entries (pebble keeps none, but be
			// general): empty it first.
			if err2 := removeTree(fs, p); err2 != nil {
				return errors.Join(err, err2)
			}
			if err := fs.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	if len(last) > 0 {
		if err := fs.SyncDir(dir); err != nil {
			return err
		}
		for _, n := range last {
			if err := fs.Remove(filepath.Join(dir, n)); err != nil {
				return err
			}
		}
	}
	if err := fs.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Pending is what a split or merge changed on disk and has not synced yet:
// directories whose entries changed and files written. A split builds its
// children with the Stage functions and syncs everything once, all at
// once (Sync), before its commit point, instead of after each step: a
// journaling file system takes concurrent syncs in one commit, and under
// other writers each commit can take a hundred milliseconds, while the
// partition refuses writes. Nothing staged counts before the commit
// point: a crash discards children without their marker. Safe for
// concurrent use.
type Pending struct {
	mu    sync.Mutex
	dirs  []string
	files []vfs.File
}

func (p *Pending) addDir(dir string) {
	dir = filepath.Clean(dir)
	p.mu.Lock()
	defer p.mu.Unlock()
	if !slices.Contains(p.dirs, dir) {
		p.dirs = append(p.dirs, dir)
	}
}

// Sync makes everything staged durable: each file and directory synced
// concurrently; the files are closed. Nothing stays pending, whatever it
// returns.
func (p *Pending) Sync(fs vfs.FS) error {
	p.mu.Lock()
	dirs, files := p.dirs, p.files
	p.dirs, p.files = nil, nil
	p.mu.Unlock()
	errs := make([]error, len(dirs)+len(files))
	var wg sync.WaitGroup
	for i, d := range dirs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fs.SyncDir(d); err != nil {
				errs[i] = fmt.Errorf("sync %s: %w", d, err)
			}
		}()
	}
	for i, f := range files {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[len(dirs)+i] = errors.Join(f.Sync(), f.Close())
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// PrepareDir makes dir a new, empty directory, durably: whatever a crashed
// split or merge left there is removed first.
func PrepareDir(fs vfs.FS, dir string) error {
	var p Pending
	if err := StageDir(fs, dir, &p); err != nil {
		return err
	}
	return p.Sync(fs)
}

// StageDir is PrepareDir with the syncs left in p.
func StageDir(fs vfs.FS, dir string, p *Pending) error {
	if err := removeTree(fs, dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	p.addDir(filepath.Dir(filepath.Clean(dir)))
	// The directories MkdirAll makes: dir and its missing ancestors.
	var made []string
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		if _, err := fs.List(d); err == nil {
			break
		}
		made = append(made, d)
		if p := filepath.Dir(d); p == d || p == "." {
			break
		}
	}
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("make %s: %w", dir, err)
	}
	// Sync the parent of each new name (dir's included), and no further:
	// a split's latency pays for every sync, and the ancestors above the
	// first that existed did not change.
	for _, d := range made {
		p.addDir(filepath.Dir(d))
	}
	return nil
}

// LinkFiles hard-links the files of from whose names keep accepts into to
// (which exists) and syncs to: the children of a split share the parent's
// immutable files instead of copying them. fs must implement vfs.Linker.
func LinkFiles(fs vfs.FS, from, to string, keep func(name string) bool) error {
	var p Pending
	if err := StageLinks(fs, from, to, keep, &p); err != nil {
		return err
	}
	return p.Sync(fs)
}

// StageLinks is LinkFiles with the sync left in p.
func StageLinks(fs vfs.FS, from, to string, keep func(name string) bool, p *Pending) error {
	ln, ok := fs.(vfs.Linker)
	if !ok {
		return fmt.Errorf("link files of %s: file system %T cannot hard-link: %w", from, fs, ErrSplitSpec)
	}
	names, err := fs.List(from)
	if err != nil {
		return fmt.Errorf("link files of %s: %w", from, err)
	}
	for _, n := range names {
		if !keep(n) {
			continue
		}
		if err := ln.Link(filepath.Join(from, n), filepath.Join(to, n)); err != nil {
			return fmt.Errorf("link %s into %s: %w", n, to, err)
		}
	}
	p.addDir(to)
	return nil
}

// StageFile writes a new file path (which must not exist: a directory
// StageDir made) with data, its sync and its directory's left in p.
func StageFile(fs vfs.FS, path string, data []byte, p *Pending) error {
	f, err := fs.Create(path)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		return errors.Join(fmt.Errorf("write %s: %w", path, err), f.Close())
	}
	p.mu.Lock()
	p.files = append(p.files, f)
	p.mu.Unlock()
	p.addDir(filepath.Dir(path))
	return nil
}

// SplitSide reports which children of a split at spec a key goes to.
// hashed says the table is a point table (split by keyspace.Hash(key)
// against spec.Hash), else an ordered one (key against spec.Key).
func SplitSide(spec SplitSpec, hashed bool, key []byte, hash uint64) (left, right bool) {
	if SharedKey(key) {
		return true, true
	}
	if hashed {
		return hash < spec.Hash, hash >= spec.Hash
	}
	c := bytes.Compare(key, spec.Key) < 0
	return c, !c
}

// copyBatch bounds CopyRecords's batches.
const (
	copyBatchKeys  = 1000
	copyBatchBytes = 4 << 20
)

// CopyRecords writes every live record of src that keep accepts into dst,
// in batches, keeping values and expiries: the split and merge of engines
// whose records live in memory, and the copying baseline the sharing ones
// are measured against.
func CopyRecords(dst Writer, src Engine, keep func(key []byte) bool) error {
	var batch []Mutation
	size := 0
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := dst.Apply(batch)
		batch, size = batch[:0], 0
		return err
	}
	err := src.Scan(func(r Record) error {
		if keep != nil && !keep(r.Key) {
			return nil
		}
		batch = append(batch, Mutation{Key: bytes.Clone(r.Key), Value: append([]byte{}, r.Value...), ExpiresAt: r.ExpiresAt, Cold: true})
		size += len(r.Key) + len(r.Value)
		if len(batch) >= copyBatchKeys || size >= copyBatchBytes {
			return flush()
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	if err != nil {
		return fmt.Errorf("copy records: %w", err)
	}
	return nil
}
