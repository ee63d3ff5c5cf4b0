package stream

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

func mustApply(t testing.TB, m *Manager, c Command) Result {
	t.Helper()
	r, err := m.Apply(c)
	if err != nil {
		t.Fatalf("%+v: %v", c, err)
	}
	return r
}

// newTestManager has nodes n0..n(k-1) in fault domains fd(i % fds).
func newTestManager(t testing.TB, k, fds int) *Manager {
	m := NewManager(ManagerOptions{})
	for i := range k {
		mustApply(t, m, Command{Op: OpAddNode, Node: fmt.Sprintf("n%d", i), Addr: fmt.Sprintf("a%d", i), FaultDomain: fmt.Sprintf("fd%d", i%fds)})
	}
	return m
}

// checkInvariants recounts the derived state, checks every extent that
// plan would change is unsettled, and round-trips a snapshot.
func checkInvariants(t testing.TB, m *Manager) {
	t.Helper()
	refs, hosted, onNode := map[uint64]int{}, map[string]int{}, map[nodeExtent]int{}
	for _, s := range m.streams.All() {
		for i, id := range s.Extents {
			e := m.extents.Get(id)
			if e == nil {
				t.Fatalf("stream %q: missing extent %d", s.Name, id)
			}
			if !e.Sealed && i != len(s.Extents)-1 {
				t.Fatalf("stream %q: open extent %d not last", s.Name, id)
			}
			refs[id]++
		}
	}
	for id, e := range m.extents.All() {
		if r := m.refs.Get(id); refs[id] == 0 || r == nil || refs[id] != *r {
			t.Fatalf("extent %d: refs %v, counted %d", id, r, refs[id])
		}
		seen := map[string]bool{}
		for _, r := range e.Replicas {
			if seen[r.Node] {
				t.Fatalf("extent %d: two replicas on %s", id, r.Node)
			}
			seen[r.Node] = true
			hosted[r.Node]++
			onNode[nodeExtent{r.Node, id}]++
		}
		if e.Coding != nil {
			for _, f := range e.Coding.Fragments {
				hosted[f.Node]++
				onNode[nodeExtent{f.Node, id}]++
			}
		}
		if m.unsettled.Has(id) == m.settled(e) {
			t.Fatalf("extent %d: settled %v, in unsettled %v", id, m.settled(e), m.unsettled.Has(id))
		}
		if !m.unsettled.Has(id) {
			c := m.Clone()
			before := c.Snapshot()
			c.plan(c.mutExtent(id))
			if !bytes.Equal(before, c.Snapshot()) {
				t.Fatalf("extent %d is settled, but plan changes it", id)
			}
		}
	}
	if m.refs.Len() != len(refs) {
		t.Fatalf("%d extents referenced, %d counted", m.refs.Len(), len(refs))
	}
	for n, c := range m.hosted.All() {
		if *c != hosted[n] {
			t.Fatalf("node %s: hosted %d, counted %d", n, *c, hosted[n])
		}
	}
	if m.hosted.Len() != len(hosted) || m.onNode.Len() != len(onNode) {
		t.Fatalf("hosted on %d nodes (counted %d), %d (node, extent) pairs (counted %d)", m.hosted.Len(), len(hosted), m.onNode.Len(), len(onNode))
	}
	for k, c := range m.onNode.All() {
		if *c != onNode[k] {
			t.Fatalf("%+v: %d, counted %d", k, *c, onNode[k])
		}
	}
	for id := range m.unsettled.All() {
		if !m.extents.Has(id) {
			t.Fatalf("unsettled extent %d does not exist", id)
		}
	}
	snap := m.Snapshot()
	m2, err := LoadSnapshot(snap)
	if err != nil {
		t.Fatalf("load own snapshot: %v\n%s", err, snap)
	}
	if !bytes.Equal(m2.Snapshot(), snap) {
		t.Fatal("snapshot does not round-trip")
	}
	if !slices.EqualFunc(m.Tasks(), m2.Tasks(), func(a, b Task) bool { return fmt.Sprint(a) == fmt.Sprint(b) }) {
		t.Fatal("tasks differ after a snapshot round trip")
	}
}

