package bulk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/cespare/xxhash/v2"

	"github.com/tabuladb/tabula/engines"
)

// File format constants (see the package comment): never change or reuse.
const (
	headerMagic   = "TABBULKH"
	footerMagic   = "TABBULKF"
	formatVersion = 2 // 1: MPH encoding version 1 (no longer read)
	headerLen     = 16
	footerLen     = 192

	// flagDelta marks a delta file: baseVersion is meaningful and deleted
	// may be non-empty.
	flagDelta  = 1 << 0
	flagsKnown = flagDelta

	secRecords = 0
	secMPH     = 1
	secFPs     = 2
	secOffsets = 3
	secDeleted = 4
	numSecs    = 5
)

// FormatVersion is the partition file format version this build writes and
// reads.
const FormatVersion = formatVersion

// ErrFormatVersion is returned (wrapped) by Open for a file of a format
// version this build does not read.
var ErrFormatVersion = errors.New("bulk: unsupported file format version")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func crcOf(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// crcCombine returns the CRC32C of a‖b from crcA = CRC32C(a), crcB =
// CRC32C(b) and len(b) (zlib's crc32_combine: crcA times x^(8·lenB) mod
// the polynomial, plus crcB).
func crcCombine(crcA, crcB uint32, lenB uint64) uint32 {
	// p = x^(8·lenB): the product of x^(2^k) for the set bits k of 8·lenB.
	p := uint32(1) << 31 // 1, bit-reflected
	for k := 3; lenB != 0; k++ {
		if lenB&1 != 0 {
			p = gfMul(crcX2k[k], p)
		}
		lenB >>= 1
	}
	return gfMul(p, crcA) ^ crcB
}

// gfMul is a·b modulo the Castagnoli polynomial, bit-reflected.
func gfMul(a, b uint32) uint32 {
	const poly = 0x82f63b78 // Castagnoli, reflected
	var p uint32
	for m := uint32(1) << 31; m != 0; m >>= 1 {
		if a&m != 0 {
			p ^= b
		}
		if b&1 != 0 {
			b = b>>1 ^ poly
		} else {
			b >>= 1
		}
	}
	return p
}

// crcX2k[k] is x^(2^k) modulo the polynomial, for every k of a length
// below 2^61 bytes.
var crcX2k = func() (t [64]uint32) {
	p := uint32(1) << 30 // x
	for k := range t {
		t[k] = p
		p = gfMul(p, p)
	}
	return t
}()

type section struct {
	off, len uint64
	crc      uint32
}

// footer is the decoded footer.
type footer struct {
	secs        [numSecs]section
	fpBits      int
	flags       byte
	n           uint64
	deleted     uint64
	fixedLen    uint64
	partition   uint32
	partitions  uint32
	version     uint64
	baseVersion uint64
	hashSeed    uint64
	maxRecLen   uint32
}

func appendHeader(dst []byte) []byte {
	var h [headerLen]byte
	copy(h[:], headerMagic)
	binary.LittleEndian.PutUint32(h[8:], formatVersion)
	binary.LittleEndian.PutUint32(h[12:], crcOf(h[:12]))
	return append(dst, h[:]...)
}

func checkHeader(h []byte) error {
	if len(h) < headerLen || string(h[:8]) != headerMagic {
		return fmt.Errorf("bulk: not a bulk table file (bad header magic): %w", engines.ErrCorrupt)
	}
	// The crc is checked first: a flipped bit in the version field is
	// corruption, and only a checksummed other version is reported as one.
	if got, want := crcOf(h[:12]), binary.LittleEndian.Uint32(h[12:]); got != want {
		return fmt.Errorf("bulk: header crc %#08x, stored %#08x: %w", got, want, engines.ErrCorrupt)
	}
	if v := binary.LittleEndian.Uint32(h[8:]); v != formatVersion {
		return fmt.Errorf("bulk: file format version %d, this build reads %d: %w", v, formatVersion, ErrFormatVersion)
	}
	return nil
}

func (f *footer) append(dst []byte) []byte {
	var b [footerLen]byte
	for i, s := range f.secs {
		binary.LittleEndian.PutUint64(b[16*i:], s.off)
		binary.LittleEndian.PutUint64(b[16*i+8:], s.len)
		binary.LittleEndian.PutUint32(b[80+4*i:], s.crc)
	}
	b[100] = byte(f.fpBits)
	b[101] = f.flags
	binary.LittleEndian.PutUint64(b[104:], f.n)
	binary.LittleEndian.PutUint64(b[112:], f.deleted)
	binary.LittleEndian.PutUint64(b[120:], f.fixedLen)
	binary.LittleEndian.PutUint32(b[128:], f.partition)
	binary.LittleEndian.PutUint32(b[132:], f.partitions)
	binary.LittleEndian.PutUint64(b[136:], f.version)
	binary.LittleEndian.PutUint64(b[144:], f.baseVersion)
	binary.LittleEndian.PutUint64(b[152:], f.hashSeed)
	binary.LittleEndian.PutUint32(b[160:], f.maxRecLen)
	binary.LittleEndian.PutUint32(b[176:], formatVersion)
	binary.LittleEndian.PutUint32(b[180:], crcOf(b[:180]))
	copy(b[184:], footerMagic)
	return append(dst, b[:]...)
}

// decodeFooter decodes and validates the footer b of a file of size bytes.
func decodeFooter(b []byte, size int64) (footer, error) {
	var f footer
	if len(b) != footerLen || string(b[184:]) != footerMagic {
		return f, fmt.Errorf("bulk: not a bulk table file or truncated (bad footer magic): %w", engines.ErrCorrupt)
	}
	// The crc is checked first (see checkHeader). Later format versions
	// keep the version at 176 and the crc of b[:180] at 180.
	if got, want := crcOf(b[:180]), binary.LittleEndian.Uint32(b[180:]); got != want {
		return f, fmt.Errorf("bulk: footer crc %#08x, stored %#08x: %w", got, want, engines.ErrCorrupt)
	}
	if v := binary.LittleEndian.Uint32(b[176:]); v != formatVersion {
		return f, fmt.Errorf("bulk: file format version %d, this build reads %d: %w", v, formatVersion, ErrFormatVersion)
	}
	for i := range f.secs {
		f.secs[i] = section{
			off: binary.LittleEndian.Uint64(b[16*i:]),
			len: binary.LittleEndian.Uint64(b[16*i+8:]),
			crc: binary.LittleEndian.Uint32(b[80+4*i:]),
		}
	}
	f.fpBits = int(b[100])
	f.flags = b[101]
	f.n = binary.LittleEndian.Uint64(b[104:])
	f.deleted = binary.LittleEndian.Uint64(b[112:])
	f.fixedLen = binary.LittleEndian.Uint64(b[120:])
	f.partition = binary.LittleEndian.Uint32(b[128:])
	f.partitions = binary.LittleEndian.Uint32(b[132:])
	f.version = binary.LittleEndian.Uint64(b[136:])
	f.baseVersion = binary.LittleEndian.Uint64(b[144:])
	f.hashSeed = binary.LittleEndian.Uint64(b[152:])
	f.maxRecLen = binary.LittleEndian.Uint32(b[160:])

	bad := func(format string, args ...any) (footer, error) {
		return f, fmt.Errorf("bulk: footer: "+format+": %w", append(args, engines.ErrCorrupt)...)
	}
	next := uint64(headerLen)
	for i, s := range f.secs {
		if s.off != next || s.len > uint64(size) {
			return bad("section %d at %d+%d, want it at %d", i, s.off, s.len, next)
		}
		next += s.len
	}
	if next+footerLen != uint64(size) {
		return bad("sections end at %d, footer at %d", next, size-footerLen)
	}
	switch {
	case f.fpBits != 0 && f.fpBits != 8 && f.fpBits != 16:
		return bad("fingerprint bits %d", f.fpBits)
	case f.flags&^flagsKnown != 0:
		return bad("flags %#x", f.flags)
	case f.n >= 1<<32:
		return bad("%d records", f.n)
	case f.secs[secFPs].len != f.n*uint64(f.fpBits/8):
		return bad("fingerprints of %d bytes for %d records", f.secs[secFPs].len, f.n)
	case f.deleted > f.n || f.flags&flagDelta == 0 && f.deleted != 0:
		return bad("%d deleted of %d records", f.deleted, f.n)
	case f.flags&flagDelta != 0 && f.secs[secDeleted].len != 8*((f.n+63)/64):
		return bad("deleted bitmap of %d bytes for %d records", f.secs[secDeleted].len, f.n)
	case f.flags&flagDelta == 0 && f.secs[secDeleted].len != 0:
		return bad("deleted bitmap in a full file")
	case f.partitions == 0 || f.partition >= f.partitions:
		return bad("partition %d of %d", f.partition, f.partitions)
	case f.fixedLen > 0 && (f.secs[secOffsets].len != 0 || f.fixedLen*f.n != f.secs[secRecords].len):
		return bad("fixed record length %d with %d records in %d bytes", f.fixedLen, f.n, f.secs[secRecords].len)
	case f.fixedLen == 0 && f.n > 0 && f.secs[secOffsets].len == 0:
		return bad("no offsets for variable-length records")
	case f.n == 0 && f.secs[secRecords].len != 0:
		return bad("records without a count")
	case uint64(f.maxRecLen) > f.secs[secRecords].len:
		return bad("longest record %d in %d bytes", f.maxRecLen, f.secs[secRecords].len)
	}
	return f, nil
}

// keyHash is the hash the file's MPH and fingerprints use.
func keyHash(seed uint64, key []byte) uint64 {
	if seed == 0 {
		return xxhash.Sum64(key)
	}
	var d xxhash.Digest
	d.ResetWithSeed(seed)
	d.Write(key)
	return d.Sum64()
}

// Limits, equal to the api package's (a test checks): engines/bulk does not
// import api, so that it builds without gRPC (the bench module does not
// carry it). Keys are 1..maxKeyBytes bytes.
const (
	maxKeyBytes          = 4 << 10  // api.MaxKeyBytes
	defaultMaxValueBytes = 4 << 20  // api.DefaultMaxValueBytes
	maxValueBytesLimit   = 64 << 20 // api.MaxValueBytesLimit
	defaultPartitions    = 8        // api.DefaultPartitions
	maxPartitions        = 4096     // api.MaxPartitions
)
