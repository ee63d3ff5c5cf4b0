package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sort"

	"github.com/tabuladb/tabula/api"
)

// Scan calls fn for every live record of the table, partition by partition
// in index order (within a partition, in the server's order). Records are
// not in key order. fn's slices are valid only during the call. If fn
// returns an error, Scan stops and returns it as is. The partitions are those
// of the map when Scan starts; each is read at one point in time, not all at
// the same one.
//
// A bulk table is scanned at one version in every partition: the pinned one
// (AtVersion) or the serving one when Scan starts, delta versions included
// (each live key once, with the value Get returns at that version). If that
// version is unloaded before the first record arrives, Scan starts again on
// the new serving version; after that, it fails with VERSION_GONE rather
// than mix versions.
//
// ReadAny, MinLSN and a Session apply to every partition's scan (a
// partition's scan runs on one replica); ReportLSN reports nothing, as a
// scan's reply carries no LSN.
func (t *Table) Scan(ctx context.Context, fn func(key, value []byte) error, opts ...ReadOption) error {
	ro := readOpts(opts)
	delivered := 0
	count := func(key, value []byte) error {
		delivered++
		return fn(key, value)
	}
	var avoid map[uint64]bool // versions an attempt found unserved
	for attempt := 0; ; attempt++ {
		m, err := t.Map(ctx)
		if err != nil {
			return err
		}
		version := t.pin
		if version == 0 {
			version = t.c.chooseBulkVersion(m, avoid)
		}
		for i := range len(m.GetPartitions()) {
			if err = t.scanPartition(ctx, i, version, count, ro); err != nil {
				break
			}
		}
		if err == nil || api.CodeOf(err) != api.ErrorCode_ERROR_CODE_VERSION_GONE || t.pin != 0 ||
			delivered > 0 || attempt >= versionGoneRetries || ctx.Err() != nil {
			return err
		}
		if avoid == nil {
			avoid = map[uint64]bool{}
		}
		avoid[version] = true
		t.refreshQuietly(ctx)
	}
}

// ScanPartition calls fn for every live record of partition index (0-based,
// as in the partition map). A retryable failure before the first record is
// retried; once records were delivered a failure is returned instead, so fn
// never sees a record twice. If fn returns an error, ScanPartition stops and
// returns it as is. Once streaming, a scan is bounded by ctx only, not by
// Options.RetryTimeout. A bulk partition is read at the pinned version, or
// the serving one by the map. The read options are as for Scan.
func (t *Table) ScanPartition(ctx context.Context, index int, fn func(key, value []byte) error, opts ...ReadOption) error {
	return t.scanPartition(ctx, index, t.pin, fn, readOpts(opts))
}

// scanPartition is ScanPartition at bulk version (0: the map's serving one,
// following switches until the first record).
func (t *Table) scanPartition(ctx context.Context, index int, version uint64, fn func(key, value []byte) error, ro readOptions) error {
	op := fmt.Sprintf("scan partition %d of", index)
	if t.err != nil {
		return t.errf(op, t.err)
	}
	pick := func(m *api.PartitionMap) (*api.Partition, error) {
		n := len(m.GetPartitions())
		if index < 0 || index >= n {
			return nil, &permanentError{t.errf(op, api.InvalidArgument("partition", "partition_out_of_range", uint64(n),
				"partition %d is out of range; the table has %d", index, n))}
		}
		return m.GetPartitions()[index], nil
	}
	ro.lsn = nil
	_, _, err := t.call(ctx, callSpec{op: op, pick: pick, read: ro, bulkVersion: version, rpc: func(ctx context.Context, ts api.TableServerClient, h *api.RequestHeader) (uint64, error) {
		return 0, t.scanAttempt(ctx, ts, h, op, version, fn)
	}})
	return err
}

// scanAttempt streams one partition's scan from one replica.
func (t *Table) scanAttempt(ctx context.Context, ts api.TableServerClient, h *api.RequestHeader, op string, version uint64, fn func(key, value []byte) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream when fn stops early
	if version != 0 {
		h.BulkVersion = version
	}
	stream, err := ts.Scan(ctx, &api.ScanRequest{Header: h})
	if err != nil {
		return err
	}
	delivered := 0
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			if version != 0 && api.CodeOf(err) == api.ErrorCode_ERROR_CODE_VERSION_GONE {
				// A version chosen for the whole scan is gone: the
				// caller decides (it must not change under the scan).
				return &permanentError{t.errf(op, err)}
			}
			// Once records were delivered a retry would repeat them: a
			// failure is final, unless the caller's context ended (the
			// call reports that), which a cut for a partition move is not.
			if delivered > 0 && (ctx.Err() == nil || errors.Is(context.Cause(ctx), errMoved)) {
				return &permanentError{t.errf(op, fmt.Errorf("stream broke after %d records: %w", delivered, err))}
			}
			return err
		}
		for _, kv := range resp.GetRecords() {
			delivered++
			if err := fn(kv.GetKey(), kv.GetValue()); err != nil {
				return &permanentError{err}
			}
		}
	}
}

