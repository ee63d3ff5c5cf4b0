package tablemaster_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/keyspace"
	"github.com/tabuladb/tabula/internal/testcluster"
	"github.com/tabuladb/tabula/tablemaster"
	"github.com/tabuladb/tabula/tablemaster/splitpolicy"
)

// TestAutoSplitHotPartition: a 3-partition table whose first partition
// takes every request, all on keys in the lowest quarter of its hash
// range, on a master with a low load threshold. The leader splits it by
// itself, at its primary's load hint (inside that quarter, not at the
// midpoint of the range), the children record that they were split by
// load, no other partition splits, no request fails, and every
// acknowledged write reads back.
func TestAutoSplitHotPartition(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	tc, err := testcluster.Start(ctx, testcluster.Options{Servers: 3, Dir: t.TempDir(), MasterOptions: func(o *tablemaster.Options) {
		o.AutoSplit = splitpolicy.Options{QPS: 50, Sustain: time.Second, Cooldown: time.Hour}
		o.AutoSplitInterval = 100 * time.Millisecond
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tc.Close() })
	c, err := client.New(ctx, tc.ClientOptions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := c.CreateTable(ctx, "hot", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 3, Replication: 3}); err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(tc.MasterAddr(), append(tc.Credential().DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	master := api.NewMasterClient(cc)
	describe := func() (*api.PartitionMap, error) {
		d, err := master.DescribeTable(ctx, &api.DescribeTableRequest{Tenant: api.DefaultTenant, Name: "hot"})
		return d.GetMap(), err
	}
	_, end0 := keyspace.Range(0, 3)
	var keys [][]byte
	for i := 0; len(keys) < 300; i++ {
		if k := fmt.Appendf(nil, "k%d", i); keyspace.Hash(k) < end0/4 {
			keys = append(keys, k)
		}
	}
	tbl := c.Table("hot")
	var failed, acked atomic.Int64
	var first atomic.Value
	var mu sync.Mutex
	latest := map[string]string{} // guarded by mu
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := keys[(i*7+w*31)%len(keys)]
				v := fmt.Sprintf("%d-%d", w, i)
				if err := tbl.Put(ctx, k, []byte(v)); err != nil {
					if ctx.Err() == nil {
						failed.Add(1)
						first.CompareAndSwap(nil, err.Error())
					}
					continue
				}
				mu.Lock()
				latest[string(k)] = v
				mu.Unlock()
				if _, err := tbl.Get(ctx, k); err != nil && ctx.Err() == nil {
					failed.Add(1)
					first.CompareAndSwap(nil, err.Error())
				}
				acked.Add(1)
			}
		})
	}
	stopped := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(stopped)
	var pm *api.PartitionMap
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for done := false; !done; {
		pm, err = describe()
		if err == nil && len(pm.GetPartitions()) >= 4 {
			done = true
			for _, p := range pm.GetPartitions() {
				done = done && p.GetLog().GetExtent() != 0
			}
		}
		if done {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no automatic split: %d partitions (%v), %d requests acknowledged", len(pm.GetPartitions()), err, acked.Load())
		case <-tick.C:
		}
	}
	if n := len(pm.GetPartitions()); n != 4 {
		t.Fatalf("%d partitions after the split, want 4 (only the hot one splits)", n)
	}
	left, right := pm.GetPartitions()[0], pm.GetPartitions()[1]
	for _, p := range []*api.Partition{left, right} {
		if p.GetSplitReason() != string(splitpolicy.ByLoad) || p.GetSplitUnixMs() == 0 || p.GetSplitFrom() == 0 {
			t.Fatalf("child %d: split from %d by %q at %d; want a split by load", p.GetId(), p.GetSplitFrom(), p.GetSplitReason(), p.GetSplitUnixMs())
		}
	}
	if left.GetEnd() >= end0/4 {
		t.Fatalf("split at %#x: the load is below %#x, the midpoint would be %#x: the load hint was not used", right.GetStart(), end0/4, end0/2)
	}
	// Requests go on across the new map.
	after := acked.Load()
	for acked.Load() < after+200 {
		select {
		case <-ctx.Done():
			t.Fatalf("requests stalled after the split: %d acknowledged", acked.Load())
		case <-tick.C:
		}
	}
	stopped()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d requests failed (first: %v)", n, first.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	for k, v := range latest {
		if got, err := tbl.Get(ctx, []byte(k)); err != nil || string(got) != v {
			t.Fatalf("%s: %q, %v; want %q (the last acknowledged write)", k, got, err, v)
		}
	}
}
