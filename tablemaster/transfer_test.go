package tablemaster

import (
	"errors"
	"testing"

	"github.com/tabuladb/tabula/api"
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
