package raftnode

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// File formats (drawn in doc.go). Never change or reuse these constants: a
// new layout gets a new formatVersion, and old versions stay readable or
// are refused with ErrUnsupportedVersion.
const (
	walMagic  = "TABRWAL\x00" // log file
	snapMagic = "TABRSNP\x00" // snapshot file

	// formatVersion 1: the record types below, raftpb payloads.
	formatVersion uint32 = 1

	// fileHeaderLen: | magic (8) | version (4) | crc32c of the 12 before (4) |
	fileHeaderLen = 16
	// recordHeaderLen: | crc32c (4) | len (4) | type (1) |, then len bytes.
	recordHeaderLen = 9
	// maxRecordBytes bounds one payload, a snapshot included.
	maxRecordBytes = 1 << 30
)

// recordType says what a record's payload is. Never change or reuse a value.
type recordType byte

const (
	// recEntries: raft entries, each | uvarint len | raftpb.Entry |.
	recEntries recordType = 1
	// recHardState: one raftpb.HardState.
	recHardState recordType = 2
	// recSnapMark: | index (8) | term (8) | kind (1) |: the log's base is
	// the snapshot at index. kind markCompact keeps the entries after the
	// index that came before the mark; markReset drops them all.
	recSnapMark recordType = 3
	// recSnapshot: one raftpb.Snapshot, the only record of a snapshot file.
	recSnapshot recordType = 4
)

// Kinds of recSnapMark.
const (
	markCompact byte = 0
	markReset   byte = 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// appendFileHeader appends the 16-byte header of a file with magic.
func appendFileHeader(dst []byte, magic string) []byte {
	var b [fileHeaderLen]byte
	copy(b[:], magic)
	binary.LittleEndian.PutUint32(b[8:], formatVersion)
	binary.LittleEndian.PutUint32(b[12:], crc32.Checksum(b[:12], castagnoli))
	return append(dst, b[:]...)
}

// checkFileHeader verifies the header of data and returns the body.
func checkFileHeader(data []byte, magic string) ([]byte, error) {
	if len(data) < fileHeaderLen {
		return nil, fmt.Errorf("%w: file is %d bytes, shorter than its header", ErrCorrupt, len(data))
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
// length, the type and the payload.
func appendRecord(dst []byte, typ recordType, payload []byte) []byte {
	var h [recordHeaderLen]byte
	binary.LittleEndian.PutUint32(h[4:], uint32(len(payload)))
	h[8] = byte(typ)
	crc := crc32.Update(crc32.Checksum(h[4:], castagnoli), castagnoli, payload)
	binary.LittleEndian.PutUint32(h[:4], crc)
	dst = append(dst, h[:]...)
	return append(dst, payload...)
}

// record is one decoded record; payload aliases the decoded buffer.
type record struct {
	typ     recordType
	payload []byte
}

// parseRecord parses the record at the start of b, or reports ok false if
// b does not start with a whole, intact one.
func parseRecord(b []byte) (r record, n int, ok bool) {
	if len(b) < recordHeaderLen {
		return record{}, 0, false
	}
	l := binary.LittleEndian.Uint32(b[4:8])
	if l > maxRecordBytes || uint64(len(b)-recordHeaderLen) < uint64(l) {
		return record{}, 0, false
	}
	end := recordHeaderLen + int(l)
	if crc32.Checksum(b[4:end], castagnoli) != binary.LittleEndian.Uint32(b[:4]) {
		return record{}, 0, false
	}
	return record{typ: recordType(b[8]), payload: b[recordHeaderLen:end]}, end, true
}

// decodeRecords parses the records of body (a file after its header). A
// torn final record — what a crash in the middle of an append leaves — is
// dropped and reported with torn true; any other damage is ErrCorrupt.
// It never panics, whatever body holds.
func decodeRecords(body []byte) (recs []record, torn bool, err error) {
	off := 0
	for off < len(body) {
		r, n, ok := parseRecord(body[off:])
		if ok {
			recs = append(recs, r)
			off += n
			continue
		}
		if tornTail(body[off:]) {
			return recs, true, nil
		}
		return nil, false, fmt.Errorf("%w: bad record at body offset %d followed by intact data", ErrCorrupt, off)
	}
	return recs, false, nil
}

// tornTail reports whether b, which does not start with an intact record,
// can be what one interrupted append left: nothing intact starts anywhere
// after its first byte. Every append is fsynced before the next one's
// messages go out, so only the tail can be torn; a bad record followed by
// an intact one is damage in the middle (a flipped length bit), which must
// not silently drop acknowledged entries. A random 9-byte window passes the
// checksum with probability 2^-32, so the scan is a reliable witness.
//
// The scan checksums the declared extent of every plausible header, which
// adversarial bytes can make quadratic; past a budget of a few times b's
// length (never reached by a real torn append, whose payload rarely holds
// plausible lengths) the tail counts as damage.
func tornTail(b []byte) bool {
	budget := 4*len(b) + 1<<20
	for k := 1; k+recordHeaderLen <= len(b); k++ {
		l := binary.LittleEndian.Uint32(b[k+4:])
		if uint64(l) > uint64(len(b)-k-recordHeaderLen) {
			continue
		}
		if budget -= int(l) + recordHeaderLen; budget < 0 {
			return false
		}
		if _, _, ok := parseRecord(b[k:]); ok {
			return false
		}
	}
	return true
}

// snapMark is the payload of a recSnapMark record.
type snapMark struct {
	index, term uint64
	kind        byte
}

func (m snapMark) encode() []byte {
	b := make([]byte, 17)
	binary.LittleEndian.PutUint64(b, m.index)
	binary.LittleEndian.PutUint64(b[8:], m.term)
	b[16] = m.kind
	return b
}

func decodeSnapMark(p []byte) (snapMark, error) {
	if len(p) != 17 || p[16] > markReset {
		return snapMark{}, fmt.Errorf("%w: bad snapshot mark (%d bytes)", ErrCorrupt, len(p))
	}
	return snapMark{binary.LittleEndian.Uint64(p), binary.LittleEndian.Uint64(p[8:]), p[16]}, nil
}
