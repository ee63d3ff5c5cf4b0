package stream

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

// codedExtent makes stream "s" (coded with LRC(12,2,2)) with one sealed
// extent of length and returns its id.
func codedExtent(t testing.TB, m *Manager, length int64) uint64 {
	t.Helper()
	mustApply(t, m, Command{Op: OpCreateStream, Stream: "s", Code: CodeLRC12})
	id := mustApply(t, m, Command{Op: OpAllocate, Stream: "s"}).Extent
	e, _ := m.Extent(id)
	var nodes []string
	for _, r := range e.Replicas {
		nodes = append(nodes, r.Node)
	}
	mustApply(t, m, Command{Op: OpSeal, Extent: id, Length: length, Nodes: nodes})
	return id
}

func tasksOf(m *Manager, kind TaskKind) []Task {
	var out []Task
	for _, t := range m.Tasks() {
		if t.Kind == kind {
			out = append(out, t)
		}
	}
	return out
}

// codedCommand is the OpCoded a coordinator would report for e.
func codedCommand(m *Manager, id uint64) Command {
	e := m.extents.Get(id)
	c := Command{Op: OpCoded, Extent: id, FragmentSize: (e.Length + 11) / 12}
	for i, f := range e.Coding.Fragments {
		c.Nodes = append(c.Nodes, f.Node)
		c.CRCs = append(c.CRCs, uint32(i+1))
	}
	for i := range 13 {
		c.Boundaries = append(c.Boundaries, min(int64(i)*c.FragmentSize, e.Length))
	}
	return c
}

// TestManagerFragmentPlacement checks the fragments spread as evenly as
// possible over fault domains, and that with fewer domains than fragments
// a local group's fragments still land in distinct domains where they can.
func TestManagerFragmentPlacement(t *testing.T) {
	code, _ := codeOf(CodeLRC12)
	for _, tc := range []struct{ nodes, fds int }{{20, 20}, {16, 16}, {16, 8}, {12, 12}, {8, 8}, {10, 5}, {3, 3}} {
		t.Run(fmt.Sprintf("%dnodes_%dfds", tc.nodes, tc.fds), func(t *testing.T) {
			m := newTestManager(t, tc.nodes, tc.fds)
			id := codedExtent(t, m, 1000)
			if got := tasksOf(m, TaskCode); len(got) != 1 || got[0].Fragments != nil {
				t.Fatalf("code tasks %+v, want one to start", got)
			}
			mustApply(t, m, Command{Op: OpCodeStart, Extent: id})
			checkInvariants(t, m)
			perFD, perGroupFD := map[string]int{}, map[[2]string]int{}
			for i, f := range m.extents.Get(id).Coding.Fragments {
				fd := m.nodes.Get(f.Node).FaultDomain
				perFD[fd]++
				perGroupFD[[2]string{fmt.Sprint(fragmentGroup(code, i)), fd}]++
			}
			fds := min(tc.fds, 16)
			if len(perFD) != fds {
				t.Fatalf("fragments in %d fault domains, want %d: %v", len(perFD), fds, perFD)
			}
			lo, hi := 16, 0
			for _, n := range perFD {
				lo, hi = min(lo, n), max(hi, n)
			}
			if hi-lo > 1 {
				t.Fatalf("uneven spread %v", perFD)
			}
			if tc.fds >= 7 { // 7 fragments per local group
				for k, n := range perGroupFD {
					if k[0] != "2" && n > 1 {
						t.Fatalf("local group %s has %d fragments in %s", k[0], n, k[1])
					}
				}
			}
			tk := tasksOf(m, TaskCode)
			if len(tk) != 1 || len(tk[0].Fragments) != 16 || len(tk[0].Sources) != 3 {
				t.Fatalf("code task %+v", tk)
			}
		})
	}
}

