package stream

import (
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
	// the primary replicates) carries: 32 MiB.
	MaxAppendBytes = 32 << 20

	kindInvalid = 0 // zeroed media is never a block
	kindData    = 1
	kindSeal    = 2

	// flagContinues marks a block of a multi-block entry that is not its
	// last: after a crash an entry counts only if its last block is there.
	flagContinues = 1 << 0
	flagsKnown    = flagContinues

	fileHeaderLen = 32
	fileMagic     = "TABEXTNT"
	fileVersion   = 1
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

// appendFileHeader appends an extent file's header.
func appendFileHeader(dst []byte, extent uint64, primary bool) []byte {
	var h [fileHeaderLen]byte
	copy(h[:], fileMagic)
	binary.LittleEndian.PutUint32(h[8:], fileVersion)
	if primary {
		binary.LittleEndian.PutUint32(h[12:], fileFlagPrimary)
	}
	binary.LittleEndian.PutUint64(h[16:], extent)
	binary.LittleEndian.PutUint32(h[28:], crc32c(h[:28]))
	return append(dst, h[:]...)
}

// parseFileHeader checks an extent file's header.
func parseFileHeader(h []byte) (extent uint64, primary bool, err error) {
	if len(h) < fileHeaderLen {
		return 0, false, fmt.Errorf("extent header of %d bytes: %w", len(h), engines.ErrCorrupt)
	}
	if got, want := crc32c(h[:28]), binary.LittleEndian.Uint32(h[28:]); got != want {
		return 0, false, fmt.Errorf("extent header crc %#08x, stored %#08x: %w", got, want, engines.ErrCorrupt)
	}
	if string(h[:8]) != fileMagic {
		return 0, false, fmt.Errorf("extent header magic %q: %w", h[:8], engines.ErrCorrupt)
	}
	if v := binary.LittleEndian.Uint32(h[8:]); v != fileVersion {
		return 0, false, fmt.Errorf("extent format version %d (this build reads %d): %w", v, fileVersion, ErrFormatVersion)
	}
	flags := binary.LittleEndian.Uint32(h[12:])
	if flags&^fileFlagPrimary != 0 || binary.LittleEndian.Uint32(h[24:]) != 0 {
		return 0, false, fmt.Errorf("extent header flags %#x: %w", flags, engines.ErrCorrupt)
	}
	return binary.LittleEndian.Uint64(h[16:]), flags&fileFlagPrimary != 0, nil
}
