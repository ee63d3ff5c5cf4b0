package stream

import (
	"bytes"
	"fmt"
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
