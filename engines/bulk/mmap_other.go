//go:build !(linux || darwin)

package bulk

import (
	"errors"
	"os"
)

const mmapSupported = false

func mmapFile(*os.File, int64) ([]byte, error) { return nil, errors.New("bulk: mmap not supported") }

func munmap([]byte) error { return nil }
