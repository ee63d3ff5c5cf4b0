package stream_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tabuladb/tabula/replication/stream"
	"github.com/tabuladb/tabula/replication/stream/streamtest"
)

// waitFor polls cond until it holds, failing the test with what after
// timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		<-tick.C
	}
}

// secondaryState is the primary node's view of node's replica of extent.
func secondaryState(t *testing.T, c *streamtest.Cluster, extent uint64, node string) stream.SecondaryState {
	t.Helper()
	sts, ok := c.Nodes[0].Node().Secondaries(extent)
	if !ok {
		t.Fatalf("en-0 is not appending to extent %d", extent)
	}
	for _, st := range sts {
		if st.Node == node {
			return st
		}
	}
	t.Fatalf("extent %d has no secondary %s: %+v", extent, node, sts)
	return stream.SecondaryState{}
}

// dropSecondary holds en-2's replication and appends to extent until
// en-2 is dropped from its ack set, then appends more: en-2 misses them.
// It returns the hold's release and the next sequence number.
func dropSecondary(t *testing.T, c *streamtest.Cluster, conns *stream.Conns, extent uint64) (release func(), seq uint64) {
	t.Helper()
	ctx := context.Background()
	release = c.Nodes[2].HoldReplicate()
	t.Cleanup(release)
	seq = 1
	for deadline := time.Now().Add(5 * time.Second); ; seq++ {
		if time.Now().After(deadline) {
			t.Fatal("the held secondary was never dropped")
		}
		resp, err := rawAppend(ctx, conns, c.Nodes[0].Addr, extent, nil, seq, []byte(fmt.Sprintf("entry %d", seq)))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Dropped) > 0 {
			break
		}
	}
	for end := seq + 20; seq < end; seq++ {
		if _, err := rawAppend(ctx, conns, c.Nodes[0].Addr, extent, nil, seq+1, []byte(fmt.Sprintf("entry %d", seq+1))); err != nil {
			t.Fatal(err)
		}
	}
	if st := secondaryState(t, c, extent, "en-2"); st.InAckSet || st.Behind == 0 || st.Reason == "" {
		t.Fatalf("en-2 while held: %+v, want out of the ack set and behind, with a reason", st)
	}
	return release, seq + 1
}

// TestDroppedSecondaryRejoins: a secondary dropped from an extent's ack
// set (its replication held past the timeout) is brought back once it
// answers again, holding every byte the primary has, and the commit
// point: with appends going on, and with none at all after the hold ends
// (an idle partition must not keep a secondary behind until its extent
// fills).
func TestDroppedSecondaryRejoins(t *testing.T) {
	for _, writes := range []bool{true, false} {
		t.Run(fmt.Sprintf("writes=%v", writes), func(t *testing.T) {
			ctx := context.Background()
			c, conns, p := quorumExtent(t, 150*time.Millisecond, "rejoin")
			release, seq := dropSecondary(t, c, conns, p.ID)
			drops := c.Nodes[0].Node().Stats().SecondaryDrops
			release()
			waitFor(t, 5*time.Second, "en-2 back in the ack set", func() bool {
				if writes {
					if _, err := rawAppend(ctx, conns, c.Nodes[0].Addr, p.ID, nil, seq, []byte(fmt.Sprintf("entry %d", seq))); err != nil {
						t.Fatal(err)
					}
					seq++
				}
				return secondaryState(t, c, p.ID, "en-2").InAckSet
			})
			// In the ack set again: appends now wait for it like any other.
			for end := seq + 5; seq < end; seq++ {
				resp, err := rawAppend(ctx, conns, c.Nodes[0].Addr, p.ID, nil, seq, []byte(fmt.Sprintf("entry %d", seq)))
				if err != nil || len(resp.Dropped) > 0 {
					t.Fatalf("append %d after the rejoin: dropped %v, %v", seq, resp.GetDropped(), err)
				}
			}
			primary := replicaLength(t, ctx, conns, c.Nodes[0].Addr, p.ID)
			waitFor(t, 2*time.Second, "en-2 holding what the primary holds", func() bool {
				return replicaLength(t, ctx, conns, c.Nodes[2].Addr, p.ID) == primary
			})
			ext, err := c.Nodes[2].Node().Extent(p.ID)
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, 2*time.Second, "en-2 told the commit point", func() bool { return ext.CommittedLength() == primary })
			st := c.Nodes[0].Node().Stats()
			if st.SecondaryRejoins == 0 || st.RejoinBytes == 0 || st.SecondaryDrops != drops {
				t.Fatalf("stats after one drop and rejoin: %+v", st)
			}
		})
	}
}

// TestRejoinEndsWhenSealed: a dropped secondary's rejoiner stops once the
// extent is sealed (the log moves on to an extent that names its
// replicas afresh) and the secondary is left out of it.
func TestRejoinEndsWhenSealed(t *testing.T) {
	ctx := context.Background()
	c, conns, p := quorumExtent(t, 150*time.Millisecond, "sealed")
	release, _ := dropSecondary(t, c, conns, p.ID)
	if _, err := c.Driver.Seal(ctx, p.ID); err != nil {
		t.Fatal(err)
	}
	release()
	waitFor(t, 5*time.Second, "the rejoiner to stop", func() bool {
		st := secondaryState(t, c, p.ID, "en-2")
		if st.InAckSet {
			t.Fatalf("en-2 rejoined a sealed extent: %+v", st)
		}
		return !st.Rejoining
	})
	if _, err := rawAppend(ctx, conns, c.Nodes[0].Addr, p.ID, nil, 1000, []byte("after the seal")); !errors.Is(err, stream.ErrSealed) && !errors.Is(err, stream.ErrFrozen) {
		t.Fatalf("append to the sealed extent: %v", err)
	}
}

// TestKeepaliveTellsIdleSecondaries: with nothing written, the primary
// still tells its secondaries the commit point every CommitKeepalive, so
// a secondary knows how fresh its view is.
func TestKeepaliveTellsIdleSecondaries(t *testing.T) {
	ctx := context.Background()
	c, conns, p := quorumExtent(t, time.Second, "keepalive")
	resp, err := rawAppend(ctx, conns, c.Nodes[0].Addr, p.ID, nil, 1, []byte("one"))
	if err != nil {
		t.Fatal(err)
	}
	ext, err := c.Nodes[1].Node().Extent(p.ID)
	if err != nil {
		t.Fatal(err)
	}
	// The commit notice that follows the append, then nothing is written:
	// only the keepalive tells it again.
	var first time.Time
	waitFor(t, 2*time.Second, "the append's commit point told", func() bool {
		var told int64
		told, first = ext.CommitHeard()
		return told == resp.CommitLength
	})
	waitFor(t, 4*stream.CommitKeepalive, "the commit point told again with nothing written", func() bool {
		_, at := ext.CommitHeard()
		return at.After(first)
	})
}
