package tablemaster

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
)

// TestShortPartitionRefilled: a secondary the log's seal could not reach
// leaves the replica set (OpPartitionLogReset); the leader then places a
// new replica, without waiting for a server to register. Before, nothing
// proposed placement after a reset: in a rolling restart
// (cmd/tabula TestRollingRestart) a secondary slow to answer one seal
// left its partition at 2 replicas, and a later slow append at 1, for good.
func TestShortPartitionRefilled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clock := newFakeClock() // servers never go silent
	m, err := Open(Options{DataDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError})), Now: clock.Now, HeartbeatInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for i := 1; i <= 4; i++ {
		// Closed ports: the log loop's stream calls fail fast.
		if _, err := m.RegisterServer(ctx, &api.RegisterServerRequest{Addr: fmt.Sprintf("127.0.0.1:%d", i), FaultDomain: fmt.Sprintf("fd%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: "t", Kind: api.TableKind_TABLE_KIND_POINT,
		Options: &api.TableOptions{Partitions: 2, Replication: 3, Storage: StorageMemory}}); err != nil {
		t.Fatal(err)
	}
	tbl, _ := m.State().Table(api.DefaultTenant, "t")
	p := tbl.Partitions[0]
	var secondary string
	for _, r := range p.Replicas {
		if r.Role == api.ReplicaRole_REPLICA_ROLE_SECONDARY {
			secondary = r.ServerID
			break
		}
	}
	res, _, err := m.propose(Command{UnixMs: clock.Now().UnixMilli(), Payload: PartitionLogReset{PartitionID: p.ID, Epoch: p.Epoch, Servers: []string{secondary}}}, nil, nil)
	if err != nil || !res.Changed {
		t.Fatalf("drop secondary %s: changed %v, err %v", secondary, res.Changed, err)
	}
	m.kickLogs()
	deadline := time.Now().Add(10 * time.Second)
	for {
		tbl, _ = m.State().Table(api.DefaultTenant, "t")
		if n := len(tbl.Partitions[0].Replicas); n == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("partition %d still has replicas %v 10s after a secondary was dropped; want 3", p.ID, tbl.Partitions[0].Replicas)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDrainedServerExitsMovesGoOn: a server drains (SIGTERM) and exits
// before all its replicas have moved; once it is declared dead the moves
// go on (copied from the other replicas), rather than the rest waiting a
// replica short for ReplaceAfter. Before, death cleared Draining and
// moveLoop started no more moves off it (cmd/tabula TestRollingRestart
// stalled with 3 of 7 replicas left on a drained server).
func TestDrainedServerExitsMovesGoOn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clock := newFakeClock()
	m, err := Open(Options{DataDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError})),
		Now: clock.Now, HeartbeatInterval: 20 * time.Millisecond, DeadAfter: time.Second, LeaseDuration: 500 * time.Millisecond, ReplaceAfter: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var ids []string
	for i := 1; i <= 5; i++ {
		reg, err := m.RegisterServer(ctx, &api.RegisterServerRequest{Addr: fmt.Sprintf("127.0.0.1:%d", i), FaultDomain: fmt.Sprintf("fd%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, reg.ServerId)
	}
	if _, err := m.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: "t", Kind: api.TableKind_TABLE_KIND_POINT,
		Options: &api.TableOptions{Partitions: 20, Replication: 3, Storage: StorageMemory}}); err != nil {
		t.Fatal(err)
	}
	// The server holding most replicas drains: more than movesPerServer.
	counts := map[string]int{}
	tbl, _ := m.State().Table(api.DefaultTenant, "t")
	for _, p := range tbl.Partitions {
		for _, r := range p.Replicas {
			counts[r.ServerID]++
		}
	}
	victim := ids[0]
	for _, id := range ids {
		if counts[id] > counts[victim] {
			victim = id
		}
	}
	if counts[victim] <= movesPerServer {
		t.Fatalf("server %s holds %d replicas; want more than %d", victim, counts[victim], movesPerServer)
	}
	if _, err := m.Heartbeat(ctx, &api.HeartbeatRequest{ServerId: victim, Draining: true}); err != nil {
		t.Fatal(err)
	}
	// beat heartbeats every other server, each reporting every replica it
	// hosts in sync (so moves to it finish).
	beat := func() {
		st := m.State()
		tbl, _ := st.Table(api.DefaultTenant, "t")
		for _, id := range ids {
			if id == victim {
				continue
			}
			var reps []*api.ReplicaStatus
			for _, p := range tbl.Partitions {
				if hostsReplica(&p, id) {
					reps = append(reps, &api.ReplicaStatus{PartitionId: p.ID, Epoch: p.Epoch, State: api.ReplicaState_REPLICA_STATE_IN_SYNC})
				}
			}
			if _, err := m.Heartbeat(ctx, &api.HeartbeatRequest{ServerId: id, Replicas: reps, MapVersion: st.Version}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The drained server exits at once: silent past DeadAfter, it is
	// declared dead while the others keep beating.
	for !func() bool { srv := m.State().Servers[victim]; return srv != nil && !srv.Alive }() {
		beat()
		clock.Advance(100 * time.Millisecond)
		time.Sleep(5 * time.Millisecond)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		beat()
		left := 0
		tbl, _ := m.State().Table(api.DefaultTenant, "t")
		for _, p := range tbl.Partitions {
			if hostsReplica(&p, victim) {
				left++
			}
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d replicas still on drained (then dead) server %s after 10s; want every one moved", left, counts[victim], victim)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
