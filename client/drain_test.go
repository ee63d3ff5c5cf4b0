package client_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
)

// Draining a server (what SIGTERM does) hands its primaries to secondaries
// with no failed client request: writers and readers run through it, and
// every acknowledged write reads back.
func TestDrainFailsNoRequest(t *testing.T) {
	tc := startCluster(t, 4)
	c := newClient(t, tc)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tbl := createTable(t, c, "drain", &api.TableOptions{Partitions: 8, Replication: 3})
	var (
		wg     sync.WaitGroup
		failed atomic.Int64
		done   atomic.Int64 // writes acknowledged and read back
		mu     sync.Mutex
		acked  = map[string]string{}
		errs   []string // the first few failures, with when they happened
	)
	start := time.Now()
	stop := make(chan struct{})
	// Writers stop before the test returns, whichever way it returns, so
	// no failure is reported after the test has completed.
	var stopOnce sync.Once
	halt := func() { stopOnce.Do(func() { close(stop); wg.Wait() }) }
	defer halt()
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k, v := fmt.Sprintf("w%d-%d", w, i%200), fmt.Sprintf("v%d", i)
				cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
				err := tbl.Put(cctx, []byte(k), []byte(v))
				if err == nil {
					_, err = tbl.Get(cctx, []byte(k))
				}
				ccancel()
				if err != nil {
					if failed.Add(1) <= 5 {
						mu.Lock()
						errs = append(errs, fmt.Sprintf("at %v: %s: %v", time.Since(start).Round(time.Millisecond), k, err))
						mu.Unlock()
					}
					continue
				}
				mu.Lock()
				acked[k] = v
				mu.Unlock()
				done.Add(1)
			}
		}()
	}
	// Load runs before the drain and after it: wait on acknowledged writes,
	// not on time.
	waitDone := func(n int64) {
		deadline := time.After(30 * time.Second)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for done.Load() < n {
			select {
			case <-deadline:
				halt()
				t.Fatalf("only %d of %d writes acknowledged; %d failed, first: %v", done.Load(), n, failed.Load(), errs)
			case <-tick.C:
			}
		}
	}
	waitDone(200)
	m, err := tbl.Map(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Drain the server holding the first partition's primary.
	target := -1
	for i, a := range tc.ServerAddrs() {
		for _, r := range m.GetPartitions()[0].GetReplicas() {
			if r.GetRole() == api.ReplicaRole_REPLICA_ROLE_PRIMARY && r.GetAddr() == a {
				target = i
			}
		}
	}
	if target < 0 {
		t.Fatal("no primary of partition 0 among the servers")
	}
	if err := tc.Server(target).Drain(); err != nil {
		t.Fatal(err)
	}
	waitDone(done.Load() + 300)
	halt()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d requests failed during the drain; first: %v", n, errs)
	}
	for k, v := range acked {
		got, err := tbl.Get(ctx, []byte(k))
		if err != nil || string(got) != v {
			t.Fatalf("acknowledged %s=%s reads back %q, %v", k, v, got, err)
		}
	}
}
