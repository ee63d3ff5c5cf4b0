package vfs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
)

// ErrCrashed is returned (wrapped in an *os.PathError) by every method of a
// File opened before MemFS.Crash, except Close, which returns nil: the
// process that held the handle is gone.
var ErrCrashed = errors.New("vfs: file handle from before a crash")

// OpKind is a set of operation kinds, for fault injection and counting.
// Kinds combine with |: OpWrite|OpSync.
type OpKind uint32

// The operation kinds. Every FS and File method is exactly one kind, except
// File.Close and MemFS's own methods (Crash, FlipBit, ...), which are none.
const (
	OpCreate   OpKind = 1 << iota // FS.Create
	OpOpen                        // FS.Open, FS.OpenReadWrite
	OpRead                        // File.Read, File.ReadAt
	OpWrite                       // File.Write
	OpSync                        // File.Sync
	OpSyncDir                     // FS.SyncDir
	OpTruncate                    // File.Truncate
	OpRename                      // FS.Rename
	OpRemove                      // FS.Remove
	OpMkdir                       // FS.MkdirAll
	OpList                        // FS.List
	OpStat                        // FS.Stat, File.Size
	OpLink                        // MemFS.Link

	numOpKinds = iota

	// OpAny is every kind.
	OpAny OpKind = 1<<numOpKinds - 1
)

var opNames = [numOpKinds]string{
	"create", "open", "read", "write", "sync", "syncdir", "truncate",
	"rename", "remove", "mkdir", "list", "stat", "link",
}

