package ordered

import (
	"encoding/binary"
	"fmt"

	"github.com/tabuladb/tabula/engines"
)

// The value format, the bytes stored under a key in pebble:
//
//	| format (1) = 0 | value |                      no expiry
//	| format (1) = 1 | expiresAt (8, LE, Unix ms) | value |
//
// Format bytes never change meaning and are never reused; any other byte is
// refused as engines.ErrCorrupt. There is no CRC here: pebble checksums
// every sstable block (and every WAL chunk) and checks it on read, so a
// flipped bit surfaces from pebble as a corruption error before these bytes
// are decoded.
const (
	formatPlain  byte = 0
	formatExpiry byte = 1
)

// appendValue appends the stored form of (value, expiresAt) to dst.
func appendValue(dst, value []byte, expiresAt int64) []byte {
	if expiresAt == 0 {
		dst = append(dst, formatPlain)
	} else {
		dst = append(dst, formatExpiry)
		dst = binary.LittleEndian.AppendUint64(dst, uint64(expiresAt))
	}
	return append(dst, value...)
}

// storedLen is the length of the stored form of (value, expiresAt).
func storedLen(value []byte, expiresAt int64) int {
	if expiresAt == 0 {
		return 1 + len(value)
	}
	return 9 + len(value)
}

// decodeValue splits a stored value; the value aliases b.
func decodeValue(b []byte) (value []byte, expiresAt int64, err error) {
	if len(b) == 0 {
		return nil, 0, fmt.Errorf("stored value of 0 bytes: %w", engines.ErrCorrupt)
	}
	switch b[0] {
	case formatPlain:
		return b[1:], 0, nil
	case formatExpiry:
		if len(b) < 9 {
			return nil, 0, fmt.Errorf("stored value of %d bytes with an expiry: %w", len(b), engines.ErrCorrupt)
		}
		return b[9:], int64(binary.LittleEndian.Uint64(b[1:9])), nil
	default:
		return nil, 0, fmt.Errorf("stored value format %d: %w", b[0], engines.ErrCorrupt)
	}
}
