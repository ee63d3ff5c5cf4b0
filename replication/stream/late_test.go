package stream_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tabuladb/tabula/replication/stream"
	"github.com/tabuladb/tabula/replication/stream/streampb"
	"github.com/tabuladb/tabula/replication/stream/streamtest"
)

// TestLateTimerIsTheNodesSilence: a replicate timeout that fires late
// (the primary was paused: every timer fires at once when it runs again)
// gives the secondary another timeout to answer instead of dropping it
// for the primary's own silence; one that fires on time still drops.
func TestLateTimerIsTheNodesSilence(t *testing.T) {
	var offset atomic.Int64 // how far the node's clock is ahead of the real one
	clock := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	const timeout = time.Second
	c := streamtest.Start(t, 3, streamtest.Options{Node: stream.NodeOptions{ReplicateTimeout: timeout, ReplicateTimeoutMax: timeout, Now: clock}})
	t.Cleanup(c.Close)
	conns := stream.NewConns()
	t.Cleanup(func() { conns.Close() })
	ctx := context.Background()
	p := openExtentOnAll(t, ctx, c.Driver, "late", stream.AckQuorum)
	primary := c.Nodes[0].Node()
	seq := uint64(1)
	appendOne := func() *streampb.AppendResponse {
		t.Helper()
		resp, err := rawAppend(ctx, conns, c.Nodes[0].Addr, p.ID, nil, seq, []byte(fmt.Sprintf("entry %d", seq)))
		if err != nil {
			t.Fatal(err)
		}
		seq++
		return resp
	}
	appendOne()
	// Every link's stream open and answered once: the held batch below
	// goes out at once, before the clock jumps.
	waitFor(t, 5*time.Second, "en-2 holding the first append", func() bool {
		return replicaLength(t, ctx, conns, c.Nodes[2].Addr, p.ID) == replicaLength(t, ctx, conns, c.Nodes[0].Addr, p.ID)
	})

	// en-2 holds its answer; the append is acknowledged by the primary
	// and en-1. Then the primary "pauses" for 3 s: its clock jumps, so
	// the timer for en-2's batch fires 3 s late.
	release := c.Nodes[2].HoldReplicate()
	t.Cleanup(release)
	appendOne()
	// The batch reached en-2, so its timer runs on the clock before the
	// jump (a loaded machine may send it after appendOne returns).
	waitFor(t, 5*time.Second, "en-2 holding the second append", func() bool { return c.Nodes[2].Holding() >= 1 })
	offset.Store(int64(3 * time.Second))
	waitFor(t, 5*time.Second, "the late timer to be noticed", func() bool { return primary.Stats().LateTimeouts >= 1 })
	release()
	waitFor(t, 5*time.Second, "en-2's batch answered", func() bool {
		return replicaLength(t, ctx, conns, c.Nodes[2].Addr, p.ID) == replicaLength(t, ctx, conns, c.Nodes[0].Addr, p.ID)
	})
	if st := primary.Stats(); st.SecondaryDrops != 0 {
		t.Fatalf("en-2 dropped for the primary's pause: %+v", st)
	}
	if st := secondaryState(t, c, p.ID, "en-2"); !st.InAckSet {
		t.Fatalf("en-2 after the primary's pause: %+v, want in the ack set", st)
	}

	// Held again, with the clock steady: the timer fires on time and
	// en-2 is dropped.
	release = c.Nodes[2].HoldReplicate()
	t.Cleanup(release)
	waitFor(t, 10*time.Second, "en-2 dropped", func() bool {
		return len(appendOne().Dropped) > 0 || primary.Stats().SecondaryDrops > 0
	})
}
