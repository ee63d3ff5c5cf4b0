package tablemaster

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
)

// TestBalancePlanFromHeartbeats: heartbeats' counters become rates in
// the load view, describe shows them per replica, and after two servers
// join a cluster of three the plan moves replicas onto them (and only
// onto servers that may take them), with a reason each, changing nothing.
func TestBalancePlanFromHeartbeats(t *testing.T) {
	ctx := context.Background()
	clock := newFakeClock()
	m, err := Open(Options{DataDir: t.TempDir(), Now: clock.Now, HeartbeatInterval: time.Hour,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	register := func(i int) string {
		reg, err := m.RegisterServer(ctx, &api.RegisterServerRequest{Addr: fmt.Sprintf("127.0.0.1:%d", i), FaultDomain: fmt.Sprintf("fd%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		return reg.ServerId
	}
	var old []string
	for i := 1; i <= 3; i++ {
		old = append(old, register(i))
	}
	if _, err := m.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: "t", Kind: api.TableKind_TABLE_KIND_POINT,
		Options: &api.TableOptions{Partitions: 12, Replication: 3, Storage: StorageMemory}}); err != nil {
		t.Fatal(err)
	}
	added := []string{register(4), register(5)}
	// Every replica reports; primaries serve 100 reads/s, every replica
	// applies 10 writes/s and is 64 MiB in memory.
	beat := func(sec uint64) {
		st := m.State()
		tbl, _ := st.Table(api.DefaultTenant, "t")
		for _, id := range st.ServerIDs() {
			var reps []*api.ReplicaStatus
			for _, p := range tbl.Partitions {
				for _, r := range p.Replicas {
					if r.ServerID != id {
						continue
					}
					s := &api.ReplicaStatus{PartitionId: p.ID, Epoch: p.Epoch, Role: r.Role, State: api.ReplicaState_REPLICA_STATE_IN_SYNC,
						Writes: 10 * sec, Bytes: 64 << 20, BusyNs: sec * 1e7}
					if r.Role == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
						s.Reads = 100 * sec
					}
					reps = append(reps, s)
				}
			}
			if _, err := m.Heartbeat(ctx, &api.HeartbeatRequest{ServerId: id, Replicas: reps, MapVersion: st.Version,
				Capacity: &api.ServerCapacity{DiskBytes: 1 << 40, DiskFreeBytes: 1 << 39, MemoryBytes: 64 << 30}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	beat(1)
	plan, err := m.BalancePlan(ctx, &api.BalancePlanRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(plan.GetNote(), "warming up") {
		t.Fatal("a plan from one report says nothing of warming up")
	}
	clock.Advance(time.Second)
	beat(2)

	desc, err := m.DescribeTable(ctx, &api.DescribeTableRequest{Tenant: api.DefaultTenant, Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	var prim int
	for _, s := range desc.GetReplicas() {
		l := s.GetLoad()
		if l == nil || math.Abs(l.GetWritesPerSec()-10) > 1e-9 || math.Abs(l.GetBusyCores()-0.01) > 1e-9 {
			t.Fatalf("replica %d on %s: load %v, want 10 writes/s and 0.01 cores", s.GetPartitionId(), s.GetServerId(), l)
		}
		if s.GetRole() == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
			prim++
			if l.GetReadsPerSec() != 100 {
				t.Fatalf("primary of %d: %v reads/s, want 100", s.GetPartitionId(), l.GetReadsPerSec())
			}
		}
	}
	if prim != 12 {
		t.Fatalf("%d primaries described, want 12", prim)
	}

	before := m.State().Version
	plan, err = m.BalancePlan(ctx, &api.BalancePlanRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if m.State().Version != before {
		t.Fatal("BalancePlan changed the map")
	}
	var moves int
	for _, a := range plan.GetActions() {
		if a.GetReason() == "" || a.GetTable() != "t" || a.GetTenant() != api.DefaultTenant {
			t.Fatalf("action %v: no reason or no table", a)
		}
		if a.GetKind() == api.BalanceActionKind_BALANCE_ACTION_KIND_MOVE_REPLICA {
			moves++
			if !slices.Contains(old, a.GetFrom()) || !slices.Contains(added, a.GetTo()) {
				t.Fatalf("move %v: want from an old server to a new one", a)
			}
		}
	}
	if moves == 0 || moves > 8 {
		t.Fatalf("%d moves planned, want 1 to 8 (the limit in flight):\n%v", moves, plan)
	}
	if len(plan.GetBefore()) != 5 || len(plan.GetAfter()) != 5 {
		t.Fatalf("servers before %d, after %d: want 5", len(plan.GetBefore()), len(plan.GetAfter()))
	}
	for _, s := range plan.GetAfter() {
		if slices.Contains(added, s.GetId()) && s.GetReplicas() == 0 {
			t.Fatalf("new server %s gets nothing: %v", s.GetId(), plan.GetAfter())
		}
		if s.GetDiskCapacityBytes() != 1<<40 || s.GetMemoryBytes() != uint64(s.GetReplicas())*(64<<20) {
			t.Fatalf("server %v: capacity or memory not from the reports", s)
		}
	}
}
