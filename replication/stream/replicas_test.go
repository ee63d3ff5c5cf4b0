package stream_test

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tabuladb/tabula/replication/stream"
	"github.com/tabuladb/tabula/replication/stream/streampb"
	"github.com/tabuladb/tabula/replication/stream/streamtest"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// rawAppend sends one Append of one single-block entry straight to the
// node at addr, naming secs as the secondaries.
func rawAppend(ctx context.Context, conns *stream.Conns, addr string, extent uint64, secs []string, seq uint64, payload []byte) (*streampb.AppendResponse, error) {
	n, err := conns.Node(addr)
	if err != nil {
		return nil, err
	}
	resp, err := n.Append(ctx, &streampb.AppendRequest{Extent: extent, Secondaries: secs, Entries: []*streampb.Entry{
		{Seq: seq, Blocks: [][]byte{payload}, Crcs: []uint32{crc32.Checksum(payload, castagnoli)}},
	}})
	return resp, stream.FromStatus(err)
}

// replicaLength is the durable length of extent's replica on addr.
func replicaLength(t *testing.T, ctx context.Context, conns *stream.Conns, addr string, extent uint64) int64 {
	t.Helper()
	n, err := conns.Node(addr)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := n.CommitLength(ctx, &streampb.CommitLengthRequest{Extent: extent})
	if err != nil {
		t.Fatalf("commit length of %d on %s: %v", extent, addr, err)
	}
	return resp.Length
}

// openExtentOnAll creates stream name with policy ack and its open
// extent on en-0 (the primary), en-1 and en-2, and returns the extent.
func openExtentOnAll(t *testing.T, ctx context.Context, d *stream.Driver, name string, ack stream.AckPolicy) *stream.ExtentPlacement {
	t.Helper()
	if _, err := d.Apply(ctx, stream.Command{Op: stream.OpCreateStream, Stream: name, Ack: ack}); err != nil {
		t.Fatal(err)
	}
	info, err := d.SealAndAllocateOn(ctx, name, 0, 0, []string{"en-0", "en-1", "en-2"})
	if err != nil {
		t.Fatal(err)
	}
	return info.Last()
}

// quorumExtent starts 3 nodes with the given replicate timeout and opens
// an AckQuorum extent on all three; the cluster and conns close with t.
func quorumExtent(t *testing.T, timeout time.Duration, name string) (*streamtest.Cluster, *stream.Conns, *stream.ExtentPlacement) {
	t.Helper()
	c := streamtest.Start(t, 3, streamtest.Options{Node: stream.NodeOptions{ReplicateTimeout: timeout}})
	t.Cleanup(c.Close)
	conns := stream.NewConns()
	t.Cleanup(func() { conns.Close() })
	return c, conns, openExtentOnAll(t, context.Background(), c.Driver, name, stream.AckQuorum)
}

