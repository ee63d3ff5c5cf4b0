package tablemaster

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/tabuladb/tabula/api"
)

// TestAlterTableRPC: a table's split settings set at create are changed
// by AlterTable (the fields the request sets; the others stay), survive a
// restart of the master, and bad settings are refused with a reason and
// change nothing.
func TestAlterTableRPC(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir := t.TempDir()
	opts := Options{DataDir: dir, Logger: testLogger(t)}
	r := start(t, opts)
	c := r.c
	if _, err := c.RegisterServer(ctx, &api.RegisterServerRequest{Addr: "10.0.0.1:1", FaultDomain: "a"}); err != nil {
		t.Fatal(err)
	}
	created, err := c.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: "t", Kind: api.TableKind_TABLE_KIND_POINT,
		Options: &api.TableOptions{Partitions: 2, Replication: 1, MaxPartitions: 8, SplitQps: 500}})
	if err != nil {
		t.Fatal(err)
	}
	if o := created.GetMap().GetTable().GetOptions(); o.GetMaxPartitions() != 8 || o.GetSplitQps() != 500 {
		t.Fatalf("created with %v", o)
	}
	u32 := func(v uint32) *uint32 { return &v }
	u64 := func(v uint64) *uint64 { return &v }
	resp, err := c.AlterTable(ctx, &api.AlterTableRequest{Tenant: api.DefaultTenant, Table: "t", MinPartitions: u32(2), SplitSizeBytes: u64(1 << 20)})
	if err != nil {
		t.Fatal(err)
	}
	want := func(o *api.TableOptions) {
		t.Helper()
		if o.GetMinPartitions() != 2 || o.GetMaxPartitions() != 8 || o.GetSplitSizeBytes() != 1<<20 || o.GetSplitQps() != 500 {
			t.Fatalf("options %v: want min 2, max 8 (unchanged), size 1 MiB, qps 500 (unchanged)", o)
		}
	}
	want(resp.GetTable().GetOptions())
	for _, c := range []struct {
		req           *api.AlterTableRequest
		reason, field string
		code          codes.Code
	}{
		{&api.AlterTableRequest{Tenant: api.DefaultTenant, Table: "t", MinPartitions: u32(9)}, "min_above_max", "options.min_partitions", codes.InvalidArgument},
		{&api.AlterTableRequest{Tenant: api.DefaultTenant, Table: "t", MaxPartitions: u32(api.MaxPartitions + 1)}, "too_many_partitions", "options.max_partitions", codes.InvalidArgument},
		{&api.AlterTableRequest{Tenant: api.DefaultTenant, Table: "nope", SplitQps: u64(1)}, "table_not_found", "", codes.NotFound},
	} {
		_, err := r.c.AlterTable(ctx, c.req)
		wantCode(t, err, c.code, c.reason, c.field)
	}
	if _, err := c.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: "b", Kind: api.TableKind_TABLE_KIND_BULK,
		Options: &api.TableOptions{Partitions: 2, Replication: 1}}); err != nil {
		t.Fatal(err)
	}
	_, err = c.AlterTable(ctx, &api.AlterTableRequest{Tenant: api.DefaultTenant, Table: "b", MaxPartitions: u32(4)})
	wantCode(t, err, codes.InvalidArgument, "bulk_table", "options")
	r.stop(t)
	r = start(t, opts)
	defer r.stop(t)
	pm, err := r.c.GetPartitionMap(ctx, &api.GetPartitionMapRequest{Tenant: api.DefaultTenant, Table: "t"})
	if err != nil {
		t.Fatal(err)
	}
	want(pm.GetMap().GetTable().GetOptions())
}
