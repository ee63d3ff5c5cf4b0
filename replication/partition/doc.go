// Package partition is the replica protocol of a table partition: roles,
// log sequence numbers, the commit point, promotion and
// deposition, as a pure state machine (Replica) its owner drives, in the
// manner of etcd raft's RawNode.
//
// The log is the partition's commit-log stream (replication/stream): the
// primary numbers each write (LSN), appends one record per write and
// applies it once the log acknowledges it durable; secondaries read the
// records from their local extent replica up to the commit point the
// primary tells them, and apply them in order. A write's outcome (a CAS's
// answer, an absolute expiry) is decided by the primary before the append
// and carried in the record, so applying is deterministic on every replica.
//
// The owner's loop:
//
//	lsn, joined, err := r.Propose(partition.Proposal{Epoch: e, RequestID: id, Body: body, Token: t})
//	...
//	rd := r.Ready()
//	appendToLog(rd.Append)       // then r.Durable(lsn) when acknowledged
//	applyToEngine(rd.Apply)      // in order, with the LSN persisted
//	answer(rd.Acks, rd.Fails)
//	r.Advance(rd)
//
// A secondary calls Observe for each committed record it reads; a new
// primary (BecomePrimary) observes the log it inherited up to the sealed
// end before it proposes. When the log refuses an append (a replica
// failed), AppendFailed stops sending; once the extent is sealed and a new
// one allocated, LogRestarted re-sends the records the seal cut, with the
// same LSNs, so the history is unchanged.
//
// Record and write formats are drawn in record.go.
//
// Concurrency: Replica is not safe for concurrent use; the owner
// serialises every call. The encoders and decoders are pure functions.
package partition
