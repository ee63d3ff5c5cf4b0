package tableserver

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/replication/partition"
)

// TestMergeRecord: the merge record round-trips, is found only in its own
// partition's log, and malformed values are refused.
func TestMergeRecord(t *testing.T) {
	mg := &api.PartitionMerge{LeftId: 7, RightId: 8, ChildId: 9}
	for _, pid := range []uint64{7, 8} {
		v, err := encodeMergeRecord(pid, mg)
		if err != nil {
			t.Fatal(err)
		}
		got, gmg, err := decodeMergeRecord(v)
		if err != nil || got != pid || !proto.Equal(gmg, mg) {
			t.Fatalf("decode: %d %v %v", got, gmg, err)
		}
		w := partition.Write{Mutations: []partition.Mutation{{Kind: partition.MutPut, Key: mergeKey, Value: v}}}
		if mergeOf(pid, w) == nil {
			t.Fatalf("the merge record of partition %d not found", pid)
		}
		if mergeOf(15-pid, w) != nil || mergeOf(9, w) != nil {
			t.Fatal("another partition took the merge record for its own")
		}
		if mergeOf(pid, partition.Write{Mutations: []partition.Mutation{{Kind: partition.MutPut, Key: []byte("user"), Value: v}}}) != nil {
			t.Fatal("a user key read as a merge record")
		}
	}
	other, _ := encodeMergeRecord(3, mg) // names a partition not in the merge
	same, _ := encodeMergeRecord(7, &api.PartitionMerge{LeftId: 7, RightId: 7, ChildId: 9})
	v, _ := encodeMergeRecord(7, mg)
	for _, bad := range [][]byte{nil, {1}, {2, 0, 0, 0, 0, 0, 0, 0, 0}, v[:9], other, same} {
		if _, _, err := decodeMergeRecord(bad); err == nil {
			t.Errorf("decodeMergeRecord(%x) accepted", bad)
		}
	}
}

// FuzzMergeRecord: the decoder never panics, and what it accepts encodes
// back to a record that decodes the same.
func FuzzMergeRecord(f *testing.F) {
	v, _ := encodeMergeRecord(8, &api.PartitionMerge{LeftId: 7, RightId: 8, ChildId: 9})
	f.Add(v)
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		pid, mg, err := decodeMergeRecord(b)
		if err != nil {
			return
		}
		again, err := encodeMergeRecord(pid, mg)
		if err != nil {
			t.Fatal(err)
		}
		p2, mg2, err := decodeMergeRecord(again)
		if err != nil || p2 != pid || !proto.Equal(mg, mg2) {
			t.Fatalf("re-encoded record differs: %v", err)
		}
	})
}
