package diskstore

import (
	"fmt"

	"github.com/tabuladb/tabula/engines"
)

// The exported record codec: the one record format of the disk store (see
// the package comment), shared with other engines' immutable files — bulk
// table files store their records with it — so a record is encoded,
// checksummed and verified the same way everywhere.

// RecordHeaderLen is the fixed part of an encoded record, in bytes.
const RecordHeaderLen = recordHeaderLen

// RecordLen is the encoded length of a put record with a key of k bytes and
// a stored value of v bytes.
func RecordLen(k, v int) int64 { return recordLen(k, v) }

// AppendPutRecord appends a put record of key and value to dst and returns
// the extended slice. expiresAt is Unix nanoseconds, 0 for no expiry. key
// must be 1..MaxKeyLen bytes and value shorter than 4 GiB.
func AppendPutRecord(dst, key, value []byte, expiresAt int64) ([]byte, error) {
	if len(key) == 0 || len(key) > MaxKeyLen {
		return dst, fmt.Errorf("diskstore: key of %d bytes, want 1..%d", len(key), MaxKeyLen)
	}
	if int64(len(value)) > 1<<32-1 {
		return dst, fmt.Errorf("diskstore: value of %d bytes, want < 4 GiB", len(value))
	}
	return appendRecord(dst, kindPut, 0, key, value, expiresAt), nil
}

// PutRecord is a decoded put record. Key and Value alias the decoded buffer.
type PutRecord struct {
	Key, Value []byte
	ExpiresAt  int64
	// Len is the record's encoded length.
	Len int64
}

// DecodePutRecord decodes and verifies the put record at the start of b,
// which must hold all of it. Anything else — a cut record, a CRC mismatch, a
// tombstone, a compressed or batched record — is an error wrapping
// engines.ErrCorrupt.
func DecodePutRecord(b []byte) (PutRecord, error) {
	h, key, value, err := decodeRecord(b)
	if err != nil {
		return PutRecord{}, err
	}
	if h.kind != kindPut || h.flags != 0 {
		return PutRecord{}, fmt.Errorf("diskstore: record kind %d flags %#x, want a plain put: %w", h.kind, h.flags, engines.ErrCorrupt)
	}
	return PutRecord{Key: key, Value: value, ExpiresAt: h.aux, Len: h.total()}, nil
}
