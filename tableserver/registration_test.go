package tableserver_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/tablemaster"
	"github.com/tabuladb/tabula/tableserver"
)

// regCluster is a master on 127.0.0.1 with short liveness timings and a
// client to it.
type regCluster struct {
	t      *testing.T
	dir    string
	master api.MasterClient
	addr   string
}

func newRegCluster(t *testing.T) *regCluster {
	t.Helper()
	dir := t.TempDir()
	m, err := tablemaster.Open(tablemaster.Options{DataDir: filepath.Join(dir, "m"), Logger: testLog(t),
		HeartbeatInterval: 50 * time.Millisecond, LeaseDuration: 500 * time.Millisecond, DeadAfter: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- m.Serve(lis) }()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cc.Close()
		if err := m.Close(); err != nil {
			t.Error(err)
		}
		if err := <-served; err != nil {
			t.Error(err)
		}
	})
	return &regCluster{t: t, dir: dir, master: api.NewMasterClient(cc), addr: lis.Addr().String()}
}

// open opens (without serving) a server on data directory name.
func (c *regCluster) open(name string, o tableserver.Options) *tableserver.Server {
	c.t.Helper()
	o.Masters, o.DataDir, o.Logger = []string{c.addr}, filepath.Join(c.dir, name), testLog(c.t)
	s, err := tableserver.Open(o)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = s.Close() })
	return s
}

// serve serves s on a new port; it returns at once.
func (c *regCluster) serve(s *tableserver.Server) {
	c.t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.t.Fatal(err)
	}
	go func() { _ = s.Serve(lis) }()
}

func waitRegistered(t *testing.T, s *tableserver.Server, within time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if err := s.WaitRegistered(ctx); err != nil {
		t.Fatalf("server not registered within %v: %v", within, err)
	}
}

func (c *regCluster) servers() map[string]*api.ServerInfo {
	c.t.Helper()
	resp, err := c.master.ListServers(context.Background(), &api.ListServersRequest{})
	if err != nil {
		c.t.Fatal(err)
	}
	out := map[string]*api.ServerInfo{}
	for _, s := range resp.GetServers() {
		out[s.GetId()] = s
	}
	return out
}

// TestDefaultFaultDomainsDistinct: servers that name no fault domain each get
// one of their own, kept across a restart; with the old default ("default"
// for every server) replication 3 silently placed one replica.
func TestDefaultFaultDomainsDistinct(t *testing.T) {
	c := newRegCluster(t)
	a, b := c.open("a", tableserver.Options{}), c.open("b", tableserver.Options{})
	c.serve(a)
	c.serve(b)
	waitRegistered(t, a, 10*time.Second)
	waitRegistered(t, b, 10*time.Second)
	srv := c.servers()
	fa, fb := srv[a.ID()].GetFaultDomain(), srv[b.ID()].GetFaultDomain()
	if fa != tablemaster.DefaultFaultDomain(a.ID()) || fb != tablemaster.DefaultFaultDomain(b.ID()) || fa == fb {
		t.Fatalf("default fault domains: %s=%q %s=%q, want one each", a.ID(), fa, b.ID(), fb)
	}
	// A drained server restarted on its data directory keeps its domain.
	id := a.ID()
	if err := a.Drain(); err != nil {
		t.Fatal(err)
	}
	a2 := c.open("a", tableserver.Options{})
	c.serve(a2)
	waitRegistered(t, a2, 10*time.Second)
	if got := c.servers()[id].GetFaultDomain(); a2.ID() != id || got != fa {
		t.Fatalf("after restart: id %s domain %q, want %s %q", a2.ID(), got, id, fa)
	}
}

// TestSecondProcessOfLiveIDRefused: a second process with a live server's
// id (a copied data directory) must not take over its partitions while the
// first one still heartbeats; it registers once the first has been silent
// past its lease, and then it alone serves them, at the same epoch.
func TestSecondProcessOfLiveIDRefused(t *testing.T) {
	c := newRegCluster(t)
	ctx := context.Background()
	a := c.open("a", tableserver.Options{FaultDomain: "fd-a"})
	c.serve(a)
	waitRegistered(t, a, 10*time.Second)
	created, err := c.master.CreateTable(ctx, &api.CreateTableRequest{Tenant: "default", Name: "t", Kind: api.TableKind_TABLE_KIND_POINT,
		Options: &api.TableOptions{Partitions: 1, Storage: "ssd"}})
	if err != nil {
		t.Fatal(err)
	}
	p := created.GetMap().GetPartitions()[0]
	// A copy of a's identity in another data directory.
	idFile, err := os.ReadFile(filepath.Join(c.dir, "a", "server-identity"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(c.dir, "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.dir, "b", "server-identity"), idFile, 0o644); err != nil {
		t.Fatal(err)
	}
	b := c.open("b", tableserver.Options{FaultDomain: "fd-a"})
	if b.ID() != a.ID() {
		t.Fatalf("copied identity: %q, want %q", b.ID(), a.ID())
	}
	c.serve(b)
	// For more than DeadAfter, b stays out while a heartbeats.
	ctxB, cancel := context.WithTimeout(ctx, 2500*time.Millisecond)
	err = b.WaitRegistered(ctxB)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a second process registered the live id %s: %v", a.ID(), err)
	}
	gm, err := c.master.GetPartitionMap(ctx, &api.GetPartitionMapRequest{Tenant: "default", Table: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if r := gm.GetMap().GetPartitions()[0].GetReplicas(); len(r) != 1 || r[0].GetAddr() != a.Addr() {
		t.Fatalf("partition replicas %v, want a's address %s", r, a.Addr())
	}
	// a dies without a word; once its lease is over, b gets in and serves
	// the partition at its address.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	waitRegistered(t, b, 10*time.Second)
	gm, err = c.master.GetPartitionMap(ctx, &api.GetPartitionMapRequest{Tenant: "default", Table: "t"})
	if err != nil {
		t.Fatal(err)
	}
	np := gm.GetMap().GetPartitions()[0]
	if r := np.GetReplicas(); len(r) != 1 || r[0].GetAddr() != b.Addr() || np.GetEpoch() != p.GetEpoch() {
		t.Fatalf("partition after b registered: %v, want b (%s) at epoch %d", np, b.Addr(), p.GetEpoch())
	}
	bc, err := grpc.NewClient(b.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer bc.Close()
	hdr := &api.RequestHeader{Tenant: "default", Table: "t", PartitionId: np.GetId(), Epoch: np.GetEpoch()}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := api.NewTableServerClient(bc).Put(ctx, &api.PutRequest{Header: hdr, Key: []byte("k"), Value: []byte("v")})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b never served the partition: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// testLog discards the servers' and master's logs unless TABULA_TEST_LOG is
// set (they outlive t.Log's test).
func testLog(*testing.T) *slog.Logger {
	if os.Getenv("TABULA_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.DiscardHandler)
}