func (k OpKind) String() string {
	if k == OpAny {
		return "any"
	}
	var parts []string
	for i := range numOpKinds {
		if k&(1<<i) != 0 {
			parts = append(parts, opNames[i])
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "|")
}

// Fault is an armed failure of a MemFS.
type Fault struct {
	// Ops are the kinds of operation the fault counts and fails.
	Ops OpKind
	// After is how many operations of kinds Ops succeed before one fails:
	// 0 fails the next one.
	After int
	// Err is the error the failing operation returns, wrapped in an
	// *os.PathError (*os.LinkError for Rename). Nil means ErrInjected; use
	// ErrNoSpace for a full disk.
	Err error
	// Sticky keeps failing every later operation of kinds Ops (a full disk, a
	// dead device) until ClearFaults or Crash. Otherwise the fault fires once.
	Sticky bool
	// Torn makes a failing Write write the first len(p)/2 bytes (a short
	// write, as write(2) can do on ENOSPC) and return that count with the
	// error. Otherwise a failing Write writes nothing and returns 0.
	Torn bool
}

// MemFS is an in-memory FS that can crash, fail the k-th operation and flip
// bits (after pebble's vfs.NewStrictMem and errorfs). It is safe for
// concurrent use: one mutex guards the whole tree.
//
// Paths are cleaned and resolved from "/": "a/b", "/a/b" and "/x/../a/b" name
// the same file. Only "/" exists at first; directories come from MkdirAll.
//
// Durability is strict, as on Linux: a file's bytes are durable once
// File.Sync returned; a name (a file or a directory, including one made by
// MkdirAll) is durable once its parent directory was SyncDir'ed. Crash drops
// everything else. A file Created and synced in a directory that was never
// SyncDir'ed vanishes; a directory made by MkdirAll whose parent was never
// SyncDir'ed vanishes with everything in it.
//
// Differences from the OS: Open of a directory fails with EISDIR (use
// SyncDir, List); Remove of a non-empty directory fails with ENOTEMPTY; file
// modes are ignored.
type MemFS struct {
	mu sync.Mutex
	// Guarded by mu.
	root   *memNode
	gen    uint64 // incremented by Crash; handles of older generations are stale
	faults []*Fault
	counts [numOpKinds]int64
	// prealloc: files honour Preallocate (zero-extending, like
	// fallocate) rather than ignoring it; see SetPreallocate.
	prealloc bool
}

var _ FS = (*MemFS)(nil)

// NewMem returns an empty MemFS holding only the root directory "/".
func NewMem() *MemFS {
	return &MemFS{root: newDir()}
}

// memNode is a file or a directory. A node's identity is its inode: a
// Rename moves the node, and open handles keep it alive after Remove.
type memNode struct {
	isDir bool
	// Files: data is the current content, synced what a crash keeps.
	data, synced []byte
	// Directories: children is the current listing, syncedChildren what a
	// crash keeps (the listing at the last SyncDir).
	children, syncedChildren map[string]*memNode
}

func newDir() *memNode {
	return &memNode{isDir: true, children: map[string]*memNode{}, syncedChildren: map[string]*memNode{}}
}

// Inject arms f. Faults armed together count independently; if several fire
// on one operation, the first armed one's error is returned.
func (fs *MemFS) Inject(f Fault) {
	if f.Err == nil {
		f.Err = ErrInjected
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.faults = append(fs.faults, &f)
}

// InjectAfter arms a one-shot fault: n operations of kinds ops succeed, the
// next one fails with err (ErrInjected if nil). A failing Write is torn: it
// writes the first len(p)/2 bytes, then returns the error.
//
// Count a scenario's operations with Ops on a clean run, then rerun it with
// InjectAfter(k, ...) for every k below that count.
func (fs *MemFS) InjectAfter(n int, ops OpKind, err error) {
	fs.Inject(Fault{Ops: ops, After: n, Err: err, Torn: true})
}

// ClearFaults disarms every fault.
func (fs *MemFS) ClearFaults() {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.faults = nil
}

// Ops returns how many operations of kinds ops were attempted since NewMem,
// failed ones included (those refused for a closed, stale or read-only
// handle excluded).
func (fs *MemFS) Ops(ops OpKind) int64 {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	var n int64
	for i, c := range fs.counts {
		if ops&(1<<i) != 0 {
			n += c
		}
	}
	return n
}

// opLocked counts one operation of kind k and returns the fault that fails
// it, or nil.
func (fs *MemFS) opLocked(k OpKind) *Fault {
	for i := range numOpKinds {
		if k == 1<<i {
			fs.counts[i]++
		}
	}
	var fired *Fault
	kept := fs.faults[:0]
	for _, f := range fs.faults {
		if f.Ops&k == 0 {
			kept = append(kept, f)
			continue
		}
		if f.After > 0 {
			f.After--
			kept = append(kept, f)
			continue
		}
		if fired == nil {
			fired = f
		}
		if f.Sticky {
			kept = append(kept, f)
		}
	}
	clear(fs.faults[len(kept):])
	fs.faults = kept
	return fired
}

// injectLocked is opLocked for operations that fail as a whole.
func (fs *MemFS) injectLocked(k OpKind, op, name string) error {
	if f := fs.opLocked(k); f != nil {
		return &os.PathError{Op: op, Path: name, Err: f.Err}
	}
	return nil
}

// Crash makes the FS what a power loss would leave: every directory lists
// what it listed at its last SyncDir, every file holds what it held at its
// last Sync. Open handles become stale (ErrCrashed) and faults are
// disarmed; the operation counters keep counting.
func (fs *MemFS) Crash() {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.crashLocked(nil)
}

// CrashKeepingPrefix is Crash with torn appends: a file whose unsynced
// changes are appends only (its synced content is a prefix of its current
// content) keeps its synced content plus a prefix of the unsynced tail, of a
// length drawn uniformly from [0, len(tail)] with rng; other files revert to
// their synced content. The prefix becomes durable. Files are visited in
// path order, so a seeded rng gives the same result every run.
//
// Real disks can also leave zeros or garbage in an unsynced tail; a log
// reader must reject those by checksum, which a bit-flip test covers.
func (fs *MemFS) CrashKeepingPrefix(rng *rand.Rand) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.crashLocked(rng)
}

func (fs *MemFS) crashLocked(rng *rand.Rand) {
	fs.gen++
	fs.faults = nil
	seen := map[*memNode]bool{}
	var restore func(n *memNode)
	restore = func(n *memNode) {
		if seen[n] {
			return
		}
		seen[n] = true
		if !n.isDir {
			keep := len(n.synced)
			if rng != nil && len(n.data) > keep && bytes.Equal(n.data[:keep], n.synced) {
				keep += rng.IntN(len(n.data) - keep + 1)
				n.data = n.data[:keep]
				n.synced = append(n.synced[:0], n.data...)
				return
			}
			n.data = append(n.data[:0], n.synced...)
			return
		}
		n.children = maps.Clone(n.syncedChildren)
		for _, name := range slices.Sorted(maps.Keys(n.children)) {
			restore(n.children[name])
		}
	}
	restore(fs.root)
}

// FlipBit flips bit (0-7) of the byte at offset in name's current and, if
// the offset is synced, synced content: media corruption that survives a
// crash. It is not an operation: it neither counts nor fails by injection.
func (fs *MemFS) FlipBit(name string, offset int64, bit uint) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	n, err := fs.walkLocked("flipbit", name)
	if err != nil {
		return err
	}
	if n.isDir {
		return &os.PathError{Op: "flipbit", Path: name, Err: syscall.EISDIR}
	}
	if offset < 0 || offset >= int64(len(n.data)) || bit > 7 {
		return &os.PathError{Op: "flipbit", Path: name,
			Err: fmt.Errorf("bit %d of byte %d out of range (size %d): %w", bit, offset, len(n.data), syscall.EINVAL)}
	}
	n.data[offset] ^= 1 << bit
	if offset < int64(len(n.synced)) {
		n.synced[offset] ^= 1 << bit
	}
	return nil
}

