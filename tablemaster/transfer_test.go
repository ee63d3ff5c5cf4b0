package tablemaster

import (
	"errors"
	"slices"
	"testing"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/tablemaster/balance"
)

// TestTransferPrimary: a transfer swaps the roles, bumps the epoch once,
// reconfigures the log and fences the new term; the same command logged
// again (or one the state moved past) changes nothing on replay, and a
// refused proposal says why with a stable code.
func TestTransferPrimary(t *testing.T) {
	s := NewState()
	must := func(c Command) Result {
		t.Helper()
		res, err := s.Apply(c)
		if err != nil {
			t.Fatalf("%s: %v", c.Op(), err)
		}
		return res
	}
	must(Command{Payload: CreateTenant{Tenant: "acme"}})
	for _, d := range []string{"a", "b", "c"} {
		must(Command{Payload: RegisterServer{Addr: "h-" + d + ":1", FaultDomain: d}})
	}
	must(Command{Payload: CreateTable{Tenant: "acme", Table: "t", Kind: api.TableKind_TABLE_KIND_POINT, Options: &TableOptions{Partitions: 1, Replication: 3, Storage: StorageSSD}}})
	_, p := s.partition(1)
	must(Command{Payload: PartitionLogAllocated{PartitionID: 1, Extent: 7, Epoch: p.Epoch, Servers: s.liveServersOf(p)}})
	_, p = s.partition(1)
	from, to, epoch := primaryID(p), p.Replicas[2].ServerID, p.Epoch

	cmd := Command{Payload: TransferPrimary{PartitionID: 1, ServerID: from, To: to}}
	snap := s.Clone()
	if res := must(cmd); !res.Changed {
		t.Fatal("transfer changed nothing")
	}
	_, p = s.partition(1)
	if primaryID(p) != to || p.Replicas[0].ServerID != to {
		t.Fatalf("primary %s first %s, want %s", primaryID(p), p.Replicas[0].ServerID, to)
	}
	if p.Epoch != epoch+1 || p.Log.Extent != 0 || p.Log.Last != 7 {
		t.Fatalf("epoch %d log %+v: want epoch %d and the log reconfigured after 7", p.Epoch, *p.Log, epoch+1)
	}
	if p.Handoff == nil || p.Handoff.From != from || p.Handoff.Version != s.Version {
		t.Fatalf("handoff %+v: the live old primary %s must fence the term", p.Handoff, from)
	}
	if !hostsReplica(p, from) || len(p.Replicas) != 3 {
		t.Fatalf("replicas %v: the old primary stays as a secondary", p.Replicas)
	}

	// Replayed from the log on a state that moved on: no change.
	v := s.Version
	if res, err := s.ApplyLogged(cmd); err != nil || res.Changed || s.Version != v {
		t.Fatalf("stale logged transfer: %+v %v", res, err)
	}
	// Replayed on the state it was proposed on: the same result.
	if res, err := snap.ApplyLogged(cmd); err != nil || !res.Changed {
		t.Fatalf("logged transfer: %+v %v", res, err)
	}
	if _, q := snap.partition(1); primaryID(q) != to || q.Epoch != epoch+1 {
		t.Fatalf("replayed transfer: primary %s epoch %d", primaryID(q), q.Epoch)
	}

	// Proposed again, it is refused: the primary is another one.
	_, err := s.Apply(cmd)
	if !errors.Is(err, ErrInvalidArgument) || api.DetailOf(err).GetReason() != "not_primary" {
		t.Fatalf("second transfer: %v, want not_primary", err)
	}
}

// TestLoadSnapshotMoving: the balancer sees a move under way as done —
// the source's replica (role included) on the target, not in sync so
// the partition stays put, three replicas, not four — so the next round
// does not take more off the source; a move whose source was dropped
// meanwhile is shown as it is.
func TestLoadSnapshotMoving(t *testing.T) {
	s := NewState()
	for _, c := range []Command{{Payload: CreateTenant{Tenant: "acme"}},
		{Payload: RegisterServer{Addr: "a:1", FaultDomain: "a"}}, {Payload: RegisterServer{Addr: "b:1", FaultDomain: "b"}},
		{Payload: RegisterServer{Addr: "c:1", FaultDomain: "c"}}, {Payload: RegisterServer{Addr: "d:1", FaultDomain: "d"}},
		{Payload: CreateTable{Tenant: "acme", Table: "t", Kind: api.TableKind_TABLE_KIND_POINT, Options: &TableOptions{Partitions: 1, Replication: 3, Storage: StorageSSD}}},
	} {
		if _, err := s.Apply(c); err != nil {
			t.Fatal(err)
		}
	}
	_, p := s.partition(1)
	from := primaryID(p)
	if _, err := s.Apply(Command{Payload: MoveReplica{PartitionID: 1, ServerID: from}}); err != nil {
		t.Fatal(err)
	}
	_, p = s.partition(1)
	to := p.Move.To
	var v loadView
	snap, _ := v.snapshot(s)
	bp := snap.Partitions[0]
	if !bp.Moving || len(bp.Replicas) != 3 {
		t.Fatalf("moving partition seen as %+v", bp)
	}
	k := slices.IndexFunc(bp.Replicas, func(r balance.Replica) bool { return r.Server == to })
	if k < 0 || !bp.Replicas[k].Primary || bp.Replicas[k].InSync || slices.ContainsFunc(bp.Replicas, func(r balance.Replica) bool { return r.Server == from }) {
		t.Fatalf("move %s -> %s seen as %+v", from, to, bp.Replicas)
	}
	// The source's engine fails mid-move: it is dropped, the target stays.
	if _, err := s.Apply(Command{Payload: ReplicaFailed{PartitionID: 1, ServerID: from}}); err != nil {
		t.Fatal(err)
	}
	_, p = s.partition(1)
	snap, _ = v.snapshot(s)
	if got := len(snap.Partitions[0].Replicas); got != len(p.Replicas) || !slices.ContainsFunc(snap.Partitions[0].Replicas, func(r balance.Replica) bool { return r.Server == to }) {
		t.Fatalf("after the source failed: %+v, map %v", snap.Partitions[0].Replicas, p.Replicas)
	}
}
