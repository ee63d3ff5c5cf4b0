package tablemaster

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/tabuladb/tabula/api"
)

// durableCluster starts a master on a fake clock with two servers in two
// fault domains and an ssd table "d" of 4 partitions (2 on each). It returns
// the master, the ids (dead first: the one the test silences), the table's
// map at creation, and a heartbeat of the live server to a master.
func durableCluster(t *testing.T, ctx context.Context, opts Options) (r *running, dead, alive string, created *api.PartitionMap, beat func(*running)) {
	t.Helper()
	r = start(t, opts)
	var ids []string
	for _, fd := range []string{"a", "b"} {
		resp, err := r.c.RegisterServer(ctx, &api.RegisterServerRequest{Addr: "10.0.0.1:" + fd, FaultDomain: fd, Incarnation: 7})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, resp.ServerId)
	}
	resp, err := r.c.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: "d", Kind: point,
		Options: &api.TableOptions{Partitions: 4, Storage: StorageSSD, Replication: 1}})
	if err != nil {
		t.Fatal(err)
	}
	dead, alive = ids[0], ids[1]
	beat = func(r *running) {
		t.Helper()
		if _, err := r.c.Heartbeat(ctx, &api.HeartbeatRequest{ServerId: alive}); err != nil {
			t.Fatal(err)
		}
	}
	return r, dead, alive, resp.Map, beat
}

func mapOf(t *testing.T, ctx context.Context, r *running, table string) *api.PartitionMap {
	t.Helper()
	resp, err := r.c.GetPartitionMap(ctx, &api.GetPartitionMapRequest{Tenant: api.DefaultTenant, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Map
}

// TestDurableHeldAcrossMasterRestart is the regression test of durable
// partitions moved EMPTY: a server dead for a long outage, then a master
// restart, used to lose its durable partitions at the first liveness tick
// (the wall-clock DownSinceMs was compared with --reassign-durable-after).
// No automatic path may move them: they wait for the server, however long.
func TestDurableHeldAcrossMasterRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clk := newFakeClock()
	opts := Options{
		DataDir:           t.TempDir(),
		Logger:            testLogger(t),
		HeartbeatInterval: time.Hour, // the test drives checkLiveness itself
		LeaseDuration:     time.Second,
		DeadAfter:         5 * time.Second,
		Now:               clk.Now,
	}
	r, dead, alive, _, beat := durableCluster(t, ctx, opts)
	clk.Advance(6 * time.Second)
	beat(r)
	r.m.checkLiveness()
	if r.m.State().Servers[dead].Alive {
		t.Fatal("silent server not declared dead")
	}
	if got := hostsOf(mapOf(t, ctx, r, "d")); got[dead] != 2 || got[alive] != 2 {
		t.Fatalf("after death: %v; want the dead server to keep its 2 durable partitions", got)
	}
	// A long outage, then the master restarts.
	clk.Advance(time.Hour)
	beat(r)
	r.m.checkLiveness()
	r.stop(t)
	r = start(t, opts)
	defer r.stop(t)
	for range 3 {
		beat(r)
		r.m.checkLiveness()
		clk.Advance(24 * time.Hour)
	}
	if got := hostsOf(mapOf(t, ctx, r, "d")); got[dead] != 2 || got[alive] != 2 {
		t.Fatalf("after a day and a master restart: %v; durable partitions must wait for their server", got)
	}
}

// TestForgetServer: only the operator's ForgetServer with accept_data_loss
// moves a dead server's only copies; they are recorded as lost, durably.
func TestForgetServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clk := newFakeClock()
	opts := Options{
		DataDir: t.TempDir(), Logger: testLogger(t), HeartbeatInterval: time.Hour,
		LeaseDuration: time.Second, DeadAfter: 5 * time.Second, Now: clk.Now,
	}
	r, dead, alive, created, beat := durableCluster(t, ctx, opts)
	// A memory table too: its partitions on the dead server move at death.
	if _, err := r.c.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: "m", Kind: point,
		Options: &api.TableOptions{Partitions: 2, Storage: StorageMemory, Replication: 1}}); err != nil {
		t.Fatal(err)
	}

	_, err := r.c.ForgetServer(ctx, &api.ForgetServerRequest{ServerId: alive, AcceptDataLoss: true})
	wantCode(t, err, codes.InvalidArgument, "server_alive", "server_id")
	_, err = r.c.ForgetServer(ctx, &api.ForgetServerRequest{ServerId: "nobody", AcceptDataLoss: true})
	wantCode(t, err, codes.NotFound, "server_not_found", "")

	clk.Advance(6 * time.Second)
	beat(r)
	r.m.checkLiveness()
	_, err = r.c.ForgetServer(ctx, &api.ForgetServerRequest{ServerId: dead})
	wantCode(t, err, codes.InvalidArgument, "data_loss_not_accepted", "accept_data_loss")
	if got := hostsOf(mapOf(t, ctx, r, "d")); got[dead] != 2 {
		t.Fatalf("a refused forget moved partitions: %v", got)
	}

	resp, err := r.c.ForgetServer(ctx, &api.ForgetServerRequest{ServerId: dead, AcceptDataLoss: true})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Moved != 2 || len(resp.Lost) != 2 {
		t.Fatalf("forget: %v", resp)
	}
	after := mapOf(t, ctx, r, "d")
	if got := hostsOf(after); got[alive] != 4 {
		t.Fatalf("after forget: %v", got)
	}
	lostIdx := map[uint32]bool{}
	for _, lp := range resp.Lost {
		was := created.Partitions[lp.Index]
		if lp.Tenant != api.DefaultTenant || lp.Table != "d" || lp.PartitionId != was.Id || lp.ServerId != dead ||
			lp.Epoch != was.Epoch || lp.LostUnixMs != clk.Now().UnixMilli() || was.Replicas[0].ServerId != dead {
			t.Fatalf("lost %v, partition was %v", lp, was)
		}
		if p := after.Partitions[lp.Index]; p.Epoch <= was.Epoch {
			t.Fatalf("partition %d moved without a new epoch", p.Id)
		}
		lostIdx[lp.Index] = true
	}
	servers, err := r.c.ListServers(ctx, &api.ListServersRequest{})
	if err != nil || len(servers.Servers) != 1 || servers.Servers[0].Id != alive {
		t.Fatalf("servers after forget: %v %v", servers, err)
	}

	// The record survives a restart; the memory table lost nothing.
	r.stop(t)
	r = start(t, opts)
	defer r.stop(t)
	list, err := r.c.ListDataLoss(ctx, &api.ListDataLossRequest{Tenant: api.DefaultTenant, Table: "d"})
	if err != nil || len(list.Lost) != 2 || !lostIdx[list.Lost[0].Index] || !lostIdx[list.Lost[1].Index] {
		t.Fatalf("data loss after restart: %v %v", list, err)
	}
	if all, err := r.c.ListDataLoss(ctx, &api.ListDataLossRequest{}); err != nil || len(all.Lost) != 2 {
		t.Fatalf("data loss of every table: %v %v", all, err)
	}
	if m, err := r.c.ListDataLoss(ctx, &api.ListDataLossRequest{Tenant: api.DefaultTenant, Table: "m"}); err != nil || len(m.Lost) != 0 {
		t.Fatalf("memory table: %v %v", m, err)
	}
	_, err = r.c.ListDataLoss(ctx, &api.ListDataLossRequest{Tenant: api.DefaultTenant, Table: "nope"})
	wantCode(t, err, codes.NotFound, "table_not_found", "")

	// A forgotten server that comes back is a new, empty server.
	if _, err := r.c.RegisterServer(ctx, &api.RegisterServerRequest{ServerId: dead, Addr: "10.0.0.1:a", Incarnation: 9}); err != nil {
		t.Fatal(err)
	}
	if got := hostsOf(mapOf(t, ctx, r, "d")); got[dead] != 0 {
		t.Fatalf("forgotten server got its partitions back: %v", got)
	}
}

