package partition

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

func TestRecordRoundTrip(t *testing.T) {
	w := Write{
		Mutations: []Mutation{
			{Kind: MutPut, Key: []byte("k1"), Value: []byte("v1"), ExpiresAt: 1700000000000},
			{Kind: MutDelete, Key: []byte("k2")},
		},
		Result: []byte{1, 2, 3},
	}
	rec := Record{LSN: 42, Epoch: 7, RequestID: "req-1", Body: EncodeWrite(nil, w)}
	got, err := DecodeRecord(EncodeRecord(nil, rec))
	if err != nil {
		t.Fatal(err)
	}
	if got.LSN != 42 || got.Epoch != 7 || got.RequestID != "req-1" || !bytes.Equal(got.Body, rec.Body) {
		t.Fatalf("record round trip: %+v", got)
	}
	gw, err := DecodeWrite(got.Body)
	if err != nil {
		t.Fatal(err)
	}
	w.Mutations[1].Value = []byte{}
	if !reflect.DeepEqual(gw, w) {
		t.Fatalf("write round trip:\n got %+v\nwant %+v", gw, w)
	}
}

func TestRecordCorrupt(t *testing.T) {
	good := EncodeRecord(nil, Record{LSN: 1, Epoch: 1, RequestID: "r", Body: EncodeWrite(nil, Write{Mutations: []Mutation{{Kind: MutPut, Key: []byte("k")}}})})
	for name, b := range map[string][]byte{
		"empty":       nil,
		"short":       good[:5],
		"version":     append([]byte{9}, good[1:]...),
		"lsn zero":    append(append([]byte{1}, make([]byte, 8)...), good[9:]...),
		"reqid overs": append(good[:17:17], 0xff, 0xff),
	} {
		if _, err := DecodeRecord(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
	body := EncodeWrite(nil, Write{Mutations: []Mutation{{Kind: MutPut, Key: []byte("k"), Value: []byte("v")}}, Result: []byte("r")})
	for i := range body {
		if _, err := DecodeWrite(body[:i]); !errors.Is(err, ErrCorrupt) {
			t.Errorf("truncated at %d: %v, want ErrCorrupt", i, err)
		}
	}
	if _, err := DecodeWrite(append(body, 0)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("trailing byte: %v", err)
	}
	bad := bytes.Clone(body)
	bad[4] = 3
	if _, err := DecodeWrite(bad); !errors.Is(err, ErrCorrupt) {
		t.Errorf("bad kind: %v", err)
	}
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add(EncodeRecord(nil, Record{LSN: 1, Epoch: 2, RequestID: "id", Body: EncodeWrite(nil, Write{Mutations: []Mutation{{Kind: MutPut, Key: []byte("k"), Value: []byte("v")}}, Result: []byte("x")})}))
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := DecodeRecord(b)
		if err != nil {
			return
		}
		again := EncodeRecord(nil, rec)
		if !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs")
		}
		w, err := DecodeWrite(rec.Body)
		if err != nil {
			return
		}
		if !bytes.Equal(EncodeWrite(nil, w), rec.Body) {
			t.Fatalf("write re-encoding differs")
		}
	})
}
