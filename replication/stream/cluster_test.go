package stream_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tabuladb/tabula/replication/stream"
	"github.com/tabuladb/tabula/replication/stream/streampb"
	"github.com/tabuladb/tabula/replication/stream/streamtest"
)

type acked struct {
	stream string
	res    stream.AppendResult
	blocks [][]byte
}

func randBlocks(rng *rand.Rand, mu *sync.Mutex) [][]byte {
	mu.Lock()
	defer mu.Unlock()
	var bs [][]byte
	for range 1 + rng.IntN(3) {
		b := make([]byte, 1+rng.IntN(2000))
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		bs = append(bs, b)
	}
	return bs
}

// readReplica reads loc from one replica directly and decodes its blocks.
func readReplica(ctx context.Context, conns *stream.Conns, addr string, loc stream.Location) ([][]byte, error) {
	n, err := conns.Node(addr)
	if err != nil {
		return nil, err
	}
	resp, err := n.Read(ctx, &streampb.ReadRequest{Extent: loc.Extent, Offset: loc.Offset, Length: loc.Length})
	if err != nil {
		return nil, err
	}
	if int64(len(resp.Data)) != loc.Length {
		return nil, fmt.Errorf("%d bytes, want %d", len(resp.Data), loc.Length)
	}
	var out [][]byte
	err = stream.DecodeBlocks(resp.Data, loc.Extent, loc.Offset, func(_ int64, _ uint64, _ bool, p []byte) error {
		out = append(out, p)
		return nil
	})
	return out, err
}

func equalBlocks(a, b [][]byte) bool {
	return slices.EqualFunc(a, b, bytes.Equal)
}

