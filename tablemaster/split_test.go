package tablemaster

import (
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/tabuladb/tabula/api"
)

func splitState(t *testing.T) *State {
	t.Helper()
	s := NewState()
	mustApply(t, s,
		Command{Payload: CreateTenant{Tenant: "default"}},
		register("a", "a:1", "fa"), register("b", "b:1", "fb"), register("c", "c:1", "fc"),
		Command{UnixMs: 1, Payload: CreateTable{Tenant: "default", Table: "t", Kind: point, Options: &TableOptions{Partitions: 2, Replication: 3, Storage: StorageMemory}}},
		Command{UnixMs: 1, Payload: CreateTable{Tenant: "default", Table: "o", Kind: api.TableKind_TABLE_KIND_ORDERED, Options: &TableOptions{Replication: 3, Storage: StorageMemory, SplitPoints: [][]byte{[]byte("m")}}}},
		Command{UnixMs: 1, Payload: CreateTable{Tenant: "default", Table: "b", Kind: api.TableKind_TABLE_KIND_BULK, Options: &TableOptions{Partitions: 2}}},
	)
	return s
}

// TestSplitRefusals: bulk tables, split points outside the range, a
// partition already splitting or moving are refused with their reasons,
// and change nothing.
func TestSplitRefusals(t *testing.T) {
	s := splitState(t)
	pt, _ := s.Table("default", "t")
	ot, _ := s.Table("default", "o")
	bt, _ := s.Table("default", "b")
	p0 := pt.Partitions[0]
	cases := []struct {
		name   string
		cmd    SplitPartition
		reason string
	}{
		{"bulk", SplitPartition{PartitionID: bt.Partitions[0].ID}, "bulk_table"},
		{"hash at the start", SplitPartition{PartitionID: pt.Partitions[1].ID, Hash: pt.Partitions[1].Start}, "split_point_out_of_range"},
		{"hash past the end", SplitPartition{PartitionID: p0.ID, Hash: p0.End + 1}, "split_point_out_of_range"},
		{"ordered without key", SplitPartition{PartitionID: ot.Partitions[0].ID}, "split_key_missing"},
		{"ordered key at the start", SplitPartition{PartitionID: ot.Partitions[1].ID, Key: []byte("m")}, "split_point_out_of_range"},
		{"ordered key past the end", SplitPartition{PartitionID: ot.Partitions[0].ID, Key: []byte("z")}, "split_point_out_of_range"},
		{"no partition", SplitPartition{PartitionID: 999}, "partition_not_found"},
	}
	for _, c := range cases {
		v := s.Version
		_, err := s.Apply(Command{Payload: c.cmd})
		if d := api.DetailOf(err); d.GetReason() != c.reason {
			t.Errorf("%s: err %v, want reason %s", c.name, err, c.reason)
		}
		if s.Version != v {
			t.Errorf("%s: a refused split changed the state", c.name)
		}
	}
	mustApply(t, s, Command{UnixMs: 5, Payload: SplitPartition{PartitionID: p0.ID}})
	if _, err := s.Apply(Command{Payload: SplitPartition{PartitionID: p0.ID}}); api.DetailOf(err).GetReason() != "split_in_progress" {
		t.Errorf("second split: %v, want split_in_progress", err)
	}
	p1 := pt.Partitions[1]
	mustApply(t, s, register("d", "d:1", "fd"), Command{UnixMs: 5, Payload: MoveReplica{PartitionID: p1.ID, ServerID: primaryID(&p1), To: "d"}})
	if _, err := s.Apply(Command{Payload: SplitPartition{PartitionID: p1.ID}}); !errors.Is(err, ErrInvalidArgument) || api.DetailOf(err).GetReason() != "move_in_progress" {
		t.Errorf("split of a moving partition: %v, want move_in_progress", err)
	}
	// The other way round: a splitting partition's replicas do not move
	// (the children would keep the source and the target, four replicas
	// each, and no move to finish). The elastic simulation found it.
	v := s.Version
	if _, err := s.Apply(Command{Payload: MoveReplica{PartitionID: p0.ID, ServerID: primaryID(&p0), To: "d"}}); !errors.Is(err, ErrInvalidArgument) || api.DetailOf(err).GetReason() != "split_in_progress" {
		t.Errorf("move off a splitting partition: %v, want split_in_progress", err)
	}
	if s.Version != v {
		t.Errorf("a refused move changed the state")
	}
}

