// Package ordered is the ordered engine (issue 18): records sorted by key,
// bytewise, with point reads, range reads in both orders, atomic
// multi-key batches and compare-and-swap, on a pebble LSM
// (github.com/cockroachdb/pebble/v2). The owner encodes (PartitionKey,
// RowKey) into the keys; this package only orders bytes.
//
// # Keys and values
//
// A record is stored in pebble under its key unchanged, so pebble's order
// is the key order and Range is a bounded pebble iterator. The value
// carries a one-byte format and the expiry (see value.go):
//
//	| format (1) = 0 | value |
//	| format (1) = 1 | expiresAt (8, LE, Unix ms) | value |
//
// There is no CRC in the value: pebble checksums every sstable block and
// WAL chunk and checks it on every read; its corruption errors come back
// wrapped as engines.ErrCorrupt, as do undecodable values. Expired records
// are skipped by reads and dropped by the Get that finds them, by
// overwrites and by deletes (pebble has no compaction filter).
//
// # Files and durability
//
// With an empty Options.Dir (or Storage "memory") pebble runs on its
// in-memory file system with the WAL off: nothing is durable. Otherwise
// pebble's files (sstables, MANIFEST, OPTIONS, WAL) live directly in
// Options.Dir, one pebble instance per engine (per partition replica).
// What is durable when a write returns:
//
//   - Replayable (a replicated partition): pebble's WAL is off. The owner's
//     commit log is the durable record, and the owner writes its applied
//     LSN as an ordinary key in the same Apply as the record it applies.
//     Writes are durable once pebble flushes the memtable holding them (a
//     memtable fills at 4 MiB), after Sync (which flushes the memtables:
//     the owner calls it before it reports an applied LSN durable, so the
//     log can be trimmed behind it) and at Close, which flushes. A crash loses
//     the unflushed memtables, so the engine comes back at an earlier
//     state; since a batch lives whole in one memtable and memtables flush
//     in order, that state is exactly the batches up to the applied LSN it
//     holds, and the owner replays its log from there (TestCrashReplayable
//     checks it on pebble's crash-cloned file system).
//   - Durability "sync" (the default): the WAL is fsynced before Apply,
//     Delete or CompareAndSwap returns; a crash loses nothing acknowledged.
//   - Durability "lazy": writes return before the fsync; a goroutine syncs
//     the WAL every LazySyncInterval (100 ms) and Close syncs, so a crash
//     loses at most that much.
//
// Every sstable has a bloom filter (10 bits per key, ~1% false positives),
// so a point read of an absent key reads no data block of 99 in 100
// sstables it checks. The block cache is pebble's default (8 MiB per
// engine) or, with Options.CacheBudget, a cache of the budget's share at
// open (pebble caches cannot be resized, so later joiners do not shrink
// it). Options.Compression "none" (default) stores blocks uncompressed,
// "s2" uses pebble's Snappy. Options.FS must be the OS's: pebble has its
// own vfs; OpenFS takes one (tests use pebble's crashable MemFS).
//
// # Concurrency
//
// Engine is safe for concurrent use. Readers take no engine lock: each
// Get, Scan and Range reads a pebble point-in-time view, so a range sees
// a batch whole or not at all. Writers serialise per key on 256
// hash-striped mutexes (a batch locks its keys' stripes in ascending
// order), under which they commit one pebble batch. Apply reads nothing
// first (a put is a blind pebble Set); CompareAndSwap and Delete read the
// key's previous record for their answer. Stats.Keys and Stats.Bytes stay
// exact without that read: Open counts the stored records once, each write
// notes its key under its stripe, and Stats (or a background reconcile
// every 64 Ki notes) reads each noted key once in the snapshot taken before
// the first of those writes and adds the difference (count.go).
//
// # Range
//
// Range(lo, hi, reverse, fn) is the ordered-read capability: lo inclusive,
// hi exclusive, nil unbounded, ascending or (reverse) descending, with
// Scan's consistency contract. It is a method of *Engine until an engines
// interface takes it:
//
//	e, _ := ordered.Open(engines.Options{Dir: dir, Replayable: true})
//	defer e.Close()
//	_ = e.Apply([]engines.Mutation{{Key: []byte("pk/001"), Value: v}})
//	_ = e.Range([]byte("pk/"), []byte("pk0"), true, func(r engines.Record) error {
//		fmt.Printf("%s\n", r.Key) // newest row key first
//		return nil
//	})
package ordered
