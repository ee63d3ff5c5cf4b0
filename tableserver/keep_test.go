package tableserver_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/testcluster"
)

// TestDeadReplicaKept: a server that dies is not replaced at once: its
// primaries fail over to other replicas, its replicas stay (as
// secondaries out of the log), and when it comes back within
// ReplaceAfter they catch up from the log, with no copy anywhere; a
// server dead past ReplaceAfter is replaced, and its replacement copies.
func TestDeadReplicaKept(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	logs := &syncBuffer{}
	c, err := testcluster.Start(ctx, testcluster.Options{Servers: 4, ReplaceAfter: 3 * time.Second,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f := &fixture{c: c, conns: map[string]*grpc.ClientConn{}}
	f.master = api.NewMasterClient(f.dial(t, c.MasterAddr()))
	resp, err := f.master.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: "t", Kind: api.TableKind_TABLE_KIND_POINT,
		Options: &api.TableOptions{Partitions: 1, Replication: 3, Storage: "ssd"}})
	if err != nil {
		t.Fatal(err)
	}
	p := resp.GetMap().GetPartitions()[0]
	describe := func() *api.Partition {
		d, err := f.master.DescribeTable(ctx, &api.DescribeTableRequest{Tenant: api.DefaultTenant, Name: "t"})
		if err != nil {
			t.Fatal(err)
		}
		return d.GetMap().GetPartitions()[0]
	}
	put := func(i int) uint64 {
		t.Helper()
		r, err := eventually(t, func() (*api.PutResponse, error) {
			p = describe()
			return f.server(t, p).Put(ctx, &api.PutRequest{Header: hdr(p), Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "v%d", i)})
		})
		if err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		return r.GetLsn()
	}
	for i := range 50 {
		put(i)
	}
	ids := c.ServerIDs()
	old := primary(p).GetServerId()
	victim := slices.Index(ids, old)
	if err := c.KillServer(victim); err != nil {
		t.Fatal(err)
	}
	// The primary fails over; the dead server's replica stays, demoted.
	deadline := time.Now().Add(20 * time.Second)
	for primary(describe()).GetServerId() == old {
		if time.Now().After(deadline) {
			t.Fatal("no failover")
		}
		time.Sleep(20 * time.Millisecond)
	}
	var last uint64
	for i := 50; i < 100; i++ {
		last = put(i)
	}
	if q := describe(); len(q.GetReplicas()) != 3 || !slices.ContainsFunc(q.GetReplicas(), func(r *api.Replica) bool { return r.GetServerId() == old }) {
		t.Fatalf("the dead server's replica was not kept: %v", q.GetReplicas())
	}
	if err := c.RestartServer(ctx, victim); err != nil {
		t.Fatal(err)
	}
	// It catches up from the log: every write, and no copy.
	addr := c.ServerAddrs()[victim]
	sc := api.NewTableServerClient(f.dial(t, addr))
	for i := range 100 {
		h := hdr(describe())
		h.ReadAny, h.MinLsn = true, last
		g, err := eventually(t, func() (*api.GetResponse, error) {
			return sc.Get(ctx, &api.GetRequest{Header: h, Key: fmt.Appendf(nil, "k%d", i)})
		})
		if err != nil || string(g.GetValue()) != fmt.Sprintf("v%d", i) {
			t.Fatalf("the returned replica, key %d: %v, %v\n%s", i, g, err, logs.String())
		}
	}
	// (Another replica may copy meanwhile: a secondary too slow for the
	// log's seal on a loaded machine is dropped and replaced at once.)
	returned := fmt.Sprintf("part=server-%d ", victim)
	if slices.ContainsFunc(strings.Split(logs.String(), "\n"), func(line string) bool {
		return strings.Contains(line, "copied a snapshot") && strings.Contains(line, returned)
	}) {
		t.Fatalf("a replica was copied though the dead server came back within ReplaceAfter; logs:\n%s", logs.String())
	}
	// Dead past ReplaceAfter: replaced on the spare server, which copies.
	p = describe()
	var sec string
	for _, r := range p.GetReplicas() {
		if r.GetRole() == api.ReplicaRole_REPLICA_ROLE_SECONDARY {
			sec = r.GetServerId()
		}
	}
	if err := c.KillServer(slices.Index(ids, sec)); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(30 * time.Second)
	for slices.ContainsFunc(describe().GetReplicas(), func(r *api.Replica) bool { return r.GetServerId() == sec }) {
		if time.Now().After(deadline) {
			t.Fatalf("a server dead for 30 s (ReplaceAfter 3 s) was not replaced")
		}
		time.Sleep(50 * time.Millisecond)
	}
	deadline = time.Now().Add(30 * time.Second)
	for !strings.Contains(logs.String(), "copied a snapshot") {
		if time.Now().After(deadline) {
			t.Fatal("the replacement never copied a snapshot")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
