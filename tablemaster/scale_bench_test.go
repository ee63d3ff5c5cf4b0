package tablemaster

import (
	"fmt"
	"testing"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/keyspace"
	"github.com/tabuladb/tabula/replication/stream"
)

// scaleState builds, directly, the state of a cluster of servers table
// servers holding perServer partition replicas each (3 replicas per
// partition, tables of 100 partitions), every partition with a commit log
// stream and an open extent on its replicas, every server an extent node.
func scaleState(tb testing.TB, servers, perServer int) *State {
	tb.Helper()
	const parts, repl = 100, 3
	s := NewState()
	s.Tenants[api.DefaultTenant] = &Tenant{Name: api.DefaultTenant}
	sm := s.streams()
	ids := make([]string, servers)
	for i := range ids {
		ids[i] = fmt.Sprintf("srv-%d", i+1)
		srv := &Server{ID: ids[i], Addr: fmt.Sprintf("10.0.%d.%d:7000", i/250, i%250), FaultDomain: DefaultFaultDomain(ids[i]), Alive: true, Incarnation: uint64(i + 1)}
		s.Servers[ids[i]] = srv
		if _, err := sm.Apply(stream.Command{Op: stream.OpAddNode, Node: srv.ID, Addr: srv.Addr, FaultDomain: srv.FaultDomain}); err != nil {
			tb.Fatal(err)
		}
	}
	s.NextServerID = uint64(servers + 1)
	tables := servers * perServer / (parts * repl)
	next := 0
	for ti := range tables {
		t := &Table{Tenant: api.DefaultTenant, Name: fmt.Sprintf("t%d", ti), Kind: api.TableKind_TABLE_KIND_POINT,
			Options: TableOptions{Partitions: parts, Replication: repl, MaxValueBytes: api.DefaultMaxValueBytes, Storage: StorageSSD, Durability: DurabilitySync, Compression: CompressionNone},
			ID:      s.NextTableID, Partitions: make([]Partition, parts)}
		s.NextTableID++
		for i := range t.Partitions {
			start, end := keyspace.Range(i, parts)
			p := Partition{ID: s.NextPartitionID, Index: uint32(i), Start: start, End: end, Epoch: 1}
			s.NextPartitionID++
			var nodes []string
			for r := range repl {
				id := ids[next%servers]
				next++
				role := api.ReplicaRole_REPLICA_ROLE_SECONDARY
				if r == 0 {
					role = api.ReplicaRole_REPLICA_ROLE_PRIMARY
				}
				srv := s.Servers[id]
				p.Replicas = append(p.Replicas, Replica{ServerID: id, Addr: srv.Addr, Role: role, FaultDomain: srv.FaultDomain})
				nodes = append(nodes, id)
			}
			p.Log = &PartitionLog{Stream: LogStreamName(p.ID)}
			if _, err := sm.Apply(stream.Command{Op: stream.OpCreateStream, Stream: p.Log.Stream, Replicas: repl, Ack: stream.AckQuorum}); err != nil {
				tb.Fatal(err)
			}
			res, err := sm.Apply(stream.Command{Op: stream.OpAllocate, Stream: p.Log.Stream, Nodes: nodes})
			if err != nil {
				tb.Fatal(err)
			}
			p.Log.Extent, p.Log.Last = res.Extent, res.Extent
			t.Partitions[i] = p
		}
		s.Tables[tableKey(t.Tenant, t.Name)] = t
	}
	s.Version = 1
	return s
}

// benchCommands proposes cmd(i) on st b.N times as the master does
// (successor of the published state), reporting the time per command.
func benchCommands(b *testing.B, st *State, cmd func(i int, st *State) Command) {
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		next, _, _, err := successor(st, cmd(i, st))
		if err != nil {
			b.Fatal(err)
		}
		st = next
	}
}

// BenchmarkCommandAtScale measures one command's cost on the state of
// 1,000 servers × 100 partition replicas each (33,300 partitions): a map
// command touching one partition (a log extent recorded), a stream
// manager command (a node's disk usage), a table creation, and a server
// re-registration (a new address).
func BenchmarkCommandAtScale(b *testing.B) {
	st := scaleState(b, 1000, 100)
	b.Run("partition_log", func(b *testing.B) {
		benchCommands(b, st, func(i int, st *State) Command {
			// Reset then record partition 1's extent, alternately.
			_, p := st.partition(1)
			if p.Log.Extent != 0 {
				return Command{Payload: PartitionLogReset{PartitionID: 1, Epoch: p.Epoch, Extent: p.Log.Extent}}
			}
			return Command{Payload: PartitionLogAllocated{PartitionID: 1, Epoch: p.Epoch, Servers: serversOf(p), Extent: p.Log.Last + 1}}
		})
	})
	b.Run("node_load", func(b *testing.B) {
		benchCommands(b, st, func(i int, _ *State) Command {
			return Command{Payload: StreamCommand{StreamCmd: &stream.Command{Op: stream.OpNodeLoad, Node: fmt.Sprintf("srv-%d", 1+i%1000), UsedBytes: int64(i + 1)}}}
		})
	})
	b.Run("create_table", func(b *testing.B) {
		benchCommands(b, st, func(i int, _ *State) Command {
			return Command{Payload: CreateTable{Tenant: api.DefaultTenant, Table: fmt.Sprintf("new%d", i), Kind: api.TableKind_TABLE_KIND_POINT, Options: &TableOptions{Partitions: 1, Replication: 3}}}
		})
	})
	b.Run("register_server", func(b *testing.B) {
		benchCommands(b, st, func(i int, _ *State) Command {
			return Command{Payload: RegisterServer{ServerID: "srv-7", Addr: fmt.Sprintf("10.9.9.9:%d", 1000+i%2), Incarnation: 7, HolderSilent: true}}
		})
	})
}
