package bulk

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/bits"
	"os"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/bulk/internal/eliasfano"
	"github.com/tabuladb/tabula/engines/bulk/mph"
	"github.com/tabuladb/tabula/engines/diskstore"
	"github.com/tabuladb/tabula/engines/vfs"
)

// OpenOptions tune Open. The zero value works.
type OpenOptions struct {
	// NoMmap reads records with ReadAt (pread) instead of mapping the
	// file. Default false: files of vfs.Default are mapped where the
	// platform supports it (Linux, macOS); other file systems always use
	// ReadAt.
	NoMmap bool
}

// File is an open partition file. It is safe for concurrent use; see Close.
type File struct {
	ft      footer
	table   *mph.Table
	fps     []byte
	offs    *eliasfano.List // nil when ft.fixedLen > 0
	deleted []uint64
	recBase int64
	size    int64

	data  []byte      // the mapped file, or nil
	ra    io.ReaderAt // when data is nil
	close func() error
	bufs  sync.Pool // *[]byte of maxRecLen, for ReadAt

	// state counts reads in flight; closedBit is set by Close. The reader
	// that brings the count to zero after Close releases the file.
	state    atomic.Int64
	drained  chan struct{}
	drainOne sync.Once
	closeOne sync.Once
	closeErr error
}

const closedBit = 1 << 62

// Open opens the partition file name of fs and validates it (see the
// package comment for what is checked). A damaged or truncated file is an
// error wrapping engines.ErrCorrupt; a file of another format version one
// wrapping ErrFormatVersion.
func Open(fs vfs.FS, name string, opts OpenOptions) (*File, error) {
	if fs == nil {
		fs = vfs.Default
	}
	if fs == vfs.Default && !opts.NoMmap && mmapSupported {
		osf, err := os.Open(name)
		if err != nil {
			return nil, fmt.Errorf("bulk: open %s: %w", name, err)
		}
		st, err := osf.Stat()
		if err != nil {
			return nil, errors.Join(fmt.Errorf("bulk: open %s: %w", name, err), osf.Close())
		}
		if st.Size() < headerLen+footerLen {
			osf.Close()
			return nil, fmt.Errorf("bulk: open %s: %d bytes, too short for a bulk file: %w", name, st.Size(), engines.ErrCorrupt)
		}
		data, err := mmapFile(osf, st.Size())
		cerr := osf.Close() // the mapping outlives the descriptor
		if err != nil {
			return nil, errors.Join(fmt.Errorf("bulk: mmap %s: %w", name, err), cerr)
		}
		adviseMapping(data)
		f, err := newFile(bytes.NewReader(data), data, st.Size(), func() error { return munmap(data) })
		if err != nil {
			return nil, errors.Join(fmt.Errorf("bulk: open %s: %w", name, err), munmap(data))
		}
		return f, nil
	}
	vf, err := fs.Open(name)
	if err != nil {
		return nil, fmt.Errorf("bulk: open %s: %w", name, err)
	}
	size, err := vf.Size()
	if err != nil {
		return nil, errors.Join(fmt.Errorf("bulk: open %s: %w", name, err), vf.Close())
	}
	f, err := newFile(vf, nil, size, vf.Close)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("bulk: open %s: %w", name, err), vf.Close())
	}
	return f, nil
}

// OpenReaderAt opens a partition file of size bytes read through r; closer
// (may be nil) is called by Close once no read uses r.
func OpenReaderAt(r io.ReaderAt, size int64, closer io.Closer) (*File, error) {
	c := func() error { return nil }
	if closer != nil {
		c = closer.Close
	}
	return newFile(r, nil, size, c)
}

