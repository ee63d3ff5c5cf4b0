//go:build linux

package vfs

import (
	"errors"
	"fmt"
	"syscall"
)

// Preallocate allocates f's blocks up to size with fallocate(2), extending
// the file to size (the new bytes read as zeros). A file system without
// fallocate leaves the file as it is.
func (f osFile) Preallocate(size int64) (bool, error) {
	sc, err := f.SyscallConn()
	if err != nil {
		return false, fmt.Errorf("preallocate %s: %w", f.Name(), err)
	}
	var ferr error
	if err := sc.Control(func(fd uintptr) {
		for {
			ferr = syscall.Fallocate(int(fd), 0, 0, size)
			if !errors.Is(ferr, syscall.EINTR) {
				return
			}
		}
	}); err != nil {
		return false, fmt.Errorf("preallocate %s: %w", f.Name(), err)
	}
	if errors.Is(ferr, syscall.EOPNOTSUPP) || errors.Is(ferr, syscall.ENOSYS) {
		return false, nil
	}
	if ferr != nil {
		return false, fmt.Errorf("preallocate %s: %w", f.Name(), ferr)
	}
	return true, nil
}

// DataSync is fdatasync(2): the file's bytes and the metadata needed to
// read them back, without the timestamps a full fsync also writes.
func (f osFile) DataSync() error {
	sc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("sync %s: %w", f.Name(), err)
	}
	var serr error
	if err := sc.Control(func(fd uintptr) {
		for {
			serr = syscall.Fdatasync(int(fd))
			if !errors.Is(serr, syscall.EINTR) {
				return
			}
		}
	}); err != nil {
		return fmt.Errorf("sync %s: %w", f.Name(), err)
	}
	if serr != nil {
		return fmt.Errorf("sync %s: %w", f.Name(), serr)
	}
	return nil
}

var (
	_ Preallocator = osFile{}
	_ DataSyncer   = osFile{}
)
