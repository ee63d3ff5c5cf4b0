package tableserver_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/engines/vfs"
	"github.com/tabuladb/tabula/internal/testcluster"
	"github.com/tabuladb/tabula/tableserver"
)

// TestEngineFaultReplaced: a disk that fails every write under one
// replica's engine, while clients write: the replica reports itself
// failed, serves nothing, and the master replaces it from a healthy one;
// no write fails and every acknowledged write is there after.
func TestEngineFaultReplaced(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fss := make([]*vfs.MemFS, 4)
	for i := range fss {
		fss[i] = vfs.NewMem()
	}
	c, err := testcluster.Start(ctx, testcluster.Options{Servers: 4,
		ServerOptions: func(i int, o *tableserver.Options) { o.EngineFS = fss[i] }})
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
	var last uint64
	put := func(i int) {
		t.Helper()
		r, err := eventually(t, func() (*api.PutResponse, error) {
			p = describe()
			return f.server(t, p).Put(ctx, &api.PutRequest{Header: hdr(p), Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "v%d", i)})
		})
		if err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		last = max(last, r.GetLsn())
	}
	for i := range 50 {
		put(i)
	}
	ids := c.ServerIDs()
	var bad string
	for _, r := range p.GetReplicas() {
		if r.GetRole() == api.ReplicaRole_REPLICA_ROLE_SECONDARY {
			bad = r.GetServerId()
		}
	}
	fss[slices.Index(ids, bad)].Inject(vfs.Fault{Ops: vfs.OpWrite | vfs.OpSync | vfs.OpCreate, Sticky: true})
	for i := 50; i < 400; i++ {
		put(i)
	}
	deadline := time.Now().Add(30 * time.Second)
	for slices.ContainsFunc(describe().GetReplicas(), func(r *api.Replica) bool { return r.GetServerId() == bad }) {
		if time.Now().After(deadline) {
			t.Fatalf("the replica on the failing disk (%s) was never replaced: %v", bad, describe().GetReplicas())
		}
		put(0)
		time.Sleep(20 * time.Millisecond)
	}
	p = describe()
	if len(p.GetReplicas()) != 3 {
		t.Fatalf("replicas after the replacement: %v", p.GetReplicas())
	}
	for _, r := range p.GetReplicas() {
		sc := api.NewTableServerClient(f.dial(t, r.GetAddr()))
		h := hdr(p)
		h.ReadAny, h.MinLsn = true, last
		for i := range 400 {
			g, err := eventually(t, func() (*api.GetResponse, error) {
				return sc.Get(ctx, &api.GetRequest{Header: h, Key: fmt.Appendf(nil, "k%d", i)})
			})
			if err != nil || string(g.GetValue()) != fmt.Sprintf("v%d", i) {
				t.Fatalf("replica on %s, key %d: %v, %v", r.GetServerId(), i, g, err)
			}
		}
	}
}
