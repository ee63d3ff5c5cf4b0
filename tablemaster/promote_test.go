package tablemaster

import (
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
)

// A replica still copying a snapshot (or failed) is never chosen to take
// over a dead primary's partition, however high the LSN it reports: it
// holds part of a snapshot, and the log may no longer hold the rest.
func TestPromotionSkipsCopyingReplicas(t *testing.T) {
	st := NewState()
	for _, c := range []Command{
		{Payload: CreateTenant{Tenant: "default"}},
		register("srv-1", "a:1", "fd-1"), register("srv-2", "a:2", "fd-2"), register("srv-3", "a:3", "fd-3"),
		{Payload: CreateTable{Tenant: "default", Table: "t", Kind: point, Options: &TableOptions{Partitions: 1, Replication: 3}}},
	} {
		if _, err := st.Apply(c); err != nil {
			t.Fatal(err)
		}
	}
	p := st.Tables["default/t"].Partitions[0]
	prim := primaryID(&p)
	var secs []string
	for _, r := range p.Replicas {
		if r.ServerID != prim {
			secs = append(secs, r.ServerID)
		}
	}
	m := &Master{live: map[string]*liveness{}}
	report := func(id string, state api.ReplicaState, lsn uint64) {
		m.live[id] = &liveness{lastHeard: time.Now(), statuses: []*api.ReplicaStatus{{PartitionId: p.ID, ServerId: id, State: state, AppliedLsn: lsn}}}
	}
	report(secs[0], api.ReplicaState_REPLICA_STATE_COPYING, 900)
	report(secs[1], api.ReplicaState_REPLICA_STATE_IN_SYNC, 500)
	if got := m.promotions(st, prim)[p.ID]; got != secs[1] {
		t.Fatalf("promoted %q, want the in-sync %s over the copying %s", got, secs[1], secs[0])
	}
	report(secs[1], api.ReplicaState_REPLICA_STATE_FAILED, 500)
	promote := m.promotions(st, prim)
	if got, ok := promote[p.ID]; !ok || got != "" {
		t.Fatalf("promoted %q (named: %v) though every other replica is copying or failed; want nobody named", got, ok)
	}
	// Applied, the primary stays on the dead server: the partition waits
	// for a replica holding the data rather than have the state machine
	// take the first live one (a copying one, here). The elastic
	// simulation found that fallback.
	v := st.Version
	if _, err := st.Apply(Command{UnixMs: 1, Payload: ServerDown{ServerID: prim, Promote: promote, Keep: true}}); err != nil {
		t.Fatal(err)
	}
	np := st.Tables["default/t"].Partitions[0]
	if st.Version == v || primaryID(&np) != prim || np.Epoch != p.Epoch || len(np.Replicas) != 3 {
		t.Fatalf("after the primary's death with no fit replica: primary %s epoch %d replicas %d, want %s kept, epoch %d, 3 replicas", primaryID(&np), np.Epoch, len(np.Replicas), prim, p.Epoch)
	}
	// Without the proposer's word (a log from before it), the first live
	// replica still takes over, as it always did.
	st2 := NewState()
	for _, c := range []Command{
		{Payload: CreateTenant{Tenant: "default"}},
		register("srv-1", "a:1", "fd-1"), register("srv-2", "a:2", "fd-2"), register("srv-3", "a:3", "fd-3"),
		{Payload: CreateTable{Tenant: "default", Table: "t", Kind: point, Options: &TableOptions{Partitions: 1, Replication: 3}}},
		{UnixMs: 1, Payload: ServerDown{ServerID: prim, Keep: true}},
	} {
		if _, err := st2.Apply(c); err != nil {
			t.Fatal(err)
		}
	}
	if q := st2.Tables["default/t"].Partitions[0]; primaryID(&q) == prim {
		t.Fatalf("with no promotion named, the primary stayed on the dead %s", prim)
	}
}

