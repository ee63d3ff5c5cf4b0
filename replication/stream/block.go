package stream

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/tabuladb/tabula/engines"
)

// Block and file constants: on-disk and on-wire format, never change or
// reuse (see the package comment for the drawings).
const (
	// BlockHeaderLen is the fixed part of every block.
	BlockHeaderLen = 20
	// MaxBlockBytes is the largest payload of one block (4 MiB).
	MaxBlockBytes = 4 << 20
	// MaxAppendBytes is the most payload one Append request (or one batch
	// the primary replicates) carries: 68 MiB, so one partition-log record
	// holds the largest value or BatchWrite a table takes (64 MiB) and
	// MaxMessageBytes equals the table server's gRPC limit.
	MaxAppendBytes = 68 << 20

	kindInvalid = 0 // zeroed media is never a block
	kindData    = 1
	kindSeal    = 2

	// flagContinues marks a block of a multi-block entry that is not its
	// last: after a crash an entry counts only if its last block is there.
	flagContinues = 1 << 0
	flagsKnown    = flagContinues

	fileHeaderLen = 32
	fileMagic     = "TABEXTNT"
	fileVersion1  = 1 // no replica list: a primary of it takes no appends
	fileVersion   = 2
	// fileFlagPrimary marks the replica that orders appends.
	fileFlagPrimary = 1 << 0
)