// TestAppendsUnderLoadSurviveReplicaLoss runs concurrent writers on three
// streams over 5 extent nodes, kills the node holding the primary of one
// stream's open extent mid-run, and checks that writers seal and continue
// on new extents (logging the seal-and-continue latency), that every
// acknowledged append reads back identically from every remaining replica,
// that each stream reads back in sequence order with duplicates dropped,
// and that re-replication restores 3 replicas in distinct fault domains.
func TestAppendsUnderLoadSurviveReplicaLoss(t *testing.T) {
	seed := streamtest.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 0))
	var rngMu sync.Mutex
	c := streamtest.Start(t, 5, streamtest.Options{})
	defer c.Close()
	ctx := context.Background()
	streams := []string{"log/a", "log/b", "log/c"}
	var sealMu sync.Mutex
	var seals []time.Duration
	clients := map[string]*stream.Client{}
	for _, s := range streams {
		if _, err := c.Driver.Apply(ctx, stream.Command{Op: stream.OpCreateStream, Stream: s}); err != nil {
			t.Fatal(err)
		}
		clients[s] = stream.NewClient(c.Driver, stream.ClientOptions{
			AppendTimeout: 2 * time.Second,
			OnSeal: func(st string, sealed, next uint64, took time.Duration) {
				sealMu.Lock()
				seals = append(seals, took)
				sealMu.Unlock()
				t.Logf("seal-and-continue on %s: extent %d sealed, appends continue on %d after %v", st, sealed, next, took)
			},
		})
	}
	defer func() {
		for _, cl := range clients {
			cl.Close()
		}
	}()

	var mu sync.Mutex
	var log []acked
	var count atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errc := make(chan error, 64)
	const perStream = 6
	for _, s := range streams {
		for range perStream {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					bs := randBlocks(rng, &rngMu)
					res, err := clients[s].Append(ctx, s, bs...)
					if err != nil {
						errc <- fmt.Errorf("append to %s: %w", s, err)
						return
					}
					mu.Lock()
					log = append(log, acked{stream: s, res: res, blocks: bs})
					mu.Unlock()
					count.Add(1)
				}
			}()
		}
	}
	streamtest.WaitFor(t, 20*time.Second, "300 acknowledged appends", func() bool { return count.Load() >= 300 })
	info, err := c.Driver.Stream(ctx, streams[0])
	if err != nil {
		t.Fatal(err)
	}
	victim := info.Last().Replicas[0].Node // the primary
	t.Logf("stopping %s, primary of extent %d of %s", victim, info.Last().ID, streams[0])
	c.Stop(c.Index(victim))
	before := count.Load()
	streamtest.WaitFor(t, 20*time.Second, "600 more acknowledged appends", func() bool { return count.Load() >= before+600 })
	close(stop)
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	sealMu.Lock()
	if len(seals) == 0 {
		t.Fatal("no writer sealed and continued")
	}
	t.Logf("%d appends acknowledged; seal-and-continue latencies %v (target < 100ms)", count.Load(), seals)
	sealMu.Unlock()

	// Every acknowledged append, from every replica still up.
	conns := stream.NewConns()
	defer conns.Close()
	for _, a := range log {
		p, err := c.Driver.Extent(ctx, a.res.Location.Extent)
		if err != nil {
			t.Fatal(err)
		}
		read := 0
		for _, r := range p.Replicas {
			if r.Node == victim {
				continue
			}
			got, err := readReplica(ctx, conns, r.Addr, a.res.Location)
			if err != nil {
				t.Fatalf("seq %d of %s at %+v from %s: %v", a.res.Seq, a.stream, a.res.Location, r.Node, err)
			}
			if !equalBlocks(got, a.blocks) {
				t.Fatalf("seq %d of %s differs on %s", a.res.Seq, a.stream, r.Node)
			}
			read++
		}
		if read < 2 {
			t.Fatalf("seq %d of %s read from %d replicas", a.res.Seq, a.stream, read)
		}
		// Single blocks read alone too.
		b := a.res.Blocks[len(a.res.Blocks)-1]
		cl := clients[a.stream]
		got, err := cl.Read(ctx, b)
		if err != nil || len(got) != 1 || !bytes.Equal(got[0], a.blocks[len(a.blocks)-1]) {
			t.Fatalf("block read of seq %d: %v", a.res.Seq, err)
		}
	}

	// Sequential reads: every acknowledged seq once, in order, and nothing
	// between that is not a real append.
	for _, s := range streams {
		want := map[uint64][][]byte{}
		for _, a := range log {
			if a.stream == s {
				want[a.res.Seq] = a.blocks
			}
		}
		var last uint64
		seen := 0
		if err := clients[s].ReadStream(ctx, s, func(e stream.Entry) error {
			if e.Seq <= last {
				return fmt.Errorf("seq %d after %d", e.Seq, last)
			}
			last = e.Seq
			if w, ok := want[e.Seq]; ok {
				if !equalBlocks(e.Blocks, w) {
					return fmt.Errorf("seq %d differs", e.Seq)
				}
				seen++
			}
			return nil
		}); err != nil {
			t.Fatalf("read %s: %v", s, err)
		}
		if seen != len(want) {
			t.Fatalf("%s: %d of %d acknowledged entries read", s, seen, len(want))
		}
	}

	// The manager learns the node is dead and re-replicates.
	if _, err := c.Driver.Apply(ctx, stream.Command{Op: stream.OpNodeDown, Node: victim}); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if _, err := c.Driver.RunTasks(ctx); err != nil {
			t.Logf("tasks: %v", err)
		}
	}
	checkPlacement(t, c, victim)
}

