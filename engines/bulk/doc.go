// Package bulk is the library of bulk tables: it builds the
// immutable per-partition files of a table version from records, reads
// them with a few bytes of memory per record, and serves a partition's
// versions as the read-only engine of kind bulk in the engines registry.
//
// # Building
//
// BuildTable reads input files (tsv, csv, jsonl or parquet, see Format; the
// key and the value from the fields or columns BuildOptions.KeyColumn and
// ValueColumn name), routes each record to partition
// keyspace.Index(keyspace.Hash(key), n) — the servers' routing — spilling
// to temporary files when the records outgrow
// BuildOptions.MemoryBudget, and builds the partitions in parallel with
// BuildPartition, which is also a library call of its own so that a batch
// engine can build partitions on many machines. The output is deterministic:
// the same input gives the same bytes whatever the worker count or memory
// budget. A malformed record stops the build before any file is written,
// as a *MalformedError naming its file and line, or its row in a Parquet
// file ("in.parquet row 12"). Parquet is read by package
// engines/bulk/parquetinput, which registers itself with RegisterFormat
// when imported, so that only programs reading Parquet link its library;
// OpenInput gives any builder the readers BuildTable uses.
//
// # Serving
//
// Open maps a partition file (mmap on Linux and macOS; a ReadAt path for any
// vfs.File) and keeps in memory only what finds a value and rejects an
// absent key: the minimal perfect hash (package mph, ~3.5 bits per key), a
// fingerprint per key (8 bits by default: an absent key reaches the disk
// with probability 1/256) and the record offsets (Elias-Fano, ~9 bits per
// record; none when all records have one length). A Get hashes the key,
// finds its slot, checks the fingerprint, reads the record, verifies its
// CRC32C and compares the full key: a fingerprint false positive is never
// served. NewOverlay serves a delta version over its base; its Scan yields
// each live key of the version once, with the value AppendGet returns,
// holding no per-key state: a layer's record is served unless a newer
// layer's index has its key (an in-memory fingerprint miss, almost always).
//
// # Serving engine
//
// Engine (engines.Open(engines.KindBulk, opts), or OpenEngine) serves one
// partition from its directory: the loaded versions, one of them serving.
// It is read-only (not an engines.Writer): a version comes in whole,
// written with Stage (an upload, or a copy from a stream; resumable from
// StagedBytes) and loaded by Stage.Finish after its whole-file CRC32C and
// every record are checked, or found in the directory at the first Retain
// after a restart; Retain(retained, current) unloads and deletes the
// versions no longer retained (a delta keeps its base chain loaded) and
// sets the serving one. Through engines.Engine and engines.BatchGetter it
// serves the serving version (a read racing a switch is read again at the
// new one); Version(v) gives a pinned version, whose reads fail with a
// *VersionGoneError once it is unloaded. Files in the directory:
//
//	v<version>-<crc32c as 8 hex digits>.bulk   a loaded (verified) version
//	v<version>-<crc32c as 8 hex digits>.part   a stage in progress
//
// A .bulk file is only ever made by renaming a complete, verified .part;
// its name carries what it is checked against, so nothing else is stored.
// Which versions to hold, where their files come from, and telling anyone
// what is loaded is the owner's business (the table server: the cluster
// map, uploads, streams, heartbeats). The engine passes
// enginetest.RunReadOnly.
//
// # File format
//
// A partition file is a header, five sections and a footer:
//
//	| header (16) | records | mph | fingerprints | offsets | deleted | footer (192) |
//
// Header:
//
//	 0            8               12           16
//	| "TABBULKH"  | version (4)   | crc32c (4) |
//
// crc32c covers bytes 0-11. Records: diskstore put records
// (diskstore.AppendPutRecord, ExpiresAt 0) back to back in slot order: the
// record of the key whose slot is i is the i-th. A deleted key of a delta
// file is a put record with an empty value and its bit set in deleted. mph:
// the mph.Table encoding. fingerprints: n bytes (fpBits 8) or n
// little-endian uint16 (fpBits 16) or nothing (fpBits 0); slot i holds the
// low fpBits of the key's hash. offsets: an eliasfano list of n+1 record
// offsets relative to the records section (the last one its length), or
// nothing when fixedLen > 0 (record i starts at i*fixedLen). deleted: a
// bitmap of n bits in ⌈n/64⌉ little-endian words, only in delta files.
//
// Footer (192 bytes, the end of the file):
//
//	  0  section table: 5 × {offset (8), length (8)}   records, mph, fps, offsets, deleted
//	 80  section crc32c: 5 × 4
//	100  fpBits (1) | flags (1) | 0 (2)
//	104  records n (8)
//	112  deleted count (8)
//	120  fixedLen (8)           0: variable-length records
//	128  partition (4) | partitions (4)
//	136  version (8)            the table version this file belongs to
//	144  baseVersion (8)        a delta's base version (flags bit 0)
//	152  hashSeed (8)           0: the key's hash is xxhash64(key), the routing hash
//	160  maxRecordLen (4) | 0 (4)
//	168  0 (8)
//	176  format version (4)
//	180  crc32c (4)             of footer bytes 0-179
//	184  "TABBULKF" (8)
//
// Integers are little-endian. Sections are contiguous and in this order. The
// key's hash h is xxhash64(key) when hashSeed is 0 (a build that meets two
// keys with one 64-bit hash uses xxhash64 seeded with hashSeed instead).
// Open checks the header, footer, section layout and the CRC32C of every
// in-memory section; the records section CRC is checked by Verify (it reads
// the whole file), and every record's own CRC on every read. A file of
// another format version is refused with ErrFormatVersion; anything
// damaged with an error wrapping engines.ErrCorrupt.
//
// The format constants (magics, flag bits, the footer layout) never change
// or get reused; a new layout is a new format version. Version 2 (this one)
// holds an mph encoding of version 2 (the table in parts); version 1 files
// are refused with ErrFormatVersion.
//
// # Build and read paths
//
// BuildPartition hashes each key once (the routing hash is the file's key
// hash), builds the MPH without sorting (the MPH itself fails on equal
// hashes; only then are the records sorted to drop or report duplicates),
// takes every record's slot from the MPH builder, and writes the records in
// slot order a window at a time: each window's records, listed with their
// slots, are read in input order and copied to their places in a buffer of
// huge pages, a group of 32 at a time with their cache lines touched first
// so that the misses overlap. Records of one key and one value length get
// their header from a template and their CRC32Cs three at a time. A
// writer goroutine checksums and writes each filled window a MiB at a time
// and has the file synced every 64 MiB without waiting, so the final sync
// finds little left. PartitionOptions.Workers goroutines hash, build the
// MPH's parts and fill windows at once (with more than one, two buffers
// alternate: one is filled while the other is written); the bytes do not
// depend on it. Each byte goes through
// CRC32C once: the whole file's CRC is combined from the sections'.
// AppendGetBatch looks up a group of 16 keys' slots, then touches their
// records, then reads them, so the cache misses of independent keys
// overlap.
//
// # Concurrency
//
// A *File and an *Overlay are safe for concurrent use, including Close
// concurrent with reads: Close waits for reads in flight and later reads
// fail with engines.ErrClosed; the mapping is released only when no read
// uses it. BuildTable and BuildPartition may run concurrently with anything.
// An *Engine and its *Versions are safe for concurrent use; reads never
// wait on a load, an unload or a stage (the loaded set is immutable and
// swapped atomically). A *Stage is used by one goroutine.
//
// # Example
//
//	infos, err := bulk.BuildTable(ctx, []string{"in.tsv"}, "out", bulk.BuildOptions{Partitions: 8})
//	f, err := bulk.Open(vfs.Default, "out/"+bulk.PartitionFileName(3, 8), bulk.OpenOptions{})
//	defer f.Close()
//	v, ok, err := f.AppendGet(nil, []byte("key"))
//
//	e, err := engines.Open(engines.KindBulk, engines.Options{Dir: dir, Partition: 3, Partitions: 8})
//	be := e.(*bulk.Engine)
//	be.Retain([]uint64{1}, 0)                   // the map lists version 1
//	st, err := be.Stage(1, size, crc, be.StagedBytes(1))
//	_, err = io.Copy(st, upload)
//	_, err = st.Finish(ctx)                     // verified and loaded
//	be.Retain([]uint64{1}, 1)                   // and serving
//	v, _, err := e.Get([]byte("key"))
package bulk
