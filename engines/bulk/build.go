package bulk

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/tabuladb/tabula/engines/bulk/internal/eliasfano"
	"github.com/tabuladb/tabula/engines/bulk/mph"
	"github.com/tabuladb/tabula/engines/diskstore"
	"github.com/tabuladb/tabula/engines/vfs"
	"github.com/tabuladb/tabula/internal/keyspace"
)

// Record is one input record of a partition build.
type Record struct {
	Key   []byte
	Value []byte
	// Delete marks a deletion of Key in a delta build (Value must be empty).
	Delete bool
}

// PartitionSpec says which file BuildPartition writes.
type PartitionSpec struct {
	// Partition and Partitions: the file holds the keys k with
	// keyspace.Index(keyspace.Hash(k), Partitions) == Partition.
	// Partitions 0 means 1.
	Partition, Partitions int
	// Version is the table version recorded in the file. Default 0.
	Version uint64
	// Delta makes a delta file over BaseVersion: it may hold deletions.
	Delta       bool
	BaseVersion uint64
}

// PartitionOptions tune BuildPartition. The zero value works.
type PartitionOptions struct {
	// FS is where the file is written. Default vfs.Default.
	FS vfs.FS
	// LastWins accepts duplicate keys, keeping the last in input order.
	// Default false: duplicates are an error (*DuplicateError).
	LastWins bool
	// FingerprintBits per key: 8 (default; an absent key reaches the disk
	// with probability 1/256), 16 (1/65536) or -1 for none.
	FingerprintBits int
	// MaxValueBytes is the largest value. Default defaultMaxValueBytes.
	MaxValueBytes int
	// MPH tunes the minimal perfect hash. The zero value is the default.
	MPH mph.Options
}

func (o PartitionOptions) withDefaults() PartitionOptions {
	if o.FS == nil {
		o.FS = vfs.Default
	}
	switch o.FingerprintBits {
	case 0:
		o.FingerprintBits = 8
	case -1:
		o.FingerprintBits = 0
	}
	if o.MaxValueBytes == 0 {
		o.MaxValueBytes = defaultMaxValueBytes
	}
	return o
}

// Validate explains what is wrong with o.
func (o PartitionOptions) Validate() error {
	switch {
	case o.FingerprintBits != 0 && o.FingerprintBits != 8 && o.FingerprintBits != 16 && o.FingerprintBits != -1:
		return fmt.Errorf("bulk: FingerprintBits %d, want 8, 16 or -1", o.FingerprintBits)
	case o.MaxValueBytes < 0 || o.MaxValueBytes > maxValueBytesLimit:
		return fmt.Errorf("bulk: MaxValueBytes %d, want 0..%d", o.MaxValueBytes, maxValueBytesLimit)
	}
	return o.MPH.Validate()
}

// PartitionInfo describes a built partition file.
type PartitionInfo struct {
	Partition, Partitions int
	// Path is the file written.
	Path string
	// Records is the number of records (including deletions); Deleted the
	// deletions among them.
	Records, Deleted uint64
	// FileBytes is the file's size; IndexBytes the memory Open will hold
	// for it (MPH, fingerprints, offsets, deleted bitmap).
	FileBytes, IndexBytes int64
	// CRC is the CRC32C of the whole file, for publishing.
	CRC uint32
}

// ErrEmptyInput is returned by BuildTable when the input holds no record.
var ErrEmptyInput = errors.New("bulk: input holds no records")

// Position is where a record came from, for error messages.
type Position struct {
	File string
	Line int64
}

func (p Position) String() string {
	if p.File == "" {
		return fmt.Sprintf("record %d", p.Line)
	}
	return fmt.Sprintf("%s:%d", p.File, p.Line)
}

// Duplicate is one duplicated key and where its first two records came from.
type Duplicate struct {
	Key         []byte
	First, Next Position
}

// maxDups is how many duplicates a DuplicateError lists.
const maxDups = 10

// DuplicateError lists the first duplicated keys of a build without
// LastWins.
type DuplicateError struct {
	// Dups are the first few duplicates (at most 10): in input order of
	// their second record from BuildTable, in key hash order from
	// BuildPartition.
	Dups []Duplicate
	// Count is the number of duplicated keys found (at least len(Dups)).
	Count int
}

