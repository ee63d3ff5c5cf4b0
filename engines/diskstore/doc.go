// Package diskstore is the FlashStore-style log store under point tables:
// records are appended to a log of segment files; a write makes
// the key's previous record garbage; a background collector re-appends the
// live records of the segments with the best cost-benefit and deletes them.
// The owner's index (engines/point's linear hash) maps keys to 48-bit
// locations; the store knows no keys. All file I/O goes through engines/vfs.
//
// # Files
//
// A store is a directory of segment files named by a 64-bit sequence
// number, "%016x.log", written in sequence order, and of index block files
// "%016x.idx" named by a block number (see Index blocks). A segment the
// collector freed while a snapshot still reads it is renamed
// "%016x.obsolete" until the snapshot lets go of it (see Snapshots), and
// a split child has a "VIEW" (see Views). Other
// files are ignored; "*.idx.tmp" (unfinished blocks) and "*.obsolete" are
// removed at recovery.
//
// # Segment header (32 bytes)
//
//	 0       8          12        14    15    16          24         28       32
//	| magic | version   | slot    | gen | 0   | seq       | 0 (4)    | crc32c  |
//	| (8)   | (4, =1)   | (2)     | (1) | (1) | (8)       |          | (4)     |
//
// magic is "TABLOGSG"; crc32c (Castagnoli) covers bytes 0-27. A segment of
// another version is refused with ErrFormatVersion. slot and gen are the
// segment's place in the location space (see below); seq repeats the name.
//
// # Record (20-byte header, then key and value)
//
//	 0        4      5       6         8         12                20
//	| crc32c | kind | flags | keyLen  | valLen  | aux            | key | value |
//	| (4)    | (1)  | (1)   | (2)     | (4)     | (8)            |     |       |
//
// Integers are little-endian. crc32c covers bytes 4 to the end of the value.
// kind: 1 put, 2 tombstone (0 is never a record: zeroed media fails). flags:
// bit 0 value is s2-compressed (Options.Compression; valLen is then the
// compressed length, and a value that does not decode, or decodes past
// 64 MiB, is corrupt), bit 1
// "batch continues": the record belongs to a Write batch and is not its last
// one. aux: for a put, ExpiresAt (Unix ms, 0 = never); for a tombstone, the
// sequence number of the segment holding the deleted version. A record never
// crosses a segment, nor does a batch.
//
// # Location (the index's 48 bits)
//
//	47              32 31  28 27                          0
//	|   slot (16)     | gen(4)|        offset (28)          |
//
// At most 65536 live segments of at most 256 MiB: 1 TiB of log at the
// default 16 MiB segment (a batch larger than that gets a segment of its
// own). See location.go for why the generation is there.
//
// # Writes and durability
//
// Append and Write encode records into the head segment's in-memory tail
// under one mutex and return their locations at once; the records are
// readable from memory until written. Commit, by Options.Durability:
//
//   - DurabilitySync (default): returns after the records are written and
//     fsynced. One committer at a time leads: it writes every pending byte
//     (everyone's) sequentially, fsyncs each touched segment in order and the
//     directory when it created a file; the committers queued behind it find
//     their bytes durable and return (group commit: many writes, one fsync).
//   - DurabilityLazy: returns at once; a flusher goroutine syncs every
//     FlushInterval. A crash loses at most that window, never a part of a
//     record or batch.
//
// Sync always writes and fsyncs; Close syncs. A failed write or fsync makes
// the store refuse writes until reopened (the file state is unknown after a
// failed fsync; reopening recovers exactly what is durable).
//
// # Reads
//
// Read(loc) copies the record out of a read-only mapping of its segment
// once the segment is sealed and fully written (and the file system can
// map: vfs.Mapper), else preads it (one 4 KiB read for most records)
// through vfs.File.ReadAt or copies it from the unwritten tail; then it
// checks its CRC: a mismatch is an error wrapping engines.ErrCorrupt and is
// never served. A location in a freed segment reads as "no record". A
// segment is unmapped only once no read is inside its mapping.
//
// ReadBatchCold reads like ReadBatch but never through a mapping (a fault on
// a cold page blocks its processor for the whole disk read) nor the cache:
// positioned reads, coalesced only where records overlap a page, 32 in
// flight. It is for reads known to go to the device (recovery).
//
// # Snapshots
//
// Snapshot fixes a log position P (the head's end) and pins, with a
// reference count per segment taken under the store's mutex, every segment
// at or before P. Its Scan reads the records before P in log order
// (sequential reads) from exactly those segments, holding no lock while
// the owner's callback runs; it releases each segment once it has read it
// and every pin when it returns (it runs once), and Close releases
// whatever is left. Store.Scan (and engines/point's client Scans) scan a
// snapshot.
//
// The collector is never held off. It collects pinned segments like any
// other: their live records are re-appended past P, and the index moves to
// the copies. It only defers the end of a pinned segment: once the copies
// are synced the segment leaves the location table (its slot stays
// reserved, so no location of it names another record while a snapshot
// can read it), its file is renamed "<seq>.obsolete" and the directory
// synced; the last unpin unmaps, closes and deletes it. A crash meanwhile
// leaves an .obsolete file, which Open deletes: everything in it was
// copied (durably) or garbage. While such a segment's rename is not
// durable (it failed), the tombstones that shadow it are kept as for a
// live segment.
//
//	log:   | s1 | s2 | s3 (head) ...P | s4 | s5 ...    (s4, s5 written after P)
//	       '-- pinned by the snapshot --'
//	collect s2: its live records -> copies in s5 (past P), synced;
//	            s2 leaves the table; its file -> "…02.obsolete";
//	            the scan still reads s2's records at their old locations;
//	            the scan passes s2 (or Close): last pin, file deleted.
//
// So a record is read once: copies past P are never read, and a record
// relocated before P was taken is read at its copy (the index pointed
// there at P). Which records were live at P is the owner's knowledge:
// engines/point holds every key stripe while it takes the snapshot (no
// writer is between an append and its index change), and from then on,
// for every location its index leaves (overwrite, delete, expiry,
// relocation) while Needs is true — before P and not yet passed by the
// Scan — remembers that the location was live, until the scan gets there.
// A record is yielded if its location is remembered or still indexed.
//
// Space: segments written after P are collected and deleted as usual, so a
// long snapshot costs at most the segments it pinned (Stats.ObsoleteBytes,
// shrinking as the scan advances), not the log written during it.
// Measured (engines/point TestLongScanDoesNotHoldGC: 64 KiB segments,
// 0.8 MB live, every key overwritten 10× during a paused client scan):
// 2.2 MB of files during the scan, 0.9 MB of them held for it; with the
// collector paused for the scan, as before, 9.9 MB. A snapshot held longer
// than Options.SnapshotWarnAge (10 minutes) is logged with what it holds,
// every SnapshotWarnAge; Stats report Snapshots, OldestSnapshotMs,
// PinnedSegments and ObsoleteSegments. Store.Close releases every
// snapshot.
//
// The read cache (ristretto, Options.CacheBytes, default 64 MiB) holds
// checked records keyed by (segment sequence number, offset): every append
// puts its record in (write-through) and every read that preads does too;
// Free deletes the entry. Reads of mapped segments neither consult nor
// fill it: their pages are the OS's cache already, and a copy out of the
// mapping costs less than a cache lookup. A segment's bytes never change and its
// sequence number is never reused, so an entry is exactly what a read of
// that position returns: the cache needs no invalidation to stay correct,
// whatever ristretto's asynchronous admission does (cache.go). A record
// cached before its bytes on disk were damaged is still served from memory.
//
// ReadBatch reads many locations at once. Records of mapped segments are
// read in passes of independent loads (every record's first cache line,
// then its others) so that their cache and TLB misses overlap, then
// copied and checked. The others: cache first, then sorted by (segment,
// offset), neighbours within 64 KiB coalesced into one read of at most
// 256 KiB, up to 8 reads in flight, each record checked.
//
// # Recovery
//
// Open checks every segment header; RecoverIndexed starts from the index
// blocks (see Index blocks) and replays only the log after them; Recover
// (and RecoverIndexed without a usable chain) reads every record in
// (segment, offset) order and hands it to the owner, so the last record of
// a key wins and a tombstone deletes. In the last segment, a bad record (or
// an unfinished batch) with no valid record after it is a torn tail of
// unacknowledged writes and is cut off; anywhere else a bad record is
// corruption and Recover fails with engines.ErrCorrupt. (A disk that
// persists unsynced pages out of order could leave a valid record after a
// torn one; that is refused as corruption, never silently served.)
//
// # Index blocks
//
// So that a restart reads keys' hashes, not values (FlashStore's delta
// index blocks), the owner notes each index change under the key's write
// lock (NoteIndexPut: hash, new location, replaced location, size, expiry;
// NoteIndexDelete: hash, deleted location). Locations are noted as log
// positions (segment sequence number, offset), which are never reused,
// unlike slots. Every Options.IndexBlockBytes of appended log (8 MiB), every
// Options.IndexBlockInterval (250 ms) with at least 64 changes noted, and
// at Close the owner, holding every key lock, cuts the noted changes with
// the log position P they cover (CutIndexDelta: no writer is then between
// appending a record and noting it, so the cut holds exactly the changes of
// the records before P); WriteIndexDelta syncs the log, then writes the
// block durably (temp file, fsync, rename, directory fsync).
//
//	 0       8         12     13    16       24       32          40          48        56        64
//	| magic | version | kind | 0   | number | prev   | P seq     | P off     | count   | 0 (8)   |
//	| (8)   | (4, =1) | (1)  | (3) | (8)    | (8)    | (8)       | (8)       | (8)     |         |
//	| entries ... | crc32c (4) of everything before it |
//
//	entry: | op (1) | key hash (8) | uvarints: put (1; 3: of a marked key): seq, off, bytes, expiresAt, old seq (0: none), [old off]
//	                                           delete (2): seq, off of the deleted record |
//
// magic "TABIDXBK"; kind 1 is a base (every index entry at P), kind 2 a
// delta (the changes since block prev = number-1). A chain is the newest
// readable base and the deltas numbered after it without a gap; a block
// that is missing, fails its CRC or does not link ends the chain there.
//
// RecoverIndexed loads the chain: the live records are its puts minus the
// positions later changes replaced or deleted (each position is put and
// removed at most once, so order does not matter). An entry in a segment
// that no longer exists is stale — the collector freed it after the block,
// having first re-appended the live record after P or found it garbage —
// and is dropped. An entry past its segment's end or past P means the chain
// disagrees with the log: the whole log is scanned instead (as without a
// chain), and logged. Otherwise the entries are handed to the owner with
// their hashes (its index's splits need no reads) and counted live, and
// only the records at and after P are replayed as Recover does. Then
// FinishIndexRecovery writes the tail's changes as the chain's next delta,
// or, when there was no usable chain or its deltas outgrew its base, a new
// base of the whole index, and removes the older blocks. A failed block
// write, or an owner that calls StopIndexBlocks (its index may not match
// the log), stops further blocks until reopened: the next restart replays
// more log from the last good block, never less.
//
// # Garbage collection
//
// Each segment counts its live bytes exactly: Append adds, Free (called by
// the owner on overwrite, delete, expiry and relocation) subtracts. See
// StartGC for victim choice and pacing. A collected segment's live records
// are re-appended through the owner (Mover) under its per-key write lock, so
// a concurrent overwrite wins; expired records are replaced by tombstones;
// a tombstone is kept only while a segment as old as the version it deleted
// survives and its key is still absent. Everything re-appended is synced
// before the segment's file is removed; a segment a snapshot pins keeps
// its file (renamed) until its last pin goes, and the collector goes on
// meanwhile (see Snapshots).
//
// # Views (split partitions)
//
// A store whose directory holds a VIEW file (view.go) is a split
// partition's child: its older segments are hard links to the parent's,
// and each view rule hides, in the segments up to its sequence number,
// the records whose key hash (Options.ViewKey) is outside the child's
// range, unless the owner marked the key (index-block op 3; engines/point
// marks reserved keys, which both children keep). Hidden records are
// skipped by recovery (entries and replay) and by the collector, so they
// are garbage at once; the collector rewrites the rest into the child's
// own segments. Segments are never appended to after recovery nor
// rewritten, so sharing them is safe.
//
// # Concurrency
//
// A Store is safe for concurrent use. Its goroutines (lazy flusher,
// collector) are stopped by Close. A Snapshot is safe for concurrent use
// (Needs from any goroutine, Scan once, Close at any time).
//
// # Example
//
//	s, err := diskstore.Open(dir, diskstore.Options{})
//	err = s.Recover(func(loc uint64, r engines.Record, tomb bool) error { ... })
//	loc, err := s.Append(engines.Record{Key: k, Value: v})
//	err = s.Commit() // durable now
//	r, ok, err := s.Read(loc, nil)
package diskstore
