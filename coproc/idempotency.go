package coproc

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"strings"

	"github.com/tabuladb/tabula/coproc/abi"
)

// IdempotencyKey is the key under which a call with token stores its
// result: abi.IdempotencyPrefix + token, in the partition the call ran on.
// It lives Options.IdempotencyTTL (the record's ExpiresAt), so a retry is
// recognised for that long. The table server must keep reserved keys
// (abi.ReservedPrefix) out of client scans and, when a partition splits,
// copy them to both halves (a retry is routed by its target key, not by
// the record's key).
func IdempotencyKey(token string) []byte {
	return []byte(abi.IdempotencyPrefix + token)
}

func isReserved(key []byte) bool {
	return len(key) >= len(abi.ReservedPrefix) && string(key[:len(abi.ReservedPrefix)]) == abi.ReservedPrefix
}

// An idempotency record is the first result of a call with a token.
// Format, little-endian:
//
//	version 1: | version u8 = 1 | crc32c u32 of what follows |
//	           | module len u16 | module | method len u16 | method | output len u32 | output |
//	version 2: | version u8 = 2 | crc32c u32 of what follows |
//	           | module len u16 | module | method len u16 | method |
//	           | input digest (32) | output len u32 | output |
//
// The input digest (inputDigest) binds the token to the call's input,
// keys and range: a retry with other input is ErrTokenReused, not the
// other input's result. New records are version 2; version 1 records
// (written before, with no digest) are still read, checked by module and
// method only. Never change or reuse either version.
type idemRecord struct {
	module, method string
	// digest is inputDigest of the call; hasDigest is false for a
	// version 1 record.
	digest    [sha256.Size]byte
	hasDigest bool
	output    []byte
}

const (
	idemVersion1 = 1
	idemVersion  = 2
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// inputDigest is the sha256 of what a call was asked to do besides the
// module and method: its input, target keys and range, each with its
// length, so no two different calls share a digest by concatenation.
func inputDigest(input []byte, keys [][]byte, rng KeyRange) [sha256.Size]byte {
	h := sha256.New()
	var n [9]byte
	put := func(tag byte, b []byte, isNil bool) {
		n[0] = tag
		if isNil {
			n[0] |= 0x80
		}
		binary.LittleEndian.PutUint64(n[1:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	put('i', input, false)
	binary.LittleEndian.PutUint64(n[1:], uint64(len(keys)))
	n[0] = 'n'
	h.Write(n[:])
	for _, k := range keys {
		put('k', k, false)
	}
	put('s', rng.Start, rng.Start == nil)
	put('e', rng.End, rng.End == nil)
	var d [sha256.Size]byte
	h.Sum(d[:0])
	return d
}

func encodeIdemRecord(r idemRecord) []byte {
	b := make([]byte, 5, 5+2+len(r.module)+2+len(r.method)+sha256.Size+4+len(r.output))
	b[0] = idemVersion
	b = binary.LittleEndian.AppendUint16(b, uint16(len(r.module)))
	b = append(b, r.module...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(r.method)))
	b = append(b, r.method...)
	b = append(b, r.digest[:]...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(r.output)))
	b = append(b, r.output...)
	binary.LittleEndian.PutUint32(b[1:], crc32.Checksum(b[5:], castagnoli))
	return b
}

// ErrCorruptRecord is wrapped by errors decoding a stored idempotency record.
var ErrCorruptRecord = fmt.Errorf("coproc: corrupt idempotency record")

func decodeIdemRecord(b []byte) (idemRecord, error) {
	var r idemRecord
	if len(b) < 5 {
		return r, fmt.Errorf("%w: %d bytes", ErrCorruptRecord, len(b))
	}
	if b[0] != idemVersion && b[0] != idemVersion1 {
		return r, fmt.Errorf("%w: unknown version %d", ErrCorruptRecord, b[0])
	}
	if crc32.Checksum(b[5:], castagnoli) != binary.LittleEndian.Uint32(b[1:]) {
		return r, fmt.Errorf("%w: checksum mismatch", ErrCorruptRecord)
	}
	p := b[5:]
	str := func(n int) (string, bool) {
		if len(p) < n {
			return "", false
		}
		s := string(p[:n])
		p = p[n:]
		return s, true
	}
	var ok bool
	if len(p) < 2 {
		return r, fmt.Errorf("%w: truncated", ErrCorruptRecord)
	}
	n := int(binary.LittleEndian.Uint16(p))
	p = p[2:]
	if r.module, ok = str(n); !ok || len(p) < 2 {
		return r, fmt.Errorf("%w: truncated module", ErrCorruptRecord)
	}
	n = int(binary.LittleEndian.Uint16(p))
	p = p[2:]
	if r.method, ok = str(n); !ok || len(p) < 4 {
		return r, fmt.Errorf("%w: truncated method", ErrCorruptRecord)
	}
	if b[0] == idemVersion {
		if len(p) < sha256.Size+4 {
			return r, fmt.Errorf("%w: truncated input digest", ErrCorruptRecord)
		}
		copy(r.digest[:], p)
		r.hasDigest = true
		p = p[sha256.Size:]
	}
	n64 := uint64(binary.LittleEndian.Uint32(p))
	p = p[4:]
	if uint64(len(p)) != n64 {
		return r, fmt.Errorf("%w: output of %d bytes, %d left", ErrCorruptRecord, n64, len(p))
	}
	r.output = append([]byte(nil), p...)
	if strings.ContainsRune(r.module, 0) {
		return r, fmt.Errorf("%w: bad module name", ErrCorruptRecord)
	}
	return r, nil
}
