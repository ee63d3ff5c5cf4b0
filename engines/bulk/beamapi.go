package bulk

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/tabuladb/tabula/internal/keyspace"
)

// This file exports the steps of BuildTable that a build running elsewhere
// (the Apache Beam pipeline of module beambuild) needs to write the same
// bytes: parsing an input with each record's Position, routing a key, the
// partition build with positions, and the error BuildTable makes of its
// partitions' errors.

// PartitionOf is the partition BuildTable routes key to in a table of
// partitions partitions (the servers' routing).
func PartitionOf(key []byte, partitions int) int {
	return keyspace.Index(keyspace.Hash(key), partitions)
}

// InputReader parses one input file as BuildTable does: the same records,
// the same Positions, the same checks and errors. It is not safe for
// concurrent use.
type InputReader struct {
	p        *parser
	err      error // the reader cannot read this format
	maxValue int
}

// NewInputReader reads r, the input named name (the name Positions carry),
// in opts' Format, Base64, DeltaOf and key and value columns; values
// beyond opts.Partition.MaxValueBytes (default as BuildTable's) are
// malformed. It reads the text formats (tsv, csv, jsonl), which stream;
// for another format (parquet needs random access) Next fails with
// ErrFormatNotLinked.
func NewInputReader(name string, r io.Reader, opts BuildOptions) *InputReader {
	ir := &InputReader{maxValue: opts.Partition.withDefaults().MaxValueBytes}
	switch opts.Format {
	case FormatTSV, FormatCSV, FormatJSONL:
		ir.p = newParser(name, r, opts.InputOptions())
	default:
		ir.err = fmt.Errorf("bulk: read %s as %s as a stream: %w (only tsv, csv and jsonl stream)", name, opts.Format, ErrFormatNotLinked)
	}
	return ir
}

// Next returns the next record and where it came from, or io.EOF after the
// last; a line that does not parse, an empty or too long key or a too long
// value is a *MalformedError, as from BuildTable. The record aliases the
// reader's buffers until the next call.
func (r *InputReader) Next() (Record, Position, error) {
	if r.err != nil {
		return Record{}, Position{}, r.err
	}
	rec, pos, _, err := r.p.Next()
	if err != nil {
		return Record{}, pos, err
	}
	// As BuildTable's read phase checks each record.
	switch {
	case len(rec.Key) == 0 || len(rec.Key) > maxKeyBytes:
		return Record{}, pos, &MalformedError{Pos: pos, Reason: fmt.Sprintf("key of %d bytes, want 1..%d", len(rec.Key), maxKeyBytes)}
	case len(rec.Value) > r.maxValue:
		return Record{}, pos, &MalformedError{Pos: pos, Reason: fmt.Sprintf("value of %d bytes, the limit is %d", len(rec.Value), r.maxValue)}
	}
	return rec, pos, nil
}

// BuildPartitionAt is BuildPartition with the Position of each record
// (pos[i] of records[i]; len(pos) == len(records)), which its errors name as
// BuildTable's do. BuildTable builds partition i as BuildPartitionAt of the
// partition's records in input order (input index, then line), spec
// {Partition: i, Partitions: n, Version, Delta: DeltaOf != 0, BaseVersion:
// DeltaOf} and opts.Partition.
func BuildPartitionAt(ctx context.Context, path string, records []Record, pos []Position, spec PartitionSpec, opts PartitionOptions) (PartitionInfo, error) {
	if len(pos) != len(records) {
		return PartitionInfo{}, fmt.Errorf("bulk: %d positions for %d records", len(pos), len(records))
	}
	return buildPartition(ctx, path, records, pos, spec, opts)
}

// JoinPartitionErrors is the error BuildTable returns when building its
// partitions failed, from errs[i], partition i's error (nil: built): the
// *DuplicateErrors of every partition as one listing the first duplicates
// in input order of inputs, else the first other error naming its
// partition, else nil.
func JoinPartitionErrors(errs []error, inputs []string) error {
	if err := mergeDuplicates(errs, inputs); err != nil {
		return err
	}
	var firstErr error
	for i, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("bulk: partition %d: %w", i, err)
		}
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return firstErr
}
