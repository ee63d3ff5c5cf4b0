package tableserver

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/replication/partition"
)

// TestSplitRecord: the split record round-trips, is found only in its own
// partition's log, and malformed values are refused.
func TestSplitRecord(t *testing.T) {
	sp := &api.PartitionSplit{LeftId: 7, RightId: 8, Hash: 1 << 62}
	v, err := encodeSplitRecord(3, sp)
	if err != nil {
		t.Fatal(err)
	}
	parent, got, err := decodeSplitRecord(v)
	if err != nil || parent != 3 || !proto.Equal(got, sp) {
		t.Fatalf("decode: %d %v %v", parent, got, err)
	}
	w := partition.Write{Mutations: []partition.Mutation{{Kind: partition.MutPut, Key: splitKey, Value: v}}}
	if splitOf(3, w) == nil {
		t.Fatal("the split record of partition 3 not found")
	}
	if splitOf(4, w) != nil {
		t.Fatal("a child took its parent's split record for its own")
	}
	if splitOf(3, partition.Write{Mutations: []partition.Mutation{{Kind: partition.MutPut, Key: []byte("user"), Value: v}}}) != nil {
		t.Fatal("a user key read as a split record")
	}
	for _, bad := range [][]byte{nil, {1}, {2, 0, 0, 0, 0, 0, 0, 0, 0}, v[:9]} {
		if _, _, err := decodeSplitRecord(bad); err == nil {
			t.Errorf("decodeSplitRecord(%x) accepted", bad)
		}
	}
}

// FuzzSplitRecord: the decoder never panics, and what it accepts encodes
// back to a record that decodes the same.
func FuzzSplitRecord(f *testing.F) {
	v, _ := encodeSplitRecord(3, &api.PartitionSplit{LeftId: 7, RightId: 8, Key: []byte("m")})
	f.Add(v)
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		parent, sp, err := decodeSplitRecord(b)
		if err != nil {
			return
		}
		again, err := encodeSplitRecord(parent, sp)
		if err != nil {
			t.Fatal(err)
		}
		p2, sp2, err := decodeSplitRecord(again)
		if err != nil || p2 != parent || !proto.Equal(sp, sp2) {
			t.Fatalf("re-encoded record differs: %v", err)
		}
	})
}