func newFile(r io.ReaderAt, data []byte, size int64, closeFn func() error) (_ *File, err error) {
	if size < headerLen+footerLen {
		return nil, fmt.Errorf("bulk: %d bytes, too short for a bulk file: %w", size, engines.ErrCorrupt)
	}
	// The sections a lookup reads at random (the MPH's pilots, the
	// fingerprints) go in huge pages when large: with 4 KiB pages each
	// lookup would add TLB misses to its cache misses.
	var frees []func()
	defer func() {
		if err != nil {
			for _, free := range frees {
				free()
			}
		}
	}()
	readInto := func(off int64, n uint64, huge bool) ([]byte, error) {
		var b []byte
		if huge && n >= HugePageBytes {
			var free func()
			b, free = allocHuge(int(n))
			frees = append(frees, free)
		} else {
			b = make([]byte, n)
		}
		if _, err := r.ReadAt(b, off); err != nil {
			return nil, fmt.Errorf("bulk: read %d bytes at %d: %w", n, off, err)
		}
		return b, nil
	}
	read := func(off int64, n uint64) ([]byte, error) { return readInto(off, n, false) }
	h, err := read(0, headerLen)
	if err != nil {
		return nil, err
	}
	fb, err := read(size-footerLen, footerLen)
	if err != nil {
		return nil, err
	}
	// The footer's version check comes first: a newer format may have
	// moved things the header check would trip on.
	ft, err := decodeFooter(fb, size)
	if err != nil {
		return nil, err
	}
	if err := checkHeader(h); err != nil {
		return nil, err
	}
	f := &File{ft: ft, ra: r, data: data, size: size, drained: make(chan struct{}), recBase: int64(ft.secs[secRecords].off)}
	sec := func(i int, huge bool) ([]byte, error) {
		s := ft.secs[i]
		b, err := readInto(int64(s.off), s.len, huge)
		if err != nil {
			return nil, err
		}
		if got := crcOf(b); got != s.crc {
			return nil, fmt.Errorf("bulk: section %d crc %#08x, stored %#08x: %w", i, got, s.crc, engines.ErrCorrupt)
		}
		return b, nil
	}
	b, err := sec(secMPH, true)
	if err != nil {
		return nil, err
	}
	if f.table, err = mph.DecodeShared(b); err != nil {
		return nil, fmt.Errorf("bulk: mph section: %w", err)
	}
	if uint64(f.table.Len()) != ft.n {
		return nil, fmt.Errorf("bulk: mph of %d keys for %d records: %w", f.table.Len(), ft.n, engines.ErrCorrupt)
	}
	if f.fps, err = sec(secFPs, true); err != nil {
		return nil, err
	}
	if ft.fixedLen == 0 {
		if b, err = sec(secOffsets, false); err != nil {
			return nil, err
		}
		if f.offs, err = eliasfano.Decode(b); err != nil {
			return nil, fmt.Errorf("bulk: offsets section: %w", err)
		}
		if uint64(f.offs.Len()) != ft.n+1 || f.offs.Get(0) != 0 || f.offs.Get(int(ft.n)) != ft.secs[secRecords].len {
			return nil, fmt.Errorf("bulk: offsets do not span the records: %w", engines.ErrCorrupt)
		}
	}
	if b, err = sec(secDeleted, false); err != nil {
		return nil, err
	}
	if len(b) > 0 {
		f.deleted = make([]uint64, len(b)/8)
		cnt := uint64(0)
		for i := range f.deleted {
			f.deleted[i] = binary.LittleEndian.Uint64(b[8*i:])
			cnt += uint64(bits.OnesCount64(f.deleted[i]))
		}
		if cnt != ft.deleted || ft.n%64 != 0 && f.deleted[len(f.deleted)-1]>>(ft.n%64) != 0 {
			return nil, fmt.Errorf("bulk: deleted bitmap holds %d keys, footer says %d: %w", cnt, ft.deleted, engines.ErrCorrupt)
		}
	}
	maxLen := int(ft.maxRecLen)
	f.bufs.New = func() any { b := make([]byte, maxLen); return &b }
	f.close = func() error {
		err := closeFn()
		for _, free := range frees {
			free()
		}
		return err
	}
	return f, nil
}

// acquire registers a read in flight; false if the file is closed.
func (f *File) acquire() bool {
	if f.state.Add(1)&closedBit != 0 {
		f.release()
		return false
	}
	return true
}

func (f *File) release() {
	if f.state.Add(-1) == closedBit {
		f.drainOne.Do(func() { close(f.drained) })
	}
}