// ErrFormatVersion: an extent file of a format version this code does not
// read.
var ErrFormatVersion = errors.New("stream: unsupported extent format version")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// crc32c is the Castagnoli CRC of b.
func crc32c(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// blockCRC is a block's checksum: it covers the extent id and the block's
// offset (not stored: a block read from the wrong place or the wrong file
// fails its check), then the header from byte 4 and the payload.
func blockCRC(extent uint64, off int64, headerTail, payload []byte) uint32 {
	var pre [16]byte
	binary.LittleEndian.PutUint64(pre[0:], extent)
	binary.LittleEndian.PutUint64(pre[8:], uint64(off))
	c := crc32.Update(0, castagnoli, pre[:])
	c = crc32.Update(c, castagnoli, headerTail)
	return crc32.Update(c, castagnoli, payload)
}

// blockSize is the encoded size of a block with n payload bytes.
func blockSize(n int) int64 { return BlockHeaderLen + int64(n) }

// appendBlock appends the encoding of one block at extent offset off to dst.
func appendBlock(dst []byte, extent uint64, off int64, kind, flags byte, seq uint64, payload []byte) []byte {
	start := len(dst)
	var h [BlockHeaderLen]byte
	h[4] = kind
	h[5] = flags
	binary.LittleEndian.PutUint32(h[8:], uint32(len(payload)))
	binary.LittleEndian.PutUint64(h[12:], seq)
	dst = append(dst, h[:]...)
	dst = append(dst, payload...)
	binary.LittleEndian.PutUint32(dst[start:], blockCRC(extent, off, dst[start+4:start+BlockHeaderLen], payload))
	return dst
}

// block is a decoded block. payload aliases the decoded bytes.
type block struct {
	kind    byte
	flags   byte
	seq     uint64
	payload []byte
}

func (b block) size() int64     { return blockSize(len(b.payload)) }
func (b block) continues() bool { return b.flags&flagContinues != 0 }

// parseBlockHeader decodes and sanity-checks a block header; h holds at
// least BlockHeaderLen bytes. It returns the payload length. The CRC is not
// checked here.
func parseBlockHeader(h []byte) (kind, flags byte, n int, seq uint64, err error) {
	kind, flags = h[4], h[5]
	n = int(binary.LittleEndian.Uint32(h[8:]))
	seq = binary.LittleEndian.Uint64(h[12:])
	switch {
	case kind != kindData && kind != kindSeal:
		return 0, 0, 0, 0, fmt.Errorf("block kind %d: %w", kind, engines.ErrCorrupt)
	case flags&^flagsKnown != 0:
		return 0, 0, 0, 0, fmt.Errorf("block flags %#x: %w", flags, engines.ErrCorrupt)
	case h[6] != 0 || h[7] != 0:
		return 0, 0, 0, 0, fmt.Errorf("block reserved bytes %#x %#x: %w", h[6], h[7], engines.ErrCorrupt)
	case n > MaxBlockBytes:
		return 0, 0, 0, 0, fmt.Errorf("block of %d bytes: %w", n, engines.ErrCorrupt)
	case kind == kindSeal && (n != 8 || flags != 0 || seq != 0):
		return 0, 0, 0, 0, fmt.Errorf("seal block of %d bytes, flags %#x: %w", n, flags, engines.ErrCorrupt)
	}
	return kind, flags, n, seq, nil
}

// decodeBlock decodes the block at the start of b, which sits at offset off
// of extent, and verifies its CRC. b may hold more than the block; the
// payload aliases b.
func decodeBlock(b []byte, extent uint64, off int64) (block, error) {
	if len(b) < BlockHeaderLen {
		return block{}, fmt.Errorf("block header at %d cut at %d bytes: %w", off, len(b), engines.ErrCorrupt)
	}
	kind, flags, n, seq, err := parseBlockHeader(b)
	if err != nil {
		return block{}, fmt.Errorf("block at %d: %w", off, err)
	}
	end := BlockHeaderLen + n
	if len(b) < end {
		return block{}, fmt.Errorf("block at %d of %d bytes cut at %d: %w", off, end, len(b), engines.ErrCorrupt)
	}
	want := binary.LittleEndian.Uint32(b)
	if got := blockCRC(extent, off, b[4:BlockHeaderLen], b[BlockHeaderLen:end]); got != want {
		return block{}, fmt.Errorf("block at %d: crc %#08x, stored %#08x: %w", off, got, want, engines.ErrCorrupt)
	}
	blk := block{kind: kind, flags: flags, seq: seq, payload: b[BlockHeaderLen:end:end]}
	if kind == kindSeal && int64(binary.LittleEndian.Uint64(blk.payload)) != off {
		return block{}, fmt.Errorf("seal block at %d says %d: %w", off, binary.LittleEndian.Uint64(blk.payload), engines.ErrCorrupt)
	}
	return blk, nil
}

// sealBlock is the encoding of the seal block at offset off.
func sealBlock(extent uint64, off int64) []byte {
	var p [8]byte
	binary.LittleEndian.PutUint64(p[:], uint64(off))
	return appendBlock(nil, extent, off, kindSeal, 0, 0, p[:])
}

// Entry is one decoded entry (an atomic multi-block append) of an extent.
type Entry struct {
	// Seq is the writer's sequence number.
	Seq uint64
	// Extent is the entry's extent (set by readers of a stream).
	Extent uint64
	// Offset is the entry's first block's offset in its extent.
	Offset int64
	// Blocks are the payloads.
	Blocks [][]byte
	// Sizes are the blocks' encoded sizes (header included), so block i is
	// at Offset + Sizes[0] + ... + Sizes[i-1].
	Sizes []int64
}

// Payload is the entry's blocks joined.
func (e Entry) Payload() []byte {
	if len(e.Blocks) == 1 {
		return e.Blocks[0]
	}
	var n int
	for _, b := range e.Blocks {
		n += len(b)
	}
	out := make([]byte, 0, n)
	for _, b := range e.Blocks {
		out = append(out, b...)
	}
	return out
}

// Len is the entry's encoded length in its extent.
func (e Entry) Len() int64 {
	var n int64
	for _, s := range e.Sizes {
		n += s
	}
	return n
}

// DecodeBlocks decodes the data blocks in b, which must be whole encoded
// blocks starting at offset off of extent, verifying every CRC, and calls fn
// for each: its offset, sequence number, whether its entry continues, and
// its payload (aliasing b). A seal block ends the decoding. Any damage is an
// error wrapping engines.ErrCorrupt.
func DecodeBlocks(b []byte, extent uint64, off int64, fn func(off int64, seq uint64, continues bool, payload []byte) error) error {
	for len(b) > 0 {
		blk, err := decodeBlock(b, extent, off)
		if err != nil {
			return err
		}
		if blk.kind == kindSeal {
			if len(b) != int(blk.size()) {
				return fmt.Errorf("%d bytes after the seal block at %d: %w", len(b)-int(blk.size()), off, engines.ErrCorrupt)
			}
			return nil
		}
		if err := fn(off, blk.seq, blk.continues(), blk.payload); err != nil {
			return err
		}
		off += blk.size()
		b = b[blk.size():]
	}
	return nil
}

// AckPolicy says how many of an extent's replicas must hold an append
// durably before its primary acknowledges it. The strings are in the
// manager's log and snapshots: never change or reuse one.
type AckPolicy string

const (
	// AckAll (also ""): every replica (WAS). A failed or slow replica
	// fails the appends; the writer seals and continues elsewhere, and a
	// seal at the smallest length of the reachable replicas cuts nothing
	// acknowledged.
	AckAll AckPolicy = "all"
	// AckQuorum: a majority of the replicas, the primary included
	// (ObjectStore). A slow replica does not delay acknowledgements; a
	// seal needs a majority reachable and seals at the largest length
	// among them.
	AckQuorum AckPolicy = "quorum"
)

// Valid says whether p is a known policy ("" is AckAll).
func (p AckPolicy) Valid() bool { return p == "" || p == AckAll || p == AckQuorum }

// Required is how many copies (the primary's included) an append needs
// under p on an extent of n replicas.
func (p AckPolicy) Required(n int) int {
	if p == AckQuorum {
		return n/2 + 1
	}
	return n
}

// entryAssembler joins decoded blocks into entries (an entry is the blocks
// up to one without "continues") for readers of a range of an extent.
type entryAssembler struct {
	extent uint64
	cur    *Entry
}

// block is a DecodeBlocks callback: it adds one block (copied) and calls
// fn with each entry it completes.
func (a *entryAssembler) block(fn func(Entry) error) func(off int64, seq uint64, cont bool, p []byte) error {
	return func(off int64, seq uint64, cont bool, p []byte) error {
		if a.cur == nil {
			a.cur = &Entry{Seq: seq, Extent: a.extent, Offset: off}
		} else if a.cur.Seq != seq {
			return fmt.Errorf("extent %d: block at %d has seq %d inside entry %d: %w", a.extent, off, seq, a.cur.Seq, engines.ErrCorrupt)
		}
		a.cur.Blocks = append(a.cur.Blocks, bytes.Clone(p))
		a.cur.Sizes = append(a.cur.Sizes, blockSize(len(p)))
		if cont {
			return nil
		}
		e := *a.cur
		a.cur = nil
		return fn(e)
	}
}

// inside reports whether the blocks so far end inside an entry.
func (a *entryAssembler) inside() bool { return a.cur != nil }

// SealQuorum is how many replicas of an extent of n replicas a seal must
// freeze and hear from under p: enough to meet every set of Required(n)
// copies that could have acknowledged an append (n - Required(n) + 1),
// so the longest of them holds everything acknowledged and no later
// append can gather its copies. Under AckAll that is one replica; under
// AckQuorum a majority of an odd n, and 1 of 2 (an append needed both).
func (p AckPolicy) SealQuorum(n int) int { return n - p.Required(n) + 1 }

// ReplicaRef names one replica of an extent: its node's id and address.
type ReplicaRef struct {
	Node string
	Addr string
}

// ReplicaConfig is what a replica is created with and what its file header
// records (format version 2).
type ReplicaConfig struct {
	// Primary: this replica orders appends (Append); otherwise it takes
	// Replicate.
	Primary bool
	// Secondaries are, on a primary, the extent's other replicas: the
	// primary replicates every append to exactly these and acknowledges
	// only once Ack.Required(1+len(Secondaries)) copies hold it.
	Secondaries []ReplicaRef
	// Ack is the extent's acknowledgement policy (primary only).
	Ack AckPolicy
}

// maxHeaderTrailer bounds a version 2 header's replica list.
const maxHeaderTrailer = 16 << 10

// fileHeader is a decoded extent file header.
type fileHeader struct {
	version uint32
	extent  uint64
	cfg     ReplicaConfig
	// size is the whole header's length: where offset 0 of the extent
	// is in the file.
	size int64
}

// appendFileHeader appends an extent file's header (the current version,
// 2).
func appendFileHeader(dst []byte, extent uint64, cfg ReplicaConfig) ([]byte, error) {
	var t []byte
	ack := byte(0)
	if cfg.Ack == AckQuorum {
		ack = 1
	}
	if len(cfg.Secondaries) > 255 {
		return nil, fmt.Errorf("%d secondaries: %w", len(cfg.Secondaries), ErrTooLarge)
	}
	t = append(t, ack, byte(len(cfg.Secondaries)))
	for _, r := range cfg.Secondaries {
		if len(r.Node) > 0xffff || len(r.Addr) > 0xffff {
			return nil, fmt.Errorf("secondary %q at %q: name too long: %w", r.Node, r.Addr, ErrTooLarge)
		}
		t = binary.LittleEndian.AppendUint16(t, uint16(len(r.Node)))
		t = append(t, r.Node...)
		t = binary.LittleEndian.AppendUint16(t, uint16(len(r.Addr)))
		t = append(t, r.Addr...)
	}
	t = binary.LittleEndian.AppendUint32(t, crc32c(t))
	if len(t) > maxHeaderTrailer {
		return nil, fmt.Errorf("extent header of %d bytes: %w", len(t), ErrTooLarge)
	}
	var h [fileHeaderLen]byte
	copy(h[:], fileMagic)
	binary.LittleEndian.PutUint32(h[8:], fileVersion)
	if cfg.Primary {
		binary.LittleEndian.PutUint32(h[12:], fileFlagPrimary)
	}
	binary.LittleEndian.PutUint64(h[16:], extent)
	binary.LittleEndian.PutUint32(h[24:], uint32(len(t)))
	binary.LittleEndian.PutUint32(h[28:], crc32c(h[:28]))
	dst = append(dst, h[:]...)
	return append(dst, t...), nil
}

// parseFileHeader checks the fixed part of an extent file's header (its
// first fileHeaderLen bytes) and returns the length of the replica list
// that follows it (version 2; 0 for version 1).
func parseFileHeader(h []byte) (hd fileHeader, trailer int, err error) {
	if len(h) < fileHeaderLen {
		return hd, 0, fmt.Errorf("extent header of %d bytes: %w", len(h), engines.ErrCorrupt)
	}
	if got, want := crc32c(h[:28]), binary.LittleEndian.Uint32(h[28:]); got != want {
		return hd, 0, fmt.Errorf("extent header crc %#08x, stored %#08x: %w", got, want, engines.ErrCorrupt)
	}
	if string(h[:8]) != fileMagic {
		return hd, 0, fmt.Errorf("extent header magic %q: %w", h[:8], engines.ErrCorrupt)
	}
	hd.version = binary.LittleEndian.Uint32(h[8:])
	if hd.version != fileVersion1 && hd.version != fileVersion {
		return hd, 0, fmt.Errorf("extent format version %d (this build reads %d and %d): %w", hd.version, fileVersion1, fileVersion, ErrFormatVersion)
	}
	flags := binary.LittleEndian.Uint32(h[12:])
	if flags&^fileFlagPrimary != 0 {
		return hd, 0, fmt.Errorf("extent header flags %#x: %w", flags, engines.ErrCorrupt)
	}
	trailer = int(binary.LittleEndian.Uint32(h[24:]))
	switch {
	case hd.version == fileVersion1 && trailer != 0:
		return hd, 0, fmt.Errorf("version 1 extent header with reserved bytes %#x: %w", trailer, engines.ErrCorrupt)
	case hd.version == fileVersion && (trailer < 6 || trailer > maxHeaderTrailer):
		return hd, 0, fmt.Errorf("extent header replica list of %d bytes: %w", trailer, engines.ErrCorrupt)
	}
	hd.extent = binary.LittleEndian.Uint64(h[16:])
	hd.cfg.Primary = flags&fileFlagPrimary != 0
	hd.size = fileHeaderLen + int64(trailer)
	return hd, trailer, nil
}

// parseHeaderTrailer decodes a version 2 header's replica list into hd.
func parseHeaderTrailer(hd *fileHeader, t []byte) error {
	n := len(t) - 4
	if n < 2 {
		return fmt.Errorf("extent header replica list of %d bytes: %w", len(t), engines.ErrCorrupt)
	}
	if got, want := crc32c(t[:n]), binary.LittleEndian.Uint32(t[n:]); got != want {
		return fmt.Errorf("extent header replica list crc %#08x, stored %#08x: %w", got, want, engines.ErrCorrupt)
	}
	switch t[0] {
	case 0:
		hd.cfg.Ack = AckAll
	case 1:
		hd.cfg.Ack = AckQuorum
	default:
		return fmt.Errorf("extent header ack policy %d: %w", t[0], engines.ErrCorrupt)
	}
	count := int(t[1])
	p := t[2:n]
	str := func() (string, error) {
		if len(p) < 2 {
			return "", fmt.Errorf("extent header replica list cut: %w", engines.ErrCorrupt)
		}
		l := int(binary.LittleEndian.Uint16(p))
		if len(p) < 2+l {
			return "", fmt.Errorf("extent header replica list cut: %w", engines.ErrCorrupt)
		}
		s := string(p[2 : 2+l])
		p = p[2+l:]
		return s, nil
	}
	hd.cfg.Secondaries = nil
	for range count {
		node, err := str()
		if err != nil {
			return err
		}
		addr, err := str()
		if err != nil {
			return err
		}
		hd.cfg.Secondaries = append(hd.cfg.Secondaries, ReplicaRef{Node: node, Addr: addr})
	}
	if len(p) != 0 {
		return fmt.Errorf("extent header replica list: %d bytes after the list: %w", len(p), engines.ErrCorrupt)
	}
	if !hd.cfg.Primary && (count != 0 || t[0] != 0) {
		return fmt.Errorf("extent header: a secondary with %d secondaries: %w", count, engines.ErrCorrupt)
	}
	return nil
}
