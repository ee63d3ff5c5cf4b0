package tablemaster

import (
	"slices"
	"testing"

	"github.com/tabuladb/tabula/api"
)

// TestKeepThenReplace: OpServerDown with Keep hands a dead server's
// primaries to live replicas (one epoch bump each) and keeps its replicas
// as secondaries, left out of the log's next extent; the server's return
// puts them back in the log; OpServerDown with Replace drops them and
// places new ones. Without Keep (old logs) the replicas go at once.
func TestKeepThenReplace(t *testing.T) {
	build := func() *State {
		s := NewState()
		mustApply(t, s,
			Command{Payload: CreateTenant{Tenant: "default"}},
			register("a", "a:1", "fa"), register("b", "b:1", "fb"), register("c", "c:1", "fc"), register("d", "d:1", "fd"),
			Command{UnixMs: 1, Payload: CreateTable{Tenant: "default", Table: "t", Kind: point, Options: &TableOptions{Partitions: 4, Replication: 3, Storage: StorageMemory}}},
		)
		return s
	}
	s := build()
	tbl, _ := s.Table("default", "t")
	var victim string
	for _, r := range tbl.Partitions[0].Replicas {
		if r.Role == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
			victim = r.ServerID
		}
	}
	before := map[uint64]Partition{}
	for _, p := range tbl.Partitions {
		p.Replicas = slices.Clone(p.Replicas)
		before[p.ID] = p
	}
	mustApply(t, s, Command{UnixMs: 10, Payload: ServerDown{ServerID: victim, Keep: true}})
	tbl, _ = s.Table("default", "t")
	for _, p := range tbl.Partitions {
		was := before[p.ID]
		if !hostsReplica(&was, victim) {
			continue
		}
		if len(p.Replicas) != 3 || !hostsReplica(&p, victim) {
			t.Fatalf("partition %d: replicas %v, want the dead server's kept", p.ID, p.Replicas)
		}
		if primaryID(&p) == victim {
			t.Fatalf("partition %d: the dead server is still primary", p.ID)
		}
		wantEpoch := was.Epoch
		if primaryID(&was) == victim {
			wantEpoch++
		}
		if p.Epoch != wantEpoch || p.Log == nil || p.Log.Extent != 0 {
			t.Fatalf("partition %d: epoch %d (want %d), log %+v (want reconfiguring)", p.ID, p.Epoch, wantEpoch, p.Log)
		}
		if slices.Contains(s.liveServersOf(&p), victim) {
			t.Fatalf("partition %d: the dead server is in the log's next extent", p.ID)
		}
	}
	// It returns: its replicas rejoin the log.
	for _, p := range tbl.Partitions {
		if p.Log != nil {
			mustApply(t, s, Command{Payload: PartitionLogAllocated{PartitionID: p.ID, Epoch: p.Epoch, Servers: s.liveServersOf(&p), Extent: 100 + p.ID}})
		}
	}
	mustApply(t, s, register(victim, victim+":2", "f"+victim))
	tbl, _ = s.Table("default", "t")
	for _, p := range tbl.Partitions {
		if hostsReplica(&p, victim) && (p.Log.Extent != 0 || !slices.Contains(s.liveServersOf(&p), victim)) {
			t.Fatalf("partition %d: the returned server's replica is not back in the log (%+v)", p.ID, p.Log)
		}
	}
	// Dead again, then replaced.
	mustApply(t, s, Command{UnixMs: 20, Payload: ServerDown{ServerID: victim, Keep: true}},
		Command{UnixMs: 30, Payload: ServerDown{ServerID: victim, Replace: true}})
	tbl, _ = s.Table("default", "t")
	for _, p := range tbl.Partitions {
		if hostsReplica(&p, victim) || len(p.Replicas) != 3 {
			t.Fatalf("partition %d after replace: %v", p.ID, p.Replicas)
		}
	}
	// An old log's OpServerDown (no Keep) drops at once.
	s = build()
	mustApply(t, s, Command{UnixMs: 10, Payload: ServerDown{ServerID: victim}})
	tbl, _ = s.Table("default", "t")
	for _, p := range tbl.Partitions {
		if hostsReplica(&p, victim) {
			t.Fatalf("partition %d: a command without Keep kept the replica", p.ID)
		}
	}
	// Replace of a live server is refused.
	if _, err := s.Apply(Command{UnixMs: 40, Payload: ServerDown{ServerID: "a", Replace: true}}); err == nil && s.Servers["a"].Alive {
		t.Fatal("replace of a live server accepted")
	}
}