func (e *DuplicateError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "bulk: %d duplicate key(s) (use LastWins / --last-wins to keep the last):", e.Count)
	for _, d := range e.Dups {
		fmt.Fprintf(&b, " %q at %s and %s;", trunc(d.Key), d.First, d.Next)
	}
	return strings.TrimSuffix(b.String(), ";")
}

func trunc(k []byte) []byte {
	if len(k) > 64 {
		return append(k[:64:64], "..."...)
	}
	return k
}

// entry is a record being built: its hash and index in the input.
type entry struct {
	h   uint64
	idx uint32
}

// BuildPartition writes the partition file of records to path, durably:
// when it returns nil the file is synced and renamed into place and its
// directory synced. It writes path+".tmp" first. records are in input order
// (LastWins keeps the last); every key must belong to spec.Partition.
// The output depends only on records, spec and opts (not on timing).
func BuildPartition(ctx context.Context, path string, records []Record, spec PartitionSpec, opts PartitionOptions) (PartitionInfo, error) {
	return buildPartition(ctx, path, records, nil, spec, opts)
}

// buildPartition is BuildPartition with optional positions for errors.
func buildPartition(ctx context.Context, path string, records []Record, pos []Position, spec PartitionSpec, opts PartitionOptions) (PartitionInfo, error) {
	if err := opts.Validate(); err != nil {
		return PartitionInfo{}, err
	}
	opts = opts.withDefaults()
	if spec.Partitions == 0 {
		spec.Partitions = 1
	}
	if spec.Partitions < 0 || spec.Partitions > 1<<31 || spec.Partition < 0 || spec.Partition >= spec.Partitions {
		return PartitionInfo{}, fmt.Errorf("bulk: partition %d of %d", spec.Partition, spec.Partitions)
	}
	if uint64(len(records)) >= 1<<32-1 {
		return PartitionInfo{}, fmt.Errorf("bulk: %d records in one partition, at most %d", len(records), uint64(1<<32-2))
	}
	posOf := func(i uint32) Position {
		if pos != nil {
			return pos[i]
		}
		return Position{Line: int64(i)}
	}
	// Validate, and hash every key once: the routing hash is the file's
	// key hash (keyHash with seed 0).
	hs := make([]uint64, len(records))
	for i, r := range records {
		switch {
		case len(r.Key) == 0 || len(r.Key) > maxKeyBytes:
			return PartitionInfo{}, fmt.Errorf("bulk: %s: key of %d bytes, want 1..%d", posOf(uint32(i)), len(r.Key), maxKeyBytes)
		case len(r.Value) > opts.MaxValueBytes:
			return PartitionInfo{}, fmt.Errorf("bulk: %s: value of %d bytes, the limit is %d", posOf(uint32(i)), len(r.Value), opts.MaxValueBytes)
		case r.Delete && !spec.Delta:
			return PartitionInfo{}, fmt.Errorf("bulk: %s: a deletion in a full (not delta) build", posOf(uint32(i)))
		case r.Delete && len(r.Value) > 0:
			return PartitionInfo{}, fmt.Errorf("bulk: %s: a deletion with a value", posOf(uint32(i)))
		}
		h := keyspace.Hash(r.Key)
		if p := keyspace.Index(h, spec.Partitions); p != spec.Partition {
			return PartitionInfo{}, fmt.Errorf("bulk: %s: key %q belongs to partition %d, not %d", posOf(uint32(i)), trunc(r.Key), p, spec.Partition)
		}
		hs[i] = h
		if i&4095 == 0 && ctx.Err() != nil {
			return PartitionInfo{}, ctx.Err()
		}
	}

	// The MPH fails on equal hashes, so distinct hashes need no sort: the
	// common case. Otherwise sort, then drop or report duplicates.
	var seed uint64
	var idxs []uint32 // kept record of hs[j]; nil: record j
	slotOf := make([]uint32, len(hs))
	table, err := mph.BuildSlots(hs, opts.MPH, slotOf)
	if errors.Is(err, mph.ErrDuplicateHash) {
		var ents []entry
		if ents, seed, err = dedup(records, hs, posOf, opts.LastWins); err != nil {
			return PartitionInfo{}, err
		}
		// Back to input order: the record writer reads records in
		// ascending order.
		slices.SortFunc(ents, func(a, b entry) int { return cmp.Compare(a.idx, b.idx) })
		hs, idxs, slotOf = hs[:len(ents)], make([]uint32, len(ents)), slotOf[:len(ents)]
		for j, e := range ents {
			hs[j], idxs[j] = e.h, e.idx
		}
		table, err = mph.BuildSlots(hs, opts.MPH, slotOf)
	}
	if err != nil {
		return PartitionInfo{}, fmt.Errorf("bulk: partition %d: %w", spec.Partition, err)
	}
	if err := ctx.Err(); err != nil {
		return PartitionInfo{}, err
	}
	recOf := func(j int) uint32 {
		if idxs != nil {
			return idxs[j]
		}
		return uint32(j)
	}

	// Slots, fingerprints, deletions and record lengths by slot.
	n := len(hs)
	ft := footer{
		fpBits:      opts.FingerprintBits,
		n:           uint64(n),
		partition:   uint32(spec.Partition),
		partitions:  uint32(spec.Partitions),
		version:     spec.Version,
		baseVersion: spec.BaseVersion,
		hashSeed:    seed,
	}
	if spec.Delta {
		ft.flags |= flagDelta
	}
	fps := make([]byte, n*opts.FingerprintBits/8)
	var deleted []uint64
	if spec.Delta {
		deleted = make([]uint64, (n+63)/64)
	}
	fixed := true
	var firstLen uint64
	for j, h := range hs {
		s := uint64(slotOf[j])
		switch opts.FingerprintBits {
		case 8:
			fps[s] = byte(h)
		case 16:
			fps[2*s], fps[2*s+1] = byte(h), byte(h>>8)
		}
		r := &records[recOf(j)]
		l := uint64(diskstore.RecordLen(len(r.Key), len(r.Value)))
		if j == 0 {
			firstLen = l
		} else if l != firstLen {
			fixed = false
		}
		ft.maxRecLen = max(ft.maxRecLen, uint32(l))
		if r.Delete {
			deleted[s/64] |= 1 << (s % 64)
			ft.deleted++
		}
	}
	hs = nil
	// offsets[s] is slot s's record offset (variable-length records only).
	var offsets []uint64
	var recordsLen uint64
	if fixed && n > 0 {
		ft.fixedLen = firstLen
		recordsLen = firstLen * uint64(n)
	} else {
		offsets = make([]uint64, n+1)
		for j, s := range slotOf {
			r := &records[recOf(j)]
			offsets[s+1] = uint64(diskstore.RecordLen(len(r.Key), len(r.Value)))
		}
		for s := 1; s <= n; s++ {
			offsets[s] += offsets[s-1]
		}
		recordsLen = offsets[n]
	}
	recOff := func(s uint64) uint64 {
		if offsets == nil {
			return s * ft.fixedLen
		}
		return offsets[s]
	}
	if err := ctx.Err(); err != nil {
		return PartitionInfo{}, err
	}

	fs := opts.FS
	tmp := path + ".tmp"
	f, err := fs.Create(tmp)
	if err != nil {
		return PartitionInfo{}, fmt.Errorf("bulk: create %s: %w", tmp, err)
	}
	fail := func(err error) (PartitionInfo, error) {
		return PartitionInfo{}, errors.Join(err, f.Close(), fs.Remove(tmp))
	}
	w := &crcWriter{w: bufio.NewWriterSize(f, 1<<20)}
	if _, err := w.Write(appendHeader(nil)); err != nil {
		return fail(fmt.Errorf("bulk: write %s: %w", tmp, err))
	}

	// Records in slot order, a window of slots at a time: the window's
	// records are encoded in input order (reading the input nearly
	// sequentially) into their places in a buffer, which is written out
	// whole. Memory: the window, and 4 bytes per record to list them.
	w.sec()
	var winEnds []uint64 // slot ranges [winEnds[k-1], winEnds[k])
	for s, start := uint64(0), uint64(0); s < uint64(n); {
		e := min(uint64(n), s+max(1, windowBytes/max(1, ft.fixedLen)))
		if offsets != nil {
			e = s + 1
			for e < uint64(n) && offsets[e+1]-start <= windowBytes {
				e++
			}
		}
		winEnds = append(winEnds, e)
		s, start = e, recOff(e)
	}
	winOf := func(s uint32) int {
		if offsets == nil {
			return int(uint64(s) / winEnds[0])
		}
		k, _ := slices.BinarySearch(winEnds, uint64(s)+1)
		return k
	}
	// byWin lists the records window by window, each in input order.
	byWin := make([]uint32, n)
	winStart := make([]int, len(winEnds)+1)
	if len(winEnds) == 1 {
		for j := range byWin {
			byWin[j] = uint32(j)
		}
		winStart[1] = n
	} else {
		for _, s := range slotOf {
			winStart[winOf(s)+1]++
		}
		for k := 1; k < len(winStart); k++ {
			winStart[k] += winStart[k-1]
		}
		next := slices.Clone(winStart)
		for j, s := range slotOf {
			k := winOf(s)
			byWin[next[k]] = uint32(j)
			next[k]++
		}
	}
	var buf []byte
	freeBuf := func() {}
	defer func() { freeBuf() }()
	for k, e := range winEnds {
		s0 := uint64(0)
		if k > 0 {
			s0 = winEnds[k-1]
		}
		base, end := recOff(s0), recOff(e)
		if uint64(cap(buf)) < end-base {
			freeBuf()
			buf, freeBuf = allocWindow(int(end - base))
		}
		buf = buf[:end-base]
		list := byWin[winStart[k]:winStart[k+1]]
		for c := 0; c < len(list); c += gatherBatch {
			batch := list[c:min(c+gatherBatch, len(list))]
			// Load the batch's records, then touch their keys and
			// values, before encoding any: the cache misses of a batch
			// overlap instead of queueing one after the other.
			var rs [gatherBatch]Record
			for i, j := range batch {
				rs[i] = records[recOf(int(j))]
			}
			var sink byte
			var offs [gatherBatch]uint64
			for i, j := range batch {
				r := &rs[i]
				sink += r.Key[0]
				if len(r.Value) > 0 {
					sink += r.Value[0] + r.Value[len(r.Value)-1]
				}
				// And the record's place in the window, so that
				// writing it does not wait for the lines either.
				off := recOff(uint64(slotOf[j])) - base
				offs[i] = off
				l := uint64(diskstore.RecordLen(len(r.Key), len(r.Value)))
				for o := off; o < off+l; o += 64 {
					sink += buf[o]
				}
				sink += buf[off+l-1]
			}
			runtime.KeepAlive(sink) // keeps the touching loads
			for i, j := range batch {
				r := &rs[i]
				off := offs[i]
				l := uint64(diskstore.RecordLen(len(r.Key), len(r.Value)))
				if _, err := diskstore.AppendPutRecord(buf[off:off:off+l], r.Key, r.Value, 0); err != nil {
					return fail(fmt.Errorf("bulk: %s: %w", posOf(recOf(int(j))), err))
				}
			}
			if ctx.Err() != nil {
				return fail(ctx.Err())
			}
		}
		if _, err := w.Write(buf); err != nil {
			return fail(fmt.Errorf("bulk: write %s: %w", tmp, err))
		}
	}
	freeBuf()
	buf, freeBuf = nil, func() {}
	byWin, slotOf = nil, nil
	ft.secs[secRecords] = w.sec()
	if ft.secs[secRecords].len != recordsLen {
		panic(fmt.Sprintf("bulk: wrote %d bytes of records, want %d", ft.secs[secRecords].len, recordsLen))
	}
	buf = table.AppendBinary(buf[:0])
	w.Write(buf)
	ft.secs[secMPH] = w.sec()
	w.Write(fps)
	ft.secs[secFPs] = w.sec()
	var ef *eliasfano.List
	if offsets != nil {
		if ef, err = eliasfano.Build(offsets); err != nil {
			return fail(err)
		}
		buf = ef.AppendBinary(buf[:0])
		w.Write(buf)
	}
	ft.secs[secOffsets] = w.sec()
	buf = buf[:0]
	for _, d := range deleted {
		buf = appendU64(buf, d)
	}
	w.Write(buf)
	ft.secs[secDeleted] = w.sec()
	if _, err := w.Write(ft.append(nil)); err != nil {
		return fail(fmt.Errorf("bulk: write %s: %w", tmp, err))
	}
	if err := w.w.Flush(); err != nil {
		return fail(fmt.Errorf("bulk: write %s: %w", tmp, err))
	}
	if err := f.Sync(); err != nil {
		return fail(fmt.Errorf("bulk: sync %s: %w", tmp, err))
	}
	if err := f.Close(); err != nil {
		return PartitionInfo{}, errors.Join(fmt.Errorf("bulk: close %s: %w", tmp, err), fs.Remove(tmp))
	}
	if err := fs.Rename(tmp, path); err != nil {
		return PartitionInfo{}, errors.Join(fmt.Errorf("bulk: rename %s: %w", tmp, err), fs.Remove(tmp))
	}
	if err := fs.SyncDir(filepath.Dir(path)); err != nil {
		return PartitionInfo{}, fmt.Errorf("bulk: sync directory of %s: %w", path, err)
	}
	idx := int64(table.MemoryBytes() + len(fps) + 8*len(deleted))
	if ef != nil {
		idx += int64(ef.MemoryBytes())
	}
	return PartitionInfo{
		Partition: spec.Partition, Partitions: spec.Partitions, Path: path,
		Records: uint64(n), Deleted: ft.deleted,
		FileBytes: w.total, IndexBytes: idx, CRC: w.sum(),
	}, nil
}

