// Package tablemaster is the Table Master: it owns the catalog (tenants,
// tables and their options) and the partition map (which server hosts each
// partition, at which epoch), places partitions on table servers, tracks
// server liveness from heartbeats, and moves the partitions of servers that
// die or drain. It serves api.MasterServer over gRPC.
//
// # Design
//
// The catalog and map are a deterministic state machine, State: Apply(Command)
// is its only mutator and does no I/O, reads no clock (times travel inside
// commands) and starts no goroutine, so it is tested line by line and sits
// under raft unchanged. Placement (Place) is a pure function of a
// snapshot of the servers. The Master drives the state machine: it applies a
// command to a copy of the current state, appends the command to the command
// log and fsyncs, and only then publishes the copy, so nothing a client sees
// is ever lost by a crash. Heartbeats are not persisted; liveness lives in
// memory, and a restarted master treats every server as heard at open time.
//
// With Options.RaftID the master is one member of a raft group
// (raft.go, over tablemaster/raftnode): the raft log replaces the command
// log, the leader validates and proposes, every member applies committed
// commands as logged, and only the leader takes calls (followers answer
// not_leader naming it) except map watches, which any member serves.
//
// Partitions move only when their server dies (silent longer than
// Options.DeadAfter) or drains: in-memory tables would lose data if a live
// partition moved. Every move bumps the partition's epoch. A durable
// partition whose only copy is on a dead or draining server never moves on
// its own (it would be served empty); only OpForgetServer, the operator's
// command with AcceptDataLoss, moves it, and marks it DataLost.
//
// Partitions of point and ordered tables also split, by an operator
// (split.go) or by the leader itself when their size or load stays over
// the thresholds (autosplit.go, deciding with tablemaster/splitpolicy).
//
// A live server id belongs to one process, named by the incarnation it
// registers with: another process registering that id is refused until the
// first drains or has been silent longer than its lease (see
// State.registerServer for why not an epoch bump). A server that names no fault domain gets one of its own
// (DefaultFaultDomain).
//
// # Map watches
//
// WatchPartitionMap sends a watcher that asks for deltas a full map, then
// per map version only the tables added, changed or dropped; the master
// keeps the deltas of recent versions in memory and sends a full map to a
// watcher it has none for (watch.go). Each version's whole-cluster full
// map and delta are encoded once and shared by every watcher, so Serve's
// gRPC server uses a codec that sends pre-encoded bytes: serve the Master
// only with Serve.
//
// # Dashboard
//
// DashboardHandler serves an operator's web page (embedded from
// dashboard/, no outside assets) and its JSON snapshot, /api/cluster:
// the published State, liveness and the servers' replica reports,
// tenants' usage (never keys), the stream manager and the recent events
// of events.go, a bounded memory-only ring. It has no authentication;
// the binary serves it only on an address the operator gives.
//
// # Concurrency
//
// Master is safe for concurrent use. Commands are serialised by one lock
// held across their log fsync; readers load an immutable published State
// without locking. The master owns one goroutine (the liveness loop) plus
// the gRPC servers Serve starts; Close stops them all and waits.
//
// # Example
//
//	m, err := tablemaster.Open(tablemaster.Options{DataDir: "/var/lib/tabula/master"})
//	if err != nil { ... }
//	defer m.Close()
//	lis, err := net.Listen("tcp", ":7400")
//	if err != nil { ... }
//	go m.Serve(lis) // returns nil after Close
//
// # Files in DataDir
//
// master.log, the command log, is append-only: a file header, then one
// record per command that changed the state, fsynced before the command's
// effect is visible:
//
//	file header (16 bytes):
//	+-------------------+---------------+----------------------------+
//	| magic "TABMLOG\0" | version (4)   | crc32c of the 12 before (4)|
//	+-------------------+---------------+----------------------------+
//	record, repeated:
//	+-------------+-----------+-----------------------------------+
//	| crc32c (4)  | len (4)   | payload (len bytes)               |
//	+-------------+-----------+-----------------------------------+
//	crc32c (Castagnoli) covers len and payload; integers little-endian;
//	payload = JSON {"seq": N, "cmd": Command} (format version 1).
//
// master.snap, the snapshot, has the same header with magic "TABMSNP\0" and
// exactly one record whose payload is JSON {"seq": N, "state": State}. It is
// replaced atomically (write temp, fsync, close, rename, fsync dir) every
// Options.SnapshotEvery commands, after which the log is reset to its bare
// header the same way. Open loads the snapshot and replays the log records
// with seq above the snapshot's (a crash between the two steps leaves
// records the snapshot already holds).
//
// A torn final record (a crash in the middle of an append, never
// acknowledged) is dropped with a log line and cut off the file. Any other
// damage — a bad header, a bad record followed by intact ones, a gap in seq,
// a damaged snapshot — fails Open with an error that errors.Is ErrCorrupt;
// an unknown format version gives ErrUnsupportedVersion.
package tablemaster
