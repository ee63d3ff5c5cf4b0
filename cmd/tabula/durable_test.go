package main

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
)

// TestKillServerMidWorkloadKeepsAcknowledgedWrites runs `tabula master` and
// two `tabula server` processes with an ssd table, kill -9s one server while
// writers are busy, restarts it on the same data directory, and checks that
// every acknowledged write is there.
func TestKillServerMidWorkloadKeepsAcknowledgedWrites(t *testing.T) {
	dir := t.TempDir()
	masterAddr := freeAddr(t)
	master := start(t, "master", append([]string{"master", "--listen", masterAddr, "--data", filepath.Join(dir, "master")}, fastTiming...)...)
	master.waitOutput("master serving", 15*time.Second)
	serverArgs := func(i int) []string {
		return []string{"server", "--master", masterAddr, "--data", filepath.Join(dir, fmt.Sprintf("server-%d", i)), "--fault-domain", fmt.Sprintf("fd-%d", i)}
	}
	servers := []*proc{start(t, "server-0", serverArgs(0)...), start(t, "server-1", serverArgs(1)...)}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := client.New(ctx, client.Options{Credential: testCred, Masters: []string{masterAddr}, RetryTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitFor(t, 20*time.Second, "2 live servers", func() (bool, error) {
		ss, err := c.ListServers(ctx)
		n := 0
		for _, s := range ss {
			if s.GetAlive() {
				n++
			}
		}
		return n == 2, err
	})
	if _, err := c.CreateTable(ctx, "durable", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 6, Storage: "ssd", Replication: 1}); err != nil {
		t.Fatal(err)
	}
	tbl := c.Table("durable")

	// Writers record what was acknowledged; each key is written once with
	// its own value, so any acknowledged key must read back exactly.
	var (
		mu    sync.Mutex
		acked = map[string]string{}
		wg    sync.WaitGroup
	)
	stop := make(chan struct{})
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k, v := fmt.Sprintf("w%d-%06d", w, i), fmt.Sprintf("value-%d-%d", w, i)
				wctx, wcancel := context.WithTimeout(ctx, 300*time.Millisecond) // half the keys wait for the killed server
				err := tbl.Put(wctx, []byte(k), []byte(v))
				wcancel()
				if err == nil {
					mu.Lock()
					acked[k] = v
					mu.Unlock()
				}
			}
		}()
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acked)
	}
	waitFor(t, 30*time.Second, "some acknowledged writes", func() (bool, error) { return count() > 300, nil })
	servers[0].kill()
	before := count()
	waitFor(t, 30*time.Second, "writes to continue on the other server", func() (bool, error) { return count() > before+100, nil })
	servers[0] = start(t, "server-0-restarted", serverArgs(0)...)
	servers[0].waitOutput("registered with master", 20*time.Second)
	waitFor(t, 30*time.Second, "writes after the restart", func() (bool, error) { return count() > before+400, nil })
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d writes acknowledged; checking every one", len(acked))
	keys := make([][]byte, 0, len(acked))
	for k := range acked {
		keys = append(keys, []byte(k))
	}
	for start := 0; start < len(keys); start += 500 {
		batch := keys[start:min(start+500, len(keys))]
		res, err := tbl.BatchGet(ctx, batch)
		if err != nil {
			t.Fatalf("BatchGet after restart: %v", err)
		}
		for i, r := range res {
			if !r.Found || string(r.Value) != acked[string(batch[i])] {
				t.Fatalf("acknowledged write %s lost or changed: found=%v value=%q", batch[i], r.Found, r.Value)
			}
		}
	}
	// The restarted server serves its partitions again (none moved: durable
	// partitions wait for their server).
	d, err := c.DescribeTable(ctx, "durable")
	if err != nil {
		t.Fatal(err)
	}
	hosts := map[string]int{}
	for _, p := range d.GetMap().GetPartitions() {
		hosts[primaryID(p)]++
	}
	if len(hosts) != 2 {
		t.Fatalf("partitions after restart: %v; want both servers to serve theirs", hosts)
	}
}
