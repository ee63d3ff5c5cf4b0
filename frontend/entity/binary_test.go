package entity

import (
	"bytes"
	"cmp"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tabuladb/tabula/frontend/edm"
)

func TestBinaryRoundTrip(t *testing.T) {
	r := seeded(t)
	for i := 0; i < 3000; i++ {
		e := randEntity(r)
		b := AppendBinary([]byte("prefix"), e)
		got, err := DecodeBinary(e.PartitionKey, e.RowKey, b[len("prefix"):])
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if d := sameEntity(e, got, true); d != "" {
			t.Fatal(d)
		}
	}
	// The zero Timestamp and the edges of what a DateTime can hold.
	e := &edm.Entity{Props: []edm.Property{
		{Name: "Min", Value: edm.Time(minTime)}, {Name: "Max", Value: edm.Time(maxTime)}}}
	got, err := DecodeBinary("", "", AppendBinary(nil, e))
	if err != nil || sameEntity(e, got, true) != "" {
		t.Fatalf("edges: %v %s", err, sameEntity(e, got, true))
	}
}

func TestBinaryGolden(t *testing.T) {
	// The version 1 layout, byte by byte: changing it breaks stored data.
	e := &edm.Entity{Timestamp: time.Unix(1, 500), Props: []edm.Property{
		{Name: "A", Value: edm.I32(-2)}, {Name: "S", Value: edm.Str("hi")}}}
	got := AppendBinary(nil, e)
	want := []byte{1, // version
		0x85, 0x96, 0x98, 0, 0, 0, 0, 0, // 10,000,005 ticks
		2,                                               // count
		1, 'A', byte(edm.Int32), 0xfe, 0xff, 0xff, 0xff, // A = -2
		1, 'S', byte(edm.String), 2, 'h', 'i', // S = "hi"
	}
	if !bytes.Equal(got[:len(got)-4], want) {
		t.Fatalf("layout\n got %x\nwant %x", got[:len(got)-4], want)
	}
}

func TestBinaryCorrupt(t *testing.T) {
	r := seeded(t)
	e := randEntity(r)
	e.Props = append(e.Props, edm.Property{Name: "X", Value: edm.Str("some text")})
	good := AppendBinary(nil, e)
	// Every single bit flip and every truncation is caught.
	for i := 0; i < len(good)*8; i++ {
		b := bytes.Clone(good)
		b[i/8] ^= 1 << (i % 8)
		if _, err := DecodeBinary("p", "r", b); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("flip bit %d: %v", i, err)
		}
	}
	for n := 0; n < len(good); n++ {
		if _, err := DecodeBinary("p", "r", good[:n]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("truncated to %d: %v", n, err)
		}
	}
	// A later version is refused, saying so, even with a valid checksum.
	b := bytes.Clone(good[:len(good)-4])
	b[0] = 2
	b = appendCRC(b)
	if _, err := DecodeBinary("p", "r", b); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "version 2") {
		t.Fatalf("version 2: %v", err)
	}
	// Well-checksummed nonsense: a huge count, a bad type, a bad bool.
	for _, body := range [][]byte{
		{1, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f},
		{1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 'A', 9, 0},
		{1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 'A', byte(edm.Boolean), 2},
		{1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 'A', byte(edm.Boolean), 1, 0},
		{1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 'A', byte(edm.String), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		{1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 'A', byte(edm.DateTime), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f},
	} {
		if _, err := DecodeBinary("p", "r", appendCRC(body)); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%x: %v", body, err)
		}
	}
}

func appendCRC(b []byte) []byte {
	sum := crc32Checksum(b)
	return append(b, byte(sum), byte(sum>>8), byte(sum>>16), byte(sum>>24))
}

func TestKeyOrder(t *testing.T) {
	r := seeded(t)
	str := func() string {
		// Bytes that stress the escaping: 0x00, 0x01, 0x02, 0xff, and text.
		const bytesOf = "\x00\x01\x02\xffaé"
		n := r.IntN(5)
		b := make([]byte, 0, n)
		for i := 0; i < n; i++ {
			b = append(b, bytesOf[r.IntN(len(bytesOf))])
		}
		return string(b)
	}
	type pair struct{ pk, rk string }
	for i := 0; i < 20000; i++ {
		a, b := pair{str(), str()}, pair{str(), str()}
		want := cmp.Or(strings.Compare(a.pk, b.pk), strings.Compare(a.rk, b.rk))
		ka, kb := Key(a.pk, a.rk), Key(b.pk, b.rk)
		if got := bytes.Compare(ka, kb); got != want {
			t.Fatalf("order of %q vs %q: keys compare %d, want %d (%x, %x)", a, b, got, want, ka, kb)
		}
		pk, rk, err := SplitKey(ka)
		if err != nil || pk != a.pk || rk != a.rk {
			t.Fatalf("SplitKey(%x) = %q, %q, %v; want %q", ka, pk, rk, err, a)
		}
		// Partition bounds hold exactly the keys of their partition.
		in := bytes.Compare(kb, PartitionPrefix(a.pk)) >= 0 && bytes.Compare(kb, PartitionEnd(a.pk)) < 0
		if in != (a.pk == b.pk) {
			t.Fatalf("partition bounds of %q: key of %q in=%t", a.pk, b.pk, in)
		}
	}
	for _, k := range []string{"", "abc", "a\x00", "a\x00\x05b", "a\x00\xff"} {
		if _, _, err := SplitKey([]byte(k)); !errors.Is(err, ErrCorrupt) {
			t.Errorf("SplitKey(%q): %v", k, err)
		}
	}
	if string(Key("a\x00b", "r\x00")) != "a\x00\xffb\x00\x01r\x00" {
		t.Errorf("layout %q", Key("a\x00b", "r\x00"))
	}
}
