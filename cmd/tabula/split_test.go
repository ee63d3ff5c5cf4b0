package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/keyspace"
)

// TestSplitUnderLoad: a point table's partitions split (one, again, then
// a child of a split, and more) on a live cluster of real processes while
// clients write and read a few hundred keys: no request fails, the
// history is linearizable (every acknowledged write is read back by the
// final reads), and each split takes the children from command to
// serving writes within a second; it prints p50 and p99.
func TestSplitUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process: skipped with -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const table = "sp"
	r := startReshape(t, ctx, 3, 2, table)
	masterAddr, admin, ops := r.masterAddr, r.admin, &r.ops

	// The first split through the CLI: its output names the children.
	out := mustCLI(t, masterAddr, "partition", "split", table, "0")
	t.Logf("tabula partition split %s 0:\n%s", table, out)
	if !strings.Contains(out, "split partition "+table+"/0") || strings.Count(out, "  partition ") != 2 {
		t.Fatalf("split output: %q", out)
	}

	// The others through the master's RPC, timed from the call to both
	// children taking a write.
	cc, err := grpc.NewClient(masterAddr, append(testCred.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	mc := api.NewMasterClient(cc)
	writer, err := client.New(ctx, client.Options{Credential: testCred, Masters: []string{masterAddr}})
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()
	wt := writer.Table(table)
	var took []time.Duration
	// Index 0 again (a child of the first split), then the last one, then
	// spread: 10 splits in all with the CLI's.
	for i, idx := range []uint32{0, 3, 1, 5, 2, 7, 4, 6, 8} {
		t0 := time.Now()
		resp, err := mc.SplitPartition(ctx, &api.SplitPartitionRequest{Tenant: api.DefaultTenant, Table: table, Index: idx, Wait: true})
		if err != nil {
			t.Fatalf("split %d (index %d): %v", i, idx, err)
		}
		if !resp.GetDone() {
			t.Fatalf("split %d: not done: %v", i, resp)
		}
		for _, p := range []*api.Partition{resp.GetLeft(), resp.GetRight()} {
			key := keyIn(p.GetStart(), p.GetEnd())
			waitFor(t, 10*time.Second, fmt.Sprintf("child %d takes writes", p.GetId()), func() (bool, error) {
				wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
				defer wcancel()
				return wt.Put(wctx, key, []byte("probe")) == nil, nil
			})
		}
		took = append(took, time.Since(t0))
		// The load runs a while on the new map between splits.
		r.loadRuns("the split", 100)
	}
	r.check("the splits")
	d, err := admin.DescribeTable(ctx, table)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(d.GetMap().GetPartitions()); n != 12 {
		t.Fatalf("%d partitions after 10 splits of 2, want 12", n)
	}
	slices.Sort(took)
	t.Logf("%d operations, 0 failed; split command -> both children took a write: p50 %v, p99 %v, max %v (of %d)",
		ops.Load(), took[len(took)/2], took[len(took)*99/100], took[len(took)-1], len(took))
	// Where the time goes: each replica's engine split ("took").
	t.Logf("engine splits took %v", r.engineTimes("partition split"))
	if took[len(took)/2] > time.Second {
		t.Errorf("the median split took %v: clients follow a split within a second", took[len(took)/2])
	}
}

// keyIn returns a key whose routing hash is in [start, end].
func keyIn(start, end uint64) []byte {
	for i := 0; ; i++ {
		k := []byte(fmt.Sprintf("probe-%d", i))
		if h := keyspace.Hash(k); h >= start && h <= end {
			return k
		}
	}
}