func TestManagerPlacement(t *testing.T) {
	m := newTestManager(t, 6, 3) // two nodes per fault domain
	mustApply(t, m, Command{Op: OpCreateStream, Stream: "s"})
	if _, err := m.Apply(Command{Op: OpCreateStream, Stream: "s"}); !errors.Is(err, ErrStreamExists) {
		t.Fatal(err)
	}
	load := map[string]int{}
	for i := range 12 {
		c := Command{Op: OpAllocate, Stream: "s"}
		if i == 5 {
			c.Node = "n4"
		}
		r := mustApply(t, m, c)
		e, _ := m.Extent(r.Extent)
		fds := map[string]bool{}
		for _, rep := range e.Replicas {
			fds[m.nodes.Get(rep.Node).FaultDomain] = true
			load[rep.Node]++
		}
		if len(e.Replicas) != 3 || len(fds) != 3 || e.Primary != e.Replicas[0].Node {
			t.Fatalf("extent %d: %+v", e.ID, e)
		}
		if i == 5 && e.Primary != "n4" {
			t.Fatalf("preferred primary ignored: %+v", e)
		}
		if _, err := m.Apply(Command{Op: OpAllocate, Stream: "s"}); !errors.Is(err, ErrNotSealed) {
			t.Fatalf("allocate after an open extent: %v", err)
		}
		mustApply(t, m, Command{Op: OpSeal, Extent: e.ID, Length: 10, Nodes: []string{e.Replicas[0].Node, e.Replicas[1].Node, e.Replicas[2].Node}})
	}
	for n, l := range load {
		if l != 6 {
			t.Fatalf("least-loaded placement: %v", load)
		}
		_ = n
	}
	checkInvariants(t, m)
	// Two fault domains cannot hold three replicas.
	m2 := newTestManager(t, 4, 2)
	mustApply(t, m2, Command{Op: OpCreateStream, Stream: "s"})
	if _, err := m2.Apply(Command{Op: OpAllocate, Stream: "s"}); !errors.Is(err, ErrNoPlacement) {
		t.Fatal(err)
	}
	checkInvariants(t, m2)
}

func TestManagerSealRepairAndReplace(t *testing.T) {
	m := newTestManager(t, 5, 5)
	mustApply(t, m, Command{Op: OpCreateStream, Stream: "s"})
	id := mustApply(t, m, Command{Op: OpAllocate, Stream: "s"}).Extent
	e, _ := m.Extent(id)
	a, b, c := e.Replicas[0].Node, e.Replicas[1].Node, e.Replicas[2].Node
	// c dies: the open extent needs a seal first.
	mustApply(t, m, Command{Op: OpNodeDown, Node: c})
	if tasks := m.Tasks(); len(tasks) != 1 || tasks[0].Kind != TaskSeal || tasks[0].Extent != id {
		t.Fatalf("tasks %+v", tasks)
	}
	// Sealed by a and b; c missed it and is dead: a new replica is placed.
	mustApply(t, m, Command{Op: OpSeal, Extent: id, Length: 100, LastSeq: 7, Nodes: []string{a, b}})
	if r, err := m.Apply(Command{Op: OpSeal, Extent: id, Length: 100}); err != nil || r.Changed {
		t.Fatalf("repeated seal: %+v %v", r, err)
	}
	if _, err := m.Apply(Command{Op: OpSeal, Extent: id, Length: 99}); !errors.Is(err, ErrSealConflict) {
		t.Fatal(err)
	}
	tasks := m.Tasks()
	if len(tasks) != 1 || tasks[0].Kind != TaskCopy || tasks[0].Length != 100 || len(tasks[0].Sources) != 2 {
		t.Fatalf("tasks %+v", tasks)
	}
	newNode := tasks[0].Node
	if newNode == a || newNode == b || newNode == c {
		t.Fatalf("replacement on %s", newNode)
	}
	checkInvariants(t, m)
	mustApply(t, m, Command{Op: OpReplicaReady, Extent: id, Node: newNode})
	e, _ = m.Extent(id)
	if len(e.Replicas) != 3 || e.replica(c) >= 0 {
		t.Fatalf("after the copy: %+v", e)
	}
	// c's delete waits until c is back.
	if tasks := m.Tasks(); len(tasks) != 0 {
		t.Fatalf("tasks with c dead: %+v", tasks)
	}
	mustApply(t, m, Command{Op: OpAddNode, Node: c, Addr: "a-new", FaultDomain: m.nodes.Get(c).FaultDomain})
	if tasks := m.Tasks(); len(tasks) != 1 || tasks[0].Kind != TaskDelete || tasks[0].Node != c || tasks[0].Addr != "a-new" {
		t.Fatalf("tasks %+v", tasks)
	}
	mustApply(t, m, Command{Op: OpReplicaDeleted, Extent: id, Node: c})
	// A corrupt report on b: rebuilt in place.
	mustApply(t, m, Command{Op: OpReportCorrupt, Extent: id, Node: b})
	if tasks := m.Tasks(); len(tasks) != 1 || tasks[0].Kind != TaskCopy || tasks[0].Node != b || len(tasks[0].Sources) != 2 {
		t.Fatalf("tasks %+v", tasks)
	}
	mustApply(t, m, Command{Op: OpReplicaFailed, Extent: id, Node: b}) // a repair stays
	if tasks := m.Tasks(); len(tasks) != 1 {
		t.Fatalf("tasks %+v", tasks)
	}
	mustApply(t, m, Command{Op: OpReplicaReady, Extent: id, Node: b})
	if tasks := m.Tasks(); len(tasks) != 0 {
		t.Fatalf("tasks %+v", tasks)
	}
	checkInvariants(t, m)
}