// ReadFileAt reads the file's own bytes at off, as they are on disk (what
// was built and published): a server that loaded a file writes it into its
// stream from here. It fails with engines.ErrClosed once the file is closed.
func (f *File) ReadFileAt(p []byte, off int64) (int, error) {
	if !f.acquire() {
		return 0, engines.ErrClosed
	}
	defer f.release()
	if off < 0 || off > f.size {
		return 0, fmt.Errorf("bulk: read at %d of a %d-byte file", off, f.size)
	}
	if f.data != nil {
		n := copy(p, f.data[off:])
		if n < len(p) {
			return n, io.EOF
		}
		return n, nil
	}
	return f.ra.ReadAt(p, off)
}

// Close waits for the reads in flight, then unmaps or closes the file.
// Reads that start after Close fail with engines.ErrClosed. Close is
// idempotent and safe to call concurrently with reads and with itself.
func (f *File) Close() error {
	f.closeOne.Do(func() {
		if f.state.Or(closedBit) == 0 {
			f.drainOne.Do(func() { close(f.drained) })
		}
		<-f.drained
		f.closeErr = f.close()
	})
	<-f.drained
	return f.closeErr
}

// Stats describes a file.
type Stats struct {
	// Records is the number of keys (deletions included); Deleted the
	// deletions of a delta file.
	Records, Deleted uint64
	// IndexBytes is the memory held to find values and reject absent keys:
	// the MPH, fingerprints, offsets and the deleted bitmap.
	IndexBytes int64
	// FileBytes is the file's size.
	FileBytes int64
	// Mapped says the file is read through mmap (else ReadAt).
	Mapped bool
}

// Stats returns the file's statistics.
func (f *File) Stats() Stats {
	idx := int64(f.table.MemoryBytes() + len(f.fps) + 8*len(f.deleted))
	if f.offs != nil {
		idx += int64(f.offs.MemoryBytes())
	}
	return Stats{Records: f.ft.n, Deleted: f.ft.deleted, IndexBytes: idx, FileBytes: f.size, Mapped: f.data != nil}
}

// Version is the table version recorded in the file.
func (f *File) Version() uint64 { return f.ft.version }

// Delta reports whether the file is a delta, and of which base version.
func (f *File) Delta() (base uint64, ok bool) { return f.ft.baseVersion, f.ft.flags&flagDelta != 0 }

// Partition returns the file's partition and the table's partition count.
func (f *File) Partition() (i, n int) { return int(f.ft.partition), int(f.ft.partitions) }

// lookupState is the outcome of one file's lookup.
type lookupState int

const (
	absent lookupState = iota
	present
	deletedKey
)

func (f *File) recordRange(slot uint64) (off, end uint64) {
	if f.ft.fixedLen > 0 {
		off = slot * f.ft.fixedLen
		return off, off + f.ft.fixedLen
	}
	return f.offs.Get2(int(slot))
}

// get appends key's value to dst. h is keyHash(f.ft.hashSeed, key).
func (f *File) get(dst, key []byte, h uint64) ([]byte, lookupState, error) {
	if f.ft.n == 0 {
		return dst, absent, nil
	}
	slot := f.table.Lookup(h)
	if !f.fpMatch(slot, h) {
		return dst, absent, nil
	}
	return f.read(dst, key, slot)
}

// fpMatch reports whether slot's fingerprint is h's.
func (f *File) fpMatch(slot, h uint64) bool {
	switch f.ft.fpBits {
	case 8:
		return f.fps[slot] == byte(h)
	case 16:
		return binary.LittleEndian.Uint16(f.fps[2*slot:]) == uint16(h)
	}
	return true
}

// read appends the value of slot's record to dst if the record's key is
// key.
func (f *File) read(dst, key []byte, slot uint64) ([]byte, lookupState, error) {
	off, end := f.recordRange(slot)
	var rec []byte
	if f.data != nil {
		rec = f.data[f.recBase+int64(off) : f.recBase+int64(end)]
	} else {
		bp := f.bufs.Get().(*[]byte)
		defer f.bufs.Put(bp)
		if end-off > uint64(len(*bp)) {
			return dst, absent, fmt.Errorf("bulk: record at %d longer than the footer's maximum: %w", off, engines.ErrCorrupt)
		}
		rec = (*bp)[:end-off]
		if _, err := f.ra.ReadAt(rec, f.recBase+int64(off)); err != nil {
			return dst, absent, fmt.Errorf("bulk: read record at %d: %w", off, err)
		}
	}
	pr, err := diskstore.DecodePutRecord(rec)
	if err != nil {
		return dst, absent, fmt.Errorf("bulk: record %d at %d: %w", slot, off, err)
	}
	if !bytes.Equal(pr.Key, key) {
		return dst, absent, nil // a fingerprint false positive
	}
	if f.deleted != nil && f.deleted[slot/64]&(1<<(slot%64)) != 0 {
		return dst, deletedKey, nil
	}
	return append(dst, pr.Value...), present, nil
}

