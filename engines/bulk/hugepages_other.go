//go:build !linux

package bulk

// allocWindow returns an n-byte buffer for the record writer (see the
// Linux version).
func allocWindow(n int) (buf []byte, free func()) { return make([]byte, n), func() {} }

// adviseMapping asks for huge pages on a file mapping (Linux only).
func adviseMapping([]byte) {}
