package stream_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tabuladb/tabula/engines/vfs"
	"github.com/tabuladb/tabula/replication/stream"
	"github.com/tabuladb/tabula/replication/stream/streamtest"
)

type codedFixture struct {
	c    *streamtest.Cluster
	cl   *stream.Client
	res  []stream.AppendResult
	data [][][]byte
	ext  uint64 // the coded extent
	open uint64 // the stream's open extent
}

// newCodedFixture starts nodes extent nodes in as many fault domains,
// writes a coded stream "s" across two extents and seals the first.
func newCodedFixture(t *testing.T, nodes int, rng *rand.Rand) *codedFixture {
	t.Helper()
	var rngMu sync.Mutex
	f := &codedFixture{c: streamtest.Start(t, nodes, streamtest.Options{})}
	ctx := context.Background()
	if _, err := f.c.Driver.Apply(ctx, stream.Command{Op: stream.OpCreateStream, Stream: "s", Code: stream.CodeLRC12}); err != nil {
		t.Fatal(err)
	}
	f.cl = stream.NewClient(f.c.Driver, stream.ClientOptions{})
	appendSome := func(n int) {
		for range n {
			bs := randBlocks(rng, &rngMu)
			r, err := f.cl.Append(ctx, "s", bs...)
			if err != nil {
				t.Fatal(err)
			}
			f.res, f.data = append(f.res, r), append(f.data, bs)
		}
	}
	appendSome(150)
	f.ext = f.res[0].Location.Extent
	if _, err := f.c.Driver.SealAndAllocate(ctx, "s", 0, f.ext); err != nil {
		t.Fatal(err)
	}
	appendSome(20) // the writer finds its extent sealed and moves on
	f.open = f.res[len(f.res)-1].Location.Extent
	if f.open == f.ext {
		t.Fatal("appends after the seal landed in the sealed extent")
	}
	return f
}

func (f *codedFixture) close() {
	f.cl.Close()
	f.c.Close()
}

// checkAll reads every acknowledged entry back, one by one and as a
// stream.
func (f *codedFixture) checkAll(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	for i, r := range f.res {
		got, err := f.cl.Read(ctx, r.Location)
		if err != nil || !equalBlocks(got, f.data[i]) {
			t.Fatalf("entry %d at %+v: %v", i, r.Location, err)
		}
		if len(r.Blocks) > 1 { // a single block in the middle of an entry
			b := r.Blocks[len(r.Blocks)-1]
			got, err := f.cl.Read(ctx, b)
			if err != nil || len(got) != 1 || !equalBlocks(got, f.data[i][len(r.Blocks)-1:]) {
				t.Fatalf("entry %d last block: %v", i, err)
			}
		}
	}
	n := 0
	if err := f.cl.ReadStream(ctx, "s", func(e stream.Entry) error {
		if e.Seq != f.res[n].Seq || !equalBlocks(e.Blocks, f.data[n]) {
			return fmt.Errorf("stream entry %d (seq %d) differs", n, e.Seq)
		}
		n++
		return nil
	}); err != nil || n != len(f.res) {
		t.Fatalf("read stream: %d of %d entries: %v", n, len(f.res), err)
	}
}

