package tablemaster

import (
	"testing"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/replication/stream"
)

// TestLogKeep checks which log extents a partition's truncation keeps. The
// cases marked "regression" were found by the repair simulation
// (replication/partition TestSimulationRepair, -sim.bug old-logkeep): a
// replica that has not flushed since it restarted (or copied) reports
// flushed 0 and was taken for one lagging by more than MaxLogLag, so the
// log was trimmed past the applied LSN it recovered at; and a primary was
// left out the same way, though a primary never copies a snapshot: after
// a restart it could not catch up, ever.
func TestLogKeep(t *testing.T) {
	const lag = 1_000_000
	info := stream.StreamInfo{Extents: []stream.ExtentPlacement{{ID: 10, Sealed: true}, {ID: 11, Sealed: true}, {ID: 12, Sealed: true}, {ID: 13}}}
	p := Partition{ID: 1, Replicas: []Replica{
		{ServerID: "a", Role: api.ReplicaRole_REPLICA_ROLE_PRIMARY},
		{ServerID: "b", Role: api.ReplicaRole_REPLICA_ROLE_SECONDARY},
		{ServerID: "c", Role: api.ReplicaRole_REPLICA_ROLE_SECONDARY},
	}}
	st := func(flushed, keep uint64) *api.ReplicaStatus {
		return &api.ReplicaStatus{PartitionId: 1, State: api.ReplicaState_REPLICA_STATE_IN_SYNC, FlushedLsn: flushed, KeepFromExtent: keep}
	}
	copying := &api.ReplicaStatus{PartitionId: 1, State: api.ReplicaState_REPLICA_STATE_COPYING}
	for _, tc := range []struct {
		name    string
		reports map[string]*api.ReplicaStatus
		want    int
	}{
		{"all flushed", map[string]*api.ReplicaStatus{"a": st(3_000_000, 12), "b": st(2_900_000, 12), "c": st(2_500_000, 11)}, 1},
		{"never the open extent", map[string]*api.ReplicaStatus{"a": st(3_000_000, 13), "b": st(3_000_000, 13), "c": st(3_000_000, 13)}, 3},
		{"one not reported", map[string]*api.ReplicaStatus{"a": st(3_000_000, 12), "b": st(2_900_000, 12)}, 0},
		{"one copying", map[string]*api.ReplicaStatus{"a": st(3_000_000, 12), "b": st(2_900_000, 12), "c": copying}, 0},
		{"a lagging secondary is left out", map[string]*api.ReplicaStatus{"a": st(3_000_000, 12), "b": st(2_900_000, 12), "c": st(10, 10)}, 2},
		{"regression: a secondary not flushed since it restarted", map[string]*api.ReplicaStatus{"a": st(3_000_000, 12), "b": st(2_900_000, 12), "c": st(0, 0)}, 0},
		{"regression: a primary not flushed since it restarted", map[string]*api.ReplicaStatus{"a": st(0, 0), "b": st(3_000_000, 12), "c": st(2_900_000, 12)}, 0},
		{"regression: a lagging primary is not left out", map[string]*api.ReplicaStatus{"a": st(10, 10), "b": st(3_000_000, 12), "c": st(2_900_000, 12)}, 0},
		{"no max lag", map[string]*api.ReplicaStatus{"a": st(3_000_000, 12), "b": st(2_900_000, 12), "c": st(10, 11)}, 1},
	} {
		maxLag := uint64(lag)
		if tc.name == "no max lag" {
			maxLag = 0
		}
		if got := logKeep(p, tc.reports, info, maxLag); got != tc.want {
			t.Errorf("%s: logKeep = %d, want %d", tc.name, got, tc.want)
		}
	}
}
