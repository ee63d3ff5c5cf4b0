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
)

// TestMergeUnderLoad: on a live cluster of real processes (four servers,
// three replicas per partition, so adjacent partitions of a new table sit
// on different servers) a point table's partitions split and merge back
// while four clients write and read a few hundred keys: two pairs of
// split children merge, then two adjacent partitions of the table as
// created (the master first moves one's replicas onto the other's
// servers and transfers its primary; through the CLI with --wait), then
// a merge's child with its neighbour. No request fails, every key is read
// back, and the history is linearizable; it prints the merges' p50 and
// p99 from command to the child taking a write.
func TestMergeUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process: skipped with -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const table = "mg"
	r := startReshape(t, ctx, 4, 4, table)
	masterAddr, admin := r.masterAddr, r.admin

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
	takesWrites := func(p *api.Partition) {
		t.Helper()
		key := keyIn(p.GetStart(), p.GetEnd())
		waitFor(t, 60*time.Second, fmt.Sprintf("partition %d takes writes", p.GetId()), func() (bool, error) {
			wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
			defer wcancel()
			return wt.Put(wctx, key, []byte("probe")) == nil, nil
		})
	}
	loadRuns := func(what string) { t.Helper(); r.loadRuns(what, 100) }
	// [A B C D] -> split 0 and 4 -> [a1 a2 B C d1 d2].
	for _, idx := range []uint32{0, 4} {
		resp, err := mc.SplitPartition(ctx, &api.SplitPartitionRequest{Tenant: api.DefaultTenant, Table: table, Index: idx, Wait: true})
		if err != nil || !resp.GetDone() {
			t.Fatalf("split index %d: %v %v", idx, resp, err)
		}
		loadRuns("a split")
	}
	var took []time.Duration
	merge := func(idx uint32) *api.Partition {
		t.Helper()
		t0 := time.Now()
		resp, err := mc.MergePartitions(ctx, &api.MergePartitionsRequest{Tenant: api.DefaultTenant, Table: table, Index: idx, Wait: true})
		if err != nil || !resp.GetDone() {
			t.Fatalf("merge index %d: %v %v", idx, resp, err)
		}
		takesWrites(resp.GetChild())
		took = append(took, time.Since(t0))
		loadRuns("a merge")
		return resp.GetChild()
	}
	// The split children merge back: [a B C d1 d2], then [a B C d].
	merge(0)
	merge(3)
	// B and C as the table was created: on different servers as a rule.
	d, err := admin.DescribeTable(ctx, table)
	if err != nil {
		t.Fatal(err)
	}
	ps := d.GetMap().GetPartitions()
	if len(ps) != 4 {
		t.Fatalf("%d partitions after 2 splits and 2 merges of 4, want 4", len(ps))
	}
	t.Logf("before merging 1 and 2: %s and %s", replicasLine(ps[1]), replicasLine(ps[2]))
	t0 := time.Now()
	out := mustCLI(t, masterAddr, "--timeout", "3m", "partition", "merge", table, "1", "--wait")
	t.Logf("tabula partition merge %s 1 --wait:\n%s", table, out)
	if !strings.Contains(out, "merging partitions "+table+"/1 and 2") || !strings.Contains(out, "merged in ") {
		t.Fatalf("merge output: %q", out)
	}
	d, err = admin.DescribeTable(ctx, table)
	if err != nil {
		t.Fatal(err)
	}
	ps = d.GetMap().GetPartitions()
	if len(ps) != 3 || ps[1].GetStart() != ps[0].GetEnd()+1 || ps[2].GetStart() != ps[1].GetEnd()+1 {
		t.Fatalf("after merging 1 and 2: %v", ps)
	}
	takesWrites(ps[1])
	took = append(took, time.Since(t0))
	loadRuns("the CLI's merge")
	// A merge's child with its neighbour: [aBC d].
	merge(0)
	r.check("the merges")

	d, err = admin.DescribeTable(ctx, table)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(d.GetMap().GetPartitions()); n != 2 {
		t.Fatalf("%d partitions at the end, want 2", n)
	}
	// The last partition has none after it: refused, with the reason.
	if out, errOut, err := cli(t, masterAddr, nil, "partition", "merge", table, "1"); err == nil || !strings.Contains(errOut, "partition_not_found") {
		t.Fatalf("merge of the last partition: %v\nstdout: %s\nstderr: %s", err, out, errOut)
	}
	slices.Sort(took)
	t.Logf("%d operations, 0 failed; merge command -> the child took a write: p50 %v, p99 %v, max %v (of %d)",
		r.ops.Load(), took[len(took)/2], took[len(took)*99/100], took[len(took)-1], len(took))
	t.Logf("engine merges took %v", r.engineTimes("partitions merged"))
}

// TestReshaping: describe's lines for pending splits and merges.
func TestReshaping(t *testing.T) {
	rep := func(id string, primary bool) *api.Replica {
		role := api.ReplicaRole_REPLICA_ROLE_SECONDARY
		if primary {
			role = api.ReplicaRole_REPLICA_ROLE_PRIMARY
		}
		return &api.Replica{ServerId: id, Role: role}
	}
	mg := &api.PartitionMerge{LeftId: 4, RightId: 5, ChildId: 9}
	parts := []*api.Partition{
		{Id: 3, Index: 0, Split: &api.PartitionSplit{LeftId: 7, RightId: 8}},
		{Id: 4, Index: 1, Merge: mg, Replicas: []*api.Replica{rep("a", true), rep("b", false)}},
		{Id: 5, Index: 2, Merge: mg, Replicas: []*api.Replica{rep("b", true), rep("c", false)}},
	}
	got := strings.Join(reshaping(parts), "\n")
	want := "  #0 (id 3): splitting into 7 and 8\n  #1 (id 4) and #2 (id 5): merging into 9, aligning (replicas [a* b] and [b* c])"
	if got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	parts[2].Replicas = []*api.Replica{rep("b", false), rep("a", true)}
	if got := reshaping(parts)[1]; !strings.HasSuffix(got, "merging into 9, aligned: merge records and the engines' merge") {
		t.Fatalf("aligned: %s", got)
	}
}
