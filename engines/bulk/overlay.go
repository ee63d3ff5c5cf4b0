package bulk

import (
	"context"
	"fmt"

	"github.com/tabuladb/tabula/engines"
)

// Overlay serves a base file with delta files over it: a key is read from
// the newest layer that has it, and a deletion there reads as absent. It
// does not own its files: the caller closes them after the overlay's last
// use (a read of a closed layer fails with engines.ErrClosed, never worse).
// It is safe for concurrent use.
type Overlay struct {
	layers []*File // newest first; the last is the base
}

// NewOverlay returns base with deltas applied in order (the last wins).
// Each delta must be a delta file whose base version is the version of the
// layer below it, of the same partition.
func NewOverlay(base *File, deltas ...*File) (*Overlay, error) {
	if _, ok := base.Delta(); ok {
		return nil, fmt.Errorf("bulk: overlay base (version %d) is a delta file", base.Version())
	}
	below := base
	layers := []*File{base}
	for _, d := range deltas {
		bv, ok := d.Delta()
		switch {
		case !ok:
			return nil, fmt.Errorf("bulk: overlay layer version %d is not a delta file", d.Version())
		case bv != below.Version():
			return nil, fmt.Errorf("bulk: delta version %d is over version %d, not %d", d.Version(), bv, below.Version())
		case d.ft.partition != base.ft.partition || d.ft.partitions != base.ft.partitions:
			return nil, fmt.Errorf("bulk: delta of partition %d/%d over partition %d/%d", d.ft.partition, d.ft.partitions, base.ft.partition, base.ft.partitions)
		}
		layers = append([]*File{d}, layers...)
		below = d
	}
	return &Overlay{layers: layers}, nil
}

// AppendGet is File.AppendGet over the layers.
func (o *Overlay) AppendGet(dst, key []byte) ([]byte, bool, error) {
	for i, f := range o.layers {
		if !f.acquire() {
			return dst, false, engines.ErrClosed
		}
		out, st, err := f.get(dst, key, f.hash(key, 0, false))
		f.release()
		if err != nil || st != absent || i == len(o.layers)-1 {
			return out, st == present, err
		}
	}
	return dst, false, nil
}

// AppendGetBatch is File.AppendGetBatch over the layers.
func (o *Overlay) AppendGetBatch(dst []byte, keys [][]byte, vals [][]byte, found []bool) ([]byte, error) {
	if len(vals) != len(keys) || len(found) != len(keys) {
		return dst, fmt.Errorf("bulk: batch of %d keys with %d vals and %d found", len(keys), len(vals), len(found))
	}
	// Hold every layer for the whole batch: it sees one set of files.
	for i, f := range o.layers {
		if !f.acquire() {
			for _, g := range o.layers[:i] {
				g.release()
			}
			return dst, engines.ErrClosed
		}
	}
	defer func() {
		for _, f := range o.layers {
			f.release()
		}
	}()
	return batch(dst, keys, vals, found, func(dst, key []byte) ([]byte, bool, error) {
		for _, f := range o.layers {
			out, st, err := f.get(dst, key, f.hash(key, 0, false))
			if err != nil || st != absent {
				return out, st == present, err
			}
		}
		return dst, false, nil
	})
}

// Scan calls fn once for every key the overlay serves, with the value
// AppendGet returns for it: each live key once with its newest value,
// deleted keys absent. It holds every layer for the whole scan, so it sees
// one set of files (a layer closed before it starts fails it with
// engines.ErrClosed). Records come layer by layer, newest first, each layer
// in file order; key and value alias a buffer valid only during the call.
// An error from fn stops the scan and is returned.
//
// It keeps no per-key state: a record of layer i is served unless a newer
// layer has its key, which is a lookup in each newer layer's index — the
// fingerprint rejects a key absent there with no disk read, except with
// probability 2^-fpBits. So memory is O(1) and the cost over scanning every
// layer is one MPH lookup per record per newer layer (a delta's own records
// read their key in it: it is there).
func (o *Overlay) Scan(ctx context.Context, fn func(key, value []byte) error) error {
	for i, f := range o.layers {
		if !f.acquire() {
			for _, g := range o.layers[:i] {
				g.release()
			}
			return engines.ErrClosed
		}
	}
	defer func() {
		for _, f := range o.layers {
			f.release()
		}
	}()
	var scratch []byte
	for i, f := range o.layers {
		newer := o.layers[:i]
		err := f.scan(ctx, func(key, value []byte, deleted bool) error {
			if deleted {
				return nil // absent, unless a newer layer puts it again: served there
			}
			for _, g := range newer {
				var st lookupState
				var err error
				scratch, st, err = g.get(scratch[:0], key, g.hash(key, 0, false))
				if err != nil {
					return err
				}
				if st != absent {
					return nil // shadowed: served (or deleted) by a newer layer
				}
			}
			return fn(key, value)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// Stats sums the layers' statistics.
func (o *Overlay) Stats() Stats {
	var s Stats
	for _, f := range o.layers {
		fs := f.Stats()
		s.Records += fs.Records
		s.Deleted += fs.Deleted
		s.IndexBytes += fs.IndexBytes
		s.FileBytes += fs.FileBytes
		s.Mapped = fs.Mapped
	}
	return s
}
