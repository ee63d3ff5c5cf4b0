package coproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/tabuladb/tabula/coproc/abi"
	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/internal/keyspace"
)

// PartitionInfo describes the partition a call runs on (see abi.PartitionInfo).
type PartitionInfo = abi.PartitionInfo

// KeyRange is a byte-wise key range [Start, End). A nil Start is unbounded
// below, a nil End unbounded above. For point and bulk tables, whose keys are
// placed by hash, a range is a predicate on the partition's keys, not an
// order: a scan visits every key of the partition and yields those in range,
// in no particular order.
type KeyRange struct {
	Start, End []byte
}

// Contains reports whether key is in r.
func (r KeyRange) Contains(key []byte) bool {
	if r.Start != nil && bytes.Compare(key, r.Start) < 0 {
		return false
	}
	return r.End == nil || bytes.Compare(key, r.End) < 0
}

// Read is one key's state as a call observed it, for the optimistic check
// of Partition.Commit.
type Read struct {
	Key     []byte
	Existed bool
	Value   []byte
}

// Partition is a table partition as a coprocessor call sees it. The table
// server implements it over its engine (PartitionFromEngine does for a plain
// engines.Engine). Implementations must be safe for concurrent use: calls on
// one partition run in parallel.
type Partition interface {
	// Info describes the partition.
	Info() PartitionInfo
	// Get returns key's value; found is false when it is absent or expired.
	Get(key []byte) (value []byte, found bool, err error)
	// GetBatch looks up keys; values[i], found[i] answer keys[i]. The
	// returned slices belong to the caller.
	GetBatch(keys [][]byte) (values [][]byte, found []bool, err error)
	// Scan calls fn for every live record of the partition with a key in
	// r, stopping at fn's first error, which it returns. The slices are
	// only valid during fn. Order is the engine's.
	Scan(r KeyRange, fn func(key, value []byte) error) error
	// Commit applies batch as one atomic write if every read in reads still
	// describes its key's current state, and returns ErrConflict (applying
	// nothing) otherwise. It returns ErrReadOnly when this replica may not
	// write (not the primary). The check and the apply must be atomic with
	// respect to every other writer of the partition: the table server runs
	// them inside the partition's write ordering, so the batch becomes one
	// log record. What is durable on return is the implementation's to
	// document.
	Commit(ctx context.Context, reads []Read, batch []engines.Mutation) error
}

// EnginePartition adapts an engines.Engine (and its engines.Writer, if any)
// to Partition. Safe for concurrent use.
type EnginePartition struct {
	e    engines.Engine
	info PartitionInfo
	lock sync.Locker
}

var _ Partition = (*EnginePartition)(nil)

// PartitionFromEngine returns e as the partition described by info. Scans
// skip keys outside [info.HashStart, info.HashEnd] when info.Count > 0, so an
// engine holding more than the partition is clipped to it. Commit checks and
// applies under lock (nil: a mutex of the adapter's own), so it is atomic
// with respect to every writer of e that holds the same lock; a table
// server passes the lock its own write path takes for the partition.
// Commit refuses with ErrReadOnly when !info.Primary or e is not an
// engines.Writer.
func PartitionFromEngine(e engines.Engine, info PartitionInfo, lock sync.Locker) *EnginePartition {
	if lock == nil {
		lock = new(sync.Mutex)
	}
	return &EnginePartition{e: e, info: info, lock: lock}
}

// Info implements Partition.
func (p *EnginePartition) Info() PartitionInfo { return p.info }

// Get implements Partition.
func (p *EnginePartition) Get(key []byte) ([]byte, bool, error) {
	v, _, err := p.e.Get(key)
	if errors.Is(err, engines.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return v, true, nil
}

// GetBatch implements Partition, with the engine's BatchGetter when it has one.
func (p *EnginePartition) GetBatch(keys [][]byte) ([][]byte, []bool, error) {
	values := make([][]byte, len(keys))
	found := make([]bool, len(keys))
	if bg, ok := p.e.(engines.BatchGetter); ok {
		expires := make([]int64, len(keys))
		if err := bg.GetBatch(keys, values, expires, found); err != nil {
			return nil, nil, err
		}
		return values, found, nil
	}
	for i, k := range keys {
		v, ok, err := p.Get(k)
		if err != nil {
			return nil, nil, err
		}
		values[i], found[i] = v, ok
	}
	return values, found, nil
}

// Scan implements Partition.
func (p *EnginePartition) Scan(r KeyRange, fn func(key, value []byte) error) error {
	clip := p.info.Count > 0
	return p.e.Scan(func(rec engines.Record) error {
		if !r.Contains(rec.Key) {
			return nil
		}
		if clip {
			if h := keyspace.Hash(rec.Key); h < p.info.HashStart || h > p.info.HashEnd {
				return nil
			}
		}
		return fn(rec.Key, rec.Value)
	})
}

// Commit implements Partition.
func (p *EnginePartition) Commit(ctx context.Context, reads []Read, batch []engines.Mutation) error {
	w, ok := p.e.(engines.Writer)
	if !ok || !p.info.Primary {
		return ErrReadOnly
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	p.lock.Lock()
	defer p.lock.Unlock()
	for _, r := range reads {
		v, found, err := p.Get(r.Key)
		if err != nil {
			return fmt.Errorf("check read of %q: %w", r.Key, err)
		}
		if found != r.Existed || (found && !bytes.Equal(v, r.Value)) {
			return ErrConflict
		}
	}
	if len(batch) == 0 {
		return nil
	}
	return w.Apply(batch)
}
