package partition

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrCorrupt: a log record or write body does not decode. It wraps
// nothing; the stream layer's block CRC32C has already been checked when a
// record reaches the decoder, so this is a bug or a format mismatch.
var ErrCorrupt = errors.New("partition: corrupt log record")

// Log record format: one stream entry per record, integers little-endian.
// The stream block around it carries the CRC32C. Never change a field's
// meaning; a new layout takes a new version byte.
//
//	| version (1, =1) | lsn (8) | epoch (8) | request id len (2) | request id | body |
//
// Write body (what a record applies):
//
//	| mutation count (4) | mutations | result len (4) | result |
//	mutation: | kind (1: 1 put, 2 delete) | expires unix ms (8, signed) |
//	          | key len (4) | key | value len (4) | value |
//
// The result is the outcome the primary decided (a CAS's answer, a
// coprocessor call's output), encoded by the owner: every replica stores
// it under the request id, so a retry of the request gets it back.
const (
	recordVersion   = 1
	recordHeaderLen = 1 + 8 + 8 + 2
	// MaxRequestIDLen bounds a request id.
	MaxRequestIDLen = 256
)

// EncodeRecord appends the encoding of rec to dst.
func EncodeRecord(dst []byte, rec Record) []byte {
	dst = append(dst, recordVersion)
	dst = binary.LittleEndian.AppendUint64(dst, rec.LSN)
	dst = binary.LittleEndian.AppendUint64(dst, rec.Epoch)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(rec.RequestID)))
	dst = append(dst, rec.RequestID...)
	return append(dst, rec.Body...)
}

// DecodeRecord decodes one record. Body aliases b.
func DecodeRecord(b []byte) (Record, error) {
	if len(b) < recordHeaderLen {
		return Record{}, fmt.Errorf("%w: %d bytes, shorter than a header", ErrCorrupt, len(b))
	}
	if b[0] != recordVersion {
		return Record{}, fmt.Errorf("%w: version %d, this build reads %d", ErrCorrupt, b[0], recordVersion)
	}
	rec := Record{LSN: binary.LittleEndian.Uint64(b[1:]), Epoch: binary.LittleEndian.Uint64(b[9:])}
	n := int(binary.LittleEndian.Uint16(b[17:]))
	if n > MaxRequestIDLen || len(b) < recordHeaderLen+n {
		return Record{}, fmt.Errorf("%w: request id of %d bytes", ErrCorrupt, n)
	}
	if rec.LSN == 0 {
		return Record{}, fmt.Errorf("%w: LSN 0", ErrCorrupt)
	}
	rec.RequestID = string(b[recordHeaderLen : recordHeaderLen+n])
	rec.Body = b[recordHeaderLen+n:]
	return rec, nil
}

// MutationKind says what a mutation does.
type MutationKind uint8

// Mutation kinds; written to the log: never change or reuse.
const (
	MutPut    MutationKind = 1
	MutDelete MutationKind = 2
)

// Mutation is one key's change in a write.
type Mutation struct {
	Kind      MutationKind
	Key       []byte
	Value     []byte
	ExpiresAt int64 // unix ms, absolute (decided by the primary); 0 none
}

// Write is what one record applies: mutations, atomically, and the result
// its request answered.
type Write struct {
	Mutations []Mutation
	Result    []byte
}

// EncodeWrite appends the encoding of w to dst.
func EncodeWrite(dst []byte, w Write) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(w.Mutations)))
	for _, m := range w.Mutations {
		dst = append(dst, byte(m.Kind))
		dst = binary.LittleEndian.AppendUint64(dst, uint64(m.ExpiresAt))
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(m.Key)))
		dst = append(dst, m.Key...)
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(m.Value)))
		dst = append(dst, m.Value...)
	}
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(w.Result)))
	return append(dst, w.Result...)
}

// DecodeWrite decodes a write body. Keys, values and the result alias b.
func DecodeWrite(b []byte) (Write, error) {
	var w Write
	take := func(n int, what string) ([]byte, error) {
		if n < 0 || n > len(b) {
			return nil, fmt.Errorf("%w: %s needs %d bytes, %d left", ErrCorrupt, what, n, len(b))
		}
		out := b[:n:n]
		b = b[n:]
		return out, nil
	}
	u32 := func(what string) (int, error) {
		x, err := take(4, what)
		if err != nil {
			return 0, err
		}
		return int(binary.LittleEndian.Uint32(x)), nil
	}
	n, err := u32("mutation count")
	if err != nil {
		return Write{}, err
	}
	// Each mutation takes at least 17 bytes: a count beyond that is
	// refused before anything is allocated for it.
	if n > len(b)/17 {
		return Write{}, fmt.Errorf("%w: %d mutations in %d bytes", ErrCorrupt, n, len(b))
	}
	if n > 0 {
		w.Mutations = make([]Mutation, n)
	}
	for i := range w.Mutations {
		h, err := take(9, "mutation header")
		if err != nil {
			return Write{}, err
		}
		m := &w.Mutations[i]
		m.Kind = MutationKind(h[0])
		if m.Kind != MutPut && m.Kind != MutDelete {
			return Write{}, fmt.Errorf("%w: mutation %d of kind %d", ErrCorrupt, i, h[0])
		}
		m.ExpiresAt = int64(binary.LittleEndian.Uint64(h[1:]))
		kl, err := u32("key length")
		if err != nil {
			return Write{}, err
		}
		if m.Key, err = take(kl, "key"); err != nil {
			return Write{}, err
		}
		vl, err := u32("value length")
		if err != nil {
			return Write{}, err
		}
		if m.Value, err = take(vl, "value"); err != nil {
			return Write{}, err
		}
	}
	rl, err := u32("result length")
	if err != nil {
		return Write{}, err
	}
	if w.Result, err = take(rl, "result"); err != nil {
		return Write{}, err
	}
	if len(b) != 0 {
		return Write{}, fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, len(b))
	}
	return w, nil
}