// components splits a path, resolved from "/", into its names.
func components(name string) []string {
	p := filepath.Join(string(filepath.Separator), name)
	p = strings.TrimLeft(p, string(filepath.Separator))
	if p == "" {
		return nil
	}
	return strings.Split(p, string(filepath.Separator))
}

// walkLocked returns the node at name.
func (fs *MemFS) walkLocked(op, name string) (*memNode, error) {
	n := fs.root
	for _, c := range components(name) {
		if !n.isDir {
			return nil, &os.PathError{Op: op, Path: name, Err: syscall.ENOTDIR}
		}
		if n = n.children[c]; n == nil {
			return nil, &os.PathError{Op: op, Path: name, Err: syscall.ENOENT}
		}
	}
	return n, nil
}

// parentLocked returns the directory holding name and name's last
// component. The root has no parent.
func (fs *MemFS) parentLocked(op, name string) (*memNode, string, error) {
	cs := components(name)
	if len(cs) == 0 {
		return nil, "", &os.PathError{Op: op, Path: name, Err: syscall.EBUSY}
	}
	dir := fs.root
	for _, c := range cs[:len(cs)-1] {
		if dir = dir.children[c]; dir == nil {
			return nil, "", &os.PathError{Op: op, Path: name, Err: syscall.ENOENT}
		}
		if !dir.isDir {
			return nil, "", &os.PathError{Op: op, Path: name, Err: syscall.ENOTDIR}
		}
	}
	return dir, cs[len(cs)-1], nil
}

// Create creates or truncates name for reading and writing. Neither the
// name nor the truncation is durable until SyncDir and Sync.
func (fs *MemFS) Create(name string) (File, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if err := fs.injectLocked(OpCreate, "open", name); err != nil {
		return nil, err
	}
	dir, base, err := fs.parentLocked("open", name)
	if err != nil {
		return nil, err
	}
	n := dir.children[base]
	switch {
	case n == nil:
		n = &memNode{}
		dir.children[base] = n
	case n.isDir:
		return nil, &os.PathError{Op: "open", Path: name, Err: syscall.EISDIR}
	default:
		n.data = n.data[:0]
	}
	return fs.newFileLocked(n, name, true, false), nil
}

