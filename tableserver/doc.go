// Package tableserver is the Tabula table server: it registers with the
// Table Master, heartbeats, watches the partition map, opens an engine for
// every partition it is assigned (by the table's kind), and serves the
// TableServer gRPC API on them.
//
// # Request checks
//
// Every data request names tenant, table, partition and the epoch the client
// routed it with. Before touching an engine the server checks, in order:
//
//	draining?                      UNAVAILABLE  (reason "draining")
//	in-flight over the limit?      SERVER_BUSY  (retry_after_ms set)
//	lease still valid?             UNAVAILABLE  (reason "lease_expired")
//	partition hosted here?         NOT_OWNER    (with the current map entry;
//	                               reason "table_not_here" when the table is
//	                               unknown here: the master's map decides)
//	request epoch == replica's?    STALE_EPOCH  (older) / UNAVAILABLE "map_behind" (newer)
//	key hashes into the partition? NOT_OWNER    (with the entry that holds it)
//	key and value within limits?   INVALID_ARGUMENT (field, limit)
//
// # Conditional batches
//
// A BatchWrite's mutations may carry conditions (conditions.go: the key
// absent, present, or its value starting with given bytes). They are
// checked against the partition's state before the batch, writes in
// flight included, in the same step that numbers the write, so the batch
// is an all-or-nothing compare-and-set: one failed condition applies
// nothing (FAILED_PRECONDITION "condition_failed", field "mutations[i]").
// A retry of a request still in flight waits for it rather than deciding
// again against its own writes.
//
// # Leases
//
// A server may serve only while its lease holds: the lease runs for
// lease_ms from the moment it sent the last heartbeat the master answered,
// measured on its own monotonic clock. The master declares a server dead only
// after a longer silence (DeadAfter > lease), so by then the old server has
// stopped serving and the new primary, with a higher epoch, is the only one.
//
// # Engine faults
//
// A replicated partition's disk engine that hits a write or sync error is
// closed and opened again in place (reopen.go), with backoff (100 ms
// doubling, 5 attempts): recovery restores what is durable, and the
// replica re-applies the rest from the commit log as a restarted replica
// would. Meanwhile it answers UNAVAILABLE (reason "replica_reopening"),
// which clients retry, and reports REPLICA_STATE_CATCHING_UP. If the
// engine does not reopen, or its disk fails more than 3 times in a
// minute, the replica reports REPLICA_STATE_FAILED and the master
// replaces it from a healthy one. Data that fails its checksums fails the
// replica at once (UNAVAILABLE "corrupt"): it is rebuilt, never served.
//
// # Concurrency
//
// A Server is safe for concurrent use. It owns three goroutines (heartbeat,
// map watch, gRPC serving) which Close stops and waits for. The set of hosted
// replicas is an immutable snapshot swapped atomically, so the request path
// takes no lock.
//
// Example:
//
//	s, err := tableserver.Open(tableserver.Options{Masters: []string{"127.0.0.1:7100"}, DataDir: dir})
//	lis, _ := net.Listen("tcp", "127.0.0.1:0")
//	go s.Serve(lis)
//	defer s.Close()
package tableserver