func TestManagerConcatGCAndFencing(t *testing.T) {
	m := newTestManager(t, 3, 3)
	for _, s := range []string{"a", "b"} {
		mustApply(t, m, Command{Op: OpCreateStream, Stream: s})
		id := mustApply(t, m, Command{Op: OpAllocate, Stream: s}).Extent
		mustApply(t, m, Command{Op: OpSeal, Extent: id, Length: 5, Nodes: []string{"n0", "n1", "n2"}})
	}
	ep := mustApply(t, m, Command{Op: OpOpenWriter, Stream: "a"}).Epoch
	mustApply(t, m, Command{Op: OpOpenWriter, Stream: "a"})
	if _, err := m.Apply(Command{Op: OpAllocate, Stream: "a", Epoch: ep}); !errors.Is(err, ErrFenced) {
		t.Fatalf("allocate by an old writer: %v", err)
	}
	mustApply(t, m, Command{Op: OpConcat, Stream: "ab", Sources: []string{"a", "b"}})
	s, _, _ := m.Stream("ab")
	if !slices.Equal(s.Extents, []uint64{1, 2}) || !slices.Equal(s.Restarts, []int{1}) {
		t.Fatalf("ab: %+v", s)
	}
	mustApply(t, m, Command{Op: OpDeleteStream, Stream: "a"})
	mustApply(t, m, Command{Op: OpDeleteStream, Stream: "b"})
	if tasks := m.Tasks(); len(tasks) != 0 {
		t.Fatalf("tasks %+v", tasks)
	}
	checkInvariants(t, m)
	mustApply(t, m, Command{Op: OpDeleteStream, Stream: "ab"})
	if tasks := m.Tasks(); len(tasks) != 6 {
		t.Fatalf("tasks %+v", tasks)
	}
	mustApply(t, m, Command{Op: OpNodeExtents, Node: "n0", Extents: []uint64{1, 2, 3}}) // 3 never allocated
	checkInvariants(t, m)
}

