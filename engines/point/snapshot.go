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
// partition to another server and for client Scans: its Scan yields exactly
// the records live when it was taken (and not expired then), each once, in
// log order — the log is read sequentially, not key by key — while writes
// and the disk store's collector go on. It pins the disk store's segments
// up to its position (diskstore.Snapshot): the collector still collects
// them, but a collected segment's file stays until the scan has passed it.
// The locations that writers and the collector take the index away from,
// and that the scan has yet to reach, are remembered (one map entry each)
// until the scan gets there. Scan runs once and releases the segments as it
// goes; Close releases the rest (a snapshot never scanned and never closed
// holds its segments' disk space until the engine closes, and the store
// logs it after diskstore.Options.SnapshotWarnAge). Safe for concurrent
// use; Close is idempotent.
type Snapshot struct {
	e  *Engine
	sn *diskstore.Snapshot
	at int64 // the engine clock when taken, for TTLs

	mu sync.Mutex
	// kept holds the locations before the snapshot's position, not yet
	// scanned, whose index entries were replaced or removed since it was
	// taken. Guarded by mu.
	kept map[uint64]struct{}
	// gone is set once the snapshot left e.snaps; guarded by e.snapMu.
	gone bool
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
	// Hold every stripe while the position is taken and the snapshot is
	// registered: no writer (nor the collector, which relocates under the
	// stripes) is between appending a record and changing the index, so
	// the index at this instant is exactly the log before the position.
	for i := range e.stripes {
		e.stripes[i].Lock()
	}
	dsn, err := e.disk.Snapshot()
	if err != nil {
		for i := range e.stripes {
			e.stripes[i].Unlock()
		}
		return nil, err
	}
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
		if sn.sn.Needs(old) {
			sn.mu.Lock()
			sn.kept[old] = struct{}{}
			sn.mu.Unlock()
		}
	}
}

// Scan calls fn for every record of the snapshot, stopping at fn's first
// error. The record's slices are valid during the call only. fn runs with
// no lock of the engine held (it may block, on a network send say: writes
// and the collector go on meanwhile). Scan runs once: a second call
// returns diskstore.ErrSnapshotScanned; when it returns, the snapshot's
// segments are released (Close is still allowed).
func (sn *Snapshot) Scan(fn func(engines.Record) error) error {
	e := sn.e
	if e.closed.Load() {
		return engines.ErrClosed
	}
	defer sn.unregister()
	return sn.sn.Scan(func(loc uint64, r engines.Record) error {
		h := keyspace.Hash(r.Key)
		// Under the key's stripe, the index and kept together say whether
		// loc was the key's version at the snapshot (writers and the
		// collector update both under it).
		mu := &e.stripes[e.stripeOf(h)]
		mu.Lock()
		sn.mu.Lock()
		_, live := sn.kept[loc]
		delete(sn.kept, loc) // each location is scanned once
		sn.mu.Unlock()
		if !live {
			_, live = e.ix.Lookup(h, func(l uint64) bool { return l == loc })
		}
		mu.Unlock()
		if !live || r.ExpiresAt > 0 && r.ExpiresAt <= sn.at {
			return nil
		}
		return fn(r)
	})
}

// unregister takes the snapshot off the engine's list: writers stop
// telling it what they replace.
func (sn *Snapshot) unregister() {
	e := sn.e
	e.snapMu.Lock()
	if !sn.gone {
		sn.gone = true
		for i, x := range e.snaps {
			if x == sn {
				e.snaps = append(e.snaps[:i:i], e.snaps[i+1:]...)
				e.snapCount.Add(-1)
				break
			}
		}
	}
	e.snapMu.Unlock()
	sn.mu.Lock()
	sn.kept = map[uint64]struct{}{}
	sn.mu.Unlock()
}

// Close releases the snapshot: the segments it still pins, and those the
// collector freed meanwhile are deleted now (the error is that of deleting
// them). A Scan running meanwhile returns engines.ErrClosed. Idempotent.
func (sn *Snapshot) Close() error {
	// The store's snapshot first: a Scan that meets a record after kept is
	// dropped is then sure to return engines.ErrClosed, not a short result.
	err := sn.sn.Close()
	sn.unregister()
	return err
}

// closeSnapshots closes every open snapshot (the engine is closing).
func (e *Engine) closeSnapshots() {
	e.snapMu.Lock()
	snaps := append([]*Snapshot(nil), e.snaps...)
	e.snapMu.Unlock()
	for _, sn := range snaps {
		if err := sn.Close(); err != nil {
			e.opts.Logger.Warn("point: close a snapshot", "dir", e.opts.Dir, "err", err)
		}
	}
}