// checkPlacement checks that every extent has its replicas on live nodes
// in distinct fault domains, all good, and that the replicas of sealed
// extents are identical.
func checkPlacement(t *testing.T, c *streamtest.Cluster, dead string) {
	t.Helper()
	ctx := context.Background()
	conns := stream.NewConns()
	defer conns.Close()
	var ids []uint64
	c.Manager(func(m *stream.Manager) {
		ids = m.ExtentIDs()
		if tasks := m.Tasks(); len(tasks) != 0 {
			t.Errorf("tasks left: %+v", tasks)
		}
	})
	for _, id := range ids {
		p, err := c.Driver.Extent(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		fds := map[string]bool{}
		var ref []byte
		for _, r := range p.Replicas {
			if r.Node == dead || !r.OK {
				t.Fatalf("extent %d: replica %+v", id, r)
			}
			fd := c.Nodes[c.Index(r.Node)].FaultDomain
			if fds[fd] {
				t.Fatalf("extent %d: two replicas in %s", id, fd)
			}
			fds[fd] = true
			if !p.Sealed {
				continue
			}
			n, _ := conns.Node(r.Addr)
			var all []byte
			for off := int64(0); off < p.Length; {
				resp, err := n.Read(ctx, &streampb.ReadRequest{Extent: id, Offset: off, Length: 1 << 20})
				if err != nil {
					t.Fatalf("extent %d on %s: %v", id, r.Node, err)
				}
				all = append(all, resp.Data...)
				off += int64(len(resp.Data))
			}
			if ref == nil {
				ref = all
			} else if !bytes.Equal(ref, all) {
				t.Fatalf("extent %d: replica on %s differs", id, r.Node)
			}
		}
		if len(p.Replicas) != 3 {
			t.Fatalf("extent %d has %d replicas", id, len(p.Replicas))
		}
	}
}

// TestScrubberRepairsBitFlip flips a bit in one replica of a sealed
// extent: the node's scrubber finds it, the manager has the replica
// rebuilt from a good one, and it scrubs clean and reads identically.
func TestScrubberRepairsBitFlip(t *testing.T) {
	seed := streamtest.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 0))
	var rngMu sync.Mutex
	c := streamtest.Start(t, 5, streamtest.Options{})
	defer c.Close()
	ctx := context.Background()
	if _, err := c.Driver.Apply(ctx, stream.Command{Op: stream.OpCreateStream, Stream: "s"}); err != nil {
		t.Fatal(err)
	}
	cl := stream.NewClient(c.Driver, stream.ClientOptions{})
	defer cl.Close()
	var res []stream.AppendResult
	var data [][][]byte
	for range 50 {
		bs := randBlocks(rng, &rngMu)
		r, err := cl.Append(ctx, "s", bs...)
		if err != nil {
			t.Fatal(err)
		}
		res, data = append(res, r), append(data, bs)
	}
	info, _ := c.Driver.Stream(ctx, "s")
	ext := info.Last().ID
	if _, err := c.Driver.Seal(ctx, ext); err != nil {
		t.Fatal(err)
	}
	p, _ := c.Driver.Extent(ctx, ext)
	victim := c.Nodes[c.Index(p.Replicas[1].Node)]
	victimAt := res[rng.IntN(len(res))].Location
	path := fmt.Sprintf("/extents/%016x.ext", ext)
	if err := victim.FS.FlipBit(path, 32+victimAt.Offset+victimAt.Length/2, uint(rng.IntN(8))); err != nil {
		t.Fatal(err)
	}
	bad := victim.Node().Scrub(ctx)
	if !slices.Equal(bad, []uint64{ext}) {
		t.Fatalf("scrub found %v, want [%d]", bad, ext)
	}
	var tasks []stream.Task
	c.Manager(func(m *stream.Manager) { tasks = m.Tasks() })
	if len(tasks) != 1 || tasks[0].Kind != stream.TaskCopy || tasks[0].Node != victim.ID {
		t.Fatalf("tasks %+v", tasks)
	}
	if n, err := c.Driver.RunTasks(ctx); err != nil || n != 1 {
		t.Fatalf("repair: %d done, %v", n, err)
	}
	if bad := victim.Node().Scrub(ctx); len(bad) != 0 {
		t.Fatalf("after repair scrub found %v", bad)
	}
	conns := stream.NewConns()
	defer conns.Close()
	for i, r := range res {
		got, err := readReplica(ctx, conns, victim.Addr, r.Location)
		if err != nil || !equalBlocks(got, data[i]) {
			t.Fatalf("entry %d on the repaired replica: %v", i, err)
		}
	}
	checkPlacement(t, c, "")
}