// randomCommand draws a command over a small universe of names, so that
// most commands are valid.
func randomCommand(rng *rand.Rand, m *Manager) Command {
	node := fmt.Sprintf("n%d", rng.IntN(6))
	st := fmt.Sprintf("s%d", rng.IntN(3))
	ext := uint64(1 + rng.IntN(12))
	var nodes []string
	for i := range 6 {
		if rng.IntN(2) == 0 {
			nodes = append(nodes, fmt.Sprintf("n%d", i))
		}
	}
	ops := []Op{OpAddNode, OpNodeDown, OpNodeLoad, OpCreateStream, OpDeleteStream, OpConcat, OpOpenWriter,
		OpAllocate, OpSeal, OpReportCorrupt, OpReplicaReady, OpReplicaFailed, OpReplicaDeleted, OpNodeExtents, "bogus",
		OpSetCode, OpCodeStart, OpCodeStart, OpCoded, OpCoded, OpCodeAbort, OpFragmentReady, OpFragmentCorrupt, OpFragmentDeleted,
		OpTrimStream, OpTrimStream}
	c := Command{Op: ops[rng.IntN(len(ops))], Node: node, Stream: st, Extent: ext}
	switch c.Op {
	case OpAddNode:
		c.Addr, c.FaultDomain = "addr-"+node, fmt.Sprintf("fd%d", rng.IntN(4))
	case OpNodeLoad:
		c.UsedBytes = rng.Int64N(1000)
	case OpConcat:
		c.Stream = fmt.Sprintf("c%d", rng.IntN(3))
		c.Sources = []string{fmt.Sprintf("s%d", rng.IntN(3)), fmt.Sprintf("s%d", rng.IntN(3))}
	case OpAllocate:
		c.Epoch = uint64(rng.IntN(2))
		c.Avoid = nodes
	case OpSeal:
		c.Length, c.LastSeq, c.Nodes = int64(rng.IntN(3)), uint64(rng.IntN(5)), nodes
	case OpNodeExtents:
		c.Extents = []uint64{ext, ext + 1}
		c.Fragments = []FragmentRef{{Extent: ext, Index: rng.IntN(16)}}
	case OpSetCode:
		c.Code = []string{CodeLRC12, "", "bogus"}[rng.IntN(3)]
	case OpTrimStream:
		// Mostly an extent of the stream (of a concatenation, now and then).
		if rng.IntN(3) == 0 {
			c.Stream = fmt.Sprintf("c%d", rng.IntN(3))
		}
		if s := m.streams.Get(c.Stream); s != nil && len(s.Extents) > 0 && rng.IntN(4) != 0 {
			c.Extent = s.Extents[rng.IntN(len(s.Extents))]
		}
	case OpFragmentReady, OpFragmentCorrupt, OpFragmentDeleted:
		c.Index = rng.IntN(17)
		if e := m.extents.Get(ext); e != nil && e.Coding != nil && rng.IntN(2) == 0 {
			c.Node = e.Coding.Fragments[c.Index%16].Node
		}
	case OpCoded:
		// Mostly a valid result for the extent's current placement.
		e := m.extents.Get(ext)
		if e == nil || e.Coding == nil {
			break
		}
		for _, f := range e.Coding.Fragments {
			c.Nodes = append(c.Nodes, f.Node)
			c.CRCs = append(c.CRCs, rng.Uint32())
		}
		c.FragmentSize = (e.Length + 11) / 12
		for i := range 13 {
			c.Boundaries = append(c.Boundaries, min(int64(i)*c.FragmentSize, e.Length))
		}
		if rng.IntN(4) == 0 {
			c.Nodes[rng.IntN(16)] = node
		}
	}
	return c
}

// TestManagerRandomCommands applies random command sequences, checking
// the invariants, that a failed command changes nothing, and that a
// replayed log reproduces the state.
func TestManagerRandomCommands(t *testing.T) {
	seed := testSeed(t)
	for round := range 200 {
		rng := rand.New(rand.NewPCG(seed, uint64(round)))
		m := NewManager(ManagerOptions{})
		var log []Command
		for range 200 {
			c := randomCommand(rng, m)
			before := m.Snapshot()
			if _, err := m.Apply(c); err != nil {
				if !bytes.Equal(before, m.Snapshot()) {
					t.Fatalf("round %d: failed %+v changed the state: %v", round, c, err)
				}
				continue
			}
			log = append(log, c)
			checkInvariants(t, m)
		}
		r := NewManager(ManagerOptions{})
		for _, c := range log {
			if _, err := r.Apply(c); err != nil {
				t.Fatalf("round %d: replay of %+v: %v", round, c, err)
			}
		}
		if !bytes.Equal(r.Snapshot(), m.Snapshot()) {
			t.Fatalf("round %d: replay differs", round)
		}
	}
}

