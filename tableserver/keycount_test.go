package tableserver_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/testcluster"
)

// TestDescribeCountsClientKeys: the key count a table's replicas report
// (what `tabula table describe` shows as KEYS) is the keys clients wrote,
// not the engine's reserved records: one put with a request id also
// stores its outcome and the applied LSN, and still counts as one key.
func TestDescribeCountsClientKeys(t *testing.T) {
	for _, kind := range []api.TableKind{api.TableKind_TABLE_KIND_POINT, api.TableKind_TABLE_KIND_ORDERED} {
		t.Run(api.KindName(kind), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c, err := testcluster.Start(ctx, testcluster.Options{Servers: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			f := &fixture{c: c, conns: map[string]*grpc.ClientConn{}}
			f.master = api.NewMasterClient(f.dial(t, c.MasterAddr()))
			resp, err := f.master.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: "t", Kind: kind,
				Options: &api.TableOptions{Partitions: 1, Replication: 1, Storage: "ssd"}})
			if err != nil {
				t.Fatal(err)
			}
			p := resp.GetMap().GetPartitions()[0]
			for i := range 3 {
				if _, err := eventually(t, func() (*api.PutResponse, error) {
					return f.server(t, p).Put(ctx, &api.PutRequest{Header: hdr(p), Key: []byte("k"), Value: []byte("v"), RequestId: fmt.Sprintf("req-%d", i)})
				}); err != nil {
					t.Fatal(err)
				}
			}
			waitFor(t, "the replica to report its keys", func() (bool, string) {
				d, err := f.master.DescribeTable(ctx, &api.DescribeTableRequest{Tenant: api.DefaultTenant, Name: "t"})
				if err != nil {
					return false, err.Error()
				}
				for _, s := range d.GetReplicas() {
					if s.GetPartitionId() == p.GetId() && s.GetWrites() > 0 {
						return s.GetKeys() == 1, fmt.Sprintf("%d keys reported", s.GetKeys())
					}
				}
				return false, "no report yet"
			})
		})
	}
}
