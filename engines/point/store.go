package point

import (
	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/diskstore"
)

// ValueStore holds the engine's records at locations: the seam between the
// index (which keeps only locations) and the storage back end. The in-memory
// store is memStore; the disk store (engines/diskstore, a FlashStore-style
// log) implements it too.
//
// Implementations are safe for concurrent use. The engine guarantees that it
// frees a location only after the index stops pointing at it, and that it
// never frees a location twice; it does not guarantee that no reader still
// holds the location, so Read must tolerate a location being freed and
// reused concurrently.
//
// Write protocol: under the key's stripe lock the engine Appends the new
// record (or a Tombstone for a delete), Commits, and only then points the
// index at it and Frees the version it replaced. So a write is visible only
// once it is as durable as the store promises, and the log order of a key's
// versions is the order the index saw them.
type ValueStore interface {
	// Append stores a copy of r and returns its location, at most
	// lhash.MaxLocation. It need not be durable before Commit.
	Append(r engines.Record) (loc uint64, err error)
	// Write stores ops (puts and tombstones) as one unit — after a crash
	// all of them or none — and sets locs[i] to each put's location. On
	// error nothing was stored. Durable as Append.
	Write(ops []diskstore.Op, locs []uint64) error
	// Tombstone records that key's record at shadowed was deleted, so that
	// a restart does not bring it (or an older version) back. Durable as
	// Append. The memory store has nothing to record.
	Tombstone(key []byte, shadowed uint64) error
	// Commit makes this goroutine's earlier Appends and Tombstones as
	// durable as the store promises before the engine acknowledges them.
	Commit() error
	// Read returns the record at loc, or ok == false if loc holds none.
	// Racing with Free or reuse of loc, it returns the old record, the new
	// one or !ok — never a mix of two. The record's slices must not be
	// modified; they may alias buf (grown as needed) or the store's own
	// immutable memory, and stay valid until buf is reused.
	Read(loc uint64, buf []byte) (r engines.Record, ok bool, err error)
	// Free releases loc, which held r, for reuse.
	Free(loc uint64, r engines.Record) error
	// Scan calls fn for every stored record in location order, stopping at
	// fn's first error. Records appended or freed during the scan may or may
	// not be seen; a record stored throughout is seen exactly once. The
	// record's slices are valid during the call only.
	Scan(fn func(loc uint64, r engines.Record) error) error
	// Close releases the store. In-flight calls complete safely.
	Close() error
}
