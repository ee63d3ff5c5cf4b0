package diskstore

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"

	"github.com/tabuladb/tabula/engines"
)

// Record kinds and flags: on-disk constants, never change or reuse.
const (
	kindInvalid   = 0 // zeroed media is never a record
	kindPut       = 1
	kindTombstone = 2

	// flagS2 marks a value compressed with s2 (klauspost/compress).
	flagS2 = 1 << 0
	// flagBatchCont marks a record of a batch that is not its last: after a
	// crash a batch counts only if its last record is there.
	flagBatchCont = 1 << 1
	// flagsKnown is every flag this version understands; others are corrupt.
	flagsKnown = flagS2 | flagBatchCont
)

// recordHeaderLen is the fixed part of a record (see the package comment).
const recordHeaderLen = 20

// MaxKeyLen is the largest key a record holds (the 2-byte key length).
const MaxKeyLen = 1<<16 - 1

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// recordLen is the encoded length of a record with a key of k bytes and a
// stored value of v bytes.
func recordLen(k, v int) int64 { return recordHeaderLen + int64(k) + int64(v) }

// appendRecord appends the encoding of one record to dst. aux is ExpiresAt
// for a put and the shadowed segment's sequence number for a tombstone.
func appendRecord(dst []byte, kind, flags byte, key, value []byte, aux int64) []byte {
	start := len(dst)
	var h [recordHeaderLen]byte
	h[4] = kind
	h[5] = flags
	binary.LittleEndian.PutUint16(h[6:], uint16(len(key)))
	binary.LittleEndian.PutUint32(h[8:], uint32(len(value)))
	binary.LittleEndian.PutUint64(h[12:], uint64(aux))
	dst = append(dst, h[:]...)
	dst = append(dst, key...)
	dst = append(dst, value...)
	crc := crc32.Checksum(dst[start+4:], castagnoli)
	binary.LittleEndian.PutUint32(dst[start:], crc)
	return dst
}

// header is a record's decoded fixed part.
type header struct {
	crc    uint32
	kind   byte
	flags  byte
	keyLen int
	valLen int
	aux    int64
}

func (h header) total() int64 { return recordLen(h.keyLen, h.valLen) }

// parseHeader decodes and sanity-checks a record's fixed part; b holds at
// least recordHeaderLen bytes. The CRC is not checked here.
func parseHeader(b []byte) (header, error) {
	h := header{
		crc:    binary.LittleEndian.Uint32(b[0:]),
		kind:   b[4],
		flags:  b[5],
		keyLen: int(binary.LittleEndian.Uint16(b[6:])),
		valLen: int(binary.LittleEndian.Uint32(b[8:])),
		aux:    int64(binary.LittleEndian.Uint64(b[12:])),
	}
	switch {
	case h.kind != kindPut && h.kind != kindTombstone:
		return h, fmt.Errorf("record kind %d: %w", h.kind, engines.ErrCorrupt)
	case h.flags&^flagsKnown != 0:
		return h, fmt.Errorf("record flags %#x: %w", h.flags, engines.ErrCorrupt)
	case h.keyLen == 0:
		return h, fmt.Errorf("record with an empty key: %w", engines.ErrCorrupt)
	case h.kind == kindTombstone && (h.valLen != 0 || h.flags&flagS2 != 0):
		return h, fmt.Errorf("tombstone with a value: %w", engines.ErrCorrupt)
	}
	return h, nil
}

// decodeRecord decodes the record at the start of b, which must hold all of
// it, and verifies its CRC. The returned slices alias b.
func decodeRecord(b []byte) (h header, key, value []byte, err error) {
	if len(b) < recordHeaderLen {
		return h, nil, nil, fmt.Errorf("record header cut at %d bytes: %w", len(b), engines.ErrCorrupt)
	}
	if h, err = parseHeader(b); err != nil {
		return h, nil, nil, err
	}
	n := h.total()
	if int64(len(b)) < n {
		return h, nil, nil, fmt.Errorf("record of %d bytes cut at %d: %w", n, len(b), engines.ErrCorrupt)
	}
	if got := crc32.Checksum(b[4:n], castagnoli); got != h.crc {
		return h, nil, nil, fmt.Errorf("record crc %#08x, stored %#08x: %w", got, h.crc, engines.ErrCorrupt)
	}
	key = b[recordHeaderLen : recordHeaderLen+h.keyLen : recordHeaderLen+h.keyLen]
	value = b[recordHeaderLen+h.keyLen : n : n]
	return h, key, value, nil
}

func crcOf(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }
