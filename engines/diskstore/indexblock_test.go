package diskstore

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/tabuladb/tabula/engines"
)

func sampleChanges() []indexChange {
	return []indexChange{
		{op: indexOpPut, hash: 1, pos: logPos{1, 32}, bytes: 10},
		{op: indexOpPut, hash: 1<<64 - 1, pos: logPos{7, 1 << 27}, old: logPos{1, 32}, bytes: 1 << 20, exp: 1 << 42},
		{op: indexOpDelete, hash: 42, old: logPos{7, 1 << 27}},
	}
}

func TestIndexBlockRoundTrip(t *testing.T) {
	for _, kind := range []byte{indexKindBase, indexKindDelta} {
		b := encodeIndexBlock(kind, 9, 8, logPos{7, 4096}, sampleChanges())
		blk, err := decodeIndexBlock(b)
		if err != nil {
			t.Fatal(err)
		}
		want := indexBlock{kind: kind, n: 9, prev: 8, at: logPos{7, 4096}, changes: sampleChanges()}
		if !reflect.DeepEqual(blk, want) {
			t.Fatalf("decoded %+v, want %+v", blk, want)
		}
		// Every flipped bit and every cut is caught.
		for i := range len(b) * 8 {
			c := bytes.Clone(b)
			c[i/8] ^= 1 << (i % 8)
			if _, err := decodeIndexBlock(c); !errors.Is(err, engines.ErrCorrupt) {
				t.Fatalf("bit %d flipped: %v", i, err)
			}
		}
		for n := range len(b) {
			if _, err := decodeIndexBlock(b[:n]); !errors.Is(err, engines.ErrCorrupt) {
				t.Fatalf("cut at %d: %v", n, err)
			}
		}
	}
}

// FuzzDecodeIndexBlock: the decoder never panics, and whatever it accepts
// re-encodes to the same bytes.
func FuzzDecodeIndexBlock(f *testing.F) {
	f.Add(encodeIndexBlock(indexKindBase, 1, 0, logPos{2, 0}, nil))
	f.Add(encodeIndexBlock(indexKindDelta, 3, 2, logPos{5, 999}, sampleChanges()))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		blk, err := decodeIndexBlock(b)
		if err != nil {
			if !errors.Is(err, engines.ErrCorrupt) && !errors.Is(err, ErrFormatVersion) {
				t.Fatalf("error %v wraps neither ErrCorrupt nor ErrFormatVersion", err)
			}
			return
		}
		re := encodeIndexBlock(blk.kind, blk.n, blk.prev, blk.at, blk.changes)
		if !bytes.Equal(re, b) {
			t.Fatalf("accepted %x, re-encodes to %x", b, re)
		}
	})
}
