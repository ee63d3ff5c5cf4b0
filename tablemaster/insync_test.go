package tablemaster

import (
	"strings"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
)

// judgePartition combines the primary's view of its ack set with each
// replica's own report: a secondary the primary dropped is DROPPED
// whatever it says of itself, and the partition is short.
func TestJudgePartition(t *testing.T) {
	const (
		inSync   = api.ReplicaState_REPLICA_STATE_IN_SYNC
		catching = api.ReplicaState_REPLICA_STATE_CATCHING_UP
		copying  = api.ReplicaState_REPLICA_STATE_COPYING
		failed   = api.ReplicaState_REPLICA_STATE_FAILED
		dropped  = api.ReplicaState_REPLICA_STATE_DROPPED
		none     = api.ReplicaState_REPLICA_STATE_UNSPECIFIED
	)
	b := syncBound{lag: time.Second, records: 64}
	p := &Partition{ID: 7, Log: &PartitionLog{Stream: "log/7"}, Replicas: []Replica{
		{ServerID: "a", Role: api.ReplicaRole_REPLICA_ROLE_PRIMARY},
		{ServerID: "b", Role: api.ReplicaRole_REPLICA_ROLE_SECONDARY},
		{ServerID: "c", Role: api.ReplicaRole_REPLICA_ROLE_SECONDARY},
	}}
	prim := func(acks ...*api.AckSetMember) *api.ReplicaStatus {
		return &api.ReplicaStatus{State: inSync, AppliedLsn: 1000, CommitLsn: 1000, AckSet: acks}
	}
	sec := func(state api.ReplicaState, applied uint64, lagMs int64) *api.ReplicaStatus {
		return &api.ReplicaStatus{State: state, AppliedLsn: applied, CommitLsn: applied, LagMs: lagMs}
	}
	in := func(id string) *api.AckSetMember { return &api.AckSetMember{ServerId: id, InAckSet: true} }
	out := func(id string) *api.AckSetMember {
		return &api.AckSetMember{ServerId: id, Reason: "replicate timed out", SinceUnixMs: 1}
	}
	for _, tc := range []struct {
		name    string
		reports map[string]replicaReport
		want    [3]api.ReplicaState
		reason  string // in the partition's reason when short
	}{
		{"all in step", map[string]replicaReport{"a": {st: prim(in("b"), in("c"))}, "b": {st: sec(inSync, 1000, 20)}, "c": {st: sec(inSync, 995, 30)}},
			[3]api.ReplicaState{inSync, inSync, inSync}, ""},
		{"idle, no keepalive: 0 records behind is in step", map[string]replicaReport{"a": {st: prim(in("b"), in("c"))}, "b": {st: sec(inSync, 1000, 60_000)}, "c": {st: sec(inSync, 1000, 60_000)}},
			[3]api.ReplicaState{inSync, inSync, inSync}, ""},
		{"dropped, says in sync of itself", map[string]replicaReport{"a": {st: prim(in("b"), out("c"))}, "b": {st: sec(inSync, 1000, 20)}, "c": {st: sec(inSync, 400, 3000)}},
			[3]api.ReplicaState{inSync, inSync, dropped}, "dropped from the log's ack set (replicate timed out); 600 records behind, last in step 3s ago"},
		{"dropped and rejoining", map[string]replicaReport{"a": {st: prim(in("b"), &api.AckSetMember{ServerId: "c", Rejoining: true, Reason: "x"})}, "b": {st: sec(inSync, 1000, 20)}, "c": {st: sec(inSync, 900, 1500)}},
			[3]api.ReplicaState{inSync, inSync, catching}, "rejoining"},
		{"in the ack set, far behind in records and time", map[string]replicaReport{"a": {st: prim(in("b"), in("c"))}, "b": {st: sec(inSync, 1000, 20)}, "c": {st: sec(inSync, 100, 5000)}},
			[3]api.ReplicaState{inSync, inSync, catching}, "behind its primary; 900 records behind"},
		{"behind in records, in step by time (reports skewed under load)", map[string]replicaReport{"a": {st: prim(in("b"), in("c"))}, "b": {st: sec(inSync, 500, 10)}, "c": {st: sec(inSync, 1000, 10)}},
			[3]api.ReplicaState{inSync, inSync, inSync}, ""},
		{"never in step, the report's age counts", map[string]replicaReport{"a": {st: prim()}, "b": {st: sec(catching, 10, -1)}, "c": {st: sec(inSync, 1000, 900), age: 200 * time.Millisecond}},
			[3]api.ReplicaState{inSync, catching, inSync}, "not in step since it became a secondary"},
		{"copying, failed", map[string]replicaReport{"a": {st: prim()}, "b": {st: sec(copying, 0, -1)}, "c": {st: sec(failed, 1000, 10)}},
			[3]api.ReplicaState{inSync, copying, failed}, "copying a snapshot"},
		{"server down, no report", map[string]replicaReport{"a": {st: prim()}, "b": {down: true}},
			[3]api.ReplicaState{inSync, none, none}, "server down"},
		{"a new primary applying its log", map[string]replicaReport{"a": {st: &api.ReplicaStatus{State: catching, AppliedLsn: 10, CommitLsn: 1000}}, "b": {st: sec(inSync, 1000, 10)}, "c": {st: sec(inSync, 1000, 10)}},
			[3]api.ReplicaState{catching, inSync, inSync}, "a new primary"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ps := judgePartition(p, 3, func(id string) replicaReport { return tc.reports[id] }, b)
			for i, js := range ps.replicas {
				if js.GetState() != tc.want[i] {
					t.Errorf("replica %s: %v (%s), want %v", p.Replicas[i].ServerID, js.GetState(), js.GetReason(), tc.want[i])
				}
				if (js.GetState() == inSync) != (js.GetReason() == "") {
					t.Errorf("replica %s: %v with reason %q", p.Replicas[i].ServerID, js.GetState(), js.GetReason())
				}
			}
			if ps.short != (tc.reason != "") || !strings.Contains(ps.reason, tc.reason) {
				t.Fatalf("short %v reason %q, want %q", ps.short, ps.reason, tc.reason)
			}
		})
	}
	// A dropped replica's lag is the primary's commit minus its applied
	// LSN (it does not know the commit moved on) and its own time lag
	// plus the report's age.
	ps := judgePartition(p, 3, func(id string) replicaReport {
		switch id {
		case "a":
			return replicaReport{st: prim(in("b"), out("c"))}
		case "c":
			return replicaReport{st: sec(inSync, 400, 3000), age: 100 * time.Millisecond}
		}
		return replicaReport{st: sec(inSync, 1000, 20)}
	}, b)
	if c := ps.replicas[2]; c.GetLagRecords() != 600 || c.GetLagMs() != 3100 || c.GetInAckSet() {
		t.Fatalf("dropped replica %+v", c)
	}
	if ps.inSync != 2 {
		t.Fatalf("%d in sync, want 2", ps.inSync)
	}
	// Fewer replicas placed than the replication factor: short too.
	two := &Partition{ID: 8, Log: p.Log, Replicas: p.Replicas[:2]}
	if ps := judgePartition(two, 3, func(id string) replicaReport {
		if id == "a" {
			return replicaReport{st: prim(in("b"))}
		}
		return replicaReport{st: sec(inSync, 1000, 10)}
	}, b); !ps.short || !strings.Contains(ps.reason, "2 of 3 replicas placed") {
		t.Fatalf("two of three: %+v", ps)
	}
}
