package client

import (
	"context"
	"errors"
	"fmt"
	"io"

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
