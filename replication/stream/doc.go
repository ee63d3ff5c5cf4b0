// Package stream is the stream layer (WAS §4): append-only
// streams of extents, replicated on three extent nodes in distinct fault
// domains.
//
// A stream is a name and an ordered list of extents; only the last is
// appended to. An extent is a file of blocks, each with its CRC32C, plus
// its commit length. Clients append entries — atomic multi-block appends,
// blocks of client-chosen sizes up to 4 MiB — to the primary of the last
// extent, which picks their offsets, writes them locally and to the
// secondaries it was created with (the manager names them at Create) in
// parallel and acknowledges them in offset order once all
// three have them durably (group commit: one write per replica for
// everything queued, one batch on the primary node's ReplicateStream to
// each secondary node for everything every extent of the primary's node
// queued for it, and one journal fsync
// per node for everything every extent of the node queued). When an append fails, the
// client asks the stream manager to seal the extent at the commit length
// the reachable replicas agree on (the smallest: every acknowledged append
// is on all three, so none is cut) and continues on a new extent on healthy
// nodes. A stream may instead have its appends acknowledged on a majority
// (AckQuorum; see "Appends and the commit point" and "Sealing"). A sealed
// extent rejects appends, which fences an old writer.
//
// The pieces:
//
//   - Extent (extent.go): one replica's file: append, sync, freeze, seal,
//     read with every block checked, scrub, crash recovery.
//   - Store (store.go): a node's directory of extents; copies are built in
//     a temp file and renamed in.
//   - journal (journal.go, journal_store.go): the node's journal of the
//     writes of all its extents, group-committed; replay at open;
//     checkpoints.
//   - Node (node.go): the ExtentNode gRPC service (streampb) over a Store;
//     the scrubber. Its methods also serve in-process callers (the table
//     server hosting the node): Append with a streampb.AppendRequest,
//     Extent for a replica to tail; their errors are status errors, which
//     FromStatus maps back to the sentinels.
//   - appender (appender.go): the primary's ordering, group commit,
//     per-secondary replication and commit point.
//   - Manager (manager.go): the stream manager as a deterministic state
//     machine (no I/O, goroutines or clock): streams → extents → replicas,
//     node registry, placement, seal records, re-replication, repair and
//     garbage collection, as Commands applied in order and Tasks for the
//     owner to run. Snapshot/LoadSnapshot encode it (JSON). Its state is
//     persistent (ptree.go: treaps whose nodes a writer copies on write),
//     so Clone is O(1) and a command copies only what it changes.
//   - Driver (driver.go): runs a Manager behind a StateLog (in memory:
//     LocalLog; in the master: its raft log) and does the I/O: creating
//     extents, the seal protocol, copy and delete tasks, node inventory.
//   - Client (client.go): appends (assigning sequence numbers), reads at a
//     location from any replica, reads a whole stream dropping duplicates.
//   - Erasure coding (coding.go, fragment.go, manager_coding.go,
//     node_coding.go, driver_coding.go, client_coding.go): sealed extents
//     of streams whose Code is CodeLRC12 are coded with LRC(12,2,2)
//     (replication/lrc) — see "Coded extents" below.
//   - streamtest: in-process clusters on real gRPC for tests.
//
// # Extent file
//
// One file per extent, "%016x.ext" (the extent id in hex), in the node's
// store directory; "%016x.ext.tmp" is a copy being built (removed at open).
// Integers are little-endian.
//
//	 0       8          12        16          24            28       32
//	| magic | version  | flags   | extent id | list len (4) | crc32c |
//	| (8)   | (4, =2)  | (4)     | (8)       |  = L         | (4)    |
//
//	32             33           34
//	| ack (1)     | count (1)  | count × (node len (2) | node | addr len (2) | addr) | crc32c (4) |
//	 └──────────────────────────── the replica list: L bytes ──────────────────────────────────┘
//
// magic is "TABEXTNT"; the first crc32c (Castagnoli) covers bytes 0-27,
// the second the replica list before it. flags bit 0: this replica is the
// primary (it takes Append; secondaries take Replicate). The replica list
// (6 to 16 KiB) records, on a primary, the extent's secondaries (node id
// and address) and its ack policy (0 all, 1 quorum): the primary
// replicates to exactly these, also after a restart, and never
// acknowledges an append held by fewer copies than the policy requires; a
// secondary has count 0, ack 0. Version 1 (the same 32 bytes with list len
// 0 and no list) is still read; a primary of version 1 refuses appends
// (ErrBroken: seal it), as it does not know its secondaries. Another
// version is refused with ErrFormatVersion. Blocks follow the header;
// extent offsets count from its end, so offset 0 is the first block.
//
// # Block (20-byte header, then the payload)
//
//	 0        4      5       6       8         12             20
//	| crc32c | kind | flags | 0 (2) | len (4) | seq (8)      | payload (len) |
//
// crc32c covers, in order, the extent id (8) and the block's extent offset
// (8) — not stored, so a block read from the wrong place or file fails —
// then header bytes 4-19 and the payload. kind: 1 data, 2 seal (0 is never
// a block: zeroed media fails). flags bit 0, "continues": the block is not
// the last of its entry. len is at most MaxBlockBytes. seq is the entry's
// sequence number (the writer's; 0 for none), in every block of the entry.
//
// A seal block (kind 2, flags 0, seq 0, len 8, payload = its own offset,
// which is the sealed length) ends a sealed extent; nothing follows it.
//
// An entry is the blocks from one without "continues" (exclusive) to the
// next one without it (inclusive). The commit length of a replica is always
// at an entry boundary.
//
// # Durability and recovery
//
// Writes are appends to the file; a replica's commit length is its
// durable length: in a node's store, what the journal holds durably (see
// "Journal"); in a store without a journal, what the file holds synced.
// Open reads and checks every block: an unfinished entry or a bad
// block at the end with no valid block after it is a torn tail of
// unacknowledged appends and is cut (durably). A bad block followed by a
// valid one is media corruption: the extent opens marked corrupt (reads of
// that block fail, the scrubber reports it) rather than losing what follows.
// Seal truncates to the chosen length, writes the seal block and syncs; a
// crash before the sync leaves the extent unsealed and the seal is redone
// (with a journal, the seal is journaled first and the replay finishes it).
//
// # Journal
//
// Every write of every extent of a node — appends on the primaries,
// replicates on the secondaries — is also a record in the node's journal,
// "journal/%016x.jnl" in the store directory (the file number in hex). The
// write goes to the extent file first (not synced), then its record is
// queued. A waiter (Extent.Sync) that finds records queued and no commit
// running writes everything queued as one frame with one write and one
// fsync, then releases the waiters, one of which commits the next frame,
// formed while the fsync ran (no added delay). So a
// node with 15 open extents makes one fsync where it made 15; an extent's
// durable length (hence its commit length) counts what the journal holds
// durably.
//
// File: a header, then frames. Integers are little-endian; formats and
// constants never change or get reused.
//
//	 0        8             12                20         28
//	| magic  | version (4) | file number (8) | salt (8) | crc32c (4) |
//	| (8)    |  = 1        |                 |          | of 0-27    |
//
// magic is "TABJOURN"; salt is random per file.
//
// Frame (one per write+fsync; a batch of records):
//
//	 0        4          8             9       12          20
//	| crc32c | len (4)  | version (1) | 0 (3) | batch (8) | records (len) |
//	                      = 1
//
// crc32c (Castagnoli) covers the file's salt (8) and the frame's file
// offset (8) — neither stored, so a frame from another file or one
// embedded in a payload never checks — then bytes 4 to the end. batch
// numbers increase by one across frames and files. Record:
//
//	 0          1       4         8            16           24
//	| kind (1) | 0 (3) | len (4) | extent (8) | offset (8) | data (len) |
//
// kind 1, data: data is the encoded blocks the extent file got at offset
// (len > 0). kind 2, seal: the extent was sealed at offset (len 0).
//
// A frame is written only after the previous one's fsync returned, so
// after a crash only the newest file's last frame can be damaged: a bad
// frame there with no valid frame after it is a torn tail (never
// acknowledged) and is dropped; a bad frame followed by a valid one, or
// anywhere in an older file, is corruption and fails the node's open
// (engines.ErrCorrupt), never dropping acknowledged data silently. A
// header cut before its sync leaves an empty newest file.
//
// A new file is preallocated to FileBytes (fallocate on Linux) and each
// commit is synced with fdatasync: overwriting allocated blocks changes no
// metadata, so a sync writes only the frame. Zeros after the last frame
// therefore end the newest file (a file whose header never synced is all
// zeros and holds nothing). A file the journal moves on from is cut to
// its frames and synced before the next one exists, and an open cuts the
// newest file the same way before it starts a new one, so an older file
// never ends in zeros or a torn frame.
//
// Recovery (OpenNode, OpenJournaledStore): the extents are opened as
// above (torn tails cut), then the journal is replayed, extent by extent
// in journal order. Records of an extent the node no longer has (deleted)
// or of a sealed one (fsynced when sealed) are skipped. Otherwise a data
// record whose bytes the file holds is skipped; else the file is cut at
// the record's offset and the record written (a torn or never-synced
// tail, a hole the OS left); a record beyond the file's end is data a
// synced file lost: ErrCorrupt. A seal record drops the data beyond its
// length and writes the seal block (the cut may have reached the disk
// without the seal block). The files are synced, recovered again, and the
// old journal files removed; a new file continues the batch numbers.
//
// Checkpoints: when the journal moves to a new file (past
// JournalOptions.FileBytes, 32 MiB by default) every extent file written
// since its last fsync is fsynced and the journal files before the
// current one are removed: each of their records was queued after its
// bytes reached the extent file and before the move. So the journal holds
// about 2 × FileBytes. An extent whose file fsync ever failed keeps the
// journal (the file's content is unknown after a failed fsync) until it
// is deleted. A failed journal write or fsync breaks the journal for good:
// every later write of the node fails (ErrBroken) and its writers seal.
//
// Sealed extents: Seal journals a seal record and waits for it, then cuts
// the file, writes the seal block and fsyncs the file, so a sealed
// extent is fully in its file before Seal returns: copies (Fetch), coding
// and scrubbing of sealed extents read files that need no journal.
// Freeze waits for the extent's journaled writes. Reads and scrubs of an
// open extent read the file below the durable length, which the file
// holds (written before the record was queued), synced or not.
//
// # Wire
//
// streampb/stream.proto: Append carries payloads with their CRC32C (checked
// by the primary); Replicate, Read and Fetch carry the encoded blocks,
// checked by the receiver, which also checks that they sit at the right
// offset of the right extent. Errors map to gRPC codes (errors.go) and
// back to this package's sentinels; corruption is codes.DataLoss.
//
// # Appends and the commit point
//
// The primary's appender (appender.go) group-commits in batches: it
// writes a batch locally and queues it for each secondary on the node's
// link to that secondary's node, then goes on with the next batch (up to
// 8 in flight) while a committer acknowledges each batch, in order, once
// it is durable locally and on as many secondaries as the extent's ack
// policy requires (AckAll: all; AckQuorum: a majority of the replicas,
// the primary included). A batch that fails fails every later one: none
// is acknowledged after a gap. A link sends what every extent queued for its node
// as one batch (an item per extent, queued batches coalesced, up to
// 4 MiB) on one long-lived ReplicateStream to that node, up to
// NodeOptions.ReplicateCalls batches in flight (1 by default), and a slow
// node delays only the copies it holds. The receiver writes each batch's
// items as the batch arrives, in stream order, then syncs them (one
// journal fsync with whatever else arrived meanwhile) and answers the
// batch by its id. A batch on a stream costs a fraction of a unary call's
// CPU on both sides (no call set-up, headers, signature check or
// trailers); a node without ReplicateStream (an older version) gets
// ReplicateBatch calls, where an item that overtook the data before it
// in its extent (a later call handled first) waits for that data rather
// than fail. A secondary whose Replicate fails (or takes longer
// than the link's timeout: NodeOptions.ReplicateTimeout, or the smoothed
// round trip plus four deviations when that is longer, up to 8× it), or
// whose queue passes NodeOptions.MaxReplicaLag, is dropped from the ack
// set; the append responses name it (AppendResponse.dropped,
// ExtentStat.dropped), and the Client seals and continues on a new
// extent. A partition's primary, which appends in-process, does not: the
// node brings the secondary back instead (rejoin.go). A rejoiner probes
// it (a data-less Replicate answers its replica's length) with backoff
// up to 500 ms, sends what it lacks from the primary's own replica, whole
// entries, and once it holds exactly what the appender handed out puts it
// back in the ack set under the appender's lock, so the next batch is
// queued for it in offset order. Rejoining ends when the extent is
// sealed, frozen or broken. With fewer copies left than required, the
// extent breaks (ErrBroken) and the writer seals.
//
// While an extent is open, its primary tells every secondary in the ack
// set the commit point at least every CommitKeepalive (250 ms), writes
// or not (keepalive.go), so a secondary knows how fresh it is
// (Extent.CommitHeard); Node.Secondaries is the primary's view of each
// secondary (in the ack set, rejoining, bytes behind, since when).
//
// The commit point is the length acknowledged so far. Every Replicate
// carries the primary's (commit_length); when no batch follows an
// acknowledgement within ~1 ms the link tells it in a data-less item, so an idle extent's secondaries learn it promptly. A replica
// reports it as Extent.CommittedLength (primary: acknowledged; secondary:
// last told, capped at its durable length; sealed: the sealed length;
// memory only, 0 after a restart until told), WaitCommitted blocks until
// it passes a length, and ReadEntries decodes the entries below it: what
// a partition's secondary tails and applies.
//
// # Sealing
//
// Driver.Seal: CommitLength(freeze) on every replica in parallel (a frozen
// replica takes no more appends or replicates, so nothing can be
// acknowledged after its length is read), the smallest length among those
// that answered is recorded (OpSeal) — or the length of a replica already
// sealed by an earlier, interrupted seal — and the answering replicas are
// sealed at it. Replicas that missed the seal are rebuilt from sealed ones.
// An AckQuorum extent's seal needs a majority of its replicas reachable
// and takes the largest length among them (an acknowledged append is on a
// majority, so on at least one of them); the replicas at that length are
// sealed, the shorter ones are left out of the seal record and rebuilt
// whole from the sealed ones (TaskCopy), like a replica that missed it.
//
// An extent none of whose reachable replicas exists (the owner crashed
// between OpAllocate and creating the replicas) is sealed empty, but only
// when more of its replicas are known never to have existed than an
// acknowledgement could do without under its ack policy (one with AckAll,
// a majority with AckQuorum): then nothing was acknowledged on it. The
// missing replicas are created as empty secondaries sealed at 0 (a late
// Create of the primary then fails) and the seal is recorded. An extent
// with any replica that exists goes through the normal seal.
//
// # Placement by the caller
//
// A stream records its replica count (create_stream's Replicas, 1-5;
// default ManagerOptions.Replicas) and ack policy; its extents keep that
// many replicas (ExtentMeta.Copies), also when re-replicated. OpAllocate
// (Driver.SealAndAllocateOn) can name the exact nodes of the new extent,
// primary first — a partition puts its log's open extent on its replica
// servers, with the primary extent on its primary — validated as known,
// alive and distinct. A 1-replica stream's extents are a primary alone.
//
// # Coded extents
//
// A stream's coding policy (StreamMeta.Code; create_stream or set_code)
// makes the manager list a TaskCode for each of its sealed, non-empty
// extents. The driver applies OpCodeStart, which places the 16 fragments
// (placeFragment: fault domain with the fewest of the extent's fragments,
// then the fewest of that fragment's local group, then the node with the
// fewest; with ≥ 16 domains every fragment has its own, with fewer they
// spread as evenly as possible, which CodingPlacement.Spread reports).
// The placement is durable before any fragment exists. The driver then
// asks a node holding a good sealed replica (the coordinator) to Code it:
// the coordinator reads its replica (every block checked), cuts it at
// block boundaries into 12 runs as even as whole blocks allow
// (splitAtBlocks), pads them to the largest, computes the 4 parities and
// PutFragments fragment i to its node. The driver records the result
// (OpCoded: fragment size, boundaries, CRC32C per fragment); only then are
// the 3 replicas dropped and deleted. A crash before OpCoded leaves the
// extent coding and the next RunTasks (any driver over the same state)
// codes it again — the split is a function of the extent, so the bytes
// are the same, and fragments already stored with that size and CRC are
// skipped; a fragment node that died meanwhile gets its slot re-placed
// and the stale result is refused (ErrPlacementChanged).
//
// Reading a coded extent: the range is mapped to the data fragments
// holding it (Boundaries), each read directly with ClientOptions.
// FragmentTimeout; a down, slow or corrupt fragment is rebuilt from
// lrc.RepairPlan's fragments (its local group — 6 reads — when intact,
// else a global decode) over the same range. The result's block CRCs are
// checked as for a replica read, so a decoding from bad inputs fails
// rather than returning wrong bytes. A lost fragment (dead node) is moved
// to another node that rebuilds it whole (RebuildFragment, checked against
// the recorded CRC); the dead node's copy is deleted after that. Corrupt
// fragments (reads, the scrubber, Stat) are rebuilt in place.
//
// Fragment file (fragment.go): header | payload | per-64-KiB-chunk
// CRC32C table | table CRC; drawn in full there.
//
// # Sequence numbers and duplicates
//
// A Client is the single writer of a stream: opening it bumps the stream's
// writer epoch and seals its open extent, so an older writer's next seal
// request fails with ErrFenced. The writer numbers entries 1, 2, ... in
// stream order and keeps one batch in flight per stream; a batch that failed
// is retried first on the new extent, so a duplicate always has a sequence
// number at most the largest before it, and ReadStream drops exactly those.
//
// # Concurrency
//
// Extent, Store, Node, Driver, LocalLog, Conns and Client are safe for
// concurrent use; Manager is not (its owner serialises it). Node and
// Client own goroutines, stopped by Close.
//
// # Example
//
//	d := stream.NewDriver(stream.NewLocalLog(stream.NewManager(stream.ManagerOptions{})), stream.DriverOptions{})
//	d.Apply(ctx, stream.Command{Op: stream.OpAddNode, Node: "en-1", Addr: addr1, FaultDomain: "rack-1"}) // ...3+
//	d.Apply(ctx, stream.Command{Op: stream.OpCreateStream, Stream: "p7/log"})
//	c := stream.NewClient(d, stream.ClientOptions{})
//	res, err := c.Append(ctx, "p7/log", record) // durable on 3 nodes
//	blocks, err := c.Read(ctx, res.Location)
//	err = c.ReadStream(ctx, "p7/log", func(e stream.Entry) error { ... })
package stream
