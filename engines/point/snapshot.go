package point

import (
	"errors"
	"sync"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/diskstore"
	"github.com/tabuladb/tabula/internal/keyspace"
)

// ErrSnapshotUnsupported is returned by Snapshot for the memory storage.
var ErrSnapshotUnsupported = errors.New("point: snapshots need the ssd storage (not implemented for memory)")

// Snapshot is a consistent view of the engine at one moment, for copying a
// partition to another server: its Scan yields exactly the records live
// when it was taken (and not expired then), each once, in log order — the
// log is read sequentially, not key by key — while writes go on. Taking it
// pauses the disk store's collector until Close, so the records it will
// read stay where they are; versions overwritten or deleted during the
// copy are remembered (one map entry each) until Close. Safe for
// concurrent use; Close is idempotent. Close snapshots promptly: garbage
// is not reclaimed while one is open.
type Snapshot struct {
	e  *Engine
	sn *diskstore.Snapshot
	at int64 // the engine clock when taken, for TTLs

	mu sync.Mutex
	// kept holds the locations before the snapshot's position whose index
	// entries were replaced or removed since it was taken. Guarded by mu.
	kept map[uint64]struct{}
}

// Snapshot takes a snapshot; see Snapshot. With the memory storage it
// returns ErrSnapshotUnsupported.
func (e *Engine) Snapshot() (*Snapshot, error) {
	if e.closed.Load() {
		return nil, engines.ErrClosed
	}
	if e.disk == nil {
		return nil, ErrSnapshotUnsupported
	}
	// Pause the collector first (it takes stripes to relocate), then hold
	// every stripe while the position is taken and the snapshot is
	// registered: no writer is between appending a record and changing the
	// index, so the index at this instant is exactly the log before it.
	dsn := e.disk.Snapshot()
	for i := range e.stripes {
		e.stripes[i].Lock()
	}
	dsn.Mark()
	sn := &Snapshot{e: e, sn: dsn, at: e.opts.Now(), kept: map[uint64]struct{}{}}
	e.snapMu.Lock()
	e.snaps = append(e.snaps, sn)
	e.snapCount.Add(1)
	e.snapMu.Unlock()
	for i := range e.stripes {
		e.stripes[i].Unlock()
	}
	return sn, nil
}

// snapKeep tells the open snapshots that the index no longer points at
// old. Caller holds the key's stripe.
func (e *Engine) snapKeep(old uint64) {
	if e.snapCount.Load() == 0 {
		return
	}
	e.snapMu.Lock()
	defer e.snapMu.Unlock()
	for _, sn := range e.snaps {
		if sn.sn.Before(old) {
			sn.mu.Lock()
			sn.kept[old] = struct{}{}
			sn.mu.Unlock()
		}
	}
}

// Scan calls fn for every record of the snapshot, stopping at fn's first
// error. The record's slices are valid during the call only.
func (sn *Snapshot) Scan(fn func(engines.Record) error) error {
	e := sn.e
	if e.closed.Load() {
		return engines.ErrClosed
	}
	return sn.sn.Scan(func(loc uint64, r engines.Record) error {
		if r.ExpiresAt > 0 && r.ExpiresAt <= sn.at {
			return nil
		}
		h := keyspace.Hash(r.Key)
		// Under the key's stripe, the index and kept together say whether
		// loc was the key's version at the snapshot (writers update both
		// under it).
		mu := &e.stripes[e.stripeOf(h)]
		mu.Lock()
		sn.mu.Lock()
		_, live := sn.kept[loc]
		sn.mu.Unlock()
		if !live {
			_, live = e.ix.Lookup(h, func(l uint64) bool { return l == loc })
		}
		mu.Unlock()
		if !live {
			return nil
		}
		return fn(r)
	})
}

// Close releases the snapshot and resumes the collector.
func (sn *Snapshot) Close() {
	e := sn.e
	e.snapMu.Lock()
	for i, x := range e.snaps {
		if x == sn {
			e.snaps = append(e.snaps[:i:i], e.snaps[i+1:]...)
			e.snapCount.Add(-1)
			break
		}
	}
	e.snapMu.Unlock()
	sn.sn.Close()
}

// closeSnapshots closes every open snapshot (the engine is closing).
func (e *Engine) closeSnapshots() {
	e.snapMu.Lock()
	snaps := append([]*Snapshot(nil), e.snaps...)
	e.snapMu.Unlock()
	for _, sn := range snaps {
		sn.Close()
	}
}