// A report about a replica a server held before it left the partition
// and was placed there again is forgotten when the map places it: it may
// say in sync while the new replica copies, and neither a primary
// transfer (the balancer reads the load view) nor a promotion may trust
// it. Reports about the other replicas stay. The elastic simulation
// found the transfer.
func TestReportsOfRejoinedReplicasForgotten(t *testing.T) {
	st := NewState()
	for _, c := range []Command{
		{Payload: CreateTenant{Tenant: "default"}},
		register("srv-1", "a:1", "fd-1"), register("srv-2", "a:2", "fd-2"), register("srv-3", "a:3", "fd-3"), register("srv-4", "a:4", "fd-4"),
		{Payload: CreateTable{Tenant: "default", Table: "t", Kind: point, Options: &TableOptions{Partitions: 1, Replication: 3}}},
	} {
		if _, err := st.Apply(c); err != nil {
			t.Fatal(err)
		}
	}
	p := st.Tables["default/t"].Partitions[0]
	var out string // the server without a replica
	for _, id := range st.ServerIDs() {
		if !hostsReplica(&p, id) {
			out = id
		}
	}
	other := p.Replicas[1].ServerID
	m := &Master{live: map[string]*liveness{}}
	now := time.Now()
	for _, id := range []string{out, other} {
		// out's report is about the replica it held before.
		statuses := []*api.ReplicaStatus{{PartitionId: p.ID, ServerId: id, State: api.ReplicaState_REPLICA_STATE_IN_SYNC, AppliedLsn: 7}}
		m.live[id] = &liveness{lastHeard: now, statuses: statuses}
		m.load.report(id, now, statuses, nil)
	}
	prev := st.Clone()
	if _, err := st.Apply(Command{UnixMs: 1, Payload: MoveReplica{PartitionID: p.ID, ServerID: other, To: out}}); err != nil {
		t.Fatal(err)
	}
	m.forgetJoined(prev, st)
	if n := len(m.live[out].statuses); n != 0 {
		t.Errorf("%s's report about its earlier replica kept (%d statuses)", out, n)
	}
	if _, inSync, ok := m.load.vecLocked(out, p.ID); ok || inSync {
		t.Errorf("the load view still has %s's earlier replica (in sync %v)", out, inSync)
	}
	if len(m.live[other].statuses) != 1 {
		t.Errorf("%s's report about a replica it kept was dropped", other)
	}
	if _, inSync, ok := m.load.vecLocked(other, p.ID); !ok || !inSync {
		t.Errorf("the load view lost %s's replica (ok %v, in sync %v)", other, ok, inSync)
	}
}

// A replica on a draining server is not named to take over a dead
// primary's partition (the state machine would not take it and fall
// back to any live replica, a copying one say): the in-sync replica on a
// live server is, and with none the partition waits. The elastic
// simulation found it.
func TestPromotionSkipsDrainingServers(t *testing.T) {
	st := NewState()
	for _, c := range []Command{
		{Payload: CreateTenant{Tenant: "default"}},
		register("srv-1", "a:1", "fd-1"), register("srv-2", "a:2", "fd-2"), register("srv-3", "a:3", "fd-3"),
		{Payload: CreateTable{Tenant: "default", Table: "t", Kind: point, Options: &TableOptions{Partitions: 1, Replication: 3}}},
	} {
		if _, err := st.Apply(c); err != nil {
			t.Fatal(err)
		}
	}
	p := st.Tables["default/t"].Partitions[0]
	prim, drained, other := p.Replicas[0].ServerID, p.Replicas[1].ServerID, p.Replicas[2].ServerID
	if _, err := st.Apply(Command{UnixMs: 1, Payload: ServerDown{ServerID: drained, Draining: true, Keep: true}}); err != nil {
		t.Fatal(err)
	}
	m := &Master{live: map[string]*liveness{}}
	report := func(id string, state api.ReplicaState, lsn uint64) {
		m.live[id] = &liveness{lastHeard: time.Now(), statuses: []*api.ReplicaStatus{{PartitionId: p.ID, ServerId: id, State: state, AppliedLsn: lsn}}}
	}
	report(drained, api.ReplicaState_REPLICA_STATE_IN_SYNC, 900)
	report(other, api.ReplicaState_REPLICA_STATE_IN_SYNC, 500)
	if got := m.promotions(st, prim)[p.ID]; got != other {
		t.Fatalf("promoted %q, want %s over the draining %s", got, other, drained)
	}
	report(other, api.ReplicaState_REPLICA_STATE_COPYING, 0)
	if got, ok := m.promotions(st, prim)[p.ID]; !ok || got != "" {
		t.Fatalf("promoted %q (named %v), want nobody: the draining replica cannot take it, the other copies", got, ok)
	}
}

// A drain hands a primary only to the replica the proposer named (Drain
// and the heartbeat's drain name promotions'): with nobody named, the
// draining server keeps the role (it is alive and has the data) until a
// move takes it off, rather than the first live replica, which may copy.
func TestDrainKeepsPrimaryWithNobodyNamed(t *testing.T) {
	st := NewState()
	for _, c := range []Command{
		{Payload: CreateTenant{Tenant: "default"}},
		register("srv-1", "a:1", "fd-1"), register("srv-2", "a:2", "fd-2"), register("srv-3", "a:3", "fd-3"),
		{Payload: CreateTable{Tenant: "default", Table: "t", Kind: point, Options: &TableOptions{Partitions: 1, Replication: 3}}},
	} {
		if _, err := st.Apply(c); err != nil {
			t.Fatal(err)
		}
	}
	p := st.Tables["default/t"].Partitions[0]
	prim := primaryID(&p)
	if _, err := st.Apply(Command{UnixMs: 1, Payload: ServerDown{ServerID: prim, Draining: true, Keep: true, Promote: map[uint64]string{p.ID: ""}}}); err != nil {
		t.Fatal(err)
	}
	np := st.Tables["default/t"].Partitions[0]
	if !st.Servers[prim].Draining || primaryID(&np) != prim || np.Epoch != p.Epoch {
		t.Fatalf("draining %v, primary %s epoch %d; want %s draining and still primary at epoch %d", st.Servers[prim].Draining, primaryID(&np), np.Epoch, prim, p.Epoch)
	}
}
