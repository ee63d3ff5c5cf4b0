package stream_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tabuladb/tabula/replication/stream"
	"github.com/tabuladb/tabula/replication/stream/streamtest"
)

// TestDiskGroupCommitAndSeal measures, on the real file system (every
// append fsynced on three nodes), the append rate of concurrent writers
// to one stream, and the seal-and-continue latency when a secondary's
// server is stopped. Numbers go to the test log.
func TestDiskGroupCommitAndSeal(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement on the real file system")
	}
	c := streamtest.Start(t, 5, streamtest.Options{Dir: t.TempDir()})
	defer c.Close()
	ctx := context.Background()
	if _, err := c.Driver.Apply(ctx, stream.Command{Op: stream.OpCreateStream, Stream: "s"}); err != nil {
		t.Fatal(err)
	}
	var sealTook atomic.Int64
	cl := stream.NewClient(c.Driver, stream.ClientOptions{OnSeal: func(_ string, _, _ uint64, d time.Duration) {
		sealTook.Store(int64(d))
	}})
	defer cl.Close()
	payload := make([]byte, 1024)
	if _, err := cl.Append(ctx, "s", payload); err != nil { // opens the writer
		t.Fatal(err)
	}
	run := func(writers, each int) (rate float64, p50, p99 time.Duration) {
		var mu sync.Mutex
		var lat []time.Duration
		var wg sync.WaitGroup
		start := time.Now()
		for range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range each {
					t0 := time.Now()
					if _, err := cl.Append(ctx, "s", payload); err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					lat = append(lat, time.Since(t0))
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		el := time.Since(start)
		slices.Sort(lat)
		if len(lat) == 0 {
			return 0, 0, 0
		}
		return float64(len(lat)) / el.Seconds(), lat[len(lat)/2], lat[len(lat)*99/100]
	}
	for _, w := range []int{1, 16} {
		rate, p50, p99 := run(w, 200)
		t.Logf("disk, 1 KiB appends, %2d writers: %6.0f appends/s, p50 %v, p99 %v", w, rate, p50.Round(time.Microsecond), p99.Round(time.Microsecond))
	}
	info, _ := c.Driver.Stream(ctx, "s")
	victim := info.Last().Replicas[1].Node // a secondary
	c.Stop(c.Index(victim))
	if _, err := cl.Append(ctx, "s", payload); err != nil {
		t.Fatal(err)
	}
	d := time.Duration(sealTook.Load())
	if d == 0 {
		t.Fatal("no seal-and-continue")
	}
	t.Logf("disk, secondary %s stopped: seal-and-continue %v (target < 100ms)", victim, d.Round(time.Microsecond))
}
