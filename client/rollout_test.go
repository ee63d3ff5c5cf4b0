package client_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
)

// rolloutReaders runs batch readers of bulk table tb until stop: every
// batch's values must come from one version (the "vN:" prefix). It returns
// a function that stops them and reports reads, failed and mixed batches,
// and the versions seen, and one that says how many batches of a version
// were read so far.
func rolloutReaders(t *testing.T, ctx context.Context, tb *client.Table, readers int) (stopReaders func() (reads, failed, mixed int64, seen map[string]int64, firstErr string), seenOf func(tag string) int64) {
	var (
		stop                atomic.Bool
		nReads, nFail, nMix atomic.Int64
		mu                  sync.Mutex
		seenV               = map[string]int64{}
		first               string
		wg                  sync.WaitGroup
	)
	for g := range readers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), testSeed))
			keys := make([][]byte, 32)
			for !stop.Load() {
				for i := range keys {
					keys[i] = []byte(bulkKey(r.IntN(bulkKeys)))
				}
				res, err := tb.BatchGet(ctx, keys)
				nReads.Add(1)
				if err != nil {
					if nFail.Add(1) == 1 {
						mu.Lock()
						first = err.Error()
						mu.Unlock()
					}
					continue
				}
				tag := ""
				for i, x := range res {
					v, _, ok := strings.Cut(string(x.Value), ":")
					if !x.Found || !ok || string(x.Value) != v+":"+string(keys[i]) {
						nMix.Add(1)
						break
					}
					if tag == "" {
						tag = v
					} else if v != tag {
						nMix.Add(1)
						break
					}
				}
				mu.Lock()
				seenV[tag]++
				mu.Unlock()
			}
		})
	}
	stopReaders = func() (int64, int64, int64, map[string]int64, string) {
		stop.Store(true)
		wg.Wait()
		return nReads.Load(), nFail.Load(), nMix.Load(), seenV, first
	}
	seenOf = func(tag string) int64 {
		mu.Lock()
		defer mu.Unlock()
		return seenV[tag]
	}
	return stopReaders, seenOf
}