// TestSplitPointTable: the midpoint by default, ids from NextPartitionID,
// the children replace the parent in place (indexes shift), with its
// replicas and roles, epoch+1, a fresh log each and the parent's record;
// splitting a child again works.
func TestSplitPointTable(t *testing.T) {
	s := splitState(t)
	pt, _ := s.Table("default", "t")
	parent := pt.Partitions[0]
	next := s.NextPartitionID
	mustApply(t, s, Command{UnixMs: 5, Payload: SplitPartition{PartitionID: parent.ID}})
	_, p := s.partition(parent.ID)
	if p.Split == nil || p.Split.Left != next || p.Split.Right != next+1 || p.Split.Hash != parent.End/2+1 {
		t.Fatalf("pending split %+v, want children %d,%d at %#x", p.Split, next, next+1, parent.End/2+1)
	}
	if s.NextPartitionID != next+2 {
		t.Fatalf("NextPartitionID %d, want %d", s.NextPartitionID, next+2)
	}
	if ap := p.Proto(); ap.GetSplit().GetLeftId() != next || ap.GetSplit().GetHash() != p.Split.Hash {
		t.Fatalf("the map does not carry the split: %v", ap.GetSplit())
	}
	mustApply(t, s, Command{UnixMs: 6, Payload: SplitDone{PartitionID: parent.ID, LSN: 42}})
	pt, _ = s.Table("default", "t")
	if len(pt.Partitions) != 3 || pt.Options.Partitions != 3 {
		t.Fatalf("%d partitions (option %d), want 3", len(pt.Partitions), pt.Options.Partitions)
	}
	l, r, old1 := pt.Partitions[0], pt.Partitions[1], pt.Partitions[2]
	if l.ID != next || r.ID != next+1 || old1.Index != 2 || l.Index != 0 || r.Index != 1 {
		t.Fatalf("ids/indexes %d/%d %d/%d %d/%d", l.ID, l.Index, r.ID, r.Index, old1.ID, old1.Index)
	}
	if l.Start != parent.Start || l.End+1 != r.Start || r.End != parent.End || r.Start != parent.End/2+1 {
		t.Fatalf("ranges [%#x,%#x] [%#x,%#x] of parent [%#x,%#x]", l.Start, l.End, r.Start, r.End, parent.Start, parent.End)
	}
	for _, c := range []Partition{l, r} {
		if c.Epoch != parent.Epoch+1 || !slices.Equal(c.Replicas, parent.Replicas) || c.SplitFrom != parent.ID || c.SplitLSN != 42 ||
			c.Log == nil || c.Log.Stream != LogStreamName(c.ID) || c.Log.Extent != 0 || c.Split != nil {
			t.Fatalf("child %+v of parent %+v", c, parent)
		}
		if _, got := s.partition(c.ID); got == nil || got.ID != c.ID {
			t.Fatalf("partition(%d) not found after the split", c.ID)
		}
	}
	if _, got := s.partition(old1.ID); got == nil || got.Index != 2 {
		t.Fatalf("partition(%d) lost after the split", old1.ID)
	}
	if _, got := s.partition(parent.ID); got != nil {
		t.Fatalf("the parent is still in the map")
	}
	// A second OpSplitDone (a replay, a second proposer) changes nothing.
	if res := mustApply(t, s, Command{Payload: SplitDone{PartitionID: parent.ID, LSN: 42}}); res.Changed {
		t.Fatal("OpSplitDone applied twice")
	}
	// Split the right child again, at a given hash.
	h := r.Start + 7
	mustApply(t, s, Command{Payload: SplitPartition{PartitionID: r.ID, Hash: h}}, Command{Payload: SplitDone{PartitionID: r.ID, LSN: 9}})
	pt, _ = s.Table("default", "t")
	if len(pt.Partitions) != 4 || pt.Partitions[1].End != h-1 || pt.Partitions[2].Start != h || pt.Partitions[2].End != r.End || pt.Partitions[2].Epoch != r.Epoch+1 {
		t.Fatalf("after the second split: %+v", pt.Partitions)
	}
	covered := uint64(0)
	for i, p := range pt.Partitions {
		if p.Start != covered || p.Index != uint32(i) {
			t.Fatalf("partition %d starts at %#x, want %#x", i, p.Start, covered)
		}
		covered = p.End + 1
	}
	// Split the first partition once more: ids are now out of order, and
	// every one is still found.
	mustApply(t, s, Command{Payload: SplitPartition{PartitionID: pt.Partitions[0].ID}}, Command{Payload: SplitDone{PartitionID: pt.Partitions[0].ID, LSN: 11}})
	pt, _ = s.Table("default", "t")
	for _, p := range pt.Partitions {
		if _, got := s.partition(p.ID); got == nil || got.ID != p.ID {
			t.Fatalf("partition(%d) not found among %d partitions", p.ID, len(pt.Partitions))
		}
	}
	if pt.Partitions[4].End != math.MaxUint64 {
		t.Fatalf("the last partition ends at %#x", pt.Partitions[4].End)
	}
}

// TestSplitOrderedTable: an ordered table splits at a key, which joins
// its split points.
func TestSplitOrderedTable(t *testing.T) {
	s := splitState(t)
	ot, _ := s.Table("default", "o")
	p := ot.Partitions[1] // ["m", ∞)
	mustApply(t, s, Command{Payload: SplitPartition{PartitionID: p.ID, Key: []byte("t")}}, Command{Payload: SplitDone{PartitionID: p.ID, LSN: 3}})
	ot, _ = s.Table("default", "o")
	if len(ot.Partitions) != 3 || string(ot.Partitions[1].KeyStart) != "m" || string(ot.Partitions[1].KeyEnd) != "t" ||
		string(ot.Partitions[2].KeyStart) != "t" || len(ot.Partitions[2].KeyEnd) != 0 {
		t.Fatalf("partitions %+v", ot.Partitions)
	}
	if len(ot.Options.SplitPoints) != 2 || string(ot.Options.SplitPoints[1]) != "t" {
		t.Fatalf("split points %q", ot.Options.SplitPoints)
	}
}

// TestSplitReplay: the logged commands replay to the same state.
func TestSplitReplay(t *testing.T) {
	s := splitState(t)
	pt, _ := s.Table("default", "t")
	cmds := []Command{{UnixMs: 3, Payload: SplitPartition{PartitionID: pt.Partitions[1].ID}}, {Payload: SplitDone{PartitionID: pt.Partitions[1].ID, LSN: 5}}}
	r := splitState(t)
	for _, c := range cmds {
		_, logged, err := s.ApplyChecked(c)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.ApplyLogged(logged); err != nil {
			t.Fatal(err)
		}
	}
	a, _ := s.Table("default", "t")
	b, _ := r.Table("default", "t")
	if len(a.Partitions) != len(b.Partitions) || a.Partitions[1].End != b.Partitions[1].End || s.NextPartitionID != r.NextPartitionID {
		t.Fatalf("replay differs")
	}
}
