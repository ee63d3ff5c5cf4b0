package tablemaster

import (
	"slices"
	"testing"

	"github.com/tabuladb/tabula/api"
)

// TestMergeRefusals: bulk tables, the last partition, a partition
// merging, splitting or moving are refused with their reasons, and change
// nothing.
func TestMergeRefusals(t *testing.T) {
	s := splitState(t)
	pt, _ := s.Table("default", "t")
	bt, _ := s.Table("default", "b")
	p0, p1 := pt.Partitions[0], pt.Partitions[1]
	refused := func(name string, cmd MergePartitions, reason string) {
		t.Helper()
		v := s.Version
		_, err := s.Apply(Command{Payload: cmd})
		if d := api.DetailOf(err); d.GetReason() != reason {
			t.Errorf("%s: err %v, want reason %s", name, err, reason)
		}
		if s.Version != v {
			t.Errorf("%s: a refused merge changed the state", name)
		}
	}
	refused("bulk", MergePartitions{PartitionID: bt.Partitions[0].ID}, "bulk_table")
	refused("last", MergePartitions{PartitionID: p1.ID}, "not_adjacent")
	refused("no partition", MergePartitions{PartitionID: 999}, "partition_not_found")
	mustApply(t, s, register("d", "d:1", "fd"), Command{UnixMs: 5, Payload: MoveReplica{PartitionID: p1.ID, ServerID: primaryID(&p1), To: "d"}})
	refused("moving", MergePartitions{PartitionID: p0.ID}, "move_in_progress")
	_, mp := s.partition(p1.ID)
	mustApply(t, s, Command{UnixMs: 6, Payload: MoveDone{PartitionID: p1.ID, ServerID: mp.Move.From, To: mp.Move.To}})
	mustApply(t, s, Command{UnixMs: 7, Payload: SplitPartition{PartitionID: p1.ID}})
	refused("splitting", MergePartitions{PartitionID: p0.ID}, "split_in_progress")
	mustApply(t, s, Command{UnixMs: 8, Payload: SplitDone{PartitionID: p1.ID, LSN: 3}})
	mustApply(t, s, Command{UnixMs: 9, Payload: MergePartitions{PartitionID: p0.ID}})
	refused("merging", MergePartitions{PartitionID: p0.ID}, "merge_in_progress")
	pt, _ = s.Table("default", "t")
	refused("right merging", MergePartitions{PartitionID: pt.Partitions[1].ID}, "merge_in_progress")
	if _, err := s.Apply(Command{Payload: SplitPartition{PartitionID: p0.ID}}); api.DetailOf(err).GetReason() != "merge_in_progress" {
		t.Errorf("split of a merging partition: %v, want merge_in_progress", err)
	}
}

// TestMergeUndoesSplit: a split then the merge of its children gives
// back the parent's range with the replicas and roles of the left, the
// larger epoch plus one, a fresh log, the parents' ids and the larger
// merge LSN; the logged commands replay to the same state; ordered tables
// lose the split point.
func TestMergeUndoesSplit(t *testing.T) {
	s := splitState(t)
	r := splitState(t)
	apply := func(c Command) {
		t.Helper()
		_, logged, err := s.ApplyChecked(c)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.ApplyLogged(logged); err != nil {
			t.Fatal(err)
		}
	}
	pt, _ := s.Table("default", "t")
	parent := pt.Partitions[0]
	apply(Command{UnixMs: 2, Payload: SplitPartition{PartitionID: parent.ID}})
	apply(Command{UnixMs: 3, Payload: SplitDone{PartitionID: parent.ID, LSN: 10}})
	pt, _ = s.Table("default", "t")
	l, rt := pt.Partitions[0], pt.Partitions[1]
	next := s.NextPartitionID
	apply(Command{UnixMs: 4, Payload: MergePartitions{PartitionID: l.ID}})
	_, pl := s.partition(l.ID)
	_, pr := s.partition(rt.ID)
	if pl.Merge == nil || pl.Merge != pr.Merge || pl.Merge.Child != next || pl.Merge.Left != l.ID || pl.Merge.Right != rt.ID {
		t.Fatalf("pending merge %+v / %+v, want child %d", pl.Merge, pr.Merge, next)
	}
	if ap := pl.Proto(); ap.GetMerge().GetChildId() != next {
		t.Fatalf("the map does not carry the merge: %v", ap.GetMerge())
	}
	apply(Command{UnixMs: 5, Payload: MergeDone{PartitionID: l.ID, LSN: 17, RightLSN: 12}})
	pt, _ = s.Table("default", "t")
	if len(pt.Partitions) != 2 || pt.Options.Partitions != 2 {
		t.Fatalf("%d partitions after the merge", len(pt.Partitions))
	}
	c := pt.Partitions[0]
	if c.ID != next || c.Start != parent.Start || c.End != parent.End || c.Epoch != parent.Epoch+2 || !slices.Equal(c.Replicas, l.Replicas) ||
		c.MergeLeft != l.ID || c.MergeRight != rt.ID || c.MergeLSN != 17 || c.Log == nil || c.Log.Stream != LogStreamName(c.ID) || c.Merge != nil || c.Index != 0 || pt.Partitions[1].Index != 1 {
		t.Fatalf("child %+v", c)
	}
	if res := mustApply(t, s, Command{Payload: MergeDone{PartitionID: l.ID, LSN: 17, RightLSN: 12}}); res.Changed {
		t.Fatal("OpMergeDone applied twice")
	}
	b, _ := r.Table("default", "t")
	if len(b.Partitions) != 2 || b.Partitions[0].ID != c.ID || b.Partitions[0].MergeLSN != 17 || r.NextPartitionID != s.NextPartitionID {
		t.Fatalf("replay differs: %+v", b.Partitions)
	}
	ot, _ := s.Table("default", "o")
	apply(Command{UnixMs: 6, Payload: MergePartitions{PartitionID: ot.Partitions[0].ID}})
	apply(Command{UnixMs: 7, Payload: MergeDone{PartitionID: ot.Partitions[0].ID, LSN: 1, RightLSN: 2}})
	ot, _ = s.Table("default", "o")
	if len(ot.Partitions) != 1 || len(ot.Options.SplitPoints) != 0 || len(ot.Partitions[0].KeyStart) != 0 || len(ot.Partitions[0].KeyEnd) != 0 || ot.Partitions[0].MergeLSN != 2 {
		t.Fatalf("ordered table after the merge: %+v, split points %q", ot.Partitions, ot.Options.SplitPoints)
	}
}
