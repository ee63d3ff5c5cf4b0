package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
)

// TestOrderedBatchesUnderKills runs `tabula master` and three `tabula
// server` processes with an ordered table of three key ranges, 3
// replicas each. Writers send conditional batches of 10 keys of one
// range (every key must be absent) while the primary of a range is
// killed with SIGKILL and restarted, four times. Afterwards every
// acknowledged batch is present whole, and every batch is present whole
// or not at all: no batch is ever seen in part.
func TestOrderedBatchesUnderKills(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process: skipped with -short")
	}
	dir := t.TempDir()
	masterAddr := freeAddr(t)
	master := start(t, "master", append([]string{"master", "--listen", masterAddr, "--data", filepath.Join(dir, "master")}, fastTiming...)...)
	master.waitOutput("master serving", 15*time.Second)
	fds := []string{"fd-0", "fd-1", "fd-2"}
	serverArgs := func(fd string) []string {
		return []string{"server", "--master", masterAddr, "--data", filepath.Join(dir, fd), "--fault-domain", fd}
	}
	var procsMu sync.Mutex
	servers := map[string]*proc{}
	for _, fd := range fds {
		servers[fd] = start(t, "server-"+fd, serverArgs(fd)...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := client.New(ctx, client.Options{Credential: testCred, Masters: []string{masterAddr}, RetryTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fdOf := map[string]string{}
	waitFor(t, 20*time.Second, "3 live servers", func() (bool, error) {
		ss, err := c.ListServers(ctx)
		for _, s := range ss {
			if s.GetAlive() {
				fdOf[s.GetId()] = s.GetFaultDomain()
			}
		}
		return len(fdOf) == 3, err
	})
	if _, err := c.CreateTable(ctx, "groups", api.TableKind_TABLE_KIND_ORDERED, &api.TableOptions{
		SplitPoints: [][]byte{[]byte("g1"), []byte("g2")}, Replication: 3}); err != nil {
		t.Fatal(err)
	}
	tbl := c.Table("groups")

	const perBatch = 10
	type outcome struct {
		acked bool
	}
	var (
		mu       sync.Mutex
		outcomes = map[string]outcome{} // batch name -> acknowledged
		wg       sync.WaitGroup
	)
	stop := make(chan struct{})
	for w := range 6 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				name := fmt.Sprintf("g%d/w%d-b%04d", w%3, w, i)
				muts := make([]client.Mutation, perBatch)
				for k := range muts {
					key := fmt.Sprintf("%s/k%d", name, k)
					muts[k] = client.Mutation{Key: []byte(key), Value: []byte(name), Cond: client.Condition{Kind: client.CondAbsent}}
				}
				wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
				err := tbl.BatchWrite(wctx, muts)
				wcancel()
				var cf *client.ConditionFailedError
				if errors.As(err, &cf) {
					// A retry found its own first attempt applied: only a
					// lost reply and a retry without the outcome kept
					// would do that.
					t.Errorf("batch %s: %v", name, err)
				}
				mu.Lock()
				outcomes[name] = outcome{acked: err == nil}
				mu.Unlock()
			}
		})
	}
	for round := range 4 {
		time.Sleep(1500 * time.Millisecond)
		m, err := tbl.Map(ctx)
		if err != nil {
			t.Fatal(err)
		}
		victim := primaryID(m.GetPartitions()[round%3])
		fd := fdOf[victim]
		procsMu.Lock()
		servers[fd].kill()
		procsMu.Unlock()
		time.Sleep(700 * time.Millisecond)
		procsMu.Lock()
		servers[fd] = start(t, fmt.Sprintf("server-%s-%d", fd, round), serverArgs(fd)...)
		procsMu.Unlock()
	}
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()

	// Every batch whole or absent; every acknowledged one whole.
	found := map[string]int{}
	err = tbl.ScanRange(ctx, client.RangeScan{}, func(k, v []byte) error {
		found[string(v)]++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	acked := 0
	for name, o := range outcomes {
		n := found[name]
		switch {
		case o.acked && n != perBatch:
			t.Errorf("acknowledged batch %s: %d of %d keys present", name, n, perBatch)
		case n != 0 && n != perBatch:
			t.Errorf("batch %s (not acknowledged): %d of %d keys present, a partial batch", name, n, perBatch)
		}
		if o.acked {
			acked++
		}
	}
	for name, n := range found {
		if _, ok := outcomes[name]; !ok {
			t.Errorf("%d keys of a batch %s nobody wrote", n, name)
		}
	}
	if acked < 50 {
		t.Errorf("only %d batches acknowledged over the run", acked)
	}
	t.Logf("%d batches, %d acknowledged", len(outcomes), acked)
}