// TestManagerCodingLifecycle walks an extent through coding, a crash
// (snapshot) mid-way, a fragment node lost while coding and once coded,
// rebuilds, and garbage collection.
func TestManagerCodingLifecycle(t *testing.T) {
	m := newTestManager(t, 12, 12)
	id := codedExtent(t, m, 5000)
	if _, err := m.Apply(Command{Op: OpCoded, Extent: id}); !errors.Is(err, ErrBadCommand) {
		t.Fatalf("coded before start: %v", err)
	}
	mustApply(t, m, Command{Op: OpCodeStart, Extent: id})
	if r := mustApply(t, m, Command{Op: OpCodeStart, Extent: id}); r.Changed {
		t.Fatal("second code_start changed the state")
	}
	// A crash here: the driver restarts from the snapshot and finds the
	// same task.
	before := tasksOf(m, TaskCode)
	m2, err := LoadSnapshot(m.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(tasksOf(m2, TaskCode)) != fmt.Sprint(before) {
		t.Fatal("code task differs after a restart")
	}
	// A fragment node dies while coding: its slot moves; a result for the
	// old placement is refused.
	stale := codedCommand(m, id)
	victim := m.extents.Get(id).Coding.Fragments[3].Node
	mustApply(t, m, Command{Op: OpNodeDown, Node: victim})
	if m.extents.Get(id).Coding.Fragments[3].Node == victim {
		t.Fatal("fragment left on a dead node while coding")
	}
	if _, err := m.Apply(stale); !errors.Is(err, ErrPlacementChanged) {
		t.Fatalf("stale coded: %v", err)
	}
	if !slices.Contains(m.FragmentDeletes(), PendingFragmentDelete{Extent: id, Index: 3, Node: victim}) {
		t.Fatalf("no delete for the dead node's partial fragment: %v", m.FragmentDeletes())
	}
	mustApply(t, m, codedCommand(m, id))
	checkInvariants(t, m)
	e, _ := m.Extent(id)
	if e.Coding.State != CodingDone || len(e.Replicas) != 0 || len(tasksOf(m, TaskDelete)) != 3 {
		t.Fatalf("after coded: %+v, %d replica deletes", e, len(tasksOf(m, TaskDelete)))
	}
	if len(tasksOf(m, TaskCopy)) != 0 || len(tasksOf(m, TaskCode)) != 0 {
		t.Fatal("copy or code tasks for a coded extent")
	}
	// A fragment holder dies: the fragment moves and is rebuilt; the old
	// copy is deleted when its node returns, after the rebuild.
	f5 := e.Coding.Fragments[5].Node
	mustApply(t, m, Command{Op: OpNodeDown, Node: f5})
	checkInvariants(t, m)
	rb := tasksOf(m, TaskRebuild)
	if len(rb) == 0 {
		t.Fatal("no rebuild task")
	}
	var r5 Task
	for _, r := range rb {
		if r.Index == 5 {
			r5 = r
		}
	}
	if r5.Node == "" || r5.Node == f5 || r5.CRC != 6 || r5.Fragments[5] != "" || r5.FragmentSize != (5000+11)/12 {
		t.Fatalf("rebuild task %+v", r5)
	}
	mustApply(t, m, Command{Op: OpAddNode, Node: f5, Addr: "back", FaultDomain: "fd5"})
	if slices.Contains(m.FragmentDeletes(), PendingFragmentDelete{Extent: id, Index: 5, Node: f5}) {
		t.Fatal("old fragment queued for delete before the rebuild")
	}
	mustApply(t, m, Command{Op: OpFragmentReady, Extent: id, Index: 5, Node: r5.Node})
	if !slices.Contains(m.FragmentDeletes(), PendingFragmentDelete{Extent: id, Index: 5, Node: f5}) {
		t.Fatal("old fragment not deleted after the rebuild")
	}
	// Corruption: rebuilt in place.
	n7 := m.extents.Get(id).Coding.Fragments[7].Node
	mustApply(t, m, Command{Op: OpFragmentCorrupt, Extent: id, Index: 7, Node: n7})
	if rb := tasksOf(m, TaskRebuild); !slices.ContainsFunc(rb, func(t Task) bool { return t.Index == 7 && t.Node == n7 }) {
		t.Fatalf("no in-place rebuild: %+v", rb)
	}
	checkInvariants(t, m)
	// Inventory: a fragment the manager does not place is garbage.
	mustApply(t, m, Command{Op: OpNodeExtents, Node: n7, Fragments: []FragmentRef{{Extent: id, Index: 7}, {Extent: id, Index: 0}}})
	if fd := m.FragmentDeletes(); slices.Contains(fd, PendingFragmentDelete{Extent: id, Index: 7, Node: n7}) ||
		(m.extents.Get(id).Coding.Fragments[0].Node != n7 && !slices.Contains(fd, PendingFragmentDelete{Extent: id, Index: 0, Node: n7})) {
		t.Fatalf("inventory deletes %v", fd)
	}
	// GC: every fragment goes.
	mustApply(t, m, Command{Op: OpDeleteStream, Stream: "s"})
	checkInvariants(t, m)
	if n := len(tasksOf(m, TaskDeleteFragment)); n < 16 {
		t.Fatalf("%d fragment deletes after GC", n)
	}
	mustApply(t, m, Command{Op: OpAddNode, Node: victim, Addr: "back", FaultDomain: "fd4"})
	for _, d := range tasksOf(m, TaskDeleteFragment) {
		mustApply(t, m, Command{Op: OpFragmentDeleted, Extent: d.Extent, Index: d.Index, Node: d.Node})
	}
	if len(m.FragmentDeletes()) != 0 {
		t.Fatalf("deletes left: %v", m.FragmentDeletes())
	}
}

func TestManagerCodePolicy(t *testing.T) {
	m := newTestManager(t, 4, 4)
	if _, err := m.Apply(Command{Op: OpCreateStream, Stream: "x", Code: "rs-6-3"}); !errors.Is(err, ErrBadCommand) {
		t.Fatalf("unknown code: %v", err)
	}
	mustApply(t, m, Command{Op: OpCreateStream, Stream: "plain"})
	id := mustApply(t, m, Command{Op: OpAllocate, Stream: "plain"}).Extent
	mustApply(t, m, Command{Op: OpSeal, Extent: id, Length: 10, Nodes: []string{"n0", "n1", "n2", "n3"}})
	if len(tasksOf(m, TaskCode)) != 0 {
		t.Fatal("coding a stream without a policy")
	}
	mustApply(t, m, Command{Op: OpSetCode, Stream: "plain", Code: CodeLRC12})
	if len(tasksOf(m, TaskCode)) != 1 {
		t.Fatal("no coding after set_code")
	}
	// Open and empty extents are not coded.
	id2 := mustApply(t, m, Command{Op: OpAllocate, Stream: "plain"}).Extent
	if _, err := m.Apply(Command{Op: OpCodeStart, Extent: id2}); !errors.Is(err, ErrNotSealed) {
		t.Fatalf("code an open extent: %v", err)
	}
	mustApply(t, m, Command{Op: OpCodeStart, Extent: id})
	mustApply(t, m, Command{Op: OpCodeAbort, Extent: id})
	if m.extents.Get(id).Coding != nil || len(m.FragmentDeletes()) != 16 {
		t.Fatalf("abort left %+v, %d deletes", m.extents.Get(id).Coding, len(m.FragmentDeletes()))
	}
	checkInvariants(t, m)
}
