package tablemaster

import (
	"context"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
)

// TestReplaceHoldsWhileNewPrimaryCatchesUp: a new primary still replaying
// the log after its promotion (CATCHING_UP) is not counted as holding the
// partition's data when the master decides whether a dead server's kept
// replica may go. It may have been promoted before it copied anything and
// be replaying the log from the start over an empty engine; if the log no
// longer holds the start, it fails, and the dead server's copy was the
// only full one. A secondary catching up from its own restart point (it
// has its engine) still counts, and so does the primary once in sync.
func TestReplaceHoldsWhileNewPrimaryCatchesUp(t *testing.T) {
	m, _, clock := healCluster(t, Options{ReplaceAfter: time.Minute, DeadAfter: time.Second, LeaseDuration: 500 * time.Millisecond})
	p := healPartition(t, m)
	dead := p.Replicas[0].ServerID // the primary
	res, _, err := m.propose(Command{UnixMs: clock.Now().UnixMilli(), Payload: ServerDown{ServerID: dead, Keep: true, Promote: map[uint64]string{p.ID: p.Replicas[1].ServerID}}}, nil, nil)
	if err != nil || !res.Changed {
		t.Fatalf("server down: changed %v, err %v", res.Changed, err)
	}
	m.liveMu.Lock()
	m.live[dead] = &liveness{dead: true}
	m.liveMu.Unlock()
	p = healPartition(t, m)
	var primary, secondary string
	for _, r := range p.Replicas {
		switch {
		case r.ServerID == dead:
		case r.Role == api.ReplicaRole_REPLICA_ROLE_PRIMARY:
			primary = r.ServerID
		default:
			secondary = r.ServerID
		}
	}
	if primary == "" || secondary == "" {
		t.Fatalf("after the primary's death: replicas %v; want a new primary and a secondary", p.Replicas)
	}
	beat := func(id string, role api.ReplicaRole, state api.ReplicaState) {
		t.Helper()
		_, err := m.Heartbeat(context.Background(), &api.HeartbeatRequest{ServerId: id, MapVersion: m.State().Version,
			Replicas: []*api.ReplicaStatus{{PartitionId: p.ID, Epoch: p.Epoch, Role: role, State: state}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	held := func() bool {
		t.Helper()
		m.replaceDead(m.State(), clock.Now().Add(2*time.Minute))
		q := healPartition(t, m)
		return hostsReplica(&q, dead)
	}
	// The new primary replays the log; the secondary is still copying.
	beat(primary, api.ReplicaRole_REPLICA_ROLE_PRIMARY, api.ReplicaState_REPLICA_STATE_CATCHING_UP)
	beat(secondary, api.ReplicaRole_REPLICA_ROLE_SECONDARY, api.ReplicaState_REPLICA_STATE_COPYING)
	if !held() {
		t.Fatal("the dead server's replica was replaced while the new primary was still replaying the log and the other replica copying")
	}
	// The same report without its role (a server that does not send it):
	// the map names it primary, so still not counted.
	beat(primary, api.ReplicaRole_REPLICA_ROLE_UNSPECIFIED, api.ReplicaState_REPLICA_STATE_CATCHING_UP)
	if !held() {
		t.Fatal("the dead server's replica was replaced on a role-less catching-up report of the new primary")
	}
	// A report from before the promotion (the server still a secondary
	// then) does not count either: the map names it primary now.
	beat(primary, api.ReplicaRole_REPLICA_ROLE_SECONDARY, api.ReplicaState_REPLICA_STATE_CATCHING_UP)
	if !held() {
		t.Fatal("the dead server's replica was replaced on the new primary's catching-up report from before its promotion")
	}
	// A secondary catching up from its own restart point holds its data.
	beat(secondary, api.ReplicaRole_REPLICA_ROLE_SECONDARY, api.ReplicaState_REPLICA_STATE_CATCHING_UP)
	if held() {
		t.Fatal("a secondary catching up from its engine should count as holding the data")
	}
}

// TestReplaceAfterNewPrimaryInSync: once the new primary reports in sync,
// the dead server's replica is replaced.
func TestReplaceAfterNewPrimaryInSync(t *testing.T) {
	m, _, clock := healCluster(t, Options{ReplaceAfter: time.Minute, DeadAfter: time.Second, LeaseDuration: 500 * time.Millisecond})
	p := healPartition(t, m)
	dead := p.Replicas[0].ServerID
	res, _, err := m.propose(Command{UnixMs: clock.Now().UnixMilli(), Payload: ServerDown{ServerID: dead, Keep: true, Promote: map[uint64]string{p.ID: p.Replicas[1].ServerID}}}, nil, nil)
	if err != nil || !res.Changed {
		t.Fatalf("server down: changed %v, err %v", res.Changed, err)
	}
	m.liveMu.Lock()
	m.live[dead] = &liveness{dead: true}
	m.liveMu.Unlock()
	p = healPartition(t, m)
	var primary string
	for _, r := range p.Replicas {
		if r.Role == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
			primary = r.ServerID
		}
	}
	if primary == "" || primary == dead {
		t.Fatalf("after the primary's death: replicas %v; want a new primary", p.Replicas)
	}
	_, err = m.Heartbeat(context.Background(), &api.HeartbeatRequest{ServerId: primary, MapVersion: m.State().Version,
		Replicas: []*api.ReplicaStatus{{PartitionId: p.ID, Epoch: p.Epoch, Role: api.ReplicaRole_REPLICA_ROLE_PRIMARY, State: api.ReplicaState_REPLICA_STATE_IN_SYNC}}})
	if err != nil {
		t.Fatal(err)
	}
	m.replaceDead(m.State(), clock.Now().Add(2*time.Minute))
	if p = healPartition(t, m); hostsReplica(&p, dead) || len(p.Replicas) != 3 {
		t.Fatalf("with the new primary in sync the dead replica should be replaced: replicas %v", p.Replicas)
	}
}
