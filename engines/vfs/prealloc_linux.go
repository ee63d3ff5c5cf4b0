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
	err := f.syscallEINTR(func(fd int) error { return syscall.Fallocate(fd, 0, 0, size) })
	if errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOSYS) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("preallocate %s: %w", f.Name(), err)
	}
	return true, nil
}

// DataSync is fdatasync(2): the file's bytes and the metadata needed to
// read them back, without the timestamps a full fsync also writes.
func (f osFile) DataSync() error {
	if err := f.syscallEINTR(syscall.Fdatasync); err != nil {
		return fmt.Errorf("sync %s: %w", f.Name(), err)
	}
	return nil
}

// syscallEINTR runs call on f's descriptor, again while it is interrupted.
func (f osFile) syscallEINTR(call func(fd int) error) error {
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var cerr error
	if err := sc.Control(func(fd uintptr) {
		for {
			if cerr = call(int(fd)); !errors.Is(cerr, syscall.EINTR) {
				return
			}
		}
	}); err != nil {
		return err
	}
	return cerr
}

var (
	_ Preallocator = osFile{}
	_ DataSyncer   = osFile{}
)
