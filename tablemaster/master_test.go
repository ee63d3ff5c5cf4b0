package tablemaster

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tabuladb/tabula/api"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock is the injected clock: it moves only when the test says.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_800_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// running is a Master serving on 127.0.0.1:0 and a client to it.
type running struct {
	m      *Master
	conn   *grpc.ClientConn
	c      api.MasterClient
	served chan error
}

func start(t *testing.T, opts Options) *running {
	t.Helper()
	m, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &running{m: m, served: make(chan error, 1)}
	go func() { r.served <- m.Serve(lis) }()
	r.conn, err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	r.c = api.NewMasterClient(r.conn)
	return r
}

func (r *running) stop(t *testing.T) {
	t.Helper()
	if err := r.conn.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.m.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := <-r.served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
}

// hostsOf counts a map's replicas per server.
func hostsOf(pm *api.PartitionMap) map[string]int {
	n := map[string]int{}
	for _, p := range pm.Partitions {
		for _, r := range p.Replicas {
			n[r.ServerId]++
		}
	}
	return n
}

func wantCode(t *testing.T, err error, code codes.Code, reason, field string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("error %v: code %v, want %v", err, status.Code(err), code)
	}
	d := api.DetailOf(err)
	if d.Reason != reason || d.Field != field {
		t.Fatalf("error %v: reason %q field %q, want %q %q", err, d.Reason, d.Field, reason, field)
	}
}

