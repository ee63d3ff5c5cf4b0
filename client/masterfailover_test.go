package client_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/testcluster"
)

// TestRaftMasterFailover: with three masters on raft, killing the leader
// stops no write (primaries keep their leases through the new leader) and
// catalog changes work again within two seconds, from a client that was
// given every master's address.
func TestRaftMasterFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tc, err := testcluster.Start(ctx, testcluster.Options{Servers: 3, Masters: 3, Dir: t.TempDir(),
		LeaseDuration: 800 * time.Millisecond, DeadAfter: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	c, err := client.New(ctx, client.Options{Masters: tc.MasterAddrs(), Credential: tc.Credential(), Seed: testSeed})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tbl := createTable(t, c, "ha", &api.TableOptions{Partitions: 3})
	var ok, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var firstErr error        // guarded by errMu
	var killedAt atomic.Int64 // unix nanoseconds; 0 before the kill
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := fmt.Appendf(nil, "w%d-%d", w, i)
				wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
				err := tbl.Put(wctx, k, k)
				wcancel()
				if err != nil {
					failed.Add(1)
					errMu.Lock()
					if firstErr == nil {
						when := "before the kill"
						if k := killedAt.Load(); k != 0 {
							when = fmt.Sprintf("%v after the kill", time.Duration(time.Now().UnixNano()-k))
						}
						firstErr = fmt.Errorf("%s: %w", when, err)
					}
					errMu.Unlock()
				} else {
					ok.Add(1)
				}
			}
		})
	}
	// Writes flow before the kill: the test is about riding through it.
	waitFor(t, 30*time.Second, "writes before the kill", func() bool { return ok.Load() >= 20 })
	leader := tc.Leader()
	if leader < 0 {
		t.Fatal("no leader")
	}
	before := ok.Load()
	killedAt.Store(time.Now().UnixNano())
	if err := tc.KillMaster(leader); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	var created time.Duration
	for i := 0; created == 0; i++ {
		if time.Since(t0) > 10*time.Second {
			t.Fatal("no CreateTable succeeded within 10 s of the leader's death")
		}
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := c.CreateTable(cctx, fmt.Sprintf("after-%d", i), api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 1})
		ccancel()
		if err == nil {
			created = time.Since(t0)
		}
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	t.Logf("CreateTable %v after the leader's kill; writes: %d before, %d in all, %d failed", created, before, ok.Load(), failed.Load())
	if created > 2*time.Second {
		t.Errorf("first CreateTable %v after the leader's kill (target 2 s)", created)
	}
	if failed.Load() > 0 {
		t.Errorf("%d writes failed across the master failover: %v", failed.Load(), firstErr)
	}
	if ok.Load() <= before {
		t.Errorf("no write succeeded after the leader's kill")
	}
}
