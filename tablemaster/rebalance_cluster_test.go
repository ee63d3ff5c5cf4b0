package tablemaster_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/testcluster"
	"github.com/tabuladb/tabula/tablemaster"
	"github.com/tabuladb/tabula/tablemaster/balance"
)

// TestRebalanceAddedServers: a table of 12 partitions on 3 servers; two
// servers join and the master's balancing rounds (Options.Rebalance)
// move replicas onto them and hand primaries around until the plan is
// empty. Then every server holds a replica count within the band of the
// mean, each partition has its 3 replicas, no write of the writers
// running all along failed, and every acknowledged write reads back. The
// planner balances replica counts only here (its load dimensions are
// floored away): how it weighs live rates is tablemaster/balance's to
// test.
func TestRebalanceAddedServers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	tc, err := testcluster.Start(ctx, testcluster.Options{Servers: 3, Dir: t.TempDir(), MasterOptions: func(o *tablemaster.Options) {
		o.Rebalance, o.RebalanceInterval = true, 200*time.Millisecond
		// Replica counts only: the writers' rates shift all the time, and
		// how the planner weighs them is tablemaster/balance's tests'.
		floors := balance.Vec{balance.DimReads: 1e18, balance.DimWrites: 1e18, balance.DimBusy: 1e18, balance.DimDisk: 1e18, balance.DimMemory: 1e18}
		o.Balance.Floors = &floors
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	opts := tc.ClientOptions()
	c, err := client.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.CreateTable(ctx, "rb", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 12, Replication: 3}); err != nil {
		t.Fatal(err)
	}
	tbl := c.Table("rb")
	cc, err := grpc.NewClient(tc.MasterAddr(), append(tc.Credential().DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	master := api.NewMasterClient(cc)

	var (
		failed, acked atomic.Int64
		first         atomic.Value
		mu            sync.Mutex
		latest        = map[string]string{}
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k, v := fmt.Sprintf("w%d-%d", w, i%200), fmt.Sprint(i)
				if err := tbl.Put(ctx, []byte(k), []byte(v)); err != nil {
					if ctx.Err() == nil {
						failed.Add(1)
						first.CompareAndSwap(nil, err.Error())
					}
					continue
				}
				mu.Lock()
				latest[k] = v
				mu.Unlock()
				acked.Add(1)
			}
		})
	}
	stopWriters := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
	})
	defer stopWriters()
	waitUntil := func(what string, cond func() (bool, string)) {
		t.Helper()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		var last string
		for {
			ok, state := cond()
			if ok {
				return
			}
			if ctx.Err() == nil {
				last = state
			}
			select {
			case <-ctx.Done():
				t.Fatalf("timed out waiting for %s: %s", what, last)
			case <-tick.C:
			}
		}
	}
	waitUntil("writes", func() (bool, string) { return acked.Load() >= 200, fmt.Sprint(acked.Load()) })

	start := time.Now()
	for range 2 {
		if _, err := tc.AddServer(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var plan *api.BalancePlanResponse
	waitUntil("an empty plan with no move under way", func() (bool, string) {
		var err error
		plan, err = master.BalancePlan(ctx, &api.BalancePlanRequest{})
		if err != nil {
			return false, err.Error()
		}
		// Empty and balanced: a plan is empty too while a moved replica's
		// first in-sync report is awaited (its partition stays put).
		if len(plan.GetActions()) != 0 || len(plan.GetBefore()) != 5 || !strings.HasPrefix(plan.GetNote(), "balanced") {
			return false, fmt.Sprintf("%d actions %v; %s", len(plan.GetActions()), plan.GetActions(), plan.GetNote())
		}
		d, err := master.DescribeTable(ctx, &api.DescribeTableRequest{Tenant: api.DefaultTenant, Name: "rb"})
		if err != nil {
			return false, err.Error()
		}
		if v := d.GetMap().GetVersion(); v != plan.GetMapVersion() {
			return false, fmt.Sprintf("the map moved on from the plan's version %d to %d", plan.GetMapVersion(), v)
		}
		for _, p := range d.GetMap().GetPartitions() {
			if len(p.GetReplicas()) != 3 {
				return false, fmt.Sprintf("partition %d has %d replicas", p.GetId(), len(p.GetReplicas()))
			}
		}
		return true, ""
	})
	t.Logf("balanced in %v; %d writes acknowledged", time.Since(start).Round(time.Millisecond), acked.Load())

	if off := replicasOff(plan); off != "" {
		t.Errorf("replica counts outside the band: %s", off)
	}
	total := 0
	for _, s := range plan.GetBefore() {
		total += int(s.GetReplicas())
	}
	if total != 36 {
		t.Errorf("%d replicas in all, want 36", total)
	}
	stopWriters()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d writes failed while balancing (first: %v)", n, first.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	for k, v := range latest {
		if got, err := tbl.Get(ctx, []byte(k)); err != nil || string(got) != v {
			t.Fatalf("%s: %q, %v; want %q (the last acknowledged write)", k, got, err, v)
		}
	}
}

// replicasOff names the servers of plan whose replica count is outside
// the band of the mean ("": none).
func replicasOff(plan *api.BalancePlanResponse) string {
	total := 0
	for _, s := range plan.GetBefore() {
		total += int(s.GetReplicas())
	}
	mean := float64(total) / float64(len(plan.GetBefore()))
	band := math.Max(plan.GetBand(), 1/mean) // one replica is the finest step
	var off []string
	for _, s := range plan.GetBefore() {
		if dev := math.Abs(float64(s.GetReplicas())/mean - 1); dev > band+1e-9 {
			off = append(off, fmt.Sprintf("%s %d (mean %.1f)", s.GetId(), s.GetReplicas(), mean))
		}
	}
	return strings.Join(off, ", ")
}
