package beambuild

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/tabuladb/tabula/engines/bulk"
)

// A chunk is a run of records of one partition, read from one input in
// line order, encoded one after another:
//
//	| input (uvarint) | line (uvarint) | flags (1) | keyLen (uvarint) | valLen (uvarint) | key | value |
//
// flags bit 0 is a deletion. Chunks travel between the pipeline's steps
// (through the runner's coders, which frame and check them), never to disk
// by this package, so they carry no checksum of their own. An empty chunk
// is a partition's seed and holds no record.

// appendRecord appends r, read from input in at line, to chunk.
func appendRecord(chunk []byte, r bulk.Record, in int, line int64) []byte {
	chunk = binary.AppendUvarint(chunk, uint64(in))
	chunk = binary.AppendUvarint(chunk, uint64(line))
	var flags byte
	if r.Delete {
		flags = 1
	}
	chunk = append(chunk, flags)
	chunk = binary.AppendUvarint(chunk, uint64(len(r.Key)))
	chunk = binary.AppendUvarint(chunk, uint64(len(r.Value)))
	chunk = append(chunk, r.Key...)
	return append(chunk, r.Value...)
}

// errBadChunk is a chunk that does not decode (a bug or a runner that
// corrupted an element).
var errBadChunk = errors.New("beambuild: malformed record chunk")

// decoded is a partition's records with their positions, and where each
// came from as (input, line) for ordering.
type decoded struct {
	recs []bulk.Record
	pos  []bulk.Position
	in   []uint32
}

// decodeChunk appends chunk's records to d, aliasing chunk. inputs names
// the inputs by index.
func (d *decoded) decodeChunk(chunk []byte, inputs []string) error {
	uv := func() (uint64, error) {
		v, n := binary.Uvarint(chunk)
		if n <= 0 {
			return 0, errBadChunk
		}
		chunk = chunk[n:]
		return v, nil
	}
	for len(chunk) > 0 {
		in, err := uv()
		if err != nil {
			return err
		}
		line, err := uv()
		if err != nil {
			return err
		}
		if len(chunk) < 1 || in >= uint64(len(inputs)) {
			return fmt.Errorf("%w: input %d of %d", errBadChunk, in, len(inputs))
		}
		del := chunk[0]&1 != 0
		chunk = chunk[1:]
		kl, err := uv()
		if err != nil {
			return err
		}
		vl, err := uv()
		if err != nil {
			return err
		}
		if uint64(len(chunk)) < kl || uint64(len(chunk))-kl < vl {
			return fmt.Errorf("%w: record cut", errBadChunk)
		}
		k := chunk[:kl:kl]
		v := chunk[kl : kl+vl : kl+vl]
		chunk = chunk[kl+vl:]
		d.recs = append(d.recs, bulk.Record{Key: k, Value: v, Delete: del})
		d.pos = append(d.pos, bulk.Position{File: inputs[in], Line: int64(line)})
		d.in = append(d.in, uint32(in))
	}
	return nil
}

// chunkStart is where a chunk's first record came from: (input, line).
func chunkStart(chunk []byte) (uint64, uint64) {
	in, n := binary.Uvarint(chunk)
	if n <= 0 {
		return 0, 0
	}
	line, m := binary.Uvarint(chunk[n:])
	if m <= 0 {
		return in, 0
	}
	return in, line
}

// inputOrder decodes a partition's chunks into the records in the native
// builder's order: by input index, then line. The chunks of one input hold
// disjoint runs of its lines, so ordering the chunks by their first record
// orders the records; a check catches anything else and sorts the records.
func inputOrder(chunks [][]byte, inputs []string) (decoded, error) {
	slices.SortStableFunc(chunks, func(a, b []byte) int {
		ai, al := chunkStart(a)
		bi, bl := chunkStart(b)
		if c := cmp.Compare(ai, bi); c != 0 {
			return c
		}
		return cmp.Compare(al, bl)
	})
	var d decoded
	for _, c := range chunks {
		if err := d.decodeChunk(c, inputs); err != nil {
			return d, err
		}
	}
	sorted := true
	for i := 1; i < len(d.recs); i++ {
		if before(d, i, i-1) {
			sorted = false
			break
		}
	}
	if !sorted {
		idx := make([]int, len(d.recs))
		for i := range idx {
			idx[i] = i
		}
		slices.SortStableFunc(idx, func(a, b int) int {
			if before(d, a, b) {
				return -1
			}
			if before(d, b, a) {
				return 1
			}
			return 0
		})
		var s decoded
		for _, i := range idx {
			s.recs = append(s.recs, d.recs[i])
			s.pos = append(s.pos, d.pos[i])
			s.in = append(s.in, d.in[i])
		}
		d = s
	}
	return d, nil
}

// before reports whether record i of d comes before record j in input order.
func before(d decoded, i, j int) bool {
	if d.in[i] != d.in[j] {
		return d.in[i] < d.in[j]
	}
	return d.pos[i].Line < d.pos[j].Line
}
