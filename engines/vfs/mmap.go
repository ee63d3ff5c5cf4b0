//go:build linux

package vfs

import (
	"fmt"
	"syscall"
)

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