// TestConcatDeleteAndGC concatenates two streams (a pointer operation),
// deletes the sources (their extents stay: the new stream references
// them), then deletes the new stream: every replica is removed from its
// node. An orphan replica a node reports is removed too.
func TestConcatDeleteAndGC(t *testing.T) {
	c := streamtest.Start(t, 4, streamtest.Options{})
	defer c.Close()
	ctx := context.Background()
	cl := stream.NewClient(c.Driver, stream.ClientOptions{})
	defer cl.Close()
	for _, s := range []string{"a", "b"} {
		if _, err := c.Driver.Apply(ctx, stream.Command{Op: stream.OpCreateStream, Stream: s}); err != nil {
			t.Fatal(err)
		}
		for i := range 5 {
			if _, err := cl.Append(ctx, s, []byte(fmt.Sprintf("%s-%d", s, i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := c.Driver.Apply(ctx, stream.Command{Op: stream.OpConcat, Stream: "ab", Sources: []string{"a", "b"}}); !errors.Is(err, stream.ErrNotSealed) {
		t.Fatalf("concat of open extents: %v", err)
	}
	for _, s := range []string{"a", "b"} {
		info, _ := c.Driver.Stream(ctx, s)
		if _, err := c.Driver.Seal(ctx, info.Last().ID); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Driver.Apply(ctx, stream.Command{Op: stream.OpConcat, Stream: "ab", Sources: []string{"a", "b"}}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"a", "b"} {
		if _, err := c.Driver.Apply(ctx, stream.Command{Op: stream.OpDeleteStream, Stream: s}); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	if err := cl.ReadStream(ctx, "ab", func(e stream.Entry) error {
		got = append(got, string(e.Blocks[0]))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := []string{"a-0", "a-1", "a-2", "a-3", "a-4", "b-0", "b-1", "b-2", "b-3", "b-4"}
	if !slices.Equal(got, want) {
		t.Fatalf("concatenated stream reads %v", got)
	}
	if n, err := c.Driver.RunTasks(ctx); n != 0 || err != nil {
		t.Fatalf("tasks while ab references everything: %d %v", n, err)
	}
	// An orphan on a node: an extent id the manager never placed there.
	orphan := c.Nodes[0]
	if _, err := orphan.Node().Store().Create(999, false); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Driver.Apply(ctx, stream.Command{Op: stream.OpDeleteStream, Stream: "ab"}); err != nil {
		t.Fatal(err)
	}
	// The manager has allocated fewer than 999 extents, so the orphan is
	// not judged; one below its next id is.
	if _, err := orphan.Node().Store().Create(1, false); err != nil && !errors.Is(err, stream.ErrExists) {
		t.Fatal(err)
	}
	for _, nd := range c.Nodes {
		if err := c.Driver.SyncNode(ctx, nd.ID); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Driver.RunTasks(ctx); err != nil {
		t.Fatal(err)
	}
	for _, nd := range c.Nodes {
		ids := nd.Node().Store().List()
		if nd == orphan {
			if !slices.Equal(ids, []uint64{999}) {
				t.Fatalf("%s holds %v, want only the unjudged 999", nd.ID, ids)
			}
			continue
		}
		if len(ids) != 0 {
			t.Fatalf("%s still holds %v", nd.ID, ids)
		}
	}
	c.Manager(func(m *stream.Manager) {
		if ids := m.ExtentIDs(); len(ids) != 0 {
			t.Fatalf("manager still has extents %v", ids)
		}
	})
}

// TestNewWriterFencesOld opens a stream with a second client: the first
// client's extent is sealed under it, and its next append fails with
// ErrFenced instead of landing after the new writer's.
func TestNewWriterFencesOld(t *testing.T) {
	c := streamtest.Start(t, 3, streamtest.Options{})
	defer c.Close()
	ctx := context.Background()
	if _, err := c.Driver.Apply(ctx, stream.Command{Op: stream.OpCreateStream, Stream: "s"}); err != nil {
		t.Fatal(err)
	}
	old := stream.NewClient(c.Driver, stream.ClientOptions{})
	defer old.Close()
	r1, err := old.Append(ctx, "s", []byte("old-1"))
	if err != nil {
		t.Fatal(err)
	}
	neu := stream.NewClient(c.Driver, stream.ClientOptions{})
	defer neu.Close()
	r2, err := neu.Append(ctx, "s", []byte("new-1"))
	if err != nil {
		t.Fatal(err)
	}
	if r2.Seq <= r1.Seq || r2.Location.Extent == r1.Location.Extent {
		t.Fatalf("new writer: %+v after %+v", r2, r1)
	}
	if _, err := old.Append(ctx, "s", []byte("old-2")); !errors.Is(err, stream.ErrFenced) {
		t.Fatalf("old writer after a new one: %v", err)
	}
	var got []string
	if err := neu.ReadStream(ctx, "s", func(e stream.Entry) error {
		got = append(got, string(e.Blocks[0]))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []string{"old-1", "new-1"}) {
		t.Fatalf("stream reads %v", got)
	}
}
