package stream

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
)

func TestManagerClone(t *testing.T) {
	m := NewManager(ManagerOptions{})
	for i := range 4 {
		mustApplyM(t, m, Command{Op: OpAddNode, Node: fmt.Sprintf("n%d", i), Addr: "a", FaultDomain: fmt.Sprint(i)})
	}
	mustApplyM(t, m, Command{Op: OpCreateStream, Stream: "s", Replicas: 3, Ack: AckQuorum})
	res := mustApplyM(t, m, Command{Op: OpAllocate, Stream: "s"})
	mustApplyM(t, m, Command{Op: OpSeal, Extent: res.Extent, Length: 10, Nodes: []string{"n0"}})
	mustApplyM(t, m, Command{Op: OpAllocate, Stream: "s"})
	c := m.Clone()
	if !bytes.Equal(c.Snapshot(), m.Snapshot()) {
		t.Fatalf("clone differs:\n%s\n%s", c.Snapshot(), m.Snapshot())
	}
	// Independent: a change to the clone leaves the original as it was.
	before := m.Snapshot()
	mustApplyM(t, c, Command{Op: OpNodeDown, Node: "n1"})
	mustApplyM(t, c, Command{Op: OpDeleteStream, Stream: "s"})
	if !bytes.Equal(m.Snapshot(), before) {
		t.Fatal("changing the clone changed the original")
	}
	if len(c.Tasks()) == len(m.Tasks()) && bytes.Equal(c.Snapshot(), m.Snapshot()) {
		t.Fatal("the clone did not change")
	}
}

func mustApplyM(t *testing.T, m *Manager, c Command) Result {
	t.Helper()
	res, err := m.Apply(c)
	if err != nil {
		t.Fatalf("%s: %v", c.Op, err)
	}
	return res
}

// TestManagerCloneRandom applies random command sequences copy-on-write
// (to a Clone of the previous version, as the master does) and to a deep
// copy (LoadSnapshot of its snapshot), and checks they give the same
// results, state and tasks, that every earlier version is unchanged, and
// that both sides of a Clone may be modified independently. Versions
// branch: now and then the next command goes to an older version.
func TestManagerCloneRandom(t *testing.T) {
	seed := testSeed(t)
	for round := range 100 {
		rng := rand.New(rand.NewPCG(seed, uint64(round)))
		type version struct {
			m    *Manager
			snap []byte
		}
		cur := NewManager(ManagerOptions{})
		versions := []version{{cur, cur.Snapshot()}}
		for step := range 300 {
			if rng.IntN(20) == 0 {
				cur = versions[rng.IntN(len(versions))].m
			}
			var c Command
			if rng.IntN(2) == 0 {
				c = goldenCommand(rng, cur)
			} else {
				c = randomCommand(rng, cur)
			}
			deep, err := LoadSnapshot(cur.Snapshot())
			if err != nil {
				t.Fatal(err)
			}
			next := cur.Clone()
			r1, err1 := next.Apply(c)
			r2, err2 := deep.Apply(c)
			if r1 != r2 || fmt.Sprint(err1) != fmt.Sprint(err2) {
				t.Fatalf("round %d step %d: %+v: copy-on-write %+v %v, deep copy %+v %v", round, step, c, r1, err1, r2, err2)
			}
			snap := next.Snapshot()
			if !bytes.Equal(snap, deep.Snapshot()) {
				t.Fatalf("round %d step %d: %+v: states differ:\n%s\n%s", round, step, c, snap, deep.Snapshot())
			}
			if fmt.Sprint(next.Tasks()) != fmt.Sprint(deep.Tasks()) {
				t.Fatalf("round %d step %d: %+v: tasks differ", round, step, c)
			}
			if step%25 == 0 {
				checkInvariants(t, next)
			}
			// The other side of the clone may be written too: here a
			// throwaway clone of next, written in place, must leave next
			// as it is.
			if rng.IntN(10) == 0 {
				scratch := next.Clone()
				for range 5 {
					_, _ = scratch.Apply(goldenCommand(rng, scratch))
				}
				if !bytes.Equal(next.Snapshot(), snap) {
					t.Fatalf("round %d step %d: writing a clone changed its original", round, step)
				}
				_, _ = next.Apply(goldenCommand(rng, next)) // and the original, in place
				snap = next.Snapshot()
			}
			versions = append(versions, version{next, snap})
			cur = next
		}
		for i, v := range versions {
			if !bytes.Equal(v.m.Snapshot(), v.snap) {
				t.Fatalf("round %d: version %d changed after it was cloned", round, i)
			}
		}
	}
}

// TestManagerCloneConcurrentReaders reads published versions from other
// goroutines while successors are cloned and written (run with -race).
// (Readers do not Clone: Clone retires the original's ownership of its
// nodes, a write; the master clones under its proposal lock.)
func TestManagerCloneConcurrentReaders(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var cur atomic.Pointer[Manager]
	cur.Store(newTestManager(t, 8, 4))
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				m := cur.Load()
				m.Tasks()
				m.Snapshot()
			}
		}()
	}
	for range 2000 {
		next := cur.Load().Clone()
		_, _ = next.Apply(goldenCommand(rng, next))
		cur.Store(next)
	}
	close(done)
	wg.Wait()
	checkInvariants(t, cur.Load())
}
