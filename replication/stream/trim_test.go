package stream_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tabuladb/tabula/replication/stream"
	"github.com/tabuladb/tabula/replication/stream/streamtest"
)

// TestTrimStream writes a stream over five extents, trims the first two
// while a reader keeps reading the entries of the others, and checks that
// the driver's delete tasks remove the trimmed replicas from every node,
// that the reader saw no error, that the stream reads back from the first
// kept extent, that appends go on, and that a repeated trim does nothing.
func TestTrimStream(t *testing.T) {
	seed := streamtest.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 0))
	var rngMu sync.Mutex
	c := streamtest.Start(t, 4, streamtest.Options{})
	defer c.Close()
	ctx := context.Background()
	cl := stream.NewClient(c.Driver, stream.ClientOptions{})
	defer cl.Close()
	if _, err := c.Driver.Apply(ctx, stream.Command{Op: stream.OpCreateStream, Stream: "log"}); err != nil {
		t.Fatal(err)
	}
	var res []stream.AppendResult
	var data [][][]byte
	appendSome := func(n int) {
		for range n {
			bs := randBlocks(rng, &rngMu)
			r, err := cl.Append(ctx, "log", bs...)
			if err != nil {
				t.Fatal(err)
			}
			res, data = append(res, r), append(data, bs)
		}
	}
	var exts []uint64
	for range 4 {
		appendSome(10)
		last := res[len(res)-1].Location.Extent
		exts = append(exts, last)
		if _, err := c.Driver.SealAndAllocate(ctx, "log", 0, last); err != nil {
			t.Fatal(err)
		}
	}
	appendSome(10) // into the open fifth extent
	exts = append(exts, res[len(res)-1].Location.Extent)
	info, err := c.Driver.Stream(ctx, "log")
	if err != nil {
		t.Fatal(err)
	}
	var ids []uint64
	for _, p := range info.Extents {
		ids = append(ids, p.ID)
	}
	if !slices.Equal(ids, exts) {
		t.Fatalf("stream extents %v, appends landed in %v", ids, exts)
	}
	keep := 20 // entries 20.. are in exts[2:]
	trimmed := map[uint64][]string{}
	for _, p := range info.Extents[:2] {
		for _, r := range p.Replicas {
			trimmed[p.ID] = append(trimmed[p.ID], r.Node)
		}
	}

	// A reader of the kept entries, running through the trim and the
	// deletes.
	var stop atomic.Bool
	defer stop.Store(true)
	var reads atomic.Int64
	readErr := make(chan error, 1)
	go func() {
		defer close(readErr)
		for i := keep; !stop.Load(); i = keep + (i-keep+1)%(len(data)-keep) {
			got, err := cl.Read(ctx, res[i].Location)
			if err != nil || !equalBlocks(got, data[i]) {
				readErr <- fmt.Errorf("entry %d at %+v: %v", i, res[i].Location, err)
				return
			}
			reads.Add(1)
		}
	}()

	streamtest.WaitFor(t, 10*time.Second, "reads before the trim", func() bool { return reads.Load() >= 10 })
	r, err := c.Driver.Apply(ctx, stream.Command{Op: stream.OpTrimStream, Stream: "log", Extent: exts[2]})
	if err != nil || !r.Changed {
		t.Fatalf("trim: %+v %v", r, err)
	}
	n, err := c.Driver.RunTasks(ctx)
	if err != nil || n != 6 {
		t.Fatalf("delete tasks: %d done, %v; want 6", n, err)
	}
	at := reads.Load()
	streamtest.WaitFor(t, 10*time.Second, "reads after the deletes", func() bool { return reads.Load() >= at+10 })
	stop.Store(true)
	if err := <-readErr; err != nil {
		t.Fatalf("reader of the kept extents: %v", err)
	}
	for _, nd := range c.Nodes {
		held := nd.Node().Store().List()
		for id, nodes := range trimmed {
			if slices.Contains(held, id) {
				t.Fatalf("node %s still holds trimmed extent %d (replicas were on %v)", nd.ID, id, nodes)
			}
		}
	}
	c.Manager(func(m *stream.Manager) {
		if got := m.ExtentIDs(); !slices.Equal(got, exts[2:]) {
			t.Errorf("manager extents %v, want %v", got, exts[2:])
		}
		if tasks := m.Tasks(); len(tasks) != 0 {
			t.Errorf("tasks left: %+v", tasks)
		}
	})
	// A trimmed entry is gone; the stream reads from the first kept one.
	if _, err := cl.Read(ctx, res[0].Location); err == nil {
		t.Fatal("read of a trimmed entry succeeded")
	}
	appendSome(5)
	i := keep
	if err := cl.ReadStream(ctx, "log", func(e stream.Entry) error {
		if i >= len(res) || e.Seq != res[i].Seq || !equalBlocks(e.Blocks, data[i]) {
			return fmt.Errorf("stream entry %d (seq %d) differs", i, e.Seq)
		}
		i++
		return nil
	}); err != nil || i != len(res) {
		t.Fatalf("read stream: up to %d of %d: %v", i, len(res), err)
	}
	// Repeated: nothing to do.
	if r, err := c.Driver.Apply(ctx, stream.Command{Op: stream.OpTrimStream, Stream: "log", Extent: exts[2]}); err != nil || r.Changed {
		t.Fatalf("repeated trim: %+v %v", r, err)
	}
	if n, err := c.Driver.RunTasks(ctx); n != 0 || err != nil {
		t.Fatalf("tasks after a repeated trim: %d %v", n, err)
	}
}

// TestTrimCodedStream trims a coded extent off a coded stream: its
// fragments are deleted from every node, and the open extent still
// reads.
func TestTrimCodedStream(t *testing.T) {
	seed := streamtest.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 0))
	f := newCodedFixture(t, 8, rng)
	defer f.close()
	c, ctx := f.c, context.Background()
	for range 2 {
		if _, err := c.Driver.RunTasks(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if p := f.placement(t); p.Coding == nil || !p.Coding.Coded {
		t.Fatalf("extent %d not coded: %+v", f.ext, p.Coding)
	}
	frags := 0
	for _, nd := range c.Nodes {
		frags += len(nd.Node().Fragments().List())
	}
	if frags != 16 {
		t.Fatalf("%d fragments on the nodes, want 16", frags)
	}
	if _, err := c.Driver.Apply(ctx, stream.Command{Op: stream.OpTrimStream, Stream: "s", Extent: f.open}); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Driver.RunTasks(ctx); err != nil || n != 16 {
		t.Fatalf("fragment deletes: %d done, %v", n, err)
	}
	for _, nd := range c.Nodes {
		if fs := nd.Node().Fragments().List(); len(fs) != 0 {
			t.Fatalf("node %s keeps fragments %+v", nd.ID, fs)
		}
	}
	k := slices.IndexFunc(f.res, func(r stream.AppendResult) bool { return r.Location.Extent == f.open })
	for i := k; i < len(f.res); i++ {
		got, err := f.cl.Read(ctx, f.res[i].Location)
		if err != nil || !equalBlocks(got, f.data[i]) {
			t.Fatalf("entry %d in the open extent: %v", i, err)
		}
	}
}
