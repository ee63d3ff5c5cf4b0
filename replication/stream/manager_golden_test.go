package stream

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var updateGolden = flag.Bool("update-golden", false, "rewrite testdata/manager_golden.txt")

// goldenCommand draws a command that is valid more often than
// randomCommand's, over 12 nodes in 5 fault domains and the manager's real
// extents, so that placement, re-replication and coding run a lot. Frozen:
// testdata/manager_golden.txt holds digests of what these sequences give.
func goldenCommand(rng *rand.Rand, m *Manager) Command {
	node := fmt.Sprintf("n%d", rng.IntN(12))
	st := fmt.Sprintf("s%d", rng.IntN(6))
	ids := m.ExtentIDs()
	ext := uint64(1 + rng.IntN(40))
	if len(ids) > 0 && rng.IntN(4) != 0 {
		ext = ids[rng.IntN(len(ids))]
	}
	e, eerr := m.Extent(ext)
	var live []string
	for _, r := range e.Replicas {
		if rng.IntN(5) != 0 {
			live = append(live, r.Node)
		}
	}
	ops := []Op{OpAddNode, OpAddNode, OpNodeDown, OpNodeLoad, OpCreateStream, OpDeleteStream, OpConcat, OpOpenWriter,
		OpAllocate, OpAllocate, OpAllocate, OpSeal, OpSeal, OpSeal, OpReportCorrupt, OpReplicaReady, OpReplicaReady, OpReplicaFailed,
		OpReplicaDeleted, OpNodeExtents, OpSetCode, OpCodeStart, OpCoded, OpCodeAbort, OpFragmentReady, OpFragmentCorrupt, OpFragmentDeleted}
	c := Command{Op: ops[rng.IntN(len(ops))], Node: node, Stream: st, Extent: ext}
	switch c.Op {
	case OpAddNode:
		c.Addr, c.FaultDomain = "addr-"+node, fmt.Sprintf("fd%d", rng.IntN(5))
	case OpNodeLoad:
		c.UsedBytes = rng.Int64N(1000)
	case OpCreateStream:
		c.Replicas = rng.IntN(4)
		if rng.IntN(4) == 0 {
			c.Code = CodeLRC12
		}
	case OpConcat:
		c.Stream = fmt.Sprintf("c%d", rng.IntN(3))
		c.Sources = []string{fmt.Sprintf("s%d", rng.IntN(6)), fmt.Sprintf("s%d", rng.IntN(6))}
	case OpAllocate:
		if rng.IntN(3) == 0 {
			c.Nodes = []string{node, fmt.Sprintf("n%d", rng.IntN(12))}
		}
	case OpSeal:
		c.Length, c.LastSeq, c.Nodes = int64(rng.IntN(3)*100), uint64(rng.IntN(5)), live
		if eerr == nil && e.Sealed {
			c.Length = e.Length
		}
	case OpReportCorrupt, OpReplicaReady, OpReplicaFailed, OpReplicaDeleted:
		if len(e.Replicas) > 0 && rng.IntN(4) != 0 {
			c.Node = e.Replicas[rng.IntN(len(e.Replicas))].Node
		}
	case OpNodeExtents:
		c.Extents = []uint64{ext, ext + 1}
		c.Fragments = []FragmentRef{{Extent: ext, Index: rng.IntN(16)}}
	case OpSetCode:
		c.Code = []string{CodeLRC12, ""}[rng.IntN(2)]
	case OpFragmentReady, OpFragmentCorrupt, OpFragmentDeleted:
		c.Index = rng.IntN(16)
		if e.Coding != nil && rng.IntN(4) != 0 {
			c.Node = e.Coding.Fragments[c.Index].Node
		}
	}
	// Half of the task outcomes are for tasks the manager lists.
	if kind := map[Op]TaskKind{OpReplicaDeleted: TaskDelete, OpFragmentDeleted: TaskDeleteFragment,
		OpFragmentReady: TaskRebuild, OpReplicaReady: TaskCopy}[c.Op]; kind != "" && rng.IntN(2) == 0 {
		var ts []Task
		for _, t := range m.Tasks() {
			if t.Kind == kind {
				ts = append(ts, t)
			}
		}
		if len(ts) > 0 {
			t := ts[rng.IntN(len(ts))]
			c.Extent, c.Node, c.Index = t.Extent, t.Node, t.Index
		}
	}
	switch c.Op {
	case OpCoded:
		if e.Coding == nil {
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
	}
	return c
}

// goldenDigests runs the frozen command sequences and digests, per round,
// every result, whether each command failed, every snapshot and the final
// tasks.
func goldenDigests(rounds, steps int) []string {
	var out []string
	for round := range rounds {
		rng := rand.New(rand.NewPCG(7, uint64(round)))
		m := NewManager(ManagerOptions{})
		h := sha256.New()
		for range steps {
			c := goldenCommand(rng, m)
			res, err := m.Apply(c)
			fmt.Fprintf(h, "%s %+v %v\n", c.Op, res, err != nil)
			h.Write(m.Snapshot())
		}
		for _, t := range m.Tasks() {
			fmt.Fprintf(h, "%+v\n", t)
		}
		out = append(out, hex.EncodeToString(h.Sum(nil)[:12]))
	}
	return out
}

// TestManagerGolden checks the manager still gives, command for command,
// the states it gave when the digests were recorded: it is replicated
// state, and a master replaying an old log must rebuild the same state.
// The digests were recorded with the map-based manager, before it became
// copy-on-write.
func TestManagerGolden(t *testing.T) {
	const rounds, steps = 60, 400
	got := goldenDigests(rounds, steps)
	path := filepath.Join("testdata", "manager_golden.txt")
	if *updateGolden {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(strings.Join(got, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var want []string
	for sc := bufio.NewScanner(f); sc.Scan(); {
		want = append(want, sc.Text())
	}
	if len(want) != rounds {
		t.Fatalf("%s: %d digests, want %d", path, len(want), rounds)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("round %d: digest %s, recorded %s", i, got[i], want[i])
		}
	}
}