// RangeScan is what ScanRange reads: the keys of an ordered table in
// [Start, End) (a nil bound is unbounded), in which order, how many.
type RangeScan struct {
	KeyRange
	// Reverse visits the keys in descending order.
	Reverse bool
	// Limit stops the scan after this many records (0: no limit).
	Limit int
}

// ScanRange calls fn for every live record of an ordered table whose key
// lies in r, in key order (descending with r.Reverse), across partitions,
// up to r.Limit records. fn's slices are valid only during the call; if
// fn returns an error, ScanRange stops and returns it as is. A failure
// mid-partition is retried from the key after the last one delivered, so
// fn never sees a record twice and misses none; each partition is read at
// one point in time, not all at the same one. Other table kinds refuse
// (INVALID_ARGUMENT): their keys are in no order.
//
// ReadAny, MinLSN and a Session apply to every partition's read.
func (t *Table) ScanRange(ctx context.Context, r RangeScan, fn func(key, value []byte) error, opts ...ReadOption) error {
	const op = "scan a key range of"
	if t.err != nil {
		return t.errf(op, t.err)
	}
	if r.Limit < 0 {
		return t.errf(op, api.InvalidArgument("limit", "limit_negative", 0, "limit %d is negative", r.Limit))
	}
	if r.End != nil && bytes.Compare(r.Start, r.End) >= 0 {
		return t.errf(op, api.InvalidArgument("end", "range_empty", 0, "range [%q, %q) is empty", r.Start, r.End))
	}
	m, err := t.Map(ctx)
	if err != nil {
		return err
	}
	if !ordered(m) {
		return t.errf(op, api.InvalidArgument("table", "scan_range_not_ordered", 0,
			"table %s is a %s table, whose keys are in no order: range scans need an ordered table", t.name, api.KindName(m.GetTable().GetKind())))
	}
	ro := readOpts(opts)
	ro.lsn = nil
	// cursor: forward, the next key to read; reverse, the key the next
	// read stops below (nil: the table's end).
	var cursor []byte
	if r.Reverse {
		cursor = r.End
	} else {
		cursor = r.Start
	}
	left := r.Limit
	for {
		var part *api.Partition
		pick := func(m *api.PartitionMap) (*api.Partition, error) {
			var p *api.Partition
			var ok bool
			if r.Reverse {
				p, ok = partitionBelow(m, cursor)
			} else {
				p, ok = partitionOf(m, route{key: cursor})
			}
			if !ok {
				return nil, unavailable("no_partition", "the partition map has no partition for key %q", cursor)
			}
			part = p
			return p, nil
		}
		_, _, err := t.call(ctx, callSpec{op: op, pick: pick, read: ro, rpc: func(ctx context.Context, ts api.TableServerClient, h *api.RequestHeader) (uint64, error) {
			req := &api.ScanRequest{Header: h, Start: r.Start, End: r.End, Reverse: r.Reverse, Limit: uint32(max(left, 0))}
			if r.Reverse {
				req.End = cursor
			} else {
				req.Start = cursor
			}
			ctx, cancel := context.WithCancel(ctx)
			defer cancel() // ends the stream when fn stops early
			stream, err := ts.Scan(ctx, req)
			if err != nil {
				return 0, err
			}
			for {
				resp, err := stream.Recv()
				if errors.Is(err, io.EOF) {
					return 0, nil
				}
				if err != nil {
					return 0, err // retried from the cursor
				}
				for _, kv := range resp.GetRecords() {
					if err := fn(kv.GetKey(), kv.GetValue()); err != nil {
						return 0, &permanentError{err}
					}
					if r.Reverse {
						cursor = kv.GetKey()
					} else {
						cursor = append(append([]byte(nil), kv.GetKey()...), 0) // the next key up
					}
					if r.Limit > 0 {
						if left--; left == 0 {
							return 0, nil
						}
					}
				}
			}
		}})
		switch {
		case err != nil:
			return err // fn's own error as is (call unwraps it)
		case r.Limit > 0 && left == 0:
			return nil
		}
		// The partition is done: on to the next one in the range.
		if r.Reverse {
			ks := part.GetKeyStart()
			if len(ks) == 0 || bytes.Compare(ks, r.Start) <= 0 {
				return nil
			}
			cursor = ks
		} else {
			ke := part.GetKeyEnd()
			if len(ke) == 0 || (r.End != nil && bytes.Compare(ke, r.End) >= 0) {
				return nil
			}
			cursor = ke
		}
	}
}

// partitionBelow finds the partition of an ordered table's map m holding
// the keys just below key (nil key: the last partition).
func partitionBelow(m *api.PartitionMap, key []byte) (*api.Partition, bool) {
	ps := m.GetPartitions()
	if len(ps) == 0 {
		return nil, false
	}
	if key == nil {
		p := ps[len(ps)-1]
		return p, len(p.GetKeyEnd()) == 0
	}
	// The last partition starting below key.
	i := sort.Search(len(ps), func(i int) bool { return bytes.Compare(ps[i].GetKeyStart(), key) >= 0 }) - 1
	if i < 0 {
		return nil, false
	}
	p := ps[i]
	if e := p.GetKeyEnd(); len(e) > 0 && bytes.Compare(e, key) < 0 {
		return nil, false // a gap below key
	}
	return p, true
}
