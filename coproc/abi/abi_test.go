package abi

import (
	"bytes"
	"testing"
)

func TestListRoundTrip(t *testing.T) {
	items := [][]byte{[]byte("a"), nil, {}, bytes.Repeat([]byte("x"), 300)}
	got, err := DecodeList(AppendList(nil, items), 0)
	if err != nil || len(got) != 4 || string(got[0]) != "a" || got[1] != nil || got[2] == nil || len(got[3]) != 300 {
		t.Fatalf("%q %v", got, err)
	}
	for _, bad := range [][]byte{nil, {1, 0, 0}, {1, 0, 0, 0}, {1, 0, 0, 0, 5, 0, 0, 0, 'a'}, {1, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff}, {0, 0, 0, 0, 9}, {0xff, 0xff, 0xff, 0xff}} {
		if _, err := DecodeList(bad, 0); err == nil {
			t.Errorf("%x decoded", bad)
		}
	}
	if _, err := DecodeList(AppendList(nil, items), 3); err == nil {
		t.Error("max ignored")
	}
}

func TestPartitionInfoRoundTrip(t *testing.T) {
	p := PartitionInfo{ID: 1, Epoch: 2, Index: 3, Count: 4, HashStart: 5, HashEnd: 6, Primary: true}
	b := EncodePartitionInfo(p)
	if got, err := DecodePartitionInfo(b[:]); err != nil || got != p {
		t.Fatalf("%+v %v", got, err)
	}
}

// FuzzDecodeList: the host decodes guest-written lists (get_multi, scan
// ranges); no input may panic, and what decodes re-encodes to itself.
func FuzzDecodeList(f *testing.F) {
	f.Add(AppendList(nil, [][]byte{[]byte("k1"), nil, {}}))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{1, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f})
	f.Fuzz(func(t *testing.T, b []byte) {
		items, err := DecodeList(b, 0)
		if err != nil {
			return
		}
		if re := AppendList(nil, items); !bytes.Equal(re, b) {
			t.Fatalf("re-encoded %x, want %x", re, b)
		}
	})
}

func TestIndexedRoundTrip(t *testing.T) {
	items := [][]byte{[]byte("a"), nil, {}, bytes.Repeat([]byte("x"), 300)}
	b := make([]byte, IndexedSize(items))
	if n := PutIndexed(b, items); n != len(b) {
		t.Fatalf("PutIndexed wrote %d of %d bytes", n, len(b))
	}
	x, err := ParseIndexed(b)
	if err != nil || x.Len() != 4 {
		t.Fatalf("ParseIndexed: %d items, %v", x.Len(), err)
	}
	for i, want := range items {
		got, ok := x.At(i)
		if ok != (want != nil) || !bytes.Equal(got, want) || (want != nil && got == nil) {
			t.Fatalf("item %d: got %q (%v), want %q", i, got, ok, want)
		}
	}
	if _, ok := x.At(4); ok {
		t.Fatal("At past the end answered")
	}
	for _, bad := range [][]byte{nil, {1, 0, 0}, {2, 0, 0, 0, 0, 0, 0, 0}} {
		if _, err := ParseIndexed(bad); err == nil {
			t.Fatalf("ParseIndexed(%x) accepted", bad)
		}
	}
}

func FuzzIndexed(f *testing.F) {
	items := [][]byte{[]byte("key"), nil, {}}
	b := make([]byte, IndexedSize(items))
	PutIndexed(b, items)
	f.Add(b)
	f.Add([]byte{1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 5, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		x, err := ParseIndexed(b)
		if err != nil {
			return
		}
		var got [][]byte
		for i := range x.Len() {
			v, ok := x.At(i)
			if ok && len(v) > len(b) {
				t.Fatalf("item %d of %d bytes from %d bytes", i, len(v), len(b))
			}
			if !ok {
				v = nil
			}
			got = append(got, v)
		}
		// What decodes encodes back to something that decodes the same.
		re := make([]byte, IndexedSize(got))
		PutIndexed(re, got)
		y, err := ParseIndexed(re)
		if err != nil || y.Len() != len(got) {
			t.Fatalf("re-encoding does not parse: %v", err)
		}
		for i := range got {
			if v, _ := y.At(i); !bytes.Equal(v, got[i]) {
				t.Fatalf("item %d changed on re-encoding", i)
			}
		}
	})
}