// gatherBatch is how many records the writer gathers at once.
const gatherBatch = 32

// windowBytes is how many bytes of records BuildPartition encodes in
// memory before writing them (one record may exceed it). Each window reads
// its records from the whole input, so fewer windows read it more densely;
// 128 MiB is 8 windows for the benchmark's 1 GB partition.
var windowBytes uint64 = 128 << 20 // a variable for tests

// dedup sorts the hashes of records by (hash, input order) and drops the
// duplicates (LastWins: the last in input order stays) or reports them. Two
// different keys with one hash make it rehash every key with the next seed.
func dedup(records []Record, hs []uint64, posOf func(uint32) Position, lastWins bool) ([]entry, uint64, error) {
	ents := make([]entry, 0, len(records))
	for seed := uint64(0); ; seed++ {
		ents = ents[:0]
		for i, r := range records {
			h := hs[i]
			if seed != 0 {
				h = keyHash(seed, r.Key)
			}
			ents = append(ents, entry{h, uint32(i)})
		}
		sortEntries(ents)
		var dupErr DuplicateError
		collision := false
		out := ents[:0]
		for i := 0; i < len(ents); i++ {
			e := ents[i]
			if len(out) > 0 && out[len(out)-1].h == e.h {
				prev := &out[len(out)-1]
				if !bytes.Equal(records[prev.idx].Key, records[e.idx].Key) {
					collision = true
					break
				}
				if !lastWins {
					if dupErr.Count == 0 || !bytes.Equal(records[e.idx].Key, dupErr.Dups[len(dupErr.Dups)-1].Key) {
						dupErr.Count++
						if len(dupErr.Dups) < maxDups {
							dupErr.Dups = append(dupErr.Dups, Duplicate{Key: records[e.idx].Key, First: posOf(prev.idx), Next: posOf(e.idx)})
						}
					}
				}
				*prev = e // later input order wins
				continue
			}
			out = append(out, e)
		}
		if collision {
			continue
		}
		if dupErr.Count > 0 {
			return nil, 0, &dupErr
		}
		return out, seed, nil
	}
}

