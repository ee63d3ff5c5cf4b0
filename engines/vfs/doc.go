// Package vfs is the file-system seam of the storage engines and the stream
// layer (after pebble's vfs.FS): every byte they persist goes through an FS,
// so tests can swap the operating system for an in-memory file system that
// crashes (drops everything not synced), fails the k-th operation (including
// a full disk) and flips bits.
//
// Default is the OS. MemFS (memfs.go) is the in-memory, fault-injecting one.
// Two optional file interfaces serve logs that sync often: Preallocator
// (fallocate, so later writes overwrite allocated blocks) and DataSyncer
// (fdatasync); Preallocate and DataSync use them where a file has them.
// MemFS files preallocate only after SetPreallocate(true).
//
// Durability model: a file's bytes are durable once File.Sync returned; a
// name's existence (Create, Rename, Remove, and a directory made by
// MkdirAll) once FS.SyncDir of its parent directory returned. Code that is
// correct under MemFS's Crash is correct on Linux with ext4/xfs in their
// default modes.
//
// MemFS's faults: Crash reverts every file to its last synced content and
// every directory to its listing at its last SyncDir, and makes open
// handles fail with ErrCrashed; CrashKeepingPrefix also keeps a random
// (seeded) prefix of each file's unsynced appends, a torn write. InjectAfter
// (or Inject with a Fault) fails the operation after the next n of the
// chosen kinds with ErrInjected or ErrNoSpace; a failing Write first writes
// half its bytes. Ops counts operations by kind; FlipBit corrupts a byte.
//
// A crash test counts the writes of a clean run, then fails each in turn:
//
//	clean := vfs.NewMem()
//	run(clean)
//	for k := range clean.Ops(vfs.OpWrite | vfs.OpSync) {
//		fs := vfs.NewMem()
//		fs.InjectAfter(int(k), vfs.OpWrite|vfs.OpSync, nil)
//		acked := run(fs)  // stops at the first error
//		fs.Crash()        // power loss: drop all that was not synced
//		check(fs, acked)  // reopen: every acknowledged write is there
//	}
//
// Every FS and File here is safe for concurrent use.
package vfs