// TestRegisterTakeoverAfterLease: a second process of a live id is refused
// while the first one's lease may still run, and admitted once the first
// has been silent for longer than the lease, before it is declared dead.
func TestRegisterTakeoverAfterLease(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clk := newFakeClock()
	r := start(t, Options{DataDir: t.TempDir(), Logger: testLogger(t), HeartbeatInterval: time.Hour,
		LeaseDuration: time.Second, DeadAfter: 5 * time.Second, Now: clk.Now})
	defer r.stop(t)
	first, err := r.c.RegisterServer(ctx, &api.RegisterServerRequest{Addr: "10.0.0.1:1", Incarnation: 1})
	if err != nil {
		t.Fatal(err)
	}
	id := first.ServerId
	second := &api.RegisterServerRequest{ServerId: id, Addr: "10.0.0.2:1", Incarnation: 2}
	clk.Advance(900 * time.Millisecond)
	_, err = r.c.RegisterServer(ctx, second)
	wantCode(t, err, codes.AlreadyExists, "server_id_in_use", "")
	if _, err := r.c.Heartbeat(ctx, &api.HeartbeatRequest{ServerId: id}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(900 * time.Millisecond)
	_, err = r.c.RegisterServer(ctx, second)
	wantCode(t, err, codes.AlreadyExists, "server_id_in_use", "")
	clk.Advance(200 * time.Millisecond) // 1.1s since the last heartbeat
	if _, err := r.c.RegisterServer(ctx, second); err != nil {
		t.Fatalf("takeover after the lease: %v", err)
	}
	if srv := r.m.State().Servers[id]; !srv.Alive || srv.Addr != "10.0.0.2:1" || srv.Incarnation != 2 {
		t.Fatalf("server after the takeover: %+v", srv)
	}
	// The same process again changes nothing.
	v := r.m.State().Version
	if _, err := r.c.RegisterServer(ctx, second); err != nil || r.m.State().Version != v {
		t.Fatalf("re-registration of the same process: %v, version %d -> %d", err, v, r.m.State().Version)
	}
}