func (f *File) hash(key []byte, routing uint64, haveRouting bool) uint64 {
	if haveRouting && f.ft.hashSeed == 0 {
		return routing
	}
	return keyHash(f.ft.hashSeed, key)
}

// AppendGet appends key's value to dst and reports whether key is present.
// A corrupt record is an error wrapping engines.ErrCorrupt, never a value;
// a closed file engines.ErrClosed. A deletion in a delta file reads as
// absent.
func (f *File) AppendGet(dst, key []byte) ([]byte, bool, error) {
	if !f.acquire() {
		return dst, false, engines.ErrClosed
	}
	defer f.release()
	out, st, err := f.get(dst, key, f.hash(key, 0, false))
	return out, st == present, err
}

// AppendGetHash is AppendGet for a key whose routing hash
// (keyspace.Hash(key)) the caller computed already; it saves hashing again.
func (f *File) AppendGetHash(dst, key []byte, routingHash uint64) ([]byte, bool, error) {
	if !f.acquire() {
		return dst, false, engines.ErrClosed
	}
	defer f.release()
	out, st, err := f.get(dst, key, f.hash(key, routingHash, true))
	return out, st == present, err
}

// Get returns a copy of key's value. See AppendGet.
func (f *File) Get(key []byte) ([]byte, bool, error) {
	v, ok, err := f.AppendGet(nil, key)
	if ok && v == nil {
		v = []byte{}
	}
	return v, ok, err
}

// AppendGetBatch looks up keys, appending the values found to dst; on
// return vals[i] is key i's value (a slice of the returned buffer) and
// found[i] whether it is present. vals and found must be len(keys) long.
// The whole batch reads this one file, so it sees one version.
func (f *File) AppendGetBatch(dst []byte, keys [][]byte, vals [][]byte, found []bool) ([]byte, error) {
	if len(vals) != len(keys) || len(found) != len(keys) {
		return dst, fmt.Errorf("bulk: batch of %d keys with %d vals and %d found", len(keys), len(vals), len(found))
	}
	if !f.acquire() {
		return dst, engines.ErrClosed
	}
	defer f.release()
	if f.data == nil || f.ft.n == 0 {
		return batch(dst, keys, vals, found, func(dst, key []byte) ([]byte, bool, error) {
			out, st, err := f.get(dst, key, f.hash(key, 0, false))
			return out, st == present, err
		})
	}
	// Mapped: find every slot of a group of keys, then touch their
	// records, then read them. A lookup is a chain of cache misses (pilot,
	// then fingerprint and record); independent lookups side by side
	// overlap theirs, where one after the other each waits in full.
	const group = 16
	var slots, hs [group]uint64
	var match [group]bool
	var offStack [64]int
	offs := offStack[:0]
	for g := 0; g < len(keys); g += group {
		ks := keys[g:min(g+group, len(keys))]
		for i, k := range ks {
			hs[i] = f.hash(k, 0, false)
			slots[i] = f.table.Lookup(hs[i])
		}
		var sink byte
		for i := range ks {
			match[i] = f.fpMatch(slots[i], hs[i])
			if match[i] {
				off, _ := f.recordRange(slots[i])
				sink += f.data[f.recBase+int64(off)]
			}
		}
		runtime.KeepAlive(sink) // keeps the touching loads
		for i, k := range ks {
			offs = append(offs, len(dst))
			found[g+i] = false
			if !match[i] {
				continue
			}
			var st lookupState
			var err error
			if dst, st, err = f.read(dst, k, slots[i]); err != nil {
				return dst, err
			}
			found[g+i] = st == present
		}
	}
	setVals(dst, offs, vals, found)
	return dst, nil
}

