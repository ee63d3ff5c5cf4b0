// Package raftnode is one member of a raft group: the replicated log under
// the Table Master's state machine (ARCHITECTURE.md, the master). It is
// generic: it replicates opaque commands to a StateMachine and knows
// nothing of tables or leases.
//
// It is built on go.etcd.io/raft/v3's RawNode (PreVote, CheckQuorum,
// ReadIndex with ReadOnlySafe, proposal forwarding off) and adds what
// raft leaves to its user: durable storage on engines/vfs, a transport,
// the apply loop, snapshots, membership with addresses.
//
// # Layers
//
//   - core (core.go): the RawNode, the Storage and the StateMachine,
//     stepped by one goroutine. It persists each Ready (fsynced) before
//     sending its messages, then applies the committed entries, as raft's
//     Ready contract says. It starts no goroutine, reads no clock and sends
//     through hooks, so the simulation (sim_test.go) drives many cores from
//     one goroutine on virtual time, deterministically from a seed.
//   - Node (node.go): owns a core, the goroutine that drives it (ticks from
//     an injected Clock, incoming messages, API calls), and one goroutine
//     that writes snapshot files, so a large fsync never stalls heartbeats.
//   - Transport (transport.go): GRPCTransport (grpc.go, service api.Raft)
//     between processes, which sends to a peer's internal listener once
//     the peer, asked at its membership address, names one; Network (memnet.go), an in-memory network on
//     virtual time that drops, delays, reorders and partitions from a seed.
//
// # Concurrency
//
// Node's methods are safe for concurrent use; the blocking ones take a
// context. The StateMachine is called only from the node's goroutine, one
// call at a time; OnLeaderChange too. Close stops both goroutines, fails
// the calls in flight with ErrStopped and closes the storage; it does not
// close the Transport, which its creator owns.
//
// # Semantics
//
// Propose returns once the entry is committed and applied locally, with
// the state machine's result; only the leader proposes (others return
// *NotLeaderError with the leader's id and address). ErrProposalDropped
// means certainly not committed; a ctx error or ErrOutcomeUnknown means
// perhaps. ReadIndex returns once the local state machine applied
// everything committed when it was called, on any member, so a read after
// it is linearizable. A new leader learns it leads through
// OnLeaderChange{IsLeader: true, Term: T}; raft answers its first
// ReadIndex only once an entry of term T is committed, so "LeaderChange,
// then ReadIndex" gives a leader whose state holds everything its
// predecessors committed.
//
// Membership changes are raft conf changes (one at a time) whose context
// carries the member's address; snapshots carry the addresses too. A new
// member starts with empty Options.Peers, is added with AddLearner, and is
// promoted with PromoteLearner once it replicates within
// Options.PromoteMaxLag entries of the leader.
//
// # Files in Options.Dir
//
// wal-<gen>.log (gen in 16 hex digits) is the log. It is written by Save
// (one write and one fsync per Ready) and rewritten into generation gen+1
// at open and after every snapshot, keeping only what follows the
// snapshot; older generations are then removed. Replaying the generations
// in order gives the same log whichever step a crash interrupted.
//
//	file header (16 bytes):
//	+-------------------+-------------+-----------------------------+
//	| magic "TABRWAL\0" | version (4) | crc32c of the 12 before (4) |
//	+-------------------+-------------+-----------------------------+
//	record, repeated:
//	+------------+---------+----------+---------------------------+
//	| crc32c (4) | len (4) | type (1) | payload (len bytes)       |
//	+------------+---------+----------+---------------------------+
//	crc32c (Castagnoli) covers len, type and payload; integers little-endian.
//	type 1, entries:    repeated | uvarint n | raftpb.Entry (n bytes) |
//	type 2, hard state: raftpb.HardState
//	type 3, snap mark:  | index (8) | term (8) | kind (1) |: the log's base is
//	                    the snapshot at index; kind 0 keeps the entries after
//	                    it, kind 1 (a snapshot from the leader) drops them all
//
// Each generation starts with a snap mark, then the entries after it and
// the HardState. Entry data is | proposer id (8) | tag (8) | command |
// (big-endian ids), so a proposer recognises its own entry when it is
// applied; an empty entry is raft's no-op.
//
// snap-<index>.snap (index in 16 hex digits) is the snapshot the log's
// last mark names: the same file header with magic "TABRSNP\0" and one
// type 4 record, a raftpb.Snapshot whose Data is
//
//	| count (uvarint) | count × ( id (uvarint) | len (uvarint) | address ) | state machine snapshot |
//
// It is written as a temporary file, fsynced, renamed and its directory
// fsynced, before the log names it; a snapshot file the log does not name
// is an orphan of a crash and is removed at open.
//
// A torn final record (a crash during an append; never acknowledged,
// since messages go out after the fsync) is dropped at open. Any other
// damage — a bad header, a bad record followed by intact ones, a missing
// or damaged snapshot the log names — fails Start with an error that errors.Is
// ErrCorrupt; an unknown version gives ErrUnsupportedVersion.
//
// # Example
//
//	tr := raftnode.NewGRPCTransport(1, logger)
//	tr.Register(grpcServer) // the member's server, serving at its address
//	// Optional: an internal listener, where peers then send raft messages.
//	tr.Register(internalServer)
//	tr.SetInternalAddr("10.0.0.1:7401")
//	n, err := raftnode.Start(raftnode.Options{
//		ID: 1, Dir: "/var/lib/tabula/raft", StateMachine: sm, Transport: tr,
//		Peers: map[uint64]string{1: "10.0.0.1:7400", 2: "10.0.0.2:7400", 3: "10.0.0.3:7400"},
//	})
//	if err != nil { ... }
//	defer tr.Close()
//	defer n.Close()
//	index, result, err := n.Propose(ctx, command)
package raftnode