func (f *codedFixture) placement(t *testing.T) stream.ExtentPlacement {
	t.Helper()
	p, err := f.c.Driver.Extent(context.Background(), f.ext)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCodingCrashResumeAndThreeLosses codes a sealed extent of a coded
// stream, with the first attempt failing half-way (a fragment node's disk
// fails) and a fresh driver (a restarted master) resuming it; checks the
// replicas are deleted only after, that the fragments spread over the
// fault domains as `extent stat` reports, then stops fragment holders
// until exactly 3 fragments are gone (12 nodes: some hold two) and reads
// every byte back through reconstruction; the manager then rebuilds the 3
// fragments elsewhere and reads are direct again.
func TestCodingCrashResumeAndThreeLosses(t *testing.T) {
	seed := streamtest.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 0))
	f := newCodedFixture(t, 12, rng)
	defer f.close()
	c, ctx := f.c, context.Background()

	// Start coding, then fail one fragment node's disk: the coordinator's
	// PutFragment to it fails, the extent stays coding, replicas intact.
	if _, err := c.Driver.Apply(ctx, stream.Command{Op: stream.OpCodeStart, Extent: f.ext}); err != nil {
		t.Fatal(err)
	}
	p := f.placement(t)
	if p.Coding == nil || p.Coding.Coded || len(p.Replicas) != 3 {
		t.Fatalf("after code_start: %+v", p)
	}
	sick := c.Nodes[c.Index(p.Coding.Fragments[4].Node)]
	sick.FS.Inject(vfs.Fault{Ops: vfs.OpCreate, Sticky: true})
	if _, err := c.Driver.RunTasks(ctx); err == nil {
		t.Fatal("coding onto a failing disk succeeded")
	}
	if p := f.placement(t); p.Coding.Coded || len(p.Replicas) != 3 {
		t.Fatalf("after a failed coding: coded %v, %d replicas", p.Coding.Coded, len(p.Replicas))
	}
	f.checkAll(t) // still served by the replicas
	sick.FS.ClearFaults()
	creates := map[string]int64{}
	for _, nd := range c.Nodes {
		creates[nd.ID] = nd.FS.Ops(vfs.OpCreate)
	}

	// The master restarts: a new driver over the same state resumes. Only
	// the fragments that did not make it are written again.
	d2 := stream.NewDriver(c.Log, stream.DriverOptions{})
	defer d2.Close()
	if _, err := d2.RunTasks(ctx); err != nil {
		t.Fatalf("resumed coding: %v", err)
	}
	for _, nd := range c.Nodes {
		if n := nd.FS.Ops(vfs.OpCreate) - creates[nd.ID]; (nd == sick) != (n > 0) {
			t.Fatalf("resume created %d files on %s (the failed node is %s)", n, nd.ID, sick.ID)
		}
	}
	if _, err := d2.RunTasks(ctx); err != nil { // the replica deletes
		t.Fatal(err)
	}
	p = f.placement(t)
	if !p.Coding.Coded || len(p.Replicas) != 0 {
		t.Fatalf("after coding: coded %v, %d replicas", p.Coding.Coded, len(p.Replicas))
	}
	for _, nd := range c.Nodes {
		if _, err := nd.Node().Store().Get(f.ext); err == nil {
			t.Fatalf("node %s still holds a full replica", nd.ID)
		}
	}
	if got, want := p.Coding.Spread(), "16 fragments in 12 fault domains (fewer domains than fragments: at most 2 per domain)"; got != want {
		t.Fatalf("spread %q, want %q", got, want)
	}
	t.Logf("fragment size %d for %d bytes; boundaries %v", p.Coding.FragmentSize, p.Length, p.Coding.Boundaries)
	f.checkAll(t)
	if n := f.cl.Reconstructions(); n != 0 {
		t.Fatalf("%d reconstruction reads with every fragment up", n)
	}

	// Stop fragment holders (not the open extent's replicas) until
	// exactly 3 fragments are gone.
	openP, _ := c.Driver.Extent(ctx, f.open)
	holders := map[string][]int{}
	for _, fr := range p.Coding.Fragments {
		holders[fr.Node] = append(holders[fr.Node], fr.Index)
	}
	var kill []string
	var lost []int
	for attempt := 0; len(lost) != 3; attempt++ {
		if attempt > 1000 {
			t.Fatal("no node set loses exactly 3 fragments")
		}
		kill, lost = nil, nil
		ids := slices.Sorted(func(yield func(string) bool) {
			for id := range holders {
				if !yield(id) {
					return
				}
			}
		})
		rng.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		for _, id := range ids {
			if slices.ContainsFunc(openP.Replicas, func(r stream.ReplicaAddr) bool { return r.Node == id }) || len(lost)+len(holders[id]) > 3 {
				continue
			}
			kill, lost = append(kill, id), append(lost, holders[id]...)
		}
	}
	slices.Sort(lost)
	t.Logf("stopping %v: fragments %v lost", kill, lost)
	for _, id := range kill {
		c.Stop(c.Index(id))
	}
	f.checkAll(t)
	if f.cl.Reconstructions() == 0 {
		t.Fatal("no reconstruction reads with 3 fragments gone")
	}

	// The manager learns the nodes are down and rebuilds the fragments.
	for _, id := range kill {
		if _, err := c.Driver.Apply(ctx, stream.Command{Op: stream.OpNodeDown, Node: id}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Driver.RunTasks(ctx); err != nil {
		t.Fatalf("rebuilds: %v", err)
	}
	p = f.placement(t)
	for _, fr := range p.Coding.Fragments {
		if !fr.OK || slices.Contains(kill, fr.Node) {
			t.Fatalf("fragment %d on %s ok=%v after rebuild", fr.Index, fr.Node, fr.OK)
		}
	}
	before := f.cl.Reconstructions()
	f.checkAll(t)
	if n := f.cl.Reconstructions() - before; n != 0 {
		t.Fatalf("%d reconstruction reads after the rebuilds", n)
	}
}

// TestCodedFragmentBitFlip flips a bit in one data fragment: reads still
// return the right bytes (by reconstruction), the client reports the
// fragment, the manager has it rebuilt in place, and the node scrubs
// clean.
func TestCodedFragmentBitFlip(t *testing.T) {
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
	p := f.placement(t)
	if !p.Coding.Coded || !strings.Contains(p.Coding.Spread(), "8 fault domains") {
		t.Fatalf("coding %+v", p.Coding)
	}
	idx := rng.IntN(3)
	fr := p.Coding.Fragments[idx]
	victim := c.Nodes[c.Index(fr.Node)]
	path := fmt.Sprintf("/extents/fragments/%016x.%02d.frag", f.ext, idx)
	span := p.Coding.Boundaries[idx+1] - p.Coding.Boundaries[idx]
	if err := victim.FS.FlipBit(path, 40+rng.Int64N(span), uint(rng.IntN(8))); err != nil {
		t.Fatal(err)
	}
	f.checkAll(t)
	if f.cl.Reconstructions() == 0 {
		t.Fatal("corrupt fragment read without reconstruction")
	}
	var tasks []stream.Task
	c.Manager(func(m *stream.Manager) { tasks = m.Tasks() })
	if len(tasks) != 1 || tasks[0].Kind != stream.TaskRebuild || tasks[0].Index != idx || tasks[0].Node != fr.Node {
		t.Fatalf("tasks %+v", tasks)
	}
	if _, err := c.Driver.RunTasks(ctx); err != nil {
		t.Fatal(err)
	}
	if bad := victim.Node().ScrubFragments(ctx); len(bad) != 0 {
		t.Fatalf("scrub after rebuild: %v", bad)
	}
	// Garbage collection removes every fragment.
	if _, err := c.Driver.Apply(ctx, stream.Command{Op: stream.OpDeleteStream, Stream: "s"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Driver.RunTasks(ctx); err != nil {
		t.Fatal(err)
	}
	for _, nd := range c.Nodes {
		if fs := nd.Node().Fragments().List(); len(fs) != 0 {
			t.Fatalf("node %s keeps fragments %+v", nd.ID, fs)
		}
	}
	var errs []error
	c.Manager(func(m *stream.Manager) {
		if len(m.Tasks()) != 0 {
			errs = append(errs, errors.New("tasks left"))
		}
	})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
}

// TestCodedReadSlowNode points a fragment holder at a listener that never
// answers (a hung node): reads of its fragments give up after
// FragmentTimeout and reconstruct, and return the right bytes.
func TestCodedReadSlowNode(t *testing.T) {
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
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	var heldMu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			heldMu.Lock()
			held = append(held, conn)
			heldMu.Unlock()
		}
	}()
	defer func() {
		lis.Close()
		<-done
		for _, conn := range held {
			conn.Close()
		}
	}()
	p := f.placement(t)
	slow := p.Coding.Fragments[1].Node
	if _, err := c.Driver.Apply(ctx, stream.Command{Op: stream.OpAddNode, Node: slow, Addr: lis.Addr().String(), FaultDomain: p.Coding.Fragments[1].FaultDomain}); err != nil {
		t.Fatal(err)
	}
	cl := stream.NewClient(c.Driver, stream.ClientOptions{FragmentTimeout: 50 * time.Millisecond})
	defer cl.Close()
	var inFrag1 []int
	for i, r := range f.res {
		if r.Location.Extent == f.ext && r.Location.Offset >= p.Coding.Boundaries[1] && r.Location.Offset+r.Location.Length <= p.Coding.Boundaries[2] {
			inFrag1 = append(inFrag1, i)
		}
	}
	if len(inFrag1) == 0 {
		t.Fatal("no entry in fragment 1")
	}
	for _, i := range inFrag1[:min(5, len(inFrag1))] {
		t0 := time.Now()
		got, err := cl.Read(ctx, f.res[i].Location)
		if err != nil || !equalBlocks(got, f.data[i]) {
			t.Fatalf("entry %d behind a hung node: %v", i, err)
		}
		t.Logf("read of entry %d in %v", i, time.Since(t0))
	}
	if cl.Reconstructions() == 0 {
		t.Fatal("no reconstruction behind a hung node")
	}
}