func batch(dst []byte, keys [][]byte, vals [][]byte, found []bool, get func(dst, key []byte) ([]byte, bool, error)) ([]byte, error) {
	var offStack [64]int
	offs := offStack[:0]
	for i, k := range keys {
		start := len(dst)
		var err error
		dst, found[i], err = get(dst, k)
		if err != nil {
			return dst, err
		}
		offs = append(offs, start)
	}
	setVals(dst, offs, vals, found)
	return dst, nil
}

// setVals points vals[i] at value i in dst, which starts at offs[i] and
// ends where the next begins.
func setVals(dst []byte, offs []int, vals [][]byte, found []bool) {
	for i := range vals {
		if !found[i] {
			vals[i] = nil
			continue
		}
		end := len(dst)
		if i+1 < len(vals) {
			end = offs[i+1]
		}
		vals[i] = dst[offs[i]:end:end]
	}
}

// Scan calls fn for every record in file order (slot order), verifying each
// record's CRC; key and value alias a buffer valid only during the call.
// deleted marks a deletion of a delta file. An error from fn stops the scan
// and is returned.
func (f *File) Scan(ctx context.Context, fn func(key, value []byte, deleted bool) error) error {
	if !f.acquire() {
		return engines.ErrClosed
	}
	defer f.release()
	return f.scan(ctx, fn)
}

// scan is Scan for a caller that holds a read.
func (f *File) scan(ctx context.Context, fn func(key, value []byte, deleted bool) error) error {
	recs := f.ft.secs[secRecords]
	var buf []byte
	for s := uint64(0); s < f.ft.n; s++ {
		if s&1023 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		off, end := f.recordRange(s)
		var rec []byte
		if f.data != nil {
			rec = f.data[int64(recs.off+off):int64(recs.off+end)]
		} else {
			if cap(buf) < int(end-off) {
				buf = make([]byte, end-off)
			}
			rec = buf[:end-off]
			if _, err := f.ra.ReadAt(rec, int64(recs.off+off)); err != nil {
				return fmt.Errorf("bulk: read record %d: %w", s, err)
			}
		}
		pr, err := diskstore.DecodePutRecord(rec)
		if err != nil {
			return fmt.Errorf("bulk: record %d: %w", s, err)
		}
		if pr.Len != int64(end-off) {
			return fmt.Errorf("bulk: record %d is %d bytes in a slot of %d: %w", s, pr.Len, end-off, engines.ErrCorrupt)
		}
		del := f.deleted != nil && f.deleted[s/64]&(1<<(s%64)) != 0
		if err := fn(pr.Key, pr.Value, del); err != nil {
			return err
		}
	}
	return nil
}

// Verify reads the whole file and checks what Open does not: the records
// section's CRC32C, and that every record decodes, sits in its key's slot
// and matches its fingerprint. Publishing runs it before registering a
// version.
func (f *File) Verify(ctx context.Context) error {
	if !f.acquire() {
		return engines.ErrClosed
	}
	defer f.release()
	recs := f.ft.secs[secRecords]
	crc := uint32(0)
	buf := make([]byte, 1<<20)
	for off := uint64(0); off < recs.len; {
		n := min(uint64(len(buf)), recs.len-off)
		if _, err := f.ra.ReadAt(buf[:n], int64(recs.off+off)); err != nil {
			return fmt.Errorf("bulk: verify: read at %d: %w", recs.off+off, err)
		}
		crc = crc32.Update(crc, castagnoli, buf[:n])
		off += n
	}
	if crc != recs.crc {
		return fmt.Errorf("bulk: records section crc %#08x, stored %#08x: %w", crc, recs.crc, engines.ErrCorrupt)
	}
	s := uint64(0)
	return f.scan(ctx, func(key, _ []byte, _ bool) error {
		h := keyHash(f.ft.hashSeed, key)
		if got := f.table.Lookup(h); got != s {
			return fmt.Errorf("bulk: record %d's key maps to slot %d: %w", s, got, engines.ErrCorrupt)
		}
		switch f.ft.fpBits {
		case 8:
			if f.fps[s] != byte(h) {
				return fmt.Errorf("bulk: record %d's fingerprint differs: %w", s, engines.ErrCorrupt)
			}
		case 16:
			if binary.LittleEndian.Uint16(f.fps[2*s:]) != uint16(h) {
				return fmt.Errorf("bulk: record %d's fingerprint differs: %w", s, engines.ErrCorrupt)
			}
		}
		s++
		return nil
	})
}