// TestBulkRolloutRowByRow: a new version of a bulk table with three copies
// per partition rolls out one row at a time: an extra copy of each
// partition loads it on the spare server, the row switches, the oldest
// row leaves, three times; during it the copies serve both versions, and
// batch readers never fail nor see two versions in one answer. At the end
// every copy serves the new version and holds nothing else (the old one
// is retained in its streams only). A rollback rolls the old version out
// again the same way.
func TestBulkRolloutRowByRow(t *testing.T) {
	tc := startCluster(t, 4)
	c := newClient(t, tc)
	ctx := testCtx(t)
	const parts = 4
	if _, err := c.CreateTable(ctx, "model", api.TableKind_TABLE_KIND_BULK, &api.TableOptions{Partitions: parts}); err != nil {
		t.Fatal(err)
	}
	tb := c.Table("model")
	if err := publishDir(t, ctx, tb, buildVersion(t, parts, 1, 0, "v1", seq(0, bulkKeys), nil), parts, client.PublishOptions{}); err != nil {
		t.Fatalf("publish 1: %v", err)
	}
	checkCopies(t, ctx, tb, 1, 3)

	stopReaders, seenOf := rolloutReaders(t, ctx, tb, 4)
	// Watch the rollout from the side: rows switch one at a time, and
	// while it runs some partition has an extra copy.
	var (
		maxCopies, rowsSeen atomic.Int64
		watchDone           = make(chan struct{})
	)
	go func() {
		defer close(watchDone)
		for ctx.Err() == nil {
			st, err := tb.BulkStatus(ctx)
			if err != nil {
				return
			}
			if ro := st.GetRollout(); ro != nil && ro.GetVersion() == 2 {
				rowsSeen.Store(max(rowsSeen.Load(), int64(ro.GetRowsDone())))
			}
			if st.GetCurrent() == 2 {
				return
			}
			if m, err := tb.Map(ctx); err == nil {
				for _, p := range m.GetPartitions() {
					maxCopies.Store(max(maxCopies.Load(), int64(len(p.GetReplicas()))))
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	var rowsReported []int
	if err := publishDir(t, ctx, tb, buildVersion(t, parts, 2, 0, "v2", seq(0, bulkKeys), nil), parts, client.PublishOptions{
		Progress: func(p client.PublishProgress) {
			if p.Rows > 0 && (len(rowsReported) == 0 || rowsReported[len(rowsReported)-1] != p.RowsDone) {
				rowsReported = append(rowsReported, p.RowsDone)
			}
		}}); err != nil {
		t.Fatalf("publish 2: %v", err)
	}
	<-watchDone
	waitFor(t, 10*time.Second, "batch reads of the new version", func() bool { return seenOf("v2") >= 20 })
	reads, failed, mixed, seen, first := stopReaders()
	t.Logf("%d batch reads across the rollout (versions seen %v); extra copies seen: %d per partition; rows switched seen: %d; progress rows %v",
		reads, seen, maxCopies.Load(), rowsSeen.Load(), rowsReported)
	if failed > 0 || mixed > 0 {
		t.Fatalf("%d of %d batch reads failed, %d mixed versions (first failure: %s)", failed, reads, mixed, first)
	}
	if maxCopies.Load() != 4 {
		t.Errorf("the rollout never had an extra copy of a partition (most copies seen %d); want one row extra", maxCopies.Load())
	}
	checkCopies(t, ctx, tb, 2, 3)

	// Roll back to 1: out of its streams, row by row again.
	if err := tb.BulkRollback(ctx, 1); err != nil {
		t.Fatalf("rollback to 1: %v", err)
	}
	checkCopies(t, ctx, tb, 1, 3)
	if v, err := tb.Get(ctx, []byte(bulkKey(7))); err != nil || string(v) != "v1:"+bulkKey(7) {
		t.Fatalf("after the rollback: %q %v", v, err)
	}
}

// checkCopies checks that every partition of tb has want copies, each
// serving version and holding only it.
func checkCopies(t *testing.T, ctx context.Context, tb *client.Table, version uint64, want int) {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("every copy to serve version %d only", version), func() bool {
		m, err := tb.Map(ctx)
		if err != nil || m.GetBulk().GetCurrent() != version || m.GetBulk().GetRollout() != nil {
			return false
		}
		for _, p := range m.GetPartitions() {
			if len(p.GetReplicas()) != want {
				return false
			}
			for _, r := range p.GetReplicas() {
				if r.GetBulkServes() != version || len(r.GetBulkHolds()) != 1 || r.GetBulkHolds()[0] != version {
					return false
				}
			}
		}
		return true
	})
}

// TestBulkRolloutPauseResumeAbort: a paused rollout switches no further
// row until resumed; an aborted one rolls its switched rows back, the
// publish waiting on it says so, and the version is dropped.
func TestBulkRolloutPauseResumeAbort(t *testing.T) {
	tc := startCluster(t, 4)
	c := newClient(t, tc)
	ctx := testCtx(t)
	const parts = 2
	if _, err := c.CreateTable(ctx, "m", api.TableKind_TABLE_KIND_BULK, &api.TableOptions{Partitions: parts}); err != nil {
		t.Fatal(err)
	}
	tb := c.Table("m")
	if err := publishDir(t, ctx, tb, buildVersion(t, parts, 1, 0, "v1", seq(0, 2000), nil), parts, client.PublishOptions{}); err != nil {
		t.Fatalf("publish 1: %v", err)
	}
	if _, err := tb.BulkRollout(ctx, "pause"); api.DetailOf(err).GetReason() != "no_rollout" {
		t.Fatalf("pause with no rollout: %v", err)
	}
	// Publish 2 and pause it at once: at most the row loading switches.
	dir2 := buildVersion(t, parts, 2, 0, "v2", seq(0, 2000), nil)
	pubErr := make(chan error, 1)
	go func() { pubErr <- publishDir(t, ctx, tb, dir2, parts, client.PublishOptions{}) }()
	waitFor(t, 10*time.Second, "the rollout of version 2", func() bool {
		st, err := tb.BulkStatus(ctx)
		return err == nil && st.GetRollout().GetVersion() == 2
	})
	ro, err := tb.BulkRollout(ctx, "pause")
	if err != nil || !ro.GetPaused() {
		t.Fatalf("pause: %v %v", ro, err)
	}
	paused := ro.GetRowsDone()
	time.Sleep(1500 * time.Millisecond)
	st, err := tb.BulkStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ro := st.GetRollout(); ro == nil || !ro.GetPaused() || ro.GetRowsDone() > paused+1 || ro.GetRowsDone() == ro.GetRows() {
		t.Fatalf("paused at %d rows, then: %v (current %d)", paused, ro, st.GetCurrent())
	}
	if _, err := tb.BulkRollout(ctx, "resume"); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if err := <-pubErr; err != nil {
		t.Fatalf("publish 2 after resume: %v", err)
	}
	checkCopies(t, ctx, tb, 2, 3)

	// Publish 3, abort once a row serves it.
	dir3 := buildVersion(t, parts, 3, 0, "v3", seq(0, 2000), nil)
	go func() { pubErr <- publishDir(t, ctx, tb, dir3, parts, client.PublishOptions{}) }()
	waitFor(t, 10*time.Second, "the rollout of version 3 to start", func() bool {
		st, err := tb.BulkStatus(ctx)
		return err == nil && st.GetRollout().GetVersion() == 3
	})
	if _, err := tb.BulkRollout(ctx, "pause"); err != nil {
		t.Fatalf("pause 3: %v", err)
	}
	if _, err := tb.BulkRollout(ctx, "abort"); err != nil {
		t.Fatalf("abort: %v", err)
	}
	if err := <-pubErr; err == nil {
		t.Fatal("the publish of an aborted version returned no error")
	}
	checkCopies(t, ctx, tb, 2, 3)
	st, err = tb.BulkStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range st.GetVersions() {
		if v.GetVersion() == 3 {
			t.Fatalf("aborted version 3 is still listed: %v", v)
		}
	}
	if v, err := tb.Get(ctx, []byte(bulkKey(5))); err != nil || string(v) != "v2:"+bulkKey(5) {
		t.Fatalf("after the abort: %q %v", v, err)
	}
	// A new version publishes after an abort.
	if err := publishDir(t, ctx, tb, buildVersion(t, parts, 4, 0, "v4", seq(0, 2000), nil), parts, client.PublishOptions{}); err != nil {
		t.Fatalf("publish 4 after the abort: %v", err)
	}
	checkCopies(t, ctx, tb, 4, 3)
}
