//go:build unix

package vfs

import (
	"fmt"
	"syscall"
)

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

// Map maps f read-only with MAP_SHARED and MADV_RANDOM (reads of single
// records should not pull in their neighbours).
func (f osFile) Map(size int64) ([]byte, func() error, error) {
	if size <= 0 || int64(int(size)) != size {
		return nil, nil, fmt.Errorf("map %s: size %d", f.Name(), size)
	}
	sc, err := f.SyscallConn()
	if err != nil {
		return nil, nil, fmt.Errorf("map %s: %w", f.Name(), err)
	}
	var data []byte
	var merr error
	if err := sc.Control(func(fd uintptr) {
		data, merr = syscall.Mmap(int(fd), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	}); err != nil {
		return nil, nil, fmt.Errorf("map %s: %w", f.Name(), err)
	}
	if merr != nil {
		return nil, nil, fmt.Errorf("map %s: %w", f.Name(), merr)
	}
	_ = syscall.Madvise(data, syscall.MADV_RANDOM) // advice only
	return data, func() error { return syscall.Munmap(data) }, nil
}

var _ Mapper = osFile{}
