package stream_test

import (
	"context"
	"fmt"
	"hash/crc32"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tabuladb/tabula/replication/stream"
	"github.com/tabuladb/tabula/replication/stream/streampb"
	"github.com/tabuladb/tabula/replication/stream/streamtest"
)

// TestMeasureAckPolicies measures appends of 100-byte records through a
// Client on 3 real nodes on loopback with real files and fsyncs, under
// each ack policy: steady, then with one secondary's Replicate handler
// paused for 2 s (a SIGSTOP'd secondary as its primary sees it). Set
// TABULA_STREAM_MEASURE=1 to run it; it prints p50, p99, max and
// throughput.
func TestMeasureAckPolicies(t *testing.T) {
	if os.Getenv("TABULA_STREAM_MEASURE") == "" {
		t.Skip("a measurement: set TABULA_STREAM_MEASURE=1")
	}
	const (
		streams   = 4
		perStream = 4
		phase     = 2 * time.Second
	)
	for _, policy := range []stream.AckPolicy{stream.AckAll, stream.AckQuorum} {
		t.Run(string(policy), func(t *testing.T) {
			c := streamtest.Start(t, 3, streamtest.Options{Dir: t.TempDir(), Node: stream.NodeOptions{ReplicateTimeout: 150 * time.Millisecond}})
			defer c.Close()
			ctx := context.Background()
			cl := stream.NewClient(c.Driver, stream.ClientOptions{AppendTimeout: 5 * time.Second, MaxSeals: 64})
			defer cl.Close()
			for s := range streams {
				if _, err := c.Driver.Apply(ctx, stream.Command{Op: stream.OpCreateStream, Stream: fmt.Sprint("p", s), Ack: policy}); err != nil {
					t.Fatal(err)
				}
				if _, err := cl.Append(ctx, fmt.Sprint("p", s), []byte("warm-up")); err != nil {
					t.Fatal(err)
				}
			}
			run := func(name string, during func()) {
				var mu sync.Mutex
				var lat []time.Duration
				var fails int
				stop := time.Now().Add(phase)
				var wg sync.WaitGroup
				rec := make([]byte, 100)
				for s := range streams * perStream {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for time.Now().Before(stop) {
							t0 := time.Now()
							_, err := cl.Append(ctx, fmt.Sprint("p", s%streams), rec)
							d := time.Since(t0)
							mu.Lock()
							if err != nil {
								fails++
							} else {
								lat = append(lat, d)
							}
							mu.Unlock()
						}
					}()
				}
				if during != nil {
					during()
				}
				wg.Wait()
				slices.Sort(lat)
				q := func(p float64) time.Duration {
					if len(lat) == 0 {
						return 0
					}
					return lat[min(len(lat)-1, int(p*float64(len(lat))))]
				}
				t.Logf("%-6s %-16s %6d appends %7.0f/s  p50 %8v  p99 %8v  max %8v  failed %d",
					policy, name, len(lat), float64(len(lat))/phase.Seconds(), q(0.50).Round(time.Microsecond), q(0.99).Round(time.Microsecond), lat[len(lat)-1].Round(time.Microsecond), fails)
			}
			run("steady", nil)
			run("secondary-paused", func() { c.Nodes[2].PauseReplicate(phase) })
		})
	}
}

// TestMeasureJournal measures the partition-log shape of the table
// servers: 3 real nodes on loopback with real files and fsyncs, 15
// streams of 3 replicas with quorum acks, 16 writers appending 100-byte
// records. Set TABULA_STREAM_MEASURE=1 to run it; it prints appends/s,
// p50 and p99. With TABULA_STREAM_MEASURE_BEFORE=1 it first measures the
// nodes without their journal (every commit fsyncs its extent's file).
func TestMeasureJournal(t *testing.T) {
	if os.Getenv("TABULA_STREAM_MEASURE") == "" {
		t.Skip("a measurement: set TABULA_STREAM_MEASURE=1")
	}
	if os.Getenv("TABULA_STREAM_MEASURE_BEFORE") != "" {
		measureJournal(t, "no-journal", stream.NodeOptions{Journal: stream.JournalOptions{Disabled: true}}, false)
	}
	measureJournal(t, "journal", stream.NodeOptions{}, false)
	// As a table server appends: in-process calls of Node.Append on the
	// primary's node (no client RPC), replicated over gRPC.
	measureJournal(t, "journal, in-process primary", stream.NodeOptions{}, true)
}

func measureJournal(t *testing.T, name string, node stream.NodeOptions, inProcess bool) {
	const (
		streams = 15
		writers = 16
		phase   = 3 * time.Second
	)
	c := streamtest.Start(t, 3, streamtest.Options{Dir: t.TempDir(), Node: node})
	defer c.Close()
	ctx := context.Background()
	cl := stream.NewClient(c.Driver, stream.ClientOptions{})
	defer cl.Close()
	for s := range streams {
		if _, err := c.Driver.Apply(ctx, stream.Command{Op: stream.OpCreateStream, Stream: fmt.Sprint("p", s), Ack: stream.AckQuorum, Replicas: 3}); err != nil {
			t.Fatal(err)
		}
		if _, err := cl.Append(ctx, fmt.Sprint("p", s), []byte("warm-up")); err != nil {
			t.Fatal(err)
		}
	}
	// With inProcess, each stream's open extent and its primary's node.
	type target struct {
		node   *stream.Node
		extent uint64
	}
	var targets []target
	if inProcess {
		for s := range streams {
			info, err := c.Driver.Stream(ctx, fmt.Sprint("p", s))
			if err != nil {
				t.Fatal(err)
			}
			last := info.Last()
			targets = append(targets, target{node: c.Nodes[c.Index(last.Replicas[0].Node)].Node(), extent: last.ID})
		}
	}
	rec := make([]byte, 100)
	crc := crc32.Checksum(rec, crc32.MakeTable(crc32.Castagnoli))
	var seq atomic.Uint64
	appendOne := func(s int) error {
		if !inProcess {
			_, err := cl.Append(ctx, fmt.Sprint("p", s), rec)
			return err
		}
		_, err := targets[s].node.Append(ctx, &streampb.AppendRequest{Extent: targets[s].extent, Entries: []*streampb.Entry{{Seq: seq.Add(1), Blocks: [][]byte{rec}, Crcs: []uint32{crc}}}})
		return err
	}
	var mu sync.Mutex
	var lat []time.Duration
	var fails int
	start := time.Now()
	stop := start.Add(phase)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for i := 0; time.Now().Before(stop); i++ {
				t0 := time.Now()
				err := appendOne((w + i*writers) % streams)
				if err != nil {
					mu.Lock()
					fails++
					mu.Unlock()
					continue
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	el := time.Since(start)
	slices.Sort(lat)
	if len(lat) == 0 {
		t.Fatalf("no appends (%d failed)", fails)
	}
	q := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	t.Logf("%-28s %7d appends %7.0f/s  p50 %8v  p99 %8v  max %8v  failed %d",
		name, len(lat), float64(len(lat))/el.Seconds(), q(0.50).Round(time.Microsecond), q(0.99).Round(time.Microsecond), lat[len(lat)-1].Round(time.Microsecond), fails)
}
