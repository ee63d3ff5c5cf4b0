package tablemaster

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// File formats of the master's state (drawn in doc.go). Never change or
// reuse these constants; a new layout gets a new formatVersion, and old
// versions stay readable or are refused with ErrUnsupportedVersion.
const (
	logMagic  = "TABMLOG\x00" // command log file
	snapMagic = "TABMSNP\x00" // snapshot file

	// formatVersion 1: JSON-encoded logEntry / snapshotBody payloads.
	formatVersion uint32 = 1

	// fileHeaderLen: | magic (8) | version (4) | crc32c of the 12 before (4) |
	fileHeaderLen = 16
	// recordHeaderLen: | crc32c (4) | len (4) |, then len bytes of payload.
	recordHeaderLen = 8
	// maxRecordBytes bounds one payload. A catalog command is ~200 bytes and
	// a snapshot of 100 tables of 4096 partitions is ~60 MiB of JSON.
	maxRecordBytes = 256 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// encodeFileHeader returns the 16-byte header of a file with magic.
func encodeFileHeader(magic string) []byte {
	b := make([]byte, fileHeaderLen)
	copy(b, magic)
	binary.LittleEndian.PutUint32(b[8:], formatVersion)
	binary.LittleEndian.PutUint32(b[12:], crc32.Checksum(b[:12], castagnoli))
	return b
}

// checkFileHeader verifies the header of data and returns the rest.
func checkFileHeader(data []byte, magic string) ([]byte, error) {
	if len(data) < fileHeaderLen {
		return nil, fmt.Errorf("%w: file is %d bytes, shorter than its %d-byte header", ErrCorrupt, len(data), fileHeaderLen)
	}
	if !bytes.Equal(data[:8], []byte(magic)) {
		return nil, fmt.Errorf("%w: bad magic %q, want %q", ErrCorrupt, data[:8], magic)
	}
	if got, want := binary.LittleEndian.Uint32(data[12:]), crc32.Checksum(data[:12], castagnoli); got != want {
		return nil, fmt.Errorf("%w: header checksum %08x, want %08x", ErrCorrupt, got, want)
	}
	if v := binary.LittleEndian.Uint32(data[8:]); v != formatVersion {
		return nil, fmt.Errorf("%w: format version %d, this build reads %d", ErrUnsupportedVersion, v, formatVersion)
	}
	return data[fileHeaderLen:], nil
}

// appendRecord appends one framed record to dst. The checksum covers the
// length and the payload, so a corrupt length is caught too.
func appendRecord(dst, payload []byte) []byte {
	var h [recordHeaderLen]byte
	binary.LittleEndian.PutUint32(h[4:], uint32(len(payload)))
	crc := crc32.Update(crc32.Checksum(h[4:], castagnoli), castagnoli, payload)
	binary.LittleEndian.PutUint32(h[:4], crc)
	dst = append(dst, h[:]...)
	return append(dst, payload...)
}

// parseRecord parses the record at the start of b: its payload (aliasing b)
// and total length, or ok false if b does not start with a whole, intact record.
func parseRecord(b []byte) (payload []byte, n int, ok bool) {
	if len(b) < recordHeaderLen {
		return nil, 0, false
	}
	l := binary.LittleEndian.Uint32(b[4:8])
	if l > maxRecordBytes || uint64(len(b)-recordHeaderLen) < uint64(l) {
		return nil, 0, false
	}
	payload = b[recordHeaderLen : recordHeaderLen+int(l)]
	crc := crc32.Update(crc32.Checksum(b[4:8], castagnoli), castagnoli, payload)
	if crc != binary.LittleEndian.Uint32(b[:4]) {
		return nil, 0, false
	}
	return payload, recordHeaderLen + int(l), true
}

// decodeRecords parses the records of data (a file body after its header).
// It returns their payloads (aliasing data) and the length of the intact
// prefix. A torn final record — what a crash in the middle of an append
// leaves — is dropped and reported with torn = true; any other damage is
// ErrCorrupt. decodeRecords never panics, whatever data holds.
func decodeRecords(data []byte) (payloads [][]byte, valid int, torn bool, err error) {
	off := 0
	for off < len(data) {
		p, n, ok := parseRecord(data[off:])
		if ok {
			payloads = append(payloads, p)
			off += n
			continue
		}
		if isTornTail(data[off:]) {
			return payloads, off, true, nil
		}
		return nil, off, false, fmt.Errorf("%w: bad record at body offset %d", ErrCorrupt, off)
	}
	return payloads, off, false, nil
}

// isTornTail reports whether b, which does not start with an intact record,
// can be what one interrupted append left: b is at most one record long
// and no intact record starts anywhere after its first byte. Each append is
// fsynced before the next begins, so only the last record can be torn, and
// whatever the crash left of it (a prefix, zeros where space was allocated
// but not written, pages written out of order) is followed by nothing
// intact. A bad record followed by an intact one is damage in the middle (a
// flipped length bit, say), which must not silently drop acknowledged
// commands. A random 8-byte window passes the checksum with probability
// 2^-32, so the scan is a reliable witness.
func isTornTail(b []byte) bool {
	if len(b) > recordHeaderLen+maxRecordBytes {
		return false
	}
	for k := 1; k+recordHeaderLen <= len(b); k++ {
		if _, _, ok := parseRecord(b[k:]); ok {
			return false
		}
	}
	return true
}