func TestMasterGRPC(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clk := newFakeClock()
	opts := Options{
		DataDir:           t.TempDir(),
		Logger:            testLogger(t),
		HeartbeatInterval: 2 * time.Millisecond, // real ticker: how often the fake clock is checked
		LeaseDuration:     100 * time.Millisecond,
		DeadAfter:         300 * time.Millisecond,
		Now:               clk.Now,
		SnapshotEvery:     4,
	}
	r := start(t, opts)
	c := r.c

	// Three servers in three fault domains.
	var ids []string
	for _, fd := range []string{"a", "b", "c"} {
		resp, err := c.RegisterServer(ctx, &api.RegisterServerRequest{Addr: "10.0.0.1:" + fd, FaultDomain: fd})
		if err != nil {
			t.Fatal(err)
		}
		if resp.HeartbeatIntervalMs != 2 || resp.LeaseMs != 100 {
			t.Fatalf("register response %v", resp)
		}
		ids = append(ids, resp.ServerId)
	}

	created, err := c.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: "t", Kind: api.TableKind_TABLE_KIND_POINT,
		Options: &api.TableOptions{Partitions: 12, Storage: StorageMemory, Replication: 1}}) // memory: a dead server's partitions move at once
	if err != nil {
		t.Fatal(err)
	}
	if h := hostsOf(created.Map); len(h) != 3 || h[ids[0]] != 4 || h[ids[1]] != 4 || h[ids[2]] != 4 {
		t.Fatalf("12 partitions on 3 servers spread %v, want 4 each", h)
	}
	if o := created.Map.Table.Options; o.Replication != 1 || o.Storage != StorageMemory || o.MaxValueBytes != api.DefaultMaxValueBytes {
		t.Fatalf("defaults not filled in: %v", o)
	}

	// Refusals travel as Tabula statuses.
	_, err = c.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: "t", Kind: api.TableKind_TABLE_KIND_POINT})
	wantCode(t, err, codes.AlreadyExists, "table_exists", "")
	_, err = c.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: "o", Kind: api.TableKind_TABLE_KIND_ORDERED,
		Options: &api.TableOptions{SplitPoints: [][]byte{[]byte("b"), []byte("a")}}})
	wantCode(t, err, codes.InvalidArgument, "split_points_unordered", "options.split_points")
	_, err = c.CreateTable(ctx, &api.CreateTableRequest{Tenant: "nobody", Name: "x", Kind: api.TableKind_TABLE_KIND_POINT})
	wantCode(t, err, codes.NotFound, "tenant_not_found", "")
	_, err = c.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Kind: api.TableKind_TABLE_KIND_POINT})
	wantCode(t, err, codes.InvalidArgument, "name_empty", "name")
	_, err = c.GetPartitionMap(ctx, &api.GetPartitionMapRequest{Tenant: api.DefaultTenant, Table: "nope"})
	wantCode(t, err, codes.NotFound, "table_not_found", "")
	_, err = c.ListTables(ctx, &api.ListTablesRequest{})
	wantCode(t, err, codes.InvalidArgument, "name_empty", "tenant")
	_, err = c.Heartbeat(ctx, &api.HeartbeatRequest{})
	wantCode(t, err, codes.InvalidArgument, "server_id_empty", "server_id")

	// A second table, dropped again: its ids are gone for good.
	if _, err := c.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: "gone", Kind: api.TableKind_TABLE_KIND_POINT}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DropTable(ctx, &api.DropTableRequest{Tenant: api.DefaultTenant, Name: "gone"}); err != nil {
		t.Fatal(err)
	}

	// Heartbeats carry replica status, which DescribeTable reports.
	p0 := created.Map.Partitions[0]
	for _, id := range ids {
		req := &api.HeartbeatRequest{ServerId: id}
		if id == p0.Replicas[0].ServerId {
			req.Replicas = []*api.ReplicaStatus{{PartitionId: p0.Id, Epoch: p0.Epoch, Keys: 7}}
		}
		resp, err := c.Heartbeat(ctx, req)
		if err != nil || resp.Reregister || resp.LeaseMs != 100 {
			t.Fatalf("heartbeat %s: %v %v", id, resp, err)
		}
	}
	desc, err := c.DescribeTable(ctx, &api.DescribeTableRequest{Tenant: api.DefaultTenant, Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if len(desc.Replicas) != 1 || desc.Replicas[0].Keys != 7 || desc.Replicas[0].ServerId != p0.Replicas[0].ServerId {
		t.Fatalf("described replicas %v", desc.Replicas)
	}

	// Watch the table and the whole cluster.
	watch, err := c.WatchPartitionMap(ctx, &api.WatchPartitionMapRequest{Tenant: api.DefaultTenant, Table: "t"})
	if err != nil {
		t.Fatal(err)
	}
	first, err := watch.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Maps) != 1 || !proto.Equal(first.Maps[0].Partitions[0], p0) {
		t.Fatalf("first watch message %v", first)
	}
	cluster, err := c.WatchPartitionMap(ctx, &api.WatchPartitionMapRequest{AfterVersion: first.Version})
	if err != nil {
		t.Fatal(err)
	}

	// The third server goes silent past DeadAfter; the others keep beating.
	dead := ids[2]
	clk.Advance(200 * time.Millisecond)
	for _, id := range ids[:2] {
		if _, err := c.Heartbeat(ctx, &api.HeartbeatRequest{ServerId: id}); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(200 * time.Millisecond)
	var moved *api.PartitionMap
	for moved == nil {
		msg, err := watch.Recv() // bounded by ctx's deadline
		if err != nil {
			t.Fatalf("waiting for the map without %s: %v", dead, err)
		}
		if hostsOf(msg.Maps[0])[dead] == 0 {
			moved = msg.Maps[0]
		}
	}
	if h := hostsOf(moved); h[ids[0]] != 6 || h[ids[1]] != 6 {
		t.Fatalf("after %s died: spread %v, want 6/6", dead, h)
	}
	for i, p := range moved.Partitions {
		old := created.Map.Partitions[i]
		wantEpoch := old.Epoch
		if old.Replicas[0].ServerId == dead {
			wantEpoch++
		}
		if p.Epoch != wantEpoch {
			t.Fatalf("partition %d epoch %d, want %d", i, p.Epoch, wantEpoch)
		}
	}
	msg, err := cluster.Recv()
	if err != nil || msg.Version <= first.Version || len(msg.Maps) != 1 {
		t.Fatalf("cluster watch: %v %v", msg, err)
	}

	// The dead server is told to re-register; when it does, it stays empty.
	hb, err := c.Heartbeat(ctx, &api.HeartbeatRequest{ServerId: dead})
	if err != nil || !hb.Reregister {
		t.Fatalf("heartbeat from a dead server: %v %v", hb, err)
	}
	if _, err := c.RegisterServer(ctx, &api.RegisterServerRequest{ServerId: dead, Addr: "10.0.0.1:c2", FaultDomain: "c"}); err != nil {
		t.Fatal(err)
	}

	// A draining server's partitions move before the heartbeat returns.
	hb, err = c.Heartbeat(ctx, &api.HeartbeatRequest{ServerId: ids[1], Draining: true})
	if err != nil || hb.Reregister {
		t.Fatalf("draining heartbeat: %v %v", hb, err)
	}
	// The new primaries are fenced (a live handoff) until the liveness
	// loop sees the server said it shuts down: it serves nothing more.
	var got *api.GetPartitionMapResponse
	for fenced := true; fenced; {
		if got, err = c.GetPartitionMap(ctx, &api.GetPartitionMapRequest{Tenant: api.DefaultTenant, Table: "t"}); err != nil {
			t.Fatal(err)
		}
		fenced = slices.ContainsFunc(got.Map.Partitions, func(p *api.Partition) bool { return p.HandoffFrom != "" })
	}
	if h := hostsOf(got.Map); h[ids[1]] != 0 || h[ids[0]] != 6 || h[dead] != 6 || got.Map.Version < hb.MapVersion {
		t.Fatalf("after drain: spread %v version %d (heartbeat said %d)", h, got.Map.Version, hb.MapVersion)
	}
	servers, err := c.ListServers(ctx, &api.ListServersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(servers.Servers) != 3 || !servers.Servers[1].Draining || servers.Servers[2].Replicas != 6 || !servers.Servers[2].Alive {
		t.Fatalf("servers %v", servers.Servers)
	}
	tables, err := c.ListTables(ctx, &api.ListTablesRequest{Tenant: api.DefaultTenant})
	if err != nil {
		t.Fatal(err)
	}

	// Close ends the watch streams; the state survives a restart.
	r.stop(t)
	for {
		// Messages sent before Close may be buffered; then the stream ends.
		if _, err := watch.Recv(); err != nil {
			if d := api.DetailOf(err); d.Code != api.ErrorCode_ERROR_CODE_UNAVAILABLE && status.Code(err) != codes.Canceled {
				t.Fatalf("watch stream ended with %v", err)
			}
			break
		}
	}
	r = start(t, opts)
	defer r.stop(t)
	got2, err := r.c.GetPartitionMap(ctx, &api.GetPartitionMapRequest{Tenant: api.DefaultTenant, Table: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got2.Map, got.Map) {
		t.Fatalf("map after restart:\n%v\nwant\n%v", got2.Map, got.Map)
	}
	tables2, err := r.c.ListTables(ctx, &api.ListTablesRequest{Tenant: api.DefaultTenant})
	if err != nil || !proto.Equal(tables2, tables) {
		t.Fatalf("tables after restart %v, want %v (%v)", tables2, tables, err)
	}
	// A restarted master counts every server as heard at open time.
	r.m.checkLiveness()
	if s := r.m.State(); !s.Servers[ids[0]].Alive || !s.Servers[dead].Alive {
		t.Fatalf("restarted master declared servers dead at once")
	}
	clk.Advance(opts.DeadAfter + time.Millisecond)
	r.m.checkLiveness()
	if s := r.m.State(); s.Servers[ids[0]].Alive || s.Servers[dead].Alive {
		t.Fatalf("silent servers alive a DeadAfter after restart")
	}
	created2, err := r.c.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: "t2", Kind: api.TableKind_TABLE_KIND_POINT})
	if err != nil {
		t.Fatal(err)
	}
	if created2.Map.Table.Id != 3 || len(created2.Map.Partitions[0].Replicas) != 0 {
		t.Fatalf("table made with no live server: %v", created2.Map)
	}
}

func TestOptionsValidate(t *testing.T) {
	if err := (Options{}).Validate(); err == nil {
		t.Fatal("empty DataDir accepted")
	}
	if err := (Options{DataDir: "x"}).Validate(); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
	if err := (Options{DataDir: "x", LeaseDuration: time.Second, DeadAfter: time.Second}).Validate(); err == nil {
		t.Fatal("DeadAfter == LeaseDuration accepted")
	}
	if _, err := Open(Options{DataDir: t.TempDir(), DeadAfter: time.Millisecond}); err == nil {
		t.Fatal("Open accepted invalid options")
	}
}

func TestServeAfterClose(t *testing.T) {
	m, err := Open(Options{DataDir: t.TempDir(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Serve(lis); !errors.Is(err, ErrClosed) {
		t.Fatalf("Serve after Close: %v", err)
	}
	_, err = m.CreateTable(context.Background(), &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: "x", Kind: api.TableKind_TABLE_KIND_POINT})
	if api.CodeOf(err) != api.ErrorCode_ERROR_CODE_UNAVAILABLE {
		t.Fatalf("CreateTable after Close: %v", err)
	}
}

// TestMasterConcurrentCommands races table creation, heartbeats and
// registrations; every acknowledged table survives a restart with unique ids.
func TestMasterConcurrentCommands(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := Options{DataDir: t.TempDir(), Logger: testLogger(t), SnapshotEvery: 5}
	m, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := m.RegisterServer(ctx, &api.RegisterServerRequest{Addr: "h:1"})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 8 {
		wg.Go(func() {
			for i := range 5 {
				name := string(rune('a'+w)) + string(rune('a'+i))
				if _, err := m.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: name, Kind: api.TableKind_TABLE_KIND_POINT,
					Options: &api.TableOptions{Partitions: 3, Replication: 1}}); err != nil {
					errs <- err
				}
				if _, err := m.Heartbeat(ctx, &api.HeartbeatRequest{ServerId: reg.ServerId}); err != nil {
					errs <- err
				}
				if _, err := m.RegisterServer(ctx, &api.RegisterServerRequest{Addr: "h:2", FaultDomain: name}); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	want := m.State()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	m, err = Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	got := m.State()
	if len(got.Tables) != 40 || len(got.Servers) != 41 || got.Version != want.Version {
		t.Fatalf("after restart: %d tables %d servers version %d (want 40, 41, %d)", len(got.Tables), len(got.Servers), got.Version, want.Version)
	}
	seen := map[uint64]bool{}
	for _, tb := range got.Tables {
		for _, p := range tb.Partitions {
			if seen[p.ID] || len(p.Replicas) != 1 {
				t.Fatalf("partition %+v duplicated or unplaced", p)
			}
			seen[p.ID] = true
		}
	}
}
