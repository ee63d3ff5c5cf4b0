package abi

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ABI v1 names. Never change or reuse them: deployed modules depend on them.
// ABI.md beside this file is the normative description.
const (
	// ABIExport is the export whose presence declares ABI v1.
	ABIExport = "tabula_abi_v1"
	// ReserveExport is tabula_reserve(size i32) -> ptr i32: the guest returns
	// a buffer of at least size bytes into which the host writes the input.
	ReserveExport = "tabula_reserve"
	// MergeSuffix names a method's merge export: "<method>__merge".
	MergeSuffix = "__merge"
	// HostModule is the import module of the host functions.
	HostModule = "tabula"
	// WASIModule is the import module of WASI preview 1.
	WASIModule = "wasi_snapshot_preview1"
)

// Status codes that host functions return to the guest (as a negative i32).
// Never change or reuse them.
const (
	CodeNotFound    = -1 // get: the key is absent
	CodeReadOnly    = -2 // a write on a replica that is not the primary, or in a merge
	CodeReservedKey = -3 // the key is in the reserved namespace (see ReservedPrefix)
	CodeTooLarge    = -4 // a key, value, or the call's staged writes exceed a limit
	CodeBadHandle   = -5 // scan_next/scan_close on an unknown handle
	CodeNoPartition = -6 // a data function called from a merge (no partition)
	CodeInvalid     = -7 // a malformed encoded argument
)

// CodeText describes a host status code.
func CodeText(c int32) string {
	switch c {
	case CodeNotFound:
		return "not found"
	case CodeReadOnly:
		return "read-only (not the primary, or in a merge)"
	case CodeReservedKey:
		return "reserved key"
	case CodeTooLarge:
		return "too large"
	case CodeBadHandle:
		return "bad scan handle"
	case CodeNoPartition:
		return "no partition"
	case CodeInvalid:
		return "invalid argument"
	}
	return fmt.Sprintf("code %d", c)
}

// CAS flags (cas's flags argument).
const (
	CASExpectExists = 1 << 0 // the key must exist with exactly the expected value
	CASDelete       = 1 << 1 // on success delete the key instead of putting the new value
)

// Log levels (log's level argument), as slog levels.
const (
	LogDebug = -4
	LogInfo  = 0
	LogWarn  = 4
	LogError = 8
)

// PartitionInfoSize is the encoded size of partition_info's result:
//
//	| id u64 | epoch u64 | hash start u64 | hash end u64 | index u32 | count u32 | flags u32 | reserved u32 |
//
// flags bit 0: this replica is the primary (writes allowed).
const PartitionInfoSize = 48

// ErrMalformed: an encoded list or record does not decode.
var ErrMalformed = errors.New("coproc/abi: malformed encoding")

// List encoding, used by get_multi (keys in, values out), scan_next
// (alternating key, value), keys, range and merge inputs; little-endian:
//
//	| count u32 | count × ( len i32 | len bytes ) |
//
// len -1 is an absent item (a missing value, an unbounded range end); it has
// no bytes. Every other negative len is malformed.

// AppendList appends the list encoding of items to dst; a nil item (not an
// empty one) is encoded as absent.
func AppendList(dst []byte, items [][]byte) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(items)))
	for _, it := range items {
		dst = AppendListItem(dst, it)
	}
	return dst
}

// AppendListItem appends one item (without the count).
func AppendListItem(dst []byte, it []byte) []byte {
	if it == nil {
		return binary.LittleEndian.AppendUint32(dst, 0xFFFFFFFF)
	}
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(it)))
	return append(dst, it...)
}

// ListItemSize is the encoded size of one item.
func ListItemSize(it []byte) int { return 4 + len(it) }

// DecodeList decodes a list. Items alias b; absent items are nil. max bounds
// the item count (0: no bound beyond what fits in b).
func DecodeList(b []byte, max int) ([][]byte, error) {
	if len(b) < 4 {
		return nil, fmt.Errorf("%w: list of %d bytes has no count", ErrMalformed, len(b))
	}
	n := binary.LittleEndian.Uint32(b)
	b = b[4:]
	// Every item takes at least 4 bytes, so a count above len/4 is a lie;
	// checking it first keeps a hostile count from sizing an allocation.
	if uint64(n) > uint64(len(b)/4) || (max > 0 && uint64(n) > uint64(max)) {
		return nil, fmt.Errorf("%w: list count %d too large for %d bytes", ErrMalformed, n, len(b))
	}
	items := make([][]byte, n)
	for i := range items {
		if len(b) < 4 {
			return nil, fmt.Errorf("%w: list item %d truncated", ErrMalformed, i)
		}
		l := int32(binary.LittleEndian.Uint32(b))
		b = b[4:]
		switch {
		case l == -1:
			continue
		case l < 0 || int64(l) > int64(len(b)):
			return nil, fmt.Errorf("%w: list item %d length %d (have %d bytes)", ErrMalformed, i, l, len(b))
		}
		items[i] = b[:l:l]
		b = b[l:]
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes after list", ErrMalformed, len(b))
	}
	return items, nil
}

