// Package point is the point engine: a read/write hash table for
// point tables. A linear-hashing index (package lhash) maps each key's
// xxhash64 to a 48-bit location in a ValueStore; the store holds the records.
//
// Storage back ends, chosen by engines.Options.Storage:
//
//   - "" or "memory": records on the Go heap (memStore). A location is a slot
//     number; nothing is durable.
//   - "ssd": the FlashStore-style log store of engines/diskstore in
//     Options.Dir (required), created or reopened; a location is a packed
//     (segment slot, generation, offset). Open rebuilds the index from the
//     store's delta index blocks (key hashes and locations, written every
//     diskstore.Options.IndexBlockBytes of log or IndexBlockInterval, and at
//     Close) and replays only the log written after the last block; without
//     usable blocks it replays the whole log. The index is sized for the
//     blocks' entries and the tail's records, so the replay splits no
//     bucket, and the replayed records are queued and applied a batch at a
//     time: the entries their keys must be compared with (a cold disk read
//     each) are read first, together (diskstore's ReadBatchCold). OpenDisk takes diskstore.Options (file system, segment size,
//     durability, collector tuning). Any other name is refused with
//     ErrStorageUnavailable.
//
// # Durability
//
// A writer holds its keys' stripes while it stores the batch (one unit in
// the log: after a crash all of it or none), commits it and only then
// points the index at it. With the disk store's default durability, Apply,
// Delete and CompareAndSwap return once the batch is fsynced (writers on
// other stripes share the fsync), so a kill -9 loses nothing acknowledged
// and no reader ever saw a write a crash could lose. With
// diskstore.DurabilityLazy they return before the fsync and a crash loses
// up to its FlushInterval. Sync flushes everything; Close syncs. A delete
// appends a tombstone; a Get that finds an expired record drops it with a
// tombstone too. The collector (diskstore.Mover, implemented by mover)
// relocates live records under the key's stripe.
//
// # Reads on ssd
//
// Reads of sealed segments copy the record out of a read-only mapping;
// the others go through the disk store's read cache (diskstore.Options
// .CacheBytes, default 64 MiB per engine, i.e. per partition; Stats reports
// its hits and misses). The cache is keyed by log position, and the index
// moves a key to a new position only under the key's stripe after the
// write is committed, so a cached value is never served for a key that was
// overwritten or deleted. GetBatch hashes every key and touches its index
// bucket first (independent loads, so the misses overlap), looks every key
// up, reads all the locations with one diskstore ReadBatch and checks each
// record's key; a key whose record moved meanwhile
// (overwrite, collector) or whose tag matched another key falls back to Get.
//
// # Concurrency
//
// An Engine is safe for concurrent use. Readers take no lock: the index's
// optimistic read verifies each candidate location by reading the record and
// comparing keys, and retries if the bucket changed meanwhile. Writers lock
// one of 256 stripes by key hash (a batch locks all of its stripes in
// ascending order), store the new record, point the index at it, and free
// the replaced one only after the index no longer points at it. A reader
// that raced with that free sees the bucket change and retries, so it never
// reports a reused location's record as its key's.
//
// # Records
//
// The memory store keeps each record as one immutable object (key and value
// in one allocation); a location's pointer is swapped atomically, and the
// garbage collector keeps a replaced record alive for readers still holding
// it. TTL: a record with 0 < ExpiresAt <= Options.Now() is absent for Get,
// Scan, Delete and CompareAndSwap; Get frees the expired records it finds.
//
// # Example
//
//	e, err := point.Open(engines.Options{})
//	err = e.Apply([]engines.Mutation{{Key: []byte("k"), Value: []byte("v")}})
//	v, expiresAt, err := e.Get([]byte("k"))
package point
