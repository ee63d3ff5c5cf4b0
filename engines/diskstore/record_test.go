package diskstore

import (
	"bytes"
	"errors"
	"testing"

	"github.com/tabuladb/tabula/engines"
)

func TestRecordRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name       string
		kind       byte
		flags      byte
		key, value []byte
		aux        int64
	}{
		{"put", kindPut, 0, []byte("k"), []byte("value"), 0},
		{"empty value", kindPut, 0, []byte("k"), nil, 0},
		{"ttl", kindPut, 0, []byte("key"), []byte("v"), 1_700_000_000_000},
		{"batch", kindPut, flagBatchCont, []byte("key"), []byte("v"), 0},
		{"tombstone", kindTombstone, 0, []byte("gone"), nil, 7},
		{"max key", kindPut, 0, bytes.Repeat([]byte("k"), MaxKeyLen), []byte("v"), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := appendRecord([]byte("prefix"), tc.kind, tc.flags, tc.key, tc.value, tc.aux)[6:]
			if int64(len(b)) != recordLen(len(tc.key), len(tc.value)) {
				t.Fatalf("encoded %d bytes, recordLen says %d", len(b), recordLen(len(tc.key), len(tc.value)))
			}
			h, k, v, err := decodeRecord(append(b, "trailing"...))
			if err != nil {
				t.Fatal(err)
			}
			if h.kind != tc.kind || h.flags != tc.flags || h.aux != tc.aux || !bytes.Equal(k, tc.key) || !bytes.Equal(v, tc.value) {
				t.Fatalf("decoded %+v %q %q", h, k, v)
			}
			// Every single-bit flip is caught.
			for i := range len(b) * 8 {
				c := append([]byte(nil), b...)
				c[i/8] ^= 1 << (i % 8)
				if _, _, _, err := decodeRecord(c); !errors.Is(err, engines.ErrCorrupt) {
					t.Fatalf("bit %d flipped: %v, want ErrCorrupt", i, err)
				}
				if i > 4096 {
					break
				}
			}
			// Every truncation is caught.
			for n := range len(b) {
				if _, _, _, err := decodeRecord(b[:n]); !errors.Is(err, engines.ErrCorrupt) {
					t.Fatalf("cut at %d: %v, want ErrCorrupt", n, err)
				}
				if n > 64 {
					break
				}
			}
		})
	}
}

func TestLocationPacking(t *testing.T) {
	for _, tc := range []struct {
		slot uint32
		gen  uint8
		off  int64
	}{{0, 0, 32}, {1, 15, maxSegmentSize - 1}, {maxSlots - 1, 7, 12345}} {
		loc := packLoc(tc.slot, tc.gen, tc.off)
		if loc>>48 != 0 {
			t.Fatalf("%+v packs to %#x, past 48 bits", tc, loc)
		}
		s, g, o := unpackLoc(loc)
		if s != tc.slot || g != tc.gen || o != tc.off {
			t.Fatalf("%+v round-trips to %d %d %d", tc, s, g, o)
		}
	}
}

func TestSegmentHeader(t *testing.T) {
	b := encodeSegmentHeader(3, 2, 99)
	slot, gen, seq, err := decodeSegmentHeader(b)
	if err != nil || slot != 3 || gen != 2 || seq != 99 {
		t.Fatalf("decoded %d %d %d %v", slot, gen, seq, err)
	}
	v2 := append([]byte(nil), b...)
	v2[8] = 2 // another format version, with a valid crc
	copy(v2[28:], encodeSegmentHeader(3, 2, 99)[28:])
	fixCRC(v2)
	if _, _, _, err := decodeSegmentHeader(v2); !errors.Is(err, ErrFormatVersion) {
		t.Fatalf("version 2 header: %v, want ErrFormatVersion", err)
	}
	b[20] ^= 1
	if _, _, _, err := decodeSegmentHeader(b); !errors.Is(err, engines.ErrCorrupt) {
		t.Fatalf("flipped header: %v, want ErrCorrupt", err)
	}
}

func fixCRC(b []byte) {
	crc := crcOf(b[:28])
	b[28], b[29], b[30], b[31] = byte(crc), byte(crc>>8), byte(crc>>16), byte(crc>>24)
}

// FuzzDecodeRecord: the decoder never panics, and whatever it accepts
// re-encodes to the same bytes.
func FuzzDecodeRecord(f *testing.F) {
	f.Add(appendRecord(nil, kindPut, 0, []byte("k"), []byte("v"), 0))
	f.Add(appendRecord(nil, kindTombstone, 0, []byte("key"), nil, 3))
	f.Add(appendRecord(nil, kindPut, flagBatchCont, []byte("key"), []byte("value"), 1<<40))
	f.Add([]byte{})
	f.Add(make([]byte, recordHeaderLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, k, v, err := decodeRecord(b)
		if err != nil {
			if !errors.Is(err, engines.ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		re := appendRecord(nil, h.kind, h.flags, k, v, h.aux)
		if !bytes.Equal(re, b[:len(re)]) {
			t.Fatalf("accepted %x, re-encodes to %x", b[:len(re)], re)
		}
	})
}
