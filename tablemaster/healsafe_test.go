package tablemaster

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
)

// healCluster is a master with five registered (fake) servers and a
// 3-replica memory table "t" of one partition, driven by hand: the test
// sends the heartbeats and runs the loops.
func healCluster(t *testing.T, opts Options) (*Master, []string, *fakeClock) {
	t.Helper()
	ctx := context.Background()
	clock := newFakeClock()
	opts.DataDir, opts.Now = t.TempDir(), clock.Now
	opts.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))
	opts.HeartbeatInterval = time.Hour // the test runs the loops itself
	m, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	var ids []string
	for i := 1; i <= 5; i++ {
		reg, err := m.RegisterServer(ctx, &api.RegisterServerRequest{Addr: fmt.Sprintf("127.0.0.1:%d", i), FaultDomain: fmt.Sprintf("fd%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, reg.ServerId)
	}
	if _, err := m.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: "t", Kind: api.TableKind_TABLE_KIND_POINT,
		Options: &api.TableOptions{Partitions: 1, Replication: 3, Storage: StorageMemory}}); err != nil {
		t.Fatal(err)
	}
	return m, ids, clock
}

func healPartition(t *testing.T, m *Master) Partition {
	t.Helper()
	tbl, err := m.State().Table(api.DefaultTenant, "t")
	if err != nil {
		t.Fatal(err)
	}
	return tbl.Partitions[0]
}

// report heartbeats server id with one status for partition p, built from
// the map of version mapVersion.
func report(t *testing.T, m *Master, id string, p Partition, state api.ReplicaState, mapVersion uint64) {
	t.Helper()
	_, err := m.Heartbeat(context.Background(), &api.HeartbeatRequest{ServerId: id, MapVersion: mapVersion,
		Replicas: []*api.ReplicaStatus{{PartitionId: p.ID, Epoch: p.Epoch, State: state}}})
	if err != nil {
		t.Fatal(err)
	}
}

// TestMoveDoneNeedsFreshReport: a move finishes only on an in-sync report
// built from the move's map or a newer one. Before, the target's last
// report — made before the move, about a replica of the same partition it
// held then — finished the move at once: the source was removed while the
// target had copied nothing.
func TestMoveDoneNeedsFreshReport(t *testing.T) {
	m, ids, clock := healCluster(t, Options{})
	p := healPartition(t, m)
	var from, to string
	for _, id := range ids {
		if !hostsReplica(&p, id) && to == "" {
			to = id
		}
	}
	from = p.Replicas[1].ServerID
	// The target says "in sync" about the partition from an old map (it
	// held a replica of it once).
	report(t, m, to, p, api.ReplicaState_REPLICA_STATE_IN_SYNC, m.State().Version)
	res, _, err := m.propose(Command{UnixMs: clock.Now().UnixMilli(), Payload: MoveReplica{PartitionID: p.ID, ServerID: from, To: to}}, nil, nil)
	if err != nil || !res.Changed {
		t.Fatalf("move: changed %v, err %v", res.Changed, err)
	}
	m.moveLoop(context.Background())
	if p = healPartition(t, m); p.Move == nil || !hostsReplica(&p, from) {
		t.Fatalf("the move finished on a report from before it: replicas %v, move %v", p.Replicas, p.Move)
	}
	// The same report again, omitted statuses (lease-only beats) keep it.
	if _, err := m.Heartbeat(context.Background(), &api.HeartbeatRequest{ServerId: to, ReplicasOmitted: true}); err != nil {
		t.Fatal(err)
	}
	m.moveLoop(context.Background())
	if p = healPartition(t, m); p.Move == nil {
		t.Fatal("the move finished on a lease-only heartbeat")
	}
	// Copying, from the new map: not yet.
	report(t, m, to, p, api.ReplicaState_REPLICA_STATE_COPYING, m.State().Version)
	m.moveLoop(context.Background())
	if p = healPartition(t, m); p.Move == nil {
		t.Fatal("the move finished while the target reports copying")
	}
	report(t, m, to, p, api.ReplicaState_REPLICA_STATE_IN_SYNC, m.State().Version)
	m.moveLoop(context.Background())
	if p = healPartition(t, m); p.Move != nil || hostsReplica(&p, from) || !hostsReplica(&p, to) {
		t.Fatalf("after the target's fresh in-sync report: replicas %v, move %v; want the move done", p.Replicas, p.Move)
	}
}

// TestReplaceHoldsTheOnlyFullCopy: past ReplaceAfter a dead server's kept
// replica is replaced only if a live replica of the partition reported
// holding its data. Before, it was dropped whatever the others' state: with
// the others still copying, the partition lost its only full copy.
func TestReplaceHoldsTheOnlyFullCopy(t *testing.T) {
	m, _, clock := healCluster(t, Options{ReplaceAfter: time.Minute, DeadAfter: time.Second, LeaseDuration: 500 * time.Millisecond})
	p := healPartition(t, m)
	dead := p.Replicas[0].ServerID // the primary
	others := []string{p.Replicas[1].ServerID, p.Replicas[2].ServerID}
	res, _, err := m.propose(Command{UnixMs: clock.Now().UnixMilli(), Payload: ServerDown{ServerID: dead, Keep: true}}, nil, nil)
	if err != nil || !res.Changed {
		t.Fatalf("server down: changed %v, err %v", res.Changed, err)
	}
	m.liveMu.Lock()
	m.live[dead] = &liveness{dead: true}
	m.liveMu.Unlock()
	for _, id := range others {
		report(t, m, id, p, api.ReplicaState_REPLICA_STATE_COPYING, m.State().Version)
	}
	m.replaceDead(m.State(), clock.Now().Add(2*time.Minute))
	if p = healPartition(t, m); !hostsReplica(&p, dead) {
		t.Fatalf("the dead server's replica was replaced while every other replica was copying: replicas %v", p.Replicas)
	}
	report(t, m, others[0], p, api.ReplicaState_REPLICA_STATE_IN_SYNC, m.State().Version)
	m.replaceDead(m.State(), clock.Now().Add(2*time.Minute))
	if p = healPartition(t, m); hostsReplica(&p, dead) || len(p.Replicas) != 3 {
		t.Fatalf("with a live replica in sync the dead one should be replaced: replicas %v", p.Replicas)
	}
}
