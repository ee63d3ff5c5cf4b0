//go:build !amd64

package bulk

// crc3 returns the CRC32Cs of a, b and c, which must be of one length.
func crc3(a, b, c []byte) (uint32, uint32, uint32) { return crcOf(a), crcOf(b), crcOf(c) }