// Open opens an existing file read-only.
func (fs *MemFS) Open(name string) (File, error) {
	return fs.open(name, false)
}

// OpenReadWrite opens an existing file for reading and writing; every Write
// goes to the end.
func (fs *MemFS) OpenReadWrite(name string) (File, error) {
	return fs.open(name, true)
}

func (fs *MemFS) open(name string, write bool) (File, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if err := fs.injectLocked(OpOpen, "open", name); err != nil {
		return nil, err
	}
	n, err := fs.walkLocked("open", name)
	if err != nil {
		return nil, err
	}
	if n.isDir {
		return nil, &os.PathError{Op: "open", Path: name, Err: syscall.EISDIR}
	}
	return fs.newFileLocked(n, name, write, write), nil
}

// Remove removes a file or an empty directory; durable once its directory
// is SyncDir'ed. Open handles keep working.
func (fs *MemFS) Remove(name string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if err := fs.injectLocked(OpRemove, "remove", name); err != nil {
		return err
	}
	dir, base, err := fs.parentLocked("remove", name)
	if err != nil {
		return err
	}
	n := dir.children[base]
	if n == nil {
		return &os.PathError{Op: "remove", Path: name, Err: syscall.ENOENT}
	}
	if n.isDir && len(n.children) > 0 {
		return &os.PathError{Op: "remove", Path: name, Err: syscall.ENOTEMPTY}
	}
	delete(dir.children, base)
	return nil
}

// Rename atomically replaces newname with oldname; durable once both
// directories are SyncDir'ed. If only one of two directories is, a crash
// keeps the file under both names or under neither.
func (fs *MemFS) Rename(oldname, newname string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	linkErr := func(err error) error {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: err}
	}
	if f := fs.opLocked(OpRename); f != nil {
		return linkErr(f.Err)
	}
	odir, obase, err := fs.parentLocked("rename", oldname)
	if err != nil {
		return linkErr(err.(*os.PathError).Err)
	}
	n := odir.children[obase]
	if n == nil {
		return linkErr(syscall.ENOENT)
	}
	ndir, nbase, err := fs.parentLocked("rename", newname)
	if err != nil {
		return linkErr(err.(*os.PathError).Err)
	}
	if odir == ndir && obase == nbase {
		return nil
	}
	if old := ndir.children[nbase]; old != nil && old.isDir {
		// Go's os.Rename refuses to replace a directory on every platform.
		return linkErr(syscall.EEXIST)
	} else if old != nil && n.isDir {
		return linkErr(syscall.ENOTDIR)
	}
	if n.isDir {
		// A directory must not move into its own subtree.
		oc, nc := components(oldname), components(newname)
		if len(nc) > len(oc) && slices.Equal(nc[:len(oc)], oc) {
			return linkErr(syscall.EINVAL)
		}
	}
	ndir.children[nbase] = n
	delete(odir.children, obase)
	return nil
}

// Link makes newname a second name of oldname's file (a hard link): both
// share its content, synced or not. The new name is durable once its
// directory is SyncDir'ed.
func (fs *MemFS) Link(oldname, newname string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	linkErr := func(err error) error {
		return &os.LinkError{Op: "link", Old: oldname, New: newname, Err: err}
	}
	if f := fs.opLocked(OpLink); f != nil {
		return linkErr(f.Err)
	}
	n, err := fs.walkLocked("link", oldname)
	if err != nil {
		return linkErr(err.(*os.PathError).Err)
	}
	if n.isDir {
		return linkErr(syscall.EPERM)
	}
	ndir, nbase, err := fs.parentLocked("link", newname)
	if err != nil {
		return linkErr(err.(*os.PathError).Err)
	}
	if ndir.children[nbase] != nil {
		return linkErr(syscall.EEXIST)
	}
	ndir.children[nbase] = n
	return nil
}

var _ Linker = (*MemFS)(nil)

