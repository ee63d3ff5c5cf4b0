package vfs

import (
	"fmt"
	"syscall"
)

func errNoSpace() error { return fmt.Errorf("vfs: no space left on device: %w", syscall.ENOSPC) }