// FuzzLoadSnapshot: arbitrary bytes never panic the loader; what it
// accepts re-encodes to a snapshot that loads to the same state.
func FuzzLoadSnapshot(f *testing.F) {
	m := newTestManager(f, 4, 4)
	mustApply(f, m, Command{Op: OpCreateStream, Stream: "s"})
	id := mustApply(f, m, Command{Op: OpAllocate, Stream: "s"}).Extent
	mustApply(f, m, Command{Op: OpSeal, Extent: id, Length: 3, Nodes: []string{"n0"}})
	mustApply(f, m, Command{Op: OpConcat, Stream: "t", Sources: []string{"s", "s"}})
	f.Add(m.Snapshot())
	f.Add(NewManager(ManagerOptions{}).Snapshot())
	mc := newTestManager(f, 8, 4)
	cid := codedExtent(f, mc, 500)
	mustApply(f, mc, Command{Op: OpCodeStart, Extent: cid})
	f.Add(mc.Snapshot())
	mustApply(f, mc, codedCommand(mc, cid))
	mustApply(f, mc, Command{Op: OpNodeDown, Node: mc.extents.Get(cid).Coding.Fragments[2].Node})
	f.Add(mc.Snapshot())
	f.Add([]byte(`{"version":1}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := LoadSnapshot(b)
		if err != nil {
			if !errors.Is(err, ErrBadCommand) {
				t.Fatalf("error not ErrBadCommand: %v", err)
			}
			return
		}
		checkInvariants(t, m)
		m.Tasks()
	})
}

var managerErrors = []error{ErrBadCommand, ErrUnknownNode, ErrUnknownExtent, ErrStreamNotFound,
	ErrStreamExists, ErrNotSealed, ErrFenced, ErrNoPlacement, ErrSealConflict, ErrUnavailable, ErrPlacementChanged}

// FuzzApply drives a manager with commands drawn from the fuzzer's seed.
func FuzzApply(f *testing.F) {
	f.Add(uint64(1), uint8(50))
	f.Add(uint64(42), uint8(200))
	f.Fuzz(func(t *testing.T, seed uint64, n uint8) {
		rng := rand.New(rand.NewPCG(seed, 0))
		m := NewManager(ManagerOptions{})
		for range int(n) {
			if _, err := m.Apply(randomCommand(rng, m)); err != nil && !slices.ContainsFunc(managerErrors, func(e error) bool { return errors.Is(err, e) }) {
				t.Fatalf("error wraps no manager sentinel: %v", err)
			}
		}
		checkInvariants(t, m)
	})
}

// TestManagerTrimStream trims a stream's prefix: the extents before the
// named one leave the stream and, unless another stream holds them, the
// manager (delete tasks for every replica, and fragment of a coded one);
// refusals; a repeat changes nothing; a replayed log and a snapshot give
// the same state.
func TestManagerTrimStream(t *testing.T) {
	m := newTestManager(t, 16, 16)
	var log []Command
	apply := func(c Command) Result {
		t.Helper()
		log = append(log, c)
		return mustApply(t, m, c)
	}
	apply(Command{Op: OpCreateStream, Stream: "s"})
	var ids []uint64
	for i := range 5 {
		id := apply(Command{Op: OpAllocate, Stream: "s"}).Extent
		ids = append(ids, id)
		if i < 4 {
			e, _ := m.Extent(id)
			apply(Command{Op: OpSeal, Extent: id, Length: 100, Nodes: []string{e.Replicas[0].Node, e.Replicas[1].Node, e.Replicas[2].Node}})
		}
	}
	// ids[1] is coded (its replicas deleted); u is another stream.
	apply(Command{Op: OpCodeStart, Extent: ids[1], Code: CodeLRC12})
	apply(codedCommand(m, ids[1]))
	for _, d := range tasksOf(m, TaskDelete) {
		apply(Command{Op: OpReplicaDeleted, Extent: d.Extent, Node: d.Node})
	}
	apply(Command{Op: OpCreateStream, Stream: "u"})
	u := apply(Command{Op: OpAllocate, Stream: "u"}).Extent
	apply(Command{Op: OpSeal, Extent: u, Length: 7, Nodes: []string{"n0"}})
	before := m.Clone()
	frags := m.extents.Get(ids[1]).Coding.Fragments

	if r := apply(Command{Op: OpTrimStream, Stream: "s", Extent: ids[2]}); !r.Changed {
		t.Fatal("trim changed nothing")
	}
	checkInvariants(t, m)
	if s, _, _ := m.Stream("s"); !slices.Equal(s.Extents, ids[2:]) {
		t.Fatalf("stream after the trim: %v, want %v", s.Extents, ids[2:])
	}
	if m.extents.Has(ids[0]) || m.extents.Has(ids[1]) {
		t.Fatalf("extents left %v", m.ExtentIDs())
	}
	// Every replica of ids[0] and fragment of the coded ids[1] is deleted.
	var dels []PendingDelete
	for _, d := range tasksOf(m, TaskDelete) {
		dels = append(dels, PendingDelete{Extent: d.Extent, Node: d.Node})
	}
	var want []PendingDelete
	e0, _ := before.Extent(ids[0])
	for _, r := range e0.Replicas {
		want = append(want, PendingDelete{Extent: ids[0], Node: r.Node})
	}
	slices.SortFunc(want, comparePendingDelete)
	if !slices.Equal(dels, want) {
		t.Fatalf("replica deletes %v, want %v", dels, want)
	}
	fd := m.FragmentDeletes()
	if len(fd) != len(frags) {
		t.Fatalf("fragment deletes %v, want one per fragment (%d)", fd, len(frags))
	}
	for i, f := range frags {
		if !slices.Contains(fd, PendingFragmentDelete{Extent: ids[1], Index: i, Node: f.Node}) {
			t.Fatalf("no delete of fragment %d on %s: %v", i, f.Node, fd)
		}
	}
	// The version before is unchanged (copy on write).
	if s, _, _ := before.Stream("s"); !slices.Equal(s.Extents, ids) {
		t.Fatalf("the version before the trim changed: %v", s.Extents)
	}
	checkInvariants(t, before)
	// Refusals.
	for _, c := range []struct {
		cmd  Command
		want error
	}{
		{Command{Op: OpTrimStream, Stream: "nope", Extent: ids[2]}, ErrStreamNotFound},
		{Command{Op: OpTrimStream, Stream: "s", Extent: ids[0]}, ErrUnknownExtent}, // trimmed already
		{Command{Op: OpTrimStream, Stream: "s", Extent: u}, ErrUnknownExtent},
		{Command{Op: OpTrimStream, Stream: "s", Extent: 999}, ErrUnknownExtent},
		{Command{Op: OpTrimStream, Stream: "s"}, ErrUnknownExtent},
	} {
		snap := m.Snapshot()
		if _, err := m.Apply(c.cmd); !errors.Is(err, c.want) {
			t.Fatalf("%+v: %v, want %v", c.cmd, err, c.want)
		}
		if !bytes.Equal(snap, m.Snapshot()) {
			t.Fatalf("refused %+v changed the state", c.cmd)
		}
	}
	// Repeated: nothing more.
	if r := apply(Command{Op: OpTrimStream, Stream: "s", Extent: ids[2]}); r.Changed {
		t.Fatal("a repeated trim changed the state")
	}
	// t = u + s shares ids[2:5]: trimming them from s keeps them.
	e4, _ := m.Extent(ids[4])
	apply(Command{Op: OpSeal, Extent: ids[4], Length: 100, Nodes: []string{e4.Replicas[0].Node, e4.Replicas[1].Node, e4.Replicas[2].Node}})
	apply(Command{Op: OpConcat, Stream: "t", Sources: []string{"u", "s"}})
	ids = append(ids, apply(Command{Op: OpAllocate, Stream: "s"}).Extent)
	ndel := len(tasksOf(m, TaskDelete))
	apply(Command{Op: OpTrimStream, Stream: "s", Extent: ids[3]})
	if !m.extents.Has(ids[2]) || len(tasksOf(m, TaskDelete)) != ndel {
		t.Fatal("an extent another stream holds was deleted")
	}
	// Up to the open extent: every sealed one goes, the open one stays.
	apply(Command{Op: OpTrimStream, Stream: "s", Extent: ids[5]})
	if s, es, _ := m.Stream("s"); !slices.Equal(s.Extents, ids[5:]) || es[0].Sealed {
		t.Fatalf("stream after trimming to its open extent: %+v", s)
	}
	// t's restart (s's extents after u's) goes with the prefix...
	apply(Command{Op: OpTrimStream, Stream: "t", Extent: ids[2]})
	if s, _, _ := m.Stream("t"); !slices.Equal(s.Extents, ids[2:5]) || len(s.Restarts) != 0 || !m.extents.Has(u) {
		t.Fatalf("t after the trim: %+v", s)
	}
	// ... and now ids[2] is t's alone: trimming it deletes it.
	apply(Command{Op: OpTrimStream, Stream: "t", Extent: ids[3]})
	if m.extents.Has(ids[2]) || len(tasksOf(m, TaskDelete)) != ndel+3 {
		t.Fatalf("ids[2] not deleted: %d delete tasks", len(tasksOf(m, TaskDelete)))
	}
	checkInvariants(t, m)
	// The deletes run: nothing is left pending.
	for _, d := range tasksOf(m, TaskDelete) {
		apply(Command{Op: OpReplicaDeleted, Extent: d.Extent, Node: d.Node})
	}
	for _, d := range tasksOf(m, TaskDeleteFragment) {
		apply(Command{Op: OpFragmentDeleted, Extent: d.Extent, Index: d.Index, Node: d.Node})
	}
	if n := len(tasksOf(m, TaskDelete)) + len(m.FragmentDeletes()); n != 0 {
		t.Fatalf("%d deletes left", n)
	}
	// Replay and encoding round trip.
	r := newTestManager(t, 16, 16)
	for _, c := range log {
		if _, err := r.Apply(c); err != nil {
			t.Fatalf("replay of %+v: %v", c, err)
		}
	}
	if !bytes.Equal(r.Snapshot(), m.Snapshot()) {
		t.Fatal("replayed log differs")
	}
	checkInvariants(t, r)
}