func appendU64(b []byte, v uint64) []byte {
	return append(b, byte(v), byte(v>>8), byte(v>>16), byte(v>>24), byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56))
}

// crcWriter tracks the offset, the CRC32C of the current section and of the
// whole file. Errors stick: after one, writes do nothing and Flush reports.
// Each byte goes through the CRC once: the whole file's CRC is combined
// from the sections' (one pass less over a 1 GB file: ~0.2 s).
type crcWriter struct {
	w          *bufio.Writer
	total      int64
	start      int64
	crc, whole uint32 // whole: of the bytes before start
}

func (c *crcWriter) Write(p []byte) (int, error) {
	c.crc = crc32.Update(c.crc, castagnoli, p)
	c.total += int64(len(p))
	return c.w.Write(p)
}

// sec ends the current section and starts the next.
func (c *crcWriter) sec() section {
	s := section{off: uint64(c.start), len: uint64(c.total - c.start), crc: c.crc}
	c.whole = c.sum()
	c.start, c.crc = c.total, 0
	return s
}

// sum is the CRC32C of everything written.
func (c *crcWriter) sum() uint32 { return crcCombine(c.whole, c.crc, uint64(c.total-c.start)) }

// sortEntries sorts by hash, then input order: an LSD radix sort on the
// hash's 64 bits would be 8 passes; a stable sort of (h, idx) is enough
// since ties in h are rare, so sort by h and fix ties by idx.
func sortEntries(es []entry) {
	slices.SortFunc(es, func(a, b entry) int {
		if c := cmp.Compare(a.h, b.h); c != 0 {
			return c
		}
		return cmp.Compare(a.idx, b.idx)
	})
}
