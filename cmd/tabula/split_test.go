package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/keyspace"
	"github.com/tabuladb/tabula/internal/linearize"
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
	dir := t.TempDir()
	masterAddr := freeAddr(t)
	master := start(t, "master", append([]string{"master", "--listen", masterAddr, "--data", filepath.Join(dir, "master")}, fastTiming...)...)
	master.waitOutput("master serving", 15*time.Second)
	servers := make([]*proc, 3)
	for i := range servers {
		servers[i] = start(t, fmt.Sprintf("server-%d", i), "server", "--master", masterAddr, "--listen", freeAddr(t),
			"--data", filepath.Join(dir, fmt.Sprintf("server-%d", i)), "--fault-domain", fmt.Sprintf("fd-%d", i))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin, err := client.New(ctx, client.Options{Credential: testCred, Masters: []string{masterAddr}})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	waitFor(t, 20*time.Second, "3 live servers", func() (bool, error) {
		ss, err := admin.ListServers(ctx)
		n := 0
		for _, s := range ss {
			if s.GetAlive() {
				n++
			}
		}
		return n == 3, err
	})
	const table = "sp"
	if _, err := admin.CreateTable(ctx, table, api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 2, Storage: "ssd", Replication: 3}); err != nil {
		t.Fatal(err)
	}
	tbl := admin.Table(table)
	// Every partition serves before the load starts.
	waitFor(t, 20*time.Second, "the table takes writes", func() (bool, error) {
		return tbl.Put(ctx, []byte("probe"), []byte("x")) == nil, nil
	})

	rec := linearize.NewRecorder(linearize.Options{})
	const keys = 300
	var ops, failed atomic.Int64
	var failMu sync.Mutex
	var failures []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := fmt.Sprintf("k%d", rng.IntN(keys))
				octx, ocancel := context.WithTimeout(ctx, 10*time.Second)
				var err error
				if rng.IntN(2) == 0 {
					v := fmt.Sprintf("w%d-%d", w, i)
					c := rec.Begin(w, linearize.Input{Kind: linearize.Put, Key: k, Value: v})
					err = tbl.Put(octx, []byte(k), []byte(v))
					c.Finish(linearize.Output{}, err)
				} else {
					c := rec.Begin(w, linearize.Input{Kind: linearize.Get, Key: k})
					var v []byte
					v, err = tbl.Get(octx, []byte(k))
					found := err == nil
					if errors.Is(err, client.ErrKeyNotFound) {
						err = nil
					}
					c.Finish(linearize.Output{Found: found, Value: string(v)}, err)
				}
				ocancel()
				ops.Add(1)
				if err != nil {
					failed.Add(1)
					failMu.Lock()
					failures = append(failures, err.Error())
					failMu.Unlock()
				}
			}
		}()
	}
	stopLoad := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopLoad()
	waitFor(t, 20*time.Second, "300 operations", func() (bool, error) { return ops.Load() >= 300, nil })

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
		base := ops.Load()
		waitFor(t, 20*time.Second, "operations after the split", func() (bool, error) { return ops.Load() >= base+100, nil })
	}
	stopLoad()

	d, err := admin.DescribeTable(ctx, table)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(d.GetMap().GetPartitions()); n != 12 {
		t.Fatalf("%d partitions after 10 splits of 2, want 12", n)
	}
	// Final reads of every key, recorded: with the history they prove
	// every acknowledged write is there.
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		c := rec.Begin(99, linearize.Input{Kind: linearize.Get, Key: key})
		v, err := tbl.Get(ctx, []byte(key))
		found := err == nil
		if errors.Is(err, client.ErrKeyNotFound) {
			err = nil
		}
		if err != nil {
			t.Errorf("final read of %s: %v", key, err)
		}
		c.Finish(linearize.Output{Found: found, Value: string(v)}, err)
	}
	if n := failed.Load(); n > 0 {
		t.Errorf("%d of %d requests failed across the splits; first: %v", n, ops.Load(), failures[:min(5, len(failures))])
	}
	res := rec.Check(30 * time.Second)
	if res.Verdict != porcupine.Ok {
		t.Fatalf("history of %d operations not linearizable (%v):\n%s", res.Ops, res.Verdict, res.Report(20))
	}
	slices.Sort(took)
	t.Logf("%d operations, 0 failed; split command -> both children took a write: p50 %v, p99 %v, max %v (of %d)",
		ops.Load(), took[len(took)/2], took[len(took)*99/100], took[len(took)-1], len(took))
	// Where the time goes: each replica's engine split ("took").
	var engineSplits []string
	for _, s := range servers {
		for _, line := range strings.Split(s.output(), "\n") {
			if i := strings.Index(line, "took="); i >= 0 && strings.Contains(line, "partition split") {
				engineSplits = append(engineSplits, strings.Fields(line[i+5:])[0])
			}
		}
	}
	t.Logf("engine splits took %v", engineSplits)
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