// EncodePartitionInfo encodes p as partition_info returns it.
func EncodePartitionInfo(p PartitionInfo) [PartitionInfoSize]byte {
	var b [PartitionInfoSize]byte
	le := binary.LittleEndian
	le.PutUint64(b[0:], p.ID)
	le.PutUint64(b[8:], p.Epoch)
	le.PutUint64(b[16:], p.HashStart)
	le.PutUint64(b[24:], p.HashEnd)
	le.PutUint32(b[32:], uint32(p.Index))
	le.PutUint32(b[36:], uint32(p.Count))
	var flags uint32
	if p.Primary {
		flags |= 1
	}
	le.PutUint32(b[40:], flags)
	return b
}

// DecodePartitionInfo is the inverse of EncodePartitionInfo.
func DecodePartitionInfo(b []byte) (PartitionInfo, error) {
	if len(b) != PartitionInfoSize {
		return PartitionInfo{}, fmt.Errorf("%w: partition info of %d bytes, want %d", ErrMalformed, len(b), PartitionInfoSize)
	}
	le := binary.LittleEndian
	return PartitionInfo{
		ID:        le.Uint64(b[0:]),
		Epoch:     le.Uint64(b[8:]),
		HashStart: le.Uint64(b[16:]),
		HashEnd:   le.Uint64(b[24:]),
		Index:     int(le.Uint32(b[32:])),
		Count:     int(le.Uint32(b[36:])),
		Primary:   le.Uint32(b[40:])&1 != 0,
	}, nil
}

// PartitionInfo describes the partition a call runs on.
type PartitionInfo struct {
	// ID is the cluster-wide partition id; Epoch its current epoch.
	ID    uint64
	Epoch uint64
	// Index and Count: this is partition Index of Count of the table.
	Index, Count int
	// HashStart and HashEnd are the inclusive xxhash64 range of the keys the
	// partition owns (internal/keyspace.Range(Index, Count)).
	HashStart, HashEnd uint64
	// Primary: this replica is the primary, so put/delete/cas are allowed.
	Primary bool
}

// Indexed encoding, used by get_keys: a count and a fixed-size entry per
// item, so that a guest reaches item i without walking the items before it
// (a walk costs a Go guest a loop iteration per item); little-endian:
//
//	| count u32 | count × ( offset u32 | len i32 ) | data |
//
// Item i is data[offset : offset+len]; len -1 is an absent item. Offsets
// are relative to the start of data.

// IndexedSize is the encoded size of items.
func IndexedSize(items [][]byte) int {
	n := 4 + 8*len(items)
	for _, it := range items {
		n += len(it)
	}
	return n
}

// PutIndexed encodes items into dst, which must hold IndexedSize(items)
// bytes, and returns that size.
func PutIndexed(dst []byte, items [][]byte) int {
	le := binary.LittleEndian
	le.PutUint32(dst, uint32(len(items)))
	ent := dst[4 : 4+8*len(items)]
	data := dst[4+8*len(items):]
	off := 0
	for i, it := range items {
		le.PutUint32(ent[8*i:], uint32(off))
		if it == nil {
			le.PutUint32(ent[8*i+4:], 0xFFFFFFFF)
			continue
		}
		le.PutUint32(ent[8*i+4:], uint32(len(it)))
		off += copy(data[off:], it)
	}
	return 4 + 8*len(items) + off
}

// Indexed is a decoded indexed encoding. Items alias the encoding.
type Indexed struct {
	b []byte
	n int
}

// ParseIndexed checks the header of an indexed encoding; items are checked
// when At reads them.
func ParseIndexed(b []byte) (Indexed, error) {
	if len(b) < 4 {
		return Indexed{}, fmt.Errorf("%w: indexed encoding of %d bytes has no count", ErrMalformed, len(b))
	}
	n := binary.LittleEndian.Uint32(b)
	if uint64(n) > uint64(len(b)-4)/8 {
		return Indexed{}, fmt.Errorf("%w: indexed count %d too large for %d bytes", ErrMalformed, n, len(b))
	}
	return Indexed{b: b, n: int(n)}, nil
}

// Len is the number of items.
func (x Indexed) Len() int { return x.n }

// At returns item i; ok is false when it is absent or malformed.
func (x Indexed) At(i int) (item []byte, ok bool) {
	if i < 0 || i >= x.n {
		return nil, false
	}
	le := binary.LittleEndian
	off := uint64(le.Uint32(x.b[4+8*i:]))
	l := int32(le.Uint32(x.b[8+8*i:]))
	data := x.b[4+8*x.n:]
	if l < 0 || off+uint64(l) > uint64(len(data)) {
		return nil, false
	}
	return data[off : off+uint64(l) : off+uint64(l)], true
}
