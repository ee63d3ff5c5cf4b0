package api

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"
)

func TestPatchMap(t *testing.T) {
	held := &PartitionMap{Table: &Table{Name: "t", Id: 1}, Version: 3, Partitions: []*Partition{
		{Id: 10, Index: 0, Epoch: 1}, {Id: 11, Index: 1, Epoch: 1}, {Id: 12, Index: 2, Epoch: 1}}}
	before := proto.Clone(held)
	patch := &PartitionMap{Table: &Table{Name: "t", Id: 1, CreatedUnixMs: 5}, Version: 7, Bulk: &BulkInfo{Current: 2},
		Partitions: []*Partition{{Id: 11, Index: 1, Epoch: 2}}}
	got, err := PatchMap(held, patch)
	if err != nil {
		t.Fatal(err)
	}
	want := &PartitionMap{Table: patch.Table, Version: 7, Bulk: patch.Bulk, Partitions: []*Partition{
		{Id: 10, Index: 0, Epoch: 1}, {Id: 11, Index: 1, Epoch: 2}, {Id: 12, Index: 2, Epoch: 1}}}
	if !proto.Equal(got, want) {
		t.Fatalf("patched %v, want %v", got, want)
	}
	if !proto.Equal(held, before) {
		t.Fatal("PatchMap modified the held map")
	}
	for name, p := range map[string]*PartitionMap{
		"another table":     {Table: &Table{Name: "t", Id: 2}},
		"index past end":    {Table: &Table{Name: "t", Id: 1}, Partitions: []*Partition{{Id: 13, Index: 3}}},
		"another partition": {Table: &Table{Name: "t", Id: 1}, Partitions: []*Partition{{Id: 13, Index: 1}}},
	} {
		if _, err := PatchMap(held, p); !errors.Is(err, ErrMapGap) {
			t.Errorf("%s: %v, want ErrMapGap", name, err)
		}
	}
	if _, err := PatchMap(nil, patch); !errors.Is(err, ErrMapGap) {
		t.Errorf("no held map: %v, want ErrMapGap", err)
	}
}
