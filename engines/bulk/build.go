package bulk

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/bits"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"

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
	// MPH tunes the minimal perfect hash. The zero value is the default
	// (its Workers: Workers).
	MPH mph.Options
	// Workers is how many goroutines build the file at once (hashing, the
	// MPH's parts, the record windows), plus one that writes the file
	// meanwhile when there are more than one. Default 1. The file does not
	// depend on it.
	Workers int
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
	o.Workers = max(1, o.Workers)
	return o
}

// Validate explains what is wrong with o.
func (o PartitionOptions) Validate() error {
	switch {
	case o.FingerprintBits != 0 && o.FingerprintBits != 8 && o.FingerprintBits != 16 && o.FingerprintBits != -1:
		return fmt.Errorf("bulk: FingerprintBits %d, want 8, 16 or -1", o.FingerprintBits)
	case o.MaxValueBytes < 0 || o.MaxValueBytes > maxValueBytesLimit:
		return fmt.Errorf("bulk: MaxValueBytes %d, want 0..%d", o.MaxValueBytes, maxValueBytesLimit)
	case o.Workers < 0:
		return fmt.Errorf("bulk: Workers %d < 0", o.Workers)
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

// Position is where a record came from, for error messages: "file:line"
// in a text input, "file row N" in a Parquet file.
type Position struct {
	File string
	// Line is the record's line (the first is 1), its row when Row is
	// set, or with no File its index in BuildPartition's records.
	Line int64
	// Row says Line counts rows of a Parquet file (the first is 1); with
	// Line 0 the position is the file as a whole.
	Row bool
}

func (p Position) String() string {
	switch {
	case p.File == "" && p.Row:
		return fmt.Sprintf("row %d", p.Line)
	case p.File == "":
		return fmt.Sprintf("record %d", p.Line)
	case p.Row && p.Line == 0:
		return p.File
	case p.Row:
		return fmt.Sprintf("%s row %d", p.File, p.Line)
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
	// Validate, hash every key once (the routing hash is the file's key
	// hash: keyHash with seed 0) and find whether the records have one
	// length, reading the input once in order (a range per worker).
	hs := make([]uint64, len(records))
	chunkLens := make([]recordLens, opts.Workers)
	err := parallel(len(records), opts.Workers, func(c, lo, hi int) error {
		var lens recordLens // not chunkLens[c]: the chunks' would share a cache line
		defer func() { chunkLens[c] = lens }()
		for i := lo; i < hi; i++ {
			r := &records[i]
			switch {
			case len(r.Key) == 0 || len(r.Key) > maxKeyBytes:
				return fmt.Errorf("bulk: %s: key of %d bytes, want 1..%d", posOf(uint32(i)), len(r.Key), maxKeyBytes)
			case len(r.Value) > opts.MaxValueBytes:
				return fmt.Errorf("bulk: %s: value of %d bytes, the limit is %d", posOf(uint32(i)), len(r.Value), opts.MaxValueBytes)
			case r.Delete && !spec.Delta:
				return fmt.Errorf("bulk: %s: a deletion in a full (not delta) build", posOf(uint32(i)))
			case r.Delete && len(r.Value) > 0:
				return fmt.Errorf("bulk: %s: a deletion with a value", posOf(uint32(i)))
			}
			h := keyspace.Hash(r.Key)
			if p := keyspace.Index(h, spec.Partitions); p != spec.Partition {
				return fmt.Errorf("bulk: %s: key %q belongs to partition %d, not %d", posOf(uint32(i)), trunc(r.Key), p, spec.Partition)
			}
			hs[i] = h
			lens.add(r)
			if i&4095 == 0 && ctx.Err() != nil {
				return ctx.Err()
			}
		}
		return nil
	})
	if err != nil {
		return PartitionInfo{}, err
	}
	var lens recordLens
	for _, l := range chunkLens {
		lens.merge(l)
	}

	// The MPH fails on equal hashes, so distinct hashes need no sort: the
	// common case. Otherwise sort, then drop or report duplicates.
	var seed uint64
	var idxs []uint32 // kept record of hs[j]; nil: record j
	slotOf := make([]uint32, len(hs))
	if opts.MPH.Workers == 0 {
		opts.MPH.Workers = opts.Workers
	}
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
		lens = recordLens{}
		for j, e := range ents {
			hs[j], idxs[j] = e.h, e.idx
			lens.add(&records[e.idx])
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

	// Fingerprints and deletions by slot.
	n := len(hs)
	ft := footer{
		fpBits:      opts.FingerprintBits,
		n:           uint64(n),
		partition:   uint32(spec.Partition),
		partitions:  uint32(spec.Partitions),
		version:     spec.Version,
		baseVersion: spec.BaseVersion,
		hashSeed:    seed,
		maxRecLen:   lens.max,
	}
	if spec.Delta {
		ft.flags |= flagDelta
	}
	fps := make([]byte, n*opts.FingerprintBits/8)
	parallel(n, opts.Workers, func(_, lo, hi int) error {
		switch opts.FingerprintBits {
		case 8:
			for j := lo; j < hi; j++ {
				fps[slotOf[j]] = byte(hs[j])
			}
		case 16:
			for j := lo; j < hi; j++ {
				s, h := 2*uint64(slotOf[j]), hs[j]
				fps[s], fps[s+1] = byte(h), byte(h>>8)
			}
		}
		return nil
	})
	var deleted []uint64
	if spec.Delta {
		deleted = make([]uint64, (n+63)/64)
		for j, s := range slotOf {
			if records[recOf(j)].Delete {
				deleted[s/64] |= 1 << (s % 64)
				ft.deleted++
			}
		}
	}

	// offsets[s] is slot s's record offset (variable-length records only).
	var offsets []uint64
	var recordsLen uint64
	fixed := lens.fixed()
	if fixed {
		ft.fixedLen = lens.first
		recordsLen = lens.first * uint64(n)
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
	w := &crcWriter{w: NewHugeWriter(f, 0)}
	if _, err := w.Write(appendHeader(nil)); err != nil {
		return fail(fmt.Errorf("bulk: write %s: %w", tmp, err))
	}

	// Records in slot order, a window of slots at a time: the window's
	// records are encoded in input order (reading the input nearly
	// sequentially) into their places in a buffer. With one worker, one
	// buffer of windowBytes is filled, then written out. With more, two
	// buffers of windowBytes/2 alternate: the workers fill one, a window
	// each, while the other is written out (overlapping them cost one
	// worker ~4% more CPU time: the two cores then contend for memory).
	// Memory: the buffers, and the 8 bytes per record of hs, reused to
	// list the records by window as (record, slot) pairs so that the
	// writer reads the slot along with the record.
	w.sec()
	nBufs := 1
	if opts.Workers > 1 {
		nBufs = 2
	}
	winBytes := max(1, windowBytes/uint64(nBufs*opts.Workers))
	// Fixed-length records: windows of a power of two slots (a shift
	// finds a slot's window).
	winShift := bits.Len64(max(1, winBytes/max(1, ft.fixedLen))) - 1
	var winEnds []uint64 // slot ranges [winEnds[k-1], winEnds[k])
	for s, start := uint64(0), uint64(0); s < uint64(n); {
		e := min(uint64(n), s+1<<winShift)
		if offsets != nil {
			e = s + 1
			for e < uint64(n) && offsets[e+1]-start <= winBytes {
				e++
			}
		}
		winEnds = append(winEnds, e)
		s, start = e, recOff(e)
	}
	winOf := func(s uint32) int {
		if offsets == nil {
			return int(s >> winShift)
		}
		k, _ := slices.BinarySearch(winEnds, uint64(s)+1)
		return k
	}
	// byWin lists the records window by window, each in input order:
	// record<<32 | slot.
	byWin := hs[:n]
	hs = nil
	winStart := make([]int, len(winEnds)+1)
	if len(winEnds) == 1 {
		for j, s := range slotOf {
			byWin[j] = uint64(recOf(j))<<32 | uint64(s)
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
			byWin[next[k]] = uint64(recOf(j))<<32 | uint64(s)
			next[k]++
		}
	}
	slotOf = nil
	enc := newRecordEncoder(records, lens, ft.fixedLen, offsets)
	winLo := func(k int) uint64 { // window k's first slot
		if k == 0 {
			return 0
		}
		return winEnds[k-1]
	}
	// Groups of up to Workers windows share a buffer.
	nGroups := (len(winEnds) + opts.Workers - 1) / opts.Workers
	groupOf := func(g int) (k0, k1 int, base, end uint64) {
		k0, k1 = g*opts.Workers, min((g+1)*opts.Workers, len(winEnds))
		return k0, k1, recOff(winLo(k0)), recOff(winEnds[k1-1])
	}
	var bufLen uint64
	for g := range nGroups {
		_, _, base, end := groupOf(g)
		bufLen = max(bufLen, end-base)
	}
	free := make(chan []byte, nBufs) // buffers not being written
	for range min(nBufs, nGroups) {
		buf, freeBuf := allocHuge(int(bufLen))
		defer freeBuf()
		free <- buf
	}
	// The writer: out a chunk at a time, its CRC pass bringing it into
	// the cache, where the write's copy finds it. Every syncBytes it asks
	// the syncer to sync the file (without waiting), so that the disk
	// writes while the workers fill windows and the final Sync has little
	// left to do (0.45 s → 0.03 s at 1 GB).
	toWrite := make(chan []byte)
	var writeErr error // the writer's; read after writerDone
	writerDone := make(chan struct{})
	toSync := make(chan struct{}, 1)
	var syncErr error // the syncer's; read after syncerDone
	syncerDone := make(chan struct{})
	go func() {
		defer close(syncerDone)
		for range toSync {
			if syncErr == nil {
				syncErr = f.Sync()
			}
		}
	}()
	go func() {
		defer close(writerDone)
		defer close(toSync)
		unsynced := 0
		for buf := range toWrite {
			for c := 0; c < len(buf) && writeErr == nil; {
				// Chunks end at huge-page boundaries of the file, so
				// that all but the first go out without a copy.
				k := min(len(buf)-c, writeChunk-int(w.total%writeChunk))
				if _, err := w.Write(buf[c : c+k]); err != nil {
					writeErr = fmt.Errorf("bulk: write %s: %w", tmp, err)
				}
				c += k
			}
			if unsynced += len(buf); unsynced >= syncBytes {
				select {
				case toSync <- struct{}{}:
				default: // one is pending
				}
				unsynced = 0
			}
			free <- buf
		}
	}()
	fillErrs := make([]error, opts.Workers)
	var fillErr error
	for g := 0; g < nGroups && fillErr == nil; g++ {
		k0, k1, base, end := groupOf(g)
		buf := (<-free)[:end-base]
		var wg sync.WaitGroup
		for k := k0; k < k1; k++ {
			fill := func() {
				lo, hi := recOff(winLo(k))-base, recOff(winEnds[k])-base
				fillErrs[k-k0] = enc.fill(ctx, buf[lo:hi], base+lo, byWin[winStart[k]:winStart[k+1]])
			}
			if k == k1-1 {
				fill()
			} else {
				wg.Go(fill)
			}
		}
		wg.Wait()
		for _, err := range fillErrs[:k1-k0] {
			if err != nil && fillErr == nil {
				fillErr = err
			}
		}
		if fillErr == nil {
			toWrite <- buf
		}
	}
	close(toWrite)
	<-writerDone
	<-syncerDone
	if fillErr != nil {
		var re recordError
		if errors.As(fillErr, &re) {
			return fail(fmt.Errorf("bulk: %s: %w", posOf(re.rec), re.err))
		}
		return fail(fillErr)
	}
	if writeErr != nil {
		return fail(writeErr)
	}
	if syncErr != nil {
		return fail(fmt.Errorf("bulk: sync %s: %w", tmp, syncErr))
	}
	byWin = nil
	ft.secs[secRecords] = w.sec()
	if ft.secs[secRecords].len != recordsLen {
		panic(fmt.Sprintf("bulk: wrote %d bytes of records, want %d", ft.secs[secRecords].len, recordsLen))
	}
	buf := table.AppendBinary(nil)
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
	if err := w.flush(); err != nil {
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

// parallel runs f on up to workers contiguous chunks [lo, hi) of [0, n)
// at once, chunk c of them in order, and returns the error of the first
// chunk that failed (the first error in input order if each chunk returns
// its first).
func parallel(n, workers int, f func(c, lo, hi int) error) error {
	chunks := max(1, min(workers, n/parallelMin))
	errs := make([]error, chunks)
	var wg sync.WaitGroup
	for c := range chunks {
		lo, hi := n*c/chunks, n*(c+1)/chunks
		if c == chunks-1 {
			errs[c] = f(c, lo, hi)
		} else {
			wg.Go(func() { errs[c] = f(c, lo, hi) })
		}
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// parallelMin is the fewest items worth a goroutine of their own.
const parallelMin = 1 << 16

// gatherBatch is how many records the writer gathers at once.
const gatherBatch = 32

// writeChunk is how many bytes of a window go out at once (a huge page,
// see HugeWriter): the chunk's CRC pass brings it into the cache, where the
// write's copy finds it.
const writeChunk = HugePageBytes

// syncBytes is how many bytes the record writer writes between syncs.
var syncBytes = 64 << 20 // a variable for tests

// windowBytes is the memory BuildPartition encodes records in before
// writing them: one buffer, or with more than one worker two buffers of
// windowBytes/2, one filled while the other is written, each holding
// Workers windows (a window may exceed its share by one record). Each
// window reads its records from the whole input, so
// fewer windows read it more densely, but the denser reads barely pay: the
// record pass over 10M records measured about the same for windows of 32
// MiB to 1 GiB (the benchmark's 1 GB partition is 8 windows of 128 MiB
// with one worker), and ~20% slower at 2 MiB.
var windowBytes uint64 = 128 << 20 // a variable for tests

// recordLens finds whether records have one encoded length, and the
// longest.
type recordLens struct {
	n         int
	first     uint64 // the first record's length
	max       uint32
	keyLen    int  // the first record's key length
	varied    bool // a record's length differs from the first's
	keyVaried bool // a record's key length differs from the first's
}

func (l *recordLens) add(r *Record) {
	rl := uint64(diskstore.RecordLen(len(r.Key), len(r.Value)))
	if l.n == 0 {
		l.first, l.keyLen = rl, len(r.Key)
	}
	l.varied = l.varied || rl != l.first
	l.keyVaried = l.keyVaried || len(r.Key) != l.keyLen
	l.max = max(l.max, uint32(rl))
	l.n++
}

// merge adds the records of m, which come after l's.
func (l *recordLens) merge(m recordLens) {
	switch {
	case m.n == 0:
		return
	case l.n == 0:
		*l = m
		return
	}
	l.varied = l.varied || m.varied || m.first != l.first
	l.keyVaried = l.keyVaried || m.keyVaried || m.keyLen != l.keyLen
	l.max = max(l.max, m.max)
	l.n += m.n
}

// fixed reports whether every record has the length first.
func (l *recordLens) fixed() bool { return l.n > 0 && !l.varied }

// recordEncoder writes records at their places in a window.
type recordEncoder struct {
	records  []Record
	fixedLen uint64   // 0: offsets
	offsets  []uint64 // by slot
	// tmpl is the bytes between the CRC and the key of every record's
	// encoding when all have one key and one value length (the header
	// then depends on nothing else); nil otherwise.
	tmpl []byte
}

func newRecordEncoder(records []Record, lens recordLens, fixedLen uint64, offsets []uint64) *recordEncoder {
	e := &recordEncoder{records: records, fixedLen: fixedLen, offsets: offsets}
	if fixedLen == 0 || lens.keyVaried {
		return e
	}
	// One key length and one record length: one value length, so one
	// header. Take it from diskstore's encoding of a record of those
	// lengths, checking that the record is | crc | header | key | value |.
	k := make([]byte, lens.keyLen)
	v := make([]byte, int(fixedLen)-lens.keyLen-(int(diskstore.RecordLen(0, 0))))
	for i := range k {
		k[i] = byte(i + 1)
	}
	for i := range v {
		v[i] = byte(i + 101)
	}
	b, err := diskstore.AppendPutRecord(nil, k, v, 0)
	h := len(b) - len(k) - len(v)
	if err != nil || uint64(len(b)) != fixedLen || h < 4 ||
		!bytes.Equal(b[h:h+len(k)], k) || !bytes.Equal(b[h+len(k):], v) ||
		binary.LittleEndian.Uint32(b) != crcOf(b[4:]) {
		return e
	}
	e.tmpl = b[4:h]
	return e
}

// recordError is a record the encoder refused.
type recordError struct {
	rec uint32
	err error
}

func (e recordError) Error() string { return e.err.Error() }

// fill encodes the records of list (record<<32 | slot, in input order) to
// their places in buf, which holds the records from offset base on. The
// records are gathered a batch at a time: the batch's records are loaded,
// then their keys, values and places in buf touched, before any is
// encoded, so that the cache misses of a batch overlap instead of queueing
// one after the other.
func (e *recordEncoder) fill(ctx context.Context, buf []byte, base uint64, list []uint64) error {
	for c := 0; c < len(list); c += gatherBatch {
		batch := list[c:min(c+gatherBatch, len(list))]
		var rs [gatherBatch]Record
		var offs [gatherBatch]uint64
		for i, p := range batch {
			rs[i] = e.records[p>>32]
			if e.offsets == nil {
				offs[i] = uint64(uint32(p))*e.fixedLen - base
			} else {
				offs[i] = e.offsets[uint32(p)] - base
			}
		}
		var sink byte
		for i := range batch {
			r := &rs[i]
			sink += r.Key[0]
			if len(r.Value) > 0 {
				sink += r.Value[0] + r.Value[len(r.Value)-1]
			}
			// And the record's place in the window, so that writing it
			// does not wait for the lines either.
			off := offs[i]
			l := uint64(diskstore.RecordLen(len(r.Key), len(r.Value)))
			for o := off; o < off+l; o += 64 {
				sink += buf[o]
			}
			sink += buf[off+l-1]
		}
		runtime.KeepAlive(sink) // keeps the touching loads
		if t := e.tmpl; t != nil {
			h, l := 4+len(t), e.fixedLen
			for i := range batch {
				r := &rs[i]
				d := buf[offs[i] : offs[i]+l : offs[i]+l]
				copy(d[4:], t)
				copy(d[h:], r.Key)
				copy(d[h+len(r.Key):], r.Value)
			}
			// The records' CRCs, three at a time.
			i := 0
			for ; i+3 <= len(batch); i += 3 {
				a, b, c := buf[offs[i]:offs[i]+l], buf[offs[i+1]:offs[i+1]+l], buf[offs[i+2]:offs[i+2]+l]
				ca, cb, cc := crc3(a[4:], b[4:], c[4:])
				binary.LittleEndian.PutUint32(a, ca)
				binary.LittleEndian.PutUint32(b, cb)
				binary.LittleEndian.PutUint32(c, cc)
			}
			for ; i < len(batch); i++ {
				d := buf[offs[i] : offs[i]+l]
				binary.LittleEndian.PutUint32(d, crcOf(d[4:]))
			}
		} else {
			for i, p := range batch {
				r := &rs[i]
				off := offs[i]
				l := uint64(diskstore.RecordLen(len(r.Key), len(r.Value)))
				if _, err := diskstore.AppendPutRecord(buf[off:off:off+l], r.Key, r.Value, 0); err != nil {
					return recordError{uint32(p >> 32), err}
				}
			}
		}
		if c%4096 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

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
// whole file, and writes through a HugeWriter (so the file's page cache can
// be mapped with huge pages when served). Errors stick: after one, writes do
// nothing and flush reports. Each byte goes through the CRC once: the whole
// file's CRC is combined from the sections' (one pass less over a 1 GB file:
// ~0.2 s).
type crcWriter struct {
	w          *HugeWriter
	total      int64
	start      int64
	crc, whole uint32 // whole: of the bytes before start
}

func (c *crcWriter) Write(p []byte) (int, error) {
	c.crc = crc32.Update(c.crc, castagnoli, p)
	c.total += int64(len(p))
	return c.w.Write(p)
}

// flush writes out the buffer and reports the first error.
func (c *crcWriter) flush() error { return c.w.Flush() }

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
