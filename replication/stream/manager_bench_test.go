package stream

import (
	"fmt"
	"testing"
)

// scaleManager is the stream manager of a cluster of nodes extent nodes
// (one per fault domain) with streams partition logs of 3 replicas, each
// with sealed extents and one open one, placed round robin as the master
// places partition logs.
func scaleManager(tb testing.TB, nodes, streams, sealed int) *Manager {
	tb.Helper()
	m := NewManager(ManagerOptions{})
	for i := range nodes {
		id := fmt.Sprintf("n%d", i)
		mustApply(tb, m, Command{Op: OpAddNode, Node: id, Addr: "addr-" + id, FaultDomain: "fd-" + id})
	}
	next := 0
	for s := range streams {
		name := fmt.Sprintf("log-%d", s)
		mustApply(tb, m, Command{Op: OpCreateStream, Stream: name, Replicas: 3, Ack: AckQuorum})
		var ns []string
		for range 3 {
			ns = append(ns, fmt.Sprintf("n%d", next%nodes))
			next++
		}
		for range sealed {
			id := mustApply(tb, m, Command{Op: OpAllocate, Stream: name, Nodes: ns}).Extent
			mustApply(tb, m, Command{Op: OpSeal, Extent: id, Length: 1 << 20, LastSeq: 100, Nodes: ns})
		}
		mustApply(tb, m, Command{Op: OpAllocate, Stream: name, Nodes: ns})
	}
	return m
}

// BenchmarkManagerCommand measures one command applied as the master
// applies it, to a Clone of the published manager, on 1,000 nodes and
// 33,300 partition logs (~33k extents): a node's disk usage, its
// inventory, its re-registration, a stream's next extent (seal, allocate)
// and, in the master, a log truncation.
func BenchmarkManagerCommand(b *testing.B) {
	const nodes, streams = 1000, 33300
	base := scaleManager(b, nodes, streams, 0)
	run := func(b *testing.B, cmd func(i int, m *Manager) []Command) {
		b.ReportAllocs()
		m := base.Clone()
		b.ResetTimer()
		for i := range b.N {
			for _, c := range cmd(i, m) {
				next := m.Clone()
				if _, err := next.Apply(c); err != nil {
					b.Fatalf("%+v: %v", c, err)
				}
				m = next
			}
		}
	}
	b.Run("node_load", func(b *testing.B) {
		run(b, func(i int, _ *Manager) []Command {
			return []Command{{Op: OpNodeLoad, Node: fmt.Sprintf("n%d", i%nodes), UsedBytes: int64(i + 1)}}
		})
	})
	held := map[string][]uint64{}
	for _, id := range base.ExtentIDs() {
		e, _ := base.Extent(id)
		for _, r := range e.Replicas {
			held[r.Node] = append(held[r.Node], id)
		}
	}
	b.Run("node_extents", func(b *testing.B) {
		run(b, func(i int, m *Manager) []Command {
			n := fmt.Sprintf("n%d", i%nodes)
			return []Command{{Op: OpNodeExtents, Node: n, Extents: held[n]}}
		})
	})
	b.Run("add_node", func(b *testing.B) {
		run(b, func(i int, _ *Manager) []Command {
			return []Command{{Op: OpAddNode, Node: "n7", Addr: fmt.Sprintf("addr-%d", i%2), FaultDomain: "fd-n7"}}
		})
	})
	b.Run("seal_allocate", func(b *testing.B) {
		run(b, func(i int, m *Manager) []Command {
			name := fmt.Sprintf("log-%d", i%streams)
			s, es, _ := m.Stream(name)
			last := es[len(es)-1]
			var ns []string
			for _, r := range last.Replicas {
				ns = append(ns, r.Node)
			}
			return []Command{{Op: OpSeal, Extent: s.Extents[len(s.Extents)-1], Length: 100, Nodes: ns},
				{Op: OpAllocate, Stream: name, Nodes: ns}}
		})
	})
	b.Run("trim", func(b *testing.B) {
		// A log that rolls to a new extent and drops the old one (three
		// commands: seal, allocate, trim), as a partition's commit log does
		// once every replica has flushed past its extent.
		run(b, func(i int, m *Manager) []Command {
			name := fmt.Sprintf("log-%d", i%streams)
			s, es, _ := m.Stream(name)
			last := s.Extents[len(s.Extents)-1]
			var ns []string
			for _, r := range es[len(es)-1].Replicas {
				ns = append(ns, r.Node)
			}
			return []Command{{Op: OpSeal, Extent: last, Length: 100, Nodes: ns},
				{Op: OpAllocate, Stream: name, Nodes: ns},
				{Op: OpTrimStream, Stream: name, Extent: m.nextExtent}}
		})
	})
}
