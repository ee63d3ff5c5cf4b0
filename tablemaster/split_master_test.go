package tablemaster_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/testcluster"
	"github.com/tabuladb/tabula/tablemaster"
)

// TestSplitMasterCrash: three masters on raft; the leader is killed at
// each of its steps of a split (Options.OnSplitStep: once the split is
// marked, once the replicas reported it, once the children replaced the
// parent). The next leader finishes the split from the replicated state
// and the servers' reports: two children, each with a log, every key
// written before the split read back, and writes taken after it.
func TestSplitMasterCrash(t *testing.T) {
	for _, step := range []tablemaster.SplitStep{tablemaster.SplitMarked, tablemaster.SplitReady, tablemaster.SplitFinished} {
		if testing.Short() && step != tablemaster.SplitReady {
			continue // the race run: one step of three
		}
		t.Run(string(step), func(t *testing.T) { testSplitMasterCrash(t, step) })
	}
}

func testSplitMasterCrash(t *testing.T, step tablemaster.SplitStep) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var armed atomic.Bool
	hit := make(chan struct{}, 1)
	tc, err := testcluster.Start(ctx, testcluster.Options{Servers: 3, Masters: 3, Dir: t.TempDir(),
		LeaseDuration: 800 * time.Millisecond, DeadAfter: time.Second,
		MasterOptions: func(o *tablemaster.Options) {
			o.OnSplitStep = func(sctx context.Context, s tablemaster.SplitStep, pid uint64) {
				if s != step || !armed.CompareAndSwap(true, false) {
					return
				}
				hit <- struct{}{}
				<-sctx.Done() // the crash: this master is killed here
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	c, err := client.New(ctx, client.Options{Masters: tc.MasterAddrs(), Credential: tc.Credential()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.CreateTable(ctx, "sm", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 1, Replication: 3}); err != nil {
		t.Fatal(err)
	}
	tbl := c.Table("sm")
	const keys = 200
	for i := range keys {
		k := fmt.Appendf(nil, "k%d", i)
		if err := tbl.Put(ctx, k, k); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
	}
	leader := tc.Leader()
	if leader < 0 {
		t.Fatal("no leader")
	}
	cc, err := grpc.NewClient(tc.MasterAddrs()[leader], append(tc.Credential().DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	armed.Store(true)
	go func() {
		// Answered, or cut off by the kill: the split is the masters'
		// state either way.
		_, _ = api.NewMasterClient(cc).SplitPartition(ctx, &api.SplitPartitionRequest{Tenant: api.DefaultTenant, Table: "sm", Index: 0})
	}()
	select {
	case <-hit:
	case <-ctx.Done():
		t.Fatalf("the split never reached step %s", step)
	}
	if err := tc.KillMaster(leader); err != nil {
		t.Fatal(err)
	}
	// The next leader finishes it: two children with their logs.
	var desc string
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		d, err := c.DescribeTable(ctx, "sm")
		if err == nil {
			parts := d.GetMap().GetPartitions()
			desc = fmt.Sprint(parts)
			if len(parts) == 2 && parts[0].GetLog().GetExtent() != 0 && parts[1].GetLog().GetExtent() != 0 {
				break
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the split was not finished after the leader died at %s: %s", step, desc)
		case <-tick.C:
		}
	}
	if err := tc.RestartMaster(leader); err != nil {
		t.Fatal(err)
	}
	for i := range keys {
		k := fmt.Appendf(nil, "k%d", i)
		v, err := tbl.Get(ctx, k)
		if err != nil || string(v) != string(k) {
			t.Fatalf("get %s after the split: %q, %v", k, v, err)
		}
	}
	for i := range 50 {
		k := fmt.Appendf(nil, "after%d", i)
		if err := tbl.Put(ctx, k, k); err != nil {
			t.Fatalf("put %s after the split: %v", k, err)
		}
	}
}
