package stream

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"

	"go.uber.org/goleak"

	"github.com/tabuladb/tabula/engines"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testSeed returns a seed for a randomised test, from TABULA_SEED if set,
// and logs it.
func testSeed(t testing.TB) uint64 {
	t.Helper()
	seed := rand.Uint64()
	if s := os.Getenv("TABULA_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("TABULA_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (rerun with TABULA_SEED=%d)", seed, seed)
	return seed
}

func TestBlockRoundTrip(t *testing.T) {
	for _, n := range []int{0, 1, 100, MaxBlockBytes} {
		p := bytes.Repeat([]byte{0xA7}, n)
		b := appendBlock(nil, 7, 1234, kindData, flagContinues, 99, p)
		if int64(len(b)) != blockSize(n) {
			t.Fatalf("size %d, want %d", len(b), blockSize(n))
		}
		blk, err := decodeBlock(b, 7, 1234)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(blk.payload, p) || blk.seq != 99 || !blk.continues() || blk.kind != kindData {
			t.Fatalf("decoded %+v", blk)
		}
		// The CRC binds the block to its extent and offset.
		if _, err := decodeBlock(b, 8, 1234); !errors.Is(err, engines.ErrCorrupt) {
			t.Fatalf("other extent: %v", err)
		}
		if _, err := decodeBlock(b, 7, 1235); !errors.Is(err, engines.ErrCorrupt) {
			t.Fatalf("other offset: %v", err)
		}
	}
}

// TestBlockEveryBitFlipAndCut checks that every single bit flip and every
// truncation of a block is reported as corruption.
func TestBlockEveryBitFlipAndCut(t *testing.T) {
	b := appendBlock(nil, 3, 40, kindData, 0, 5, []byte("hello, stream layer"))
	for i := range len(b) * 8 {
		c := bytes.Clone(b)
		c[i/8] ^= 1 << (i % 8)
		if _, err := decodeBlock(c, 3, 40); !errors.Is(err, engines.ErrCorrupt) {
			t.Fatalf("flip of bit %d: %v", i, err)
		}
	}
	for n := range len(b) {
		if _, err := decodeBlock(b[:n], 3, 40); !errors.Is(err, engines.ErrCorrupt) {
			t.Fatalf("cut at %d: %v", n, err)
		}
	}
	s := sealBlock(3, 40)
	if blk, err := decodeBlock(s, 3, 40); err != nil || blk.kind != kindSeal {
		t.Fatalf("seal block: %+v %v", blk, err)
	}
}

func TestFileHeader(t *testing.T) {
	cfg := ReplicaConfig{Primary: true, Ack: AckQuorum, Secondaries: []ReplicaRef{{"en-1", "127.0.0.1:1"}, {"en-2", "127.0.0.1:2"}}}
	h, err := appendFileHeader(nil, 42, cfg)
	if err != nil {
		t.Fatal(err)
	}
	parse := func(h []byte) (fileHeader, error) {
		hd, n, err := parseFileHeader(h)
		if err != nil {
			return hd, err
		}
		if fileHeaderLen+n != len(h) {
			return hd, fmt.Errorf("trailer of %d bytes in a header of %d: %w", n, len(h), engines.ErrCorrupt)
		}
		if n > 0 {
			err = parseHeaderTrailer(&hd, h[fileHeaderLen:])
		}
		return hd, err
	}
	hd, err := parse(h)
	if err != nil || hd.extent != 42 || hd.version != fileVersion || hd.size != int64(len(h)) || !sameConfig(hd.cfg, cfg) {
		t.Fatalf("%+v %v", hd, err)
	}
	for i := range len(h) * 8 {
		c := bytes.Clone(h)
		c[i/8] ^= 1 << (i % 8)
		if _, err := parse(c); err == nil {
			t.Fatalf("flip of bit %d accepted", i)
		}
	}
	// Version 1 (no replica list) is still read; an unknown version is
	// refused by name.
	var v1 [fileHeaderLen]byte
	copy(v1[:], fileMagic)
	binary.LittleEndian.PutUint32(v1[8:], fileVersion1)
	binary.LittleEndian.PutUint32(v1[12:], fileFlagPrimary)
	binary.LittleEndian.PutUint64(v1[16:], 7)
	binary.LittleEndian.PutUint32(v1[28:], crc32c(v1[:28]))
	if hd, err := parse(v1[:]); err != nil || hd.version != 1 || hd.extent != 7 || !hd.cfg.Primary || hd.size != fileHeaderLen {
		t.Fatalf("version 1: %+v %v", hd, err)
	}
	binary.LittleEndian.PutUint32(v1[8:], 9)
	binary.LittleEndian.PutUint32(v1[28:], crc32c(v1[:28]))
	if _, err := parse(v1[:]); !errors.Is(err, ErrFormatVersion) {
		t.Fatalf("version 9: %v", err)
	}
}

// FuzzDecodeBlocks feeds arbitrary bytes to the block decoder: it must
// never panic, must report damage as engines.ErrCorrupt, and what it
// accepts must re-encode to the same bytes.
func FuzzDecodeBlocks(f *testing.F) {
	var good []byte
	good = appendBlock(good, 1, 0, kindData, flagContinues, 1, []byte("a"))
	good = appendBlock(good, 1, int64(len(good)), kindData, 0, 1, []byte("bc"))
	f.Add(good, uint64(1), int64(0))
	f.Add(append(bytes.Clone(good), sealBlock(1, int64(len(good)))...), uint64(1), int64(0))
	f.Add(good[:len(good)-1], uint64(1), int64(0))
	f.Add([]byte{}, uint64(0), int64(0))
	f.Add(bytes.Repeat([]byte{0}, 40), uint64(0), int64(0))
	f.Fuzz(func(t *testing.T, b []byte, extent uint64, off int64) {
		var re []byte
		o := off
		err := DecodeBlocks(b, extent, off, func(at int64, seq uint64, cont bool, p []byte) error {
			if at != o {
				t.Fatalf("block at %d, want %d", at, o)
			}
			var flags byte
			if cont {
				flags = flagContinues
			}
			re = appendBlock(re, extent, at, kindData, flags, seq, p)
			o += blockSize(len(p))
			return nil
		})
		if err != nil {
			if !errors.Is(err, engines.ErrCorrupt) {
				t.Fatalf("error not ErrCorrupt: %v", err)
			}
			return
		}
		if !bytes.Equal(re, b[:len(re)]) {
			t.Fatal("accepted blocks do not re-encode to the input")
		}
		if rest := b[len(re):]; len(rest) > 0 {
			if blk, err := decodeBlock(rest, extent, o); err != nil || blk.kind != kindSeal || blk.size() != int64(len(rest)) {
				t.Fatalf("%d trailing bytes accepted that are not one seal block", len(rest))
			}
		}
	})
}

func TestSealQuorum(t *testing.T) {
	for _, tc := range []struct {
		ack               AckPolicy
		n, required, seal int
	}{
		{AckAll, 1, 1, 1}, {AckAll, 3, 3, 1},
		{AckQuorum, 1, 1, 1}, {AckQuorum, 2, 2, 1}, {AckQuorum, 3, 2, 2}, {AckQuorum, 4, 3, 2}, {AckQuorum, 5, 3, 3},
	} {
		if r, s := tc.ack.Required(tc.n), tc.ack.SealQuorum(tc.n); r != tc.required || s != tc.seal {
			t.Errorf("%s of %d: required %d seal %d, want %d and %d", tc.ack, tc.n, r, s, tc.required, tc.seal)
		}
		// Every ack set meets every seal set.
		if tc.ack.Required(tc.n)+tc.ack.SealQuorum(tc.n) <= tc.n {
			t.Errorf("%s of %d: an ack set and a seal set can miss each other", tc.ack, tc.n)
		}
	}
}
