package point

import "github.com/tabuladb/tabula/engines"

// ValueStore holds the engine's records at locations: the seam between the
// index (which keeps only locations) and the storage back end. The in-memory
// store is memStore; the disk store (a FlashStore-style log) implements the
// same interface.
//
// Implementations are safe for concurrent use. The engine guarantees that it
// frees a location only after the index stops pointing at it, and that it
// never frees a location twice; it does not guarantee that no reader still
// holds the location, so Read must tolerate a location being freed and
// reused concurrently.
type ValueStore interface {
	// Append stores a copy of r and returns its location, at most
	// lhash.MaxLocation.
	Append(r engines.Record) (loc uint64, err error)
	// Read returns the record at loc, or ok == false if loc holds none.
	// Racing with Free or reuse of loc, it returns the old record, the new
	// one or !ok — never a mix of two. The record's slices must not be
	// modified; they may alias buf (grown as needed) or the store's own
	// immutable memory, and stay valid until buf is reused.
	Read(loc uint64, buf []byte) (r engines.Record, ok bool, err error)
	// Free releases loc for reuse.
	Free(loc uint64) error
	// Scan calls fn for every stored record in location order, stopping at
	// fn's first error. Records appended or freed during the scan may or may
	// not be seen; a record stored throughout is seen exactly once. The
	// record's slices are valid during the call only.
	Scan(fn func(loc uint64, r engines.Record) error) error
	// Close releases the store. In-flight calls complete safely.
	Close() error
}