// MkdirAll creates dir and any missing parents (perm is ignored). A new
// directory is durable once its parent is SyncDir'ed.
func (fs *MemFS) MkdirAll(dir string, perm os.FileMode) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if err := fs.injectLocked(OpMkdir, "mkdir", dir); err != nil {
		return err
	}
	n := fs.root
	for _, c := range components(dir) {
		child := n.children[c]
		if child == nil {
			child = newDir()
			n.children[c] = child
		} else if !child.isDir {
			return &os.PathError{Op: "mkdir", Path: dir, Err: syscall.ENOTDIR}
		}
		n = child
	}
	return nil
}

// List returns the names in dir, sorted.
func (fs *MemFS) List(dir string) ([]string, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if err := fs.injectLocked(OpList, "open", dir); err != nil {
		return nil, err
	}
	n, err := fs.walkLocked("open", dir)
	if err != nil {
		return nil, err
	}
	if !n.isDir {
		return nil, &os.PathError{Op: "readdirent", Path: dir, Err: syscall.ENOTDIR}
	}
	return slices.Sorted(maps.Keys(n.children)), nil
}

// Stat returns a file's current size (0 for a directory).
func (fs *MemFS) Stat(name string) (int64, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if err := fs.injectLocked(OpStat, "stat", name); err != nil {
		return 0, err
	}
	n, err := fs.walkLocked("stat", name)
	if err != nil {
		return 0, err
	}
	return int64(len(n.data)), nil
}

// SyncDir makes dir's current listing durable: the creates, renames and
// removes in it survive a crash. It does not sync the files' content.
func (fs *MemFS) SyncDir(dir string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if err := fs.injectLocked(OpSyncDir, "sync", dir); err != nil {
		return err
	}
	n, err := fs.walkLocked("open", dir)
	if err != nil {
		return err
	}
	if !n.isDir {
		return &os.PathError{Op: "sync", Path: dir, Err: syscall.ENOTDIR}
	}
	n.syncedChildren = maps.Clone(n.children)
	return nil
}

// memFile is an open MemFS file. Like an *os.File it has one offset, shared
// by Read and Write; in append mode every Write first moves it to the end.
type memFile struct {
	fs            *MemFS
	n             *memNode
	name          string
	gen           uint64
	write, append bool
	// Guarded by fs.mu.
	off    int64
	closed bool
}

var (
	_ File         = (*memFile)(nil)
	_ Preallocator = (*memFile)(nil)
)

func (fs *MemFS) newFileLocked(n *memNode, name string, write, append bool) *memFile {
	return &memFile{fs: fs, n: n, name: name, gen: fs.gen, write: write, append: append}
}

// checkLocked refuses closed and stale handles.
func (f *memFile) checkLocked(op string) error {
	if f.closed {
		return &os.PathError{Op: op, Path: f.name, Err: os.ErrClosed}
	}
	if f.gen != f.fs.gen {
		return &os.PathError{Op: op, Path: f.name, Err: ErrCrashed}
	}
	return nil
}

// writeAtLocked writes p at f.off, zero-filling any gap, and advances f.off.
func (f *memFile) writeAtLocked(p []byte) {
	end := f.off + int64(len(p))
	if end > int64(len(f.n.data)) {
		f.n.data = slices.Grow(f.n.data, int(end)-len(f.n.data))
		old := len(f.n.data)
		f.n.data = f.n.data[:end]
		clear(f.n.data[old:])
	}
	copy(f.n.data[f.off:], p)
	f.off = end
}

func (f *memFile) Write(p []byte) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.checkLocked("write"); err != nil {
		return 0, err
	}
	if !f.write {
		return 0, &os.PathError{Op: "write", Path: f.name, Err: syscall.EBADF}
	}
	fault := f.fs.opLocked(OpWrite)
	if f.append {
		f.off = int64(len(f.n.data))
	}
	if fault != nil {
		k := 0
		if fault.Torn {
			k = len(p) / 2
		}
		f.writeAtLocked(p[:k])
		return k, &os.PathError{Op: "write", Path: f.name, Err: fault.Err}
	}
	f.writeAtLocked(p)
	return len(p), nil
}