// TestPrimaryReplicatesToItsOwnSecondaries: the primary extent node
// replicates to the secondaries it was created with, whatever an append
// names: an append naming none is still on every replica when it is
// acknowledged (it used to be acknowledged with one copy, and a seal at
// the smallest length then cut it), an append naming others is refused,
// the primary still knows its secondaries after a restart, and with a
// secondary down nothing is acknowledged.
func TestPrimaryReplicatesToItsOwnSecondaries(t *testing.T) {
	c := streamtest.Start(t, 3, streamtest.Options{})
	defer c.Close()
	ctx := context.Background()
	if _, err := c.Driver.Apply(ctx, stream.Command{Op: stream.OpCreateStream, Stream: "s"}); err != nil {
		t.Fatal(err)
	}
	info, err := c.Driver.SealAndAllocate(ctx, "s", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	p := info.Last()
	conns := stream.NewConns()
	defer conns.Close()
	prim := p.Replicas[0].Addr
	checkAll := func(want int64) {
		t.Helper()
		for _, r := range p.Replicas {
			if got := replicaLength(t, ctx, conns, r.Addr, p.ID); got != want {
				t.Fatalf("replica on %s holds %d bytes, %d acknowledged", r.Node, got, want)
			}
		}
	}
	resp, err := rawAppend(ctx, conns, prim, p.ID, nil, 1, []byte("no secondaries named"))
	if err != nil {
		t.Fatal(err)
	}
	checkAll(resp.CommitLength)

	if _, err := rawAppend(ctx, conns, prim, p.ID, []string{p.Replicas[1].Addr}, 2, []byte("one secondary named")); !errors.Is(err, stream.ErrRole) {
		t.Fatalf("append naming one of two secondaries: %v", err)
	}
	checkAll(resp.CommitLength)

	// The primary's node restarts: it still knows its secondaries.
	pi := c.Index(p.Replicas[0].Node)
	c.Stop(pi)
	if err := c.Restart(pi); err != nil {
		t.Fatal(err)
	}
	prim = c.Nodes[pi].Addr
	if prim != p.Replicas[0].Addr {
		t.Skipf("primary restarted at another address (%s, was %s)", prim, p.Replicas[0].Addr)
	}
	conns = stream.NewConns() // the old connection to it is broken
	defer conns.Close()
	if resp, err = rawAppend(ctx, conns, prim, p.ID, nil, 3, []byte("after a restart")); err != nil {
		t.Fatal(err)
	}
	checkAll(resp.CommitLength)

	// A secondary is down: nothing more is acknowledged.
	c.Stop(c.Index(p.Replicas[2].Node))
	if _, err := rawAppend(ctx, conns, prim, p.ID, nil, 4, []byte("one secondary down")); err == nil {
		t.Fatal("append acknowledged with a secondary down")
	}
	// The seal keeps everything acknowledged.
	if _, err := c.Driver.Seal(ctx, p.ID); err != nil {
		t.Fatal(err)
	}
	var sealed stream.ExtentMeta
	c.Manager(func(m *stream.Manager) { sealed, _ = m.Extent(p.ID) })
	if !sealed.Sealed || sealed.Length < resp.CommitLength {
		t.Fatalf("sealed %v at %d, %d acknowledged", sealed.Sealed, sealed.Length, resp.CommitLength)
	}
}

// TestAllocatedButNeverCreated: an owner (master) that crashes between
// logging an extent's allocation and creating its replicas used to leave
// the stream unwritable for good (the seal found no replica). A fresh
// driver now seals such an extent empty and the stream goes on; an extent
// of which one replica exists goes through the normal seal.
func TestAllocatedButNeverCreated(t *testing.T) {
	c := streamtest.Start(t, 3, streamtest.Options{})
	defer c.Close()
	ctx := context.Background()
	for _, name := range []string{"none", "one"} {
		if _, err := c.Driver.Apply(ctx, stream.Command{Op: stream.OpCreateStream, Stream: name}); err != nil {
			t.Fatal(err)
		}
		// The crash: the allocation is logged, no replica is created.
		res, err := c.Driver.Apply(ctx, stream.Command{Op: stream.OpAllocate, Stream: name})
		if err != nil {
			t.Fatal(err)
		}
		var meta stream.ExtentMeta
		c.Manager(func(m *stream.Manager) { meta, _ = m.Extent(res.Extent) })
		if name == "one" {
			// Only the primary was created before the crash.
			if _, err := c.Nodes[c.Index(meta.Primary)].Node().Store().Create(res.Extent, true); err != nil {
				t.Fatal(err)
			}
		}
		d := stream.NewDriver(c.Log, stream.DriverOptions{}) // the restarted owner
		info, err := d.SealAndAllocate(ctx, name, 0, res.Extent)
		if err != nil {
			d.Close()
			t.Fatalf("%s: seal and allocate after the crash: %v", name, err)
		}
		c.Manager(func(m *stream.Manager) { meta, _ = m.Extent(res.Extent) })
		if !meta.Sealed || meta.Length != 0 || info.Last().ID == res.Extent || info.Last().Sealed {
			t.Fatalf("%s: extent %+v, stream %+v", name, meta, info)
		}
		if _, err := d.RunTasks(ctx); err != nil { // rebuild the replicas the seal missed
			t.Fatalf("%s: %v", name, err)
		}
		c.Manager(func(m *stream.Manager) { meta, _ = m.Extent(res.Extent) })
		for _, r := range meta.Replicas {
			e, err := c.Nodes[c.Index(r.Node)].Node().Store().Get(res.Extent)
			if r.State != stream.ReplicaOK || err != nil || !e.Info().Sealed || e.Info().Length != 0 {
				t.Fatalf("%s: replica %+v: %v", name, r, err)
			}
		}
		cl := stream.NewClient(d, stream.ClientOptions{})
		if _, err := cl.Append(ctx, name, []byte("after the crash")); err != nil {
			t.Fatalf("%s: append after the crash: %v", name, err)
		}
		if err := errors.Join(cl.Close(), d.Close()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCommitPointOnSecondaries: an in-process Append on the primary's
// node; the secondaries learn the commit point promptly with no further
// append (a data-less Replicate), WaitCommitted wakes on it and on the
// seal, and ReadEntries returns the committed entries with their blocks.
func TestCommitPointOnSecondaries(t *testing.T) {
	c := streamtest.Start(t, 3, streamtest.Options{})
	defer c.Close()
	ctx := context.Background()
	if _, err := c.Driver.Apply(ctx, stream.Command{Op: stream.OpCreateStream, Stream: "s"}); err != nil {
		t.Fatal(err)
	}
	info, err := c.Driver.SealAndAllocate(ctx, "s", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	p := info.Last()
	prim := c.Nodes[c.Index(p.Replicas[0].Node)].Node()
	var secs []*stream.Extent
	for _, r := range p.Replicas[1:] {
		e, err := c.Nodes[c.Index(r.Node)].Node().Extent(p.ID)
		if err != nil {
			t.Fatal(err)
		}
		secs = append(secs, e)
	}
	entry := func(seq uint64, blocks ...string) *streampb.Entry {
		en := &streampb.Entry{Seq: seq}
		for _, b := range blocks {
			en.Blocks = append(en.Blocks, []byte(b))
			en.Crcs = append(en.Crcs, crc32.Checksum([]byte(b), castagnoli))
		}
		return en
	}
	want := []string{"one", "two-a|two-b", "three"}
	resp, err := prim.Append(ctx, &streampb.AppendRequest{Extent: p.ID, Entries: []*streampb.Entry{entry(1, "one"), entry(2, "two-a|", "two-b")}})
	if err != nil {
		t.Fatal(stream.FromStatus(err))
	}
	resp2, err := prim.Append(ctx, &streampb.AppendRequest{Extent: p.ID, Entries: []*streampb.Entry{entry(3, "three")}})
	if err != nil {
		t.Fatal(stream.FromStatus(err))
	}
	end := resp2.CommitLength
	pe, err := prim.Extent(p.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := pe.CommittedLength(); got != end {
		t.Fatalf("primary committed %d, acknowledged %d", got, end)
	}
	for i, e := range secs {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		got, err := e.WaitCommitted(wctx, resp.CommitLength)
		cancel()
		if err != nil || got != end {
			t.Fatalf("secondary %d: committed %d (%v), want %d", i, got, err, end)
		}
		var seen []string
		if err := e.ReadEntries(0, got, func(en stream.Entry) error {
			if en.Seq != uint64(len(seen)+1) {
				return fmt.Errorf("entry %d has seq %d", len(seen), en.Seq)
			}
			seen = append(seen, string(en.Payload()))
			return nil
		}); err != nil || !slices.Equal(seen, want) {
			t.Fatalf("secondary %d: entries %q (%v), want %q", i, seen, err, want)
		}
		if err := e.ReadEntries(resp.Entries[1].Offset+1, got, func(stream.Entry) error { return nil }); !errors.Is(err, stream.ErrBadRange) {
			t.Fatalf("read from inside an entry: %v", err)
		}
		if err := e.ReadEntries(resp.Entries[1].Offset+resp.Entries[1].BlockSizes[0], got, func(stream.Entry) error { return nil }); !errors.Is(err, stream.ErrBadRange) {
			t.Fatalf("read from the second block of an entry: %v", err)
		}
		wctx, cancel = context.WithTimeout(ctx, 20*time.Millisecond)
		if _, err := e.WaitCommitted(wctx, end); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("wait beyond the end: %v", err)
		}
		cancel()
	}
	// A seal wakes a waiter with the sealed length.
	done := make(chan error, 1)
	go func() {
		got, err := secs[0].WaitCommitted(ctx, end)
		if err == nil && got != end {
			err = fmt.Errorf("woke at %d, sealed at %d", got, end)
		}
		done <- err
	}()
	if _, err := c.Driver.Seal(ctx, p.ID); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestPlacementTheCallerDecides: a stream records its replica count
// (1-5); OpAllocate on named nodes (primary first) is validated; an
// extent of a 1-replica stream takes appends with its primary alone, and
// its sealed extent keeps one copy.
func TestPlacementTheCallerDecides(t *testing.T) {
	c := streamtest.Start(t, 4, streamtest.Options{})
	defer c.Close()
	ctx := context.Background()
	d := c.Driver
	if _, err := d.Apply(ctx, stream.Command{Op: stream.OpCreateStream, Stream: "big", Replicas: 6}); !errors.Is(err, stream.ErrBadCommand) {
		t.Fatalf("6 replicas: %v", err)
	}
	for _, s := range []stream.Command{{Stream: "two", Replicas: 2}, {Stream: "one", Replicas: 1}} {
		s.Op = stream.OpCreateStream
		if _, err := d.Apply(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	c.Stop(3)
	if _, err := d.Apply(ctx, stream.Command{Op: stream.OpNodeDown, Node: "en-3"}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		nodes []string
		want  error
	}{
		{[]string{"en-0", "en-1", "en-2", "en-4", "en-5"}, stream.ErrBadCommand}, // more than twice the stream's 2
		{[]string{"en-0", "en-0"}, stream.ErrBadCommand},
		{[]string{"en-0", "en-9"}, stream.ErrUnknownNode},
		{[]string{"en-0", "en-3"}, stream.ErrNoPlacement},
	} {
		if _, err := d.Apply(ctx, stream.Command{Op: stream.OpAllocate, Stream: "two", Nodes: tc.nodes}); !errors.Is(err, tc.want) {
			t.Fatalf("allocate on %v: %v, want %v", tc.nodes, err, tc.want)
		}
	}
	cl := stream.NewClient(d, stream.ClientOptions{})
	defer cl.Close()
	for _, tc := range []struct {
		stream string
		nodes  []string
	}{{"two", []string{"en-2", "en-0"}}, {"one", []string{"en-1"}}} {
		info, err := d.SealAndAllocateOn(ctx, tc.stream, 0, 0, tc.nodes)
		if err != nil {
			t.Fatal(err)
		}
		p := info.Last()
		var got []string
		for _, r := range p.Replicas {
			got = append(got, r.Node)
		}
		if !slices.Equal(got, tc.nodes) {
			t.Fatalf("%s: replicas on %v, asked for %v", tc.stream, got, tc.nodes)
		}
		res, err := cl.Append(ctx, tc.stream, []byte("x"))
		if err != nil {
			t.Fatal(err)
		}
		// The client's writer sealed the extent and took a new one.
		var meta stream.ExtentMeta
		c.Manager(func(m *stream.Manager) { meta, _ = m.Extent(res.Location.Extent) })
		if len(meta.Replicas) != len(tc.nodes) {
			t.Fatalf("%s: extent of %d replicas, want %d", tc.stream, len(meta.Replicas), len(tc.nodes))
		}
		for _, r := range meta.Replicas {
			e, err := c.Nodes[c.Index(r.Node)].Node().Extent(meta.ID)
			if err != nil || e.Length() != res.Location.Length {
				t.Fatalf("%s: replica on %s: %v", tc.stream, r.Node, err)
			}
		}
		if _, err := d.Seal(ctx, meta.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := d.RunTasks(ctx); err != nil {
			t.Fatal(err)
		}
		c.Manager(func(m *stream.Manager) { meta, _ = m.Extent(p.ID) })
		if len(meta.Replicas) != len(tc.nodes) {
			t.Fatalf("%s: sealed extent with %d replicas, want %d", tc.stream, len(meta.Replicas), len(tc.nodes))
		}
	}
}

// TestQuorumSlowSecondary: under AckQuorum a paused secondary does not
// delay acknowledgements; past ReplicateTimeout it is dropped from the ack
// set and the responses say so; the seal takes the longest length of a
// reachable majority (acknowledged entries are on a majority, not on all:
// the smallest length would cut them) and the short replica is rebuilt.
func TestQuorumSlowSecondary(t *testing.T) {
	c := streamtest.Start(t, 3, streamtest.Options{Node: stream.NodeOptions{ReplicateTimeout: 150 * time.Millisecond}})
	defer c.Close()
	ctx := context.Background()
	d := c.Driver
	p := openExtentOnAll(t, ctx, d, "q", stream.AckQuorum)
	if p.Ack != stream.AckQuorum {
		t.Fatalf("extent ack policy %q", p.Ack)
	}
	conns := stream.NewConns()
	defer conns.Close()
	c.Nodes[2].PauseReplicate(3 * time.Second)
	var last *streampb.AppendResponse
	start := time.Now()
	for seq := uint64(1); last == nil || len(last.Dropped) == 0; seq++ {
		if time.Since(start) > 2*time.Second {
			t.Fatal("the paused secondary was never reported dropped")
		}
		t0 := time.Now()
		resp, err := rawAppend(ctx, conns, c.Nodes[0].Addr, p.ID, nil, seq, []byte(fmt.Sprintf("entry %d", seq)))
		if err != nil {
			t.Fatal(err)
		}
		if took := time.Since(t0); took > time.Second {
			t.Fatalf("append %d took %v with one secondary paused", seq, took)
		}
		last = resp
	}
	if !slices.Equal(last.Dropped, []string{"en-2"}) {
		t.Fatalf("dropped %v", last.Dropped)
	}
	if got := replicaLength(t, ctx, conns, c.Nodes[2].Addr, p.ID); got >= last.CommitLength {
		t.Fatalf("paused secondary holds %d bytes of %d", got, last.CommitLength)
	}
	if _, err := d.Seal(ctx, p.ID); err != nil {
		t.Fatal(err)
	}
	var meta stream.ExtentMeta
	c.Manager(func(m *stream.Manager) { meta, _ = m.Extent(p.ID) })
	if !meta.Sealed || meta.Length != last.CommitLength {
		t.Fatalf("sealed %v at %d, %d acknowledged", meta.Sealed, meta.Length, last.CommitLength)
	}
	if _, err := d.RunTasks(ctx); err != nil {
		t.Fatal(err)
	}
	e, err := c.Nodes[2].Node().Extent(p.ID)
	if err != nil || !e.Info().Sealed || e.Length() != meta.Length {
		t.Fatalf("rebuilt replica: %+v %v", e.Info(), err)
	}
}

// TestLinkBatchesExtents: appends to many extents with the same primary
// and secondary nodes reach each secondary node together, in one
// ReplicateBatch (one RPC and one journal sync there), not one call each.
// The secondaries hold their Replicates for a moment, so while the first
// batch waits every other extent's append queues on the links.
func TestLinkBatchesExtents(t *testing.T) {
	c := streamtest.Start(t, 3, streamtest.Options{})
	defer c.Close()
	ctx := context.Background()
	d := c.Driver
	const extents = 8
	ids := make([]uint64, extents)
	for i := range ids {
		ids[i] = openExtentOnAll(t, ctx, d, fmt.Sprintf("s%d", i), "").ID
	}
	conns := stream.NewConns()
	defer conns.Close()
	c.Nodes[1].PauseReplicate(200 * time.Millisecond)
	c.Nodes[2].PauseReplicate(200 * time.Millisecond)
	var wg sync.WaitGroup
	errs := make(chan error, extents)
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := rawAppend(ctx, conns, c.Nodes[0].Addr, id, nil, 1, []byte(fmt.Sprintf("entry of %d", i))); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, n := range c.Nodes[1:] {
		var calls, most int
		for _, k := range n.ReplicateBatches() {
			if k > 0 {
				calls++
				most = max(most, k)
			}
		}
		if calls >= extents || most < 2 {
			t.Fatalf("%s: %d appends to %d extents reached it in %d calls with data (at most %d extents in one)", n.ID, extents, extents, calls, most)
		}
		for _, id := range ids {
			if got := replicaLength(t, ctx, conns, n.Addr, id); got == 0 {
				t.Fatalf("%s: extent %d holds nothing", n.ID, id)
			}
		}
	}
}

// TestLinkPipelinesCalls: with NodeOptions.ReplicateCalls above 1 a
// primary does not wait for one batch to a node to be answered before it
// sends the next (every write then waits for the batch before its own),
// and the secondary writes each extent's data in offset order: on a
// ReplicateStream in the order sent, with ReplicateBatch calls (a node
// without the stream) whichever call it handles first. Both secondaries
// hold their batches for a moment; the appends sent meanwhile go out in
// batches of their own, in flight together, and all land in order.
func TestLinkPipelinesCalls(t *testing.T) {
	for _, unary := range []bool{false, true} {
		t.Run(map[bool]string{false: "stream", true: "unary"}[unary], func(t *testing.T) {
			c := streamtest.Start(t, 3, streamtest.Options{Node: stream.NodeOptions{ReplicateCalls: 4}})
			defer c.Close()
			if unary {
				c.Nodes[1].RefuseReplicateStream()
				c.Nodes[2].RefuseReplicateStream()
			}
			ctx := context.Background()
			d := c.Driver
			id := openExtentOnAll(t, ctx, d, "p", "").ID
			conns := stream.NewConns()
			defer conns.Close()
			primary, err := c.Nodes[0].Node().Extent(id)
			if err != nil {
				t.Fatal(err)
			}
			c.Nodes[1].PauseReplicate(300 * time.Millisecond)
			c.Nodes[2].PauseReplicate(300 * time.Millisecond)
			const appends = 6
			var wg sync.WaitGroup
			errs := make(chan error, appends)
			ends := make(chan int64, appends)
			for seq := uint64(1); seq <= appends; seq++ {
				// One at a time into the appender, so each is its own
				// batch: the next starts once the last is written on the
				// primary (and so queued for the secondaries).
				before := primary.Length()
				wg.Add(1)
				go func() {
					defer wg.Done()
					resp, err := rawAppend(ctx, conns, c.Nodes[0].Addr, id, nil, seq, []byte(fmt.Sprintf("entry %d", seq)))
					if err != nil {
						errs <- err
						return
					}
					ends <- resp.CommitLength
				}()
				for deadline := time.Now().Add(2 * time.Second); primary.Length() == before; {
					if time.Now().After(deadline) {
						t.Fatalf("append %d was not written on the primary", seq)
					}
					runtime.Gosched()
				}
			}
			wg.Wait()
			close(errs)
			close(ends)
			for err := range errs {
				t.Fatal(err)
			}
			var end int64
			for e := range ends {
				end = max(end, e)
			}
			for _, n := range c.Nodes[1:] {
				if most := n.MostReplicateBatches(); most < 2 {
					t.Fatalf("%s: at most %d batch at once while its batches were held", n.ID, most)
				}
				if got := replicaLength(t, ctx, conns, n.Addr, id); got != end {
					t.Fatalf("%s: extent %d holds %d bytes, %d acknowledged", n.ID, id, got, end)
				}
				e, err := n.Node().Extent(id)
				if err != nil {
					t.Fatal(err)
				}
				var seqs []uint64
				if err := e.ReadEntries(0, end, func(en stream.Entry) error {
					seqs = append(seqs, en.Seq)
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				if want := []uint64{1, 2, 3, 4, 5, 6}; !slices.Equal(seqs, want) {
					t.Fatalf("%s holds entries %v, want %v", n.ID, seqs, want)
				}
			}
		})
	}
}

// TestPipelinedAppendsNoGap: with many appends in flight per extent (the
// appender's pipeline and several Replicate calls per link), a secondary
// that stops answering and then a second one that dies break the
// extents mid-stream; what was acknowledged is a prefix of what was sent
// (nothing acknowledged after a failed append) and every acknowledged
// entry is in the sealed extent, in order.
func TestPipelinedAppendsNoGap(t *testing.T) {
	c := streamtest.Start(t, 3, streamtest.Options{Node: stream.NodeOptions{ReplicateCalls: 4, ReplicateTimeout: 100 * time.Millisecond}})
	defer c.Close()
	ctx := context.Background()
	d := c.Driver
	const extents = 4
	ids := make([]uint64, extents)
	for i := range ids {
		ids[i] = openExtentOnAll(t, ctx, d, fmt.Sprintf("g%d", i), stream.AckQuorum).ID
	}
	prim := c.Nodes[0].Node()
	type outcome struct {
		seq uint64
		err error
	}
	results := make([][]outcome, extents)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			waits := make(chan func() outcome, 256)
			var ww sync.WaitGroup
			ww.Add(1)
			go func() {
				defer ww.Done()
				for w := range waits {
					results[i] = append(results[i], w())
				}
			}()
			defer func() { close(waits); ww.Wait() }()
			for seq := uint64(1); ; seq++ {
				select {
				case <-stop:
					return
				default:
				}
				p := []byte(fmt.Sprintf("extent %d entry %d", id, seq))
				wait, err := prim.StartAppend(&streampb.AppendRequest{Extent: id, Entries: []*streampb.Entry{
					{Seq: seq, Blocks: [][]byte{p}, Crcs: []uint32{crc32.Checksum(p, castagnoli)}},
				}})
				if err != nil {
					waits <- func() outcome { return outcome{seq, err} }
					return
				}
				waits <- func() outcome {
					_, err := wait(ctx)
					return outcome{seq, err}
				}
				if seq%64 == 0 {
					runtime.Gosched()
				}
			}
		}()
	}
	// Let appends flow, then stall one secondary past the timeout (it
	// leaves the ack sets) and kill the other (the extents break).
	waitAppends := func(n uint64) {
		for deadline := time.Now().Add(5 * time.Second); prim.Stats().Appends < n && time.Now().Before(deadline); {
			runtime.Gosched()
		}
	}
	waitAppends(200)
	c.Nodes[2].PauseReplicate(400 * time.Millisecond)
	waitAppends(prim.Stats().Appends + 200)
	c.Stop(1)
	close(stop)
	wg.Wait()
	for i, id := range ids {
		var acked []uint64
		failed := false
		for _, o := range results[i] {
			switch {
			case o.err == nil && failed:
				t.Fatalf("extent %d: entry %d acknowledged after an earlier one failed", id, o.seq)
			case o.err == nil:
				acked = append(acked, o.seq)
			default:
				failed = true
			}
		}
		if len(acked) == 0 {
			t.Fatalf("extent %d: nothing acknowledged", id)
		}
		for k, s := range acked {
			if s != uint64(k+1) {
				t.Fatalf("extent %d: acknowledged %v..., not a prefix of what was sent", id, acked[:k+1])
			}
		}
		if _, err := d.Seal(ctx, id); err != nil {
			t.Fatalf("seal extent %d: %v", id, err)
		}
		e, err := prim.Extent(id)
		if err != nil {
			t.Fatal(err)
		}
		var seqs []uint64
		if err := e.ReadEntries(0, e.Length(), func(en stream.Entry) error {
			seqs = append(seqs, en.Seq)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if len(seqs) < len(acked) || !slices.Equal(seqs[:len(acked)], acked) {
			t.Fatalf("extent %d sealed with %d entries; the %d acknowledged are not its prefix", id, len(seqs), len(acked))
		}
		t.Logf("extent %d: %d acknowledged, %d sent, %d kept by the seal", id, len(acked), len(results[i]), len(seqs))
	}
}

// TestLinkFallsBackToReplicateBatch: a secondary node without
// ReplicateStream (an older version) answers it Unimplemented; its
// primaries replicate to it with ReplicateBatch calls instead, and every
// append lands on all three replicas with none dropped.
func TestLinkFallsBackToReplicateBatch(t *testing.T) {
	c := streamtest.Start(t, 3, streamtest.Options{})
	defer c.Close()
	c.Nodes[2].RefuseReplicateStream()
	ctx := context.Background()
	conns := stream.NewConns()
	defer conns.Close()
	var ids []uint64
	for i := range 3 {
		ids = append(ids, openExtentOnAll(t, ctx, c.Driver, fmt.Sprintf("old%d", i), "").ID)
	}
	for seq := uint64(1); seq <= 20; seq++ {
		for _, id := range ids {
			resp, err := rawAppend(ctx, conns, c.Nodes[0].Addr, id, nil, seq, []byte(fmt.Sprintf("entry %d", seq)))
			if err != nil {
				t.Fatalf("extent %d append %d: %v", id, seq, err)
			}
			if len(resp.Dropped) > 0 {
				t.Fatalf("extent %d append %d dropped %v", id, seq, resp.Dropped)
			}
		}
	}
	for _, n := range c.Nodes[1:] {
		if len(n.ReplicateBatches()) == 0 {
			t.Fatalf("%s received no batches", n.ID)
		}
		for _, id := range ids {
			if got, want := replicaLength(t, ctx, conns, n.Addr, id), replicaLength(t, ctx, conns, c.Nodes[0].Addr, id); got != want {
				t.Fatalf("%s: extent %d holds %d bytes, the primary %d", n.ID, id, got, want)
			}
		}
	}
}

// TestLinkStreamReopensAfterTimeout: a secondary node that does not
// answer within the replicate timeout ends its ReplicateStream (the
// extents with data in flight drop it); once it answers again, the
// primary's next batches to it go on a new stream, and an extent opened
// then keeps all three replicas.
func TestLinkStreamReopensAfterTimeout(t *testing.T) {
	ctx := context.Background()
	c, conns, p := quorumExtent(t, 150*time.Millisecond, "slow")
	c.Nodes[2].PauseReplicate(400 * time.Millisecond)
	resp, err := rawAppend(ctx, conns, c.Nodes[0].Addr, p.ID, nil, 1, []byte("during the pause"))
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(2 * time.Second); len(resp.Dropped) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the paused secondary was never dropped")
		}
		if resp, err = rawAppend(ctx, conns, c.Nodes[0].Addr, p.ID, nil, 2, []byte("after")); err != nil {
			t.Fatal(err)
		}
	}
	c.Nodes[2].PauseReplicate(0) // it answers again
	q := openExtentOnAll(t, ctx, c.Driver, "fresh", "")
	for seq := uint64(1); seq <= 5; seq++ {
		resp, err := rawAppend(ctx, conns, c.Nodes[0].Addr, q.ID, nil, seq, []byte(fmt.Sprintf("entry %d", seq)))
		if err != nil {
			t.Fatalf("append %d after the pause: %v", seq, err)
		}
		if len(resp.Dropped) > 0 {
			t.Fatalf("append %d after the pause dropped %v", seq, resp.Dropped)
		}
	}
	if got, want := replicaLength(t, ctx, conns, c.Nodes[2].Addr, q.ID), replicaLength(t, ctx, conns, c.Nodes[0].Addr, q.ID); got != want {
		t.Fatalf("the resumed node holds %d bytes of the new extent, the primary %d", got, want)
	}
}

// TestDrainEndsReplicateStreams: a secondary node that drains ends the
// ReplicateStreams its primaries keep open into it, so its gRPC server's
// graceful stop (which waits for every stream) ends promptly; the appends
// in flight meanwhile are acknowledged (AckQuorum: the drained node is
// dropped) and none fails.
func TestDrainEndsReplicateStreams(t *testing.T) {
	ctx := context.Background()
	c, conns, p := quorumExtent(t, time.Second, "drain")
	stop := make(chan struct{})
	errs := make(chan error, 1)
	var appended atomic.Int64
	progress := make(chan struct{}, 1) // signalled after each append
	waitAppended := func(n int64, what string) {
		t.Helper()
		timeout := time.NewTimer(2 * time.Second)
		defer timeout.Stop()
		for appended.Load() < n {
			select {
			case <-progress:
			case <-timeout.C:
				t.Fatalf("appends stalled %s", what)
			}
		}
	}
	go func() {
		defer close(errs)
		for seq := uint64(1); ; seq++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := rawAppend(ctx, conns, c.Nodes[0].Addr, p.ID, nil, seq, []byte(fmt.Sprintf("entry %d", seq))); err != nil {
				errs <- fmt.Errorf("append %d: %w", seq, err)
				return
			}
			appended.Add(1)
			select {
			case progress <- struct{}{}:
			default:
			}
		}
	}()
	waitAppended(20, "before the drain")
	took, err := c.Drain(2, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitAppended(appended.Load()+20, "after the drain")
	close(stop)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	t.Logf("graceful stop took %v; %d appends", took, appended.Load())
}

// TestRefusedStreamFailsItsBatches: a node that refuses ReplicateStream
// (shutting down; its server still answers) fails the batches sent to it
// at once, however the refusal races the first batch: the appends go on
// without it (AckQuorum) and name it dropped, and none waits for the
// replicate timeout.
func TestRefusedStreamFailsItsBatches(t *testing.T) {
	c := streamtest.Start(t, 3, streamtest.Options{Node: stream.NodeOptions{ReplicateTimeout: 5 * time.Second}})
	defer c.Close()
	ctx := context.Background()
	conns := stream.NewConns()
	defer conns.Close()
	c.Nodes[2].Node().StopReplicateStreams()
	for i := range 10 {
		p := openExtentOnAll(t, ctx, c.Driver, fmt.Sprintf("refused%d", i), stream.AckQuorum)
		start := time.Now()
		var dropped []string
		for seq := uint64(1); len(dropped) == 0; seq++ {
			if time.Since(start) > 2*time.Second {
				t.Fatalf("extent %d: the refusing node was not dropped within 2 s", p.ID)
			}
			resp, err := rawAppend(ctx, conns, c.Nodes[0].Addr, p.ID, nil, seq, []byte("entry"))
			if err != nil {
				t.Fatalf("extent %d append %d: %v", p.ID, seq, err)
			}
			dropped = resp.Dropped
		}
		if !slices.Equal(dropped, []string{"en-2"}) {
			t.Fatalf("extent %d dropped %v", p.ID, dropped)
		}
	}
}

// TestLinkOpenBoundedByTimeout: opening a replicate stream to a node that
// accepts connections and never answers (a hung process) waits no longer
// than the replicate timeout, as a call did: the appends go on without
// that secondary (AckQuorum) instead of stalling for gRPC's connect
// timeout.
func TestLinkOpenBoundedByTimeout(t *testing.T) {
	ctx := context.Background()
	c, conns, p := quorumExtent(t, 100*time.Millisecond, "hung")
	if _, err := rawAppend(ctx, conns, c.Nodes[0].Addr, p.ID, nil, 1, []byte("before")); err != nil {
		t.Fatal(err)
	}
	addr := c.Nodes[2].Addr
	c.Stop(2)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen on the stopped node's address %s: %v", addr, err)
	}
	defer ln.Close()
	go func() { // accept, never answer
		var held []net.Conn
		defer func() {
			for _, cn := range held {
				cn.Close()
			}
		}()
		for {
			cn, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, cn)
		}
	}()
	start := time.Now()
	var dropped []string
	for seq := uint64(2); len(dropped) == 0; seq++ {
		resp, err := rawAppend(ctx, conns, c.Nodes[0].Addr, p.ID, nil, seq, []byte("after"))
		if err != nil {
			t.Fatal(err)
		}
		dropped = resp.Dropped
	}
	if took := time.Since(start); took > 900*time.Millisecond {
		t.Fatalf("the hung node was dropped after %v; want about the replicate timeout (100ms)", took)
	}
}
