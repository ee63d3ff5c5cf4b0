//go:build !linux

package bulk

// allocHuge returns an n-byte buffer (see the
// Linux version).
func allocHuge(n int) (buf []byte, free func()) { return make([]byte, n), func() {} }

// adviseMapping asks for huge pages on a file mapping (Linux only).
func adviseMapping([]byte) {}
