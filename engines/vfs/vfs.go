package vfs

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
)

// File is an open file. Methods are safe for concurrent use as far as the
// underlying *os.File is (ReadAt from many goroutines is fine; Write is
// serialised by the caller).
type File interface {
	io.Reader
	io.ReaderAt
	io.Writer
	io.Closer
	// Sync makes everything written so far durable: after it returns, a
	// crash keeps it.
	Sync() error
	// Size is the file's current length.
	Size() (int64, error)
	// Truncate changes the file's length (not durable until Sync).
	Truncate(size int64) error
}

// Mapper is implemented by files that can be memory-mapped read-only: the
// OS file system's (MemFS files are not, so tests that inject faults read
// through ReadAt). A mapping shows the file's bytes as they are on the
// page cache, so the caller must verify them (CRC) as it would a read, and
// must never touch them after unmap.
type Mapper interface {
	// Map maps bytes [0, size) of the file read-only. The file must not
	// shrink below size while mapped: touching a page past its end faults
	// the process (SIGBUS).
	Map(size int64) (data []byte, unmap func() error, err error)
}

// Linker is implemented by file systems that can hard-link a file (the
// OS's and MemFS): a second name for the same file, whose bytes both names
// share. A split partition's children share its immutable files so.
type Linker interface {
	// Link makes newname name oldname's file; durable once newname's
	// directory is SyncDir'ed. newname must not exist.
	Link(oldname, newname string) error
}

// FS is the file-system seam every engine and the stream layer use.
// Implementations are safe for concurrent use.
//
// Durability model (what MemFS's Crash enforces, and what the OS gives):
// a file's bytes are durable once the file was Synced; a file's existence
// under a name (Create, Rename, Remove) is durable once its directory was
// SyncDir'ed.
type FS interface {
	// Create creates or truncates name for reading and writing.
	Create(name string) (File, error)
	// Open opens an existing file read-only.
	Open(name string) (File, error)
	// OpenReadWrite opens an existing file for reading and writing; writes
	// go to the end (append).
	OpenReadWrite(name string) (File, error)
	Remove(name string) error
	// Rename atomically replaces newname with oldname.
	Rename(oldname, newname string) error
	MkdirAll(dir string, perm os.FileMode) error
	// List returns the names (not paths) in dir, sorted.
	List(dir string) ([]string, error)
	// Stat returns a file's size; os.ErrNotExist if absent.
	Stat(name string) (size int64, err error)
	// SyncDir makes the creates, renames and removes in dir durable.
	SyncDir(dir string) error
}

// ErrInjected is the error MemFS's fault injection returns (wrapped), unless
// a specific error such as ErrNoSpace was asked for.
var ErrInjected = errors.New("vfs: injected fault")

// ErrNoSpace is returned (wrapped) by an injected full-disk fault; it wraps
// the same errno the OS uses (ENOSPC).
var ErrNoSpace = errNoSpace()

// Default is the operating system's file system.
var Default FS = osFS{}

type osFS struct{}

type osFile struct{ *os.File }

func (f osFile) Size() (int64, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

func (osFS) Create(name string) (File, error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (osFS) Open(name string) (File, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (osFS) OpenReadWrite(name string) (File, error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_APPEND, 0)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (osFS) Link(oldname, newname string) error { return os.Link(oldname, newname) }

func (osFS) Remove(name string) error                    { return os.Remove(name) }
func (osFS) Rename(oldname, newname string) error        { return os.Rename(oldname, newname) }
func (osFS) MkdirAll(dir string, perm os.FileMode) error { return os.MkdirAll(dir, perm) }

func (osFS) List(dir string) ([]string, error) {
	es, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(es))
	for i, e := range es {
		names[i] = e.Name()
	}
	sort.Strings(names)
	return names, nil
}

func (osFS) Stat(name string) (int64, error) {
	st, err := os.Stat(name)
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

func (osFS) SyncDir(dir string) error {
	d, err := os.Open(filepath.Clean(dir))
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		return errors.Join(err, d.Close())
	}
	return d.Close()
}

// Preallocator is implemented by files whose blocks can be allocated
// ahead of the writes that fill them (the OS file system's on Linux).
// A log that preallocates its file and then overwrites it syncs with
// DataSync and no metadata change per sync: on this project's machines
// about a quarter less time and CPU per sync than appending.
type Preallocator interface {
	// Preallocate allocates the file's blocks up to size, extending it
	// to size with zeros. It reports whether it did: false, with no
	// error, where the file system cannot.
	Preallocate(size int64) (bool, error)
}

// DataSyncer is implemented by files that can sync their bytes without
// the metadata a reader does not need (fdatasync(2)).
type DataSyncer interface {
	// DataSync makes everything written so far durable, with the file's
	// length, like Sync.
	DataSync() error
}

// Preallocate preallocates f up to size if it can (Preallocator) and
// reports whether it did.
func Preallocate(f File, size int64) (bool, error) {
	if p, ok := f.(Preallocator); ok {
		return p.Preallocate(size)
	}
	return false, nil
}

// DataSync syncs f with DataSync where it can and with Sync otherwise.
func DataSync(f File) error {
	if d, ok := f.(DataSyncer); ok {
		return d.DataSync()
	}
	return f.Sync()
}
