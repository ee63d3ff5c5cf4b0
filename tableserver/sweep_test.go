package tableserver_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/testcluster"
)

// TestStaleDataSwept: a server that comes back after its replicas were
// replaced elsewhere, and after a table it held was dropped, deletes both
// partitions' files and moved-aside copies the cluster no longer needs.
func TestStaleDataSwept(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := testcluster.Start(ctx, testcluster.Options{Servers: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f := &fixture{c: c, conns: map[string]*grpc.ClientConn{}}
	master := api.NewMasterClient(f.dial(t, c.MasterAddr()))
	create := func(name string) *api.Partition {
		resp, err := master.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: name, Kind: api.TableKind_TABLE_KIND_POINT,
			Options: &api.TableOptions{Partitions: 1, Replication: 3, Storage: "ssd"}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetMap().GetPartitions()[0]
	}
	rep, gone := create("rep"), create("gone")
	ids := c.ServerIDs()
	hosts := func(p *api.Partition, id string) bool {
		return slices.ContainsFunc(p.GetReplicas(), func(r *api.Replica) bool { return r.GetServerId() == id })
	}
	victim := -1
	for i, id := range ids {
		if hosts(rep, id) && hosts(gone, id) && primary(rep).GetServerId() != id {
			victim = i
			break
		}
	}
	if victim < 0 {
		t.Skip("no server hosts a secondary of rep and a replica of gone")
	}
	dir := filepath.Join(c.Dir(), "server-"+strconv.Itoa(victim))
	part := func(id uint64) string { return filepath.Join(dir, "partitions", strconv.FormatUint(id, 10)) }
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("the victim's partition directories", func() bool {
		_, e1 := os.Stat(part(rep.GetId()))
		_, e2 := os.Stat(part(gone.GetId()))
		return e1 == nil && e2 == nil
	})
	if err := c.KillServer(victim); err != nil {
		t.Fatal(err)
	}
	waitFor("the victim's replica of rep replaced", func() bool {
		d, err := master.DescribeTable(ctx, &api.DescribeTableRequest{Tenant: api.DefaultTenant, Name: "rep"})
		return err == nil && !hosts(d.GetMap().GetPartitions()[0], ids[victim])
	})
	if _, err := master.DropTable(ctx, &api.DropTableRequest{Tenant: api.DefaultTenant, Name: "gone"}); err != nil {
		t.Fatal(err)
	}
	// An old moved-aside copy of rep's partition.
	orphan := filepath.Join(dir, "orphaned", strconv.FormatUint(rep.GetId(), 10)+"-e1-1")
	if err := os.MkdirAll(orphan, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := c.RestartServer(ctx, victim); err != nil {
		t.Fatal(err)
	}
	waitFor("stale partition data deleted", func() bool {
		_, e1 := os.Stat(part(rep.GetId()))
		_, e2 := os.Stat(part(gone.GetId()))
		_, e3 := os.Stat(orphan)
		return os.IsNotExist(e1) && os.IsNotExist(e2) && os.IsNotExist(e3)
	})
}