func (f *memFile) Read(p []byte) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.checkLocked("read"); err != nil {
		return 0, err
	}
	if err := f.fs.injectLocked(OpRead, "read", f.name); err != nil {
		return 0, err
	}
	if len(p) == 0 {
		return 0, nil
	}
	if f.off >= int64(len(f.n.data)) {
		return 0, io.EOF
	}
	k := copy(p, f.n.data[f.off:])
	f.off += int64(k)
	return k, nil
}

// ReadAt reads like os.File.ReadAt: io.EOF if fewer than len(p) bytes lie
// at off.
func (f *memFile) ReadAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.checkLocked("read"); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, &os.PathError{Op: "readat", Path: f.name, Err: errors.New("negative offset")}
	}
	if err := f.fs.injectLocked(OpRead, "read", f.name); err != nil {
		return 0, err
	}
	if len(p) == 0 {
		return 0, nil
	}
	if off >= int64(len(f.n.data)) {
		return 0, io.EOF
	}
	k := copy(p, f.n.data[off:])
	if k < len(p) {
		return k, io.EOF
	}
	return k, nil
}

// Sync makes the file's current content durable, whichever handle wrote
// it (fsync(2) syncs the inode). It copies the whole file (about 0.1 ms per
// MB), which keeps Crash trivially right; tests keep files small. A failed Sync syncs nothing; callers must
// treat it as fatal, since on Linux the unsynced pages may already be lost.
func (f *memFile) Sync() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.checkLocked("sync"); err != nil {
		return err
	}
	if err := f.fs.injectLocked(OpSync, "sync", f.name); err != nil {
		return err
	}
	f.n.synced = append(f.n.synced[:0], f.n.data...)
	return nil
}

func (f *memFile) Size() (int64, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.checkLocked("stat"); err != nil {
		return 0, err
	}
	if err := f.fs.injectLocked(OpStat, "stat", f.name); err != nil {
		return 0, err
	}
	return int64(len(f.n.data)), nil
}

// Truncate cuts or zero-extends the file; the offset does not move.
func (f *memFile) Truncate(size int64) error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.checkLocked("truncate"); err != nil {
		return err
	}
	if !f.write || size < 0 {
		return &os.PathError{Op: "truncate", Path: f.name, Err: syscall.EINVAL}
	}
	if err := f.fs.injectLocked(OpTruncate, "truncate", f.name); err != nil {
		return err
	}
	if size <= int64(len(f.n.data)) {
		f.n.data = f.n.data[:size]
		return nil
	}
	off := f.off
	f.off = int64(len(f.n.data))
	f.writeAtLocked(make([]byte, size-f.off))
	f.off = off
	return nil
}

// SetPreallocate makes the files' Preallocate extend them with zeros, as
// fallocate(2) does, so that a test sees the layout the OS file system
// gives; by default Preallocate does nothing (Sync copies whole files, and
// most tests keep them small).
func (fs *MemFS) SetPreallocate(on bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.prealloc = on
}

// Preallocate zero-extends the file to size when the MemFS was set to
// (SetPreallocate); it counts and fails as a Truncate.
func (f *memFile) Preallocate(size int64) (bool, error) {
	f.fs.mu.Lock()
	prealloc := f.fs.prealloc
	n := int64(len(f.n.data))
	f.fs.mu.Unlock()
	switch {
	case !prealloc:
		return false, nil
	case size <= n:
		return true, nil
	}
	if err := f.Truncate(size); err != nil {
		return false, err
	}
	return true, nil
}

// Close closes the handle; a second Close returns os.ErrClosed, like the
// OS. Close of a handle from before a crash returns nil.
func (f *memFile) Close() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.closed {
		return &os.PathError{Op: "close", Path: f.name, Err: os.ErrClosed}
	}
	f.closed = true
	return nil
}
