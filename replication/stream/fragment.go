package stream

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/vfs"
)

// Fragment file: one fragment of a coded extent on a node, in the node's
// "fragments" directory as "%016x.%02d.frag" (extent id in hex, fragment
// index); "*.frag.tmp" is one being written (removed at open). A fragment
// is written once, whole, and never changes. Integers are little-endian.
//
//	 0       8         12        16          24         32       36       40
//	| magic | version | index   | extent id | size     | crc32c | crc32c | payload (size) | chunk crcs (4 each) | crc32c (4) |
//	| (8)   | (4, =1) | (4)     | (8)       | (8)      | of the | of 0-35|                |                     | of the     |
//	|       |         |         |           |          | payload|        |                |                     | crc table  |
//
// magic is "TABFRAGM". The payload is split in FragmentChunk-byte chunks
// (the last may be short); chunk i's CRC32C is entry i of the table after
// the payload. A read checks every chunk it touches, the scrubber every
// chunk and the whole-payload CRC (which the stream manager also records).
// Another version is refused with ErrFormatVersion.
const (
	fragMagic   = "TABFRAGM"
	fragVersion = 1
	// fragHeaderLen is the fixed header size: never change.
	fragHeaderLen = 40
	// FragmentChunk is the checksum granularity of a fragment: a read of
	// n bytes reads and checks at most n + 2 chunks. Never change (format).
	FragmentChunk = 64 << 10
	fragSuffix    = ".frag"
	fragTmpSuffix = ".frag.tmp"
)

// FragmentInfo describes one stored fragment.
type FragmentInfo struct {
	Extent uint64
	Index  int
	Size   int64
	// CRC is the CRC32C of the whole fragment.
	CRC uint32
	// Corrupt: a read or a scrub found a chunk failing its CRC (or the
	// file's header or table was bad at open).
	Corrupt bool
}

type fragKey struct {
	extent uint64
	index  int
}

type fragFile struct {
	key    fragKey
	size   int64
	crc    uint32
	chunks []uint32
	// corrupt is set by a failed check; the file is never served again
	// until replaced.
	corrupt atomic.Bool
}

// appendFragHeader encodes the fixed header.
func appendFragHeader(dst []byte, extent uint64, index int, size int64, crc uint32) []byte {
	start := len(dst)
	dst = append(dst, fragMagic...)
	dst = binary.LittleEndian.AppendUint32(dst, fragVersion)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(index))
	dst = binary.LittleEndian.AppendUint64(dst, extent)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(size))
	dst = binary.LittleEndian.AppendUint32(dst, crc)
	return binary.LittleEndian.AppendUint32(dst, crc32c(dst[start:]))
}

// parseFragHeader decodes and checks the fixed header.
func parseFragHeader(h []byte) (extent uint64, index int, size int64, crc uint32, err error) {
	if len(h) < fragHeaderLen {
		return 0, 0, 0, 0, fmt.Errorf("fragment header of %d bytes: %w", len(h), engines.ErrCorrupt)
	}
	if string(h[:8]) != fragMagic {
		return 0, 0, 0, 0, fmt.Errorf("fragment magic %q: %w", h[:8], engines.ErrCorrupt)
	}
	if got, want := binary.LittleEndian.Uint32(h[36:]), crc32c(h[:36]); got != want {
		return 0, 0, 0, 0, fmt.Errorf("fragment header crc %08x, want %08x: %w", got, want, engines.ErrCorrupt)
	}
	if v := binary.LittleEndian.Uint32(h[8:]); v != fragVersion {
		return 0, 0, 0, 0, fmt.Errorf("fragment format version %d (this build reads %d): %w", v, fragVersion, ErrFormatVersion)
	}
	index = int(binary.LittleEndian.Uint32(h[12:]))
	extent = binary.LittleEndian.Uint64(h[16:])
	s := binary.LittleEndian.Uint64(h[24:])
	if s > 1<<40 || index > 255 {
		return 0, 0, 0, 0, fmt.Errorf("fragment size %d index %d: %w", s, index, engines.ErrCorrupt)
	}
	return extent, index, int64(s), binary.LittleEndian.Uint32(h[32:]), nil
}

func fragChunks(size int64) int { return int((size + FragmentChunk - 1) / FragmentChunk) }

// FragmentStore is the directory of fragments of one extent node. Safe for
// concurrent use.
type FragmentStore struct {
	fs  vfs.FS
	dir string

	mu sync.Mutex
	// Guarded by mu.
	frags  map[fragKey]*fragFile
	busy   map[fragKey]bool
	closed bool
}

func (s *FragmentStore) path(k fragKey) string {
	return filepath.Join(s.dir, fmt.Sprintf("%016x.%02d%s", k.extent, k.index, fragSuffix))
}

// OpenFragmentStore opens (creating it) the fragment directory dir: it
// removes unfinished writes and reads every fragment's header and CRC
// table. A fragment whose header or table is bad is kept, marked corrupt
// (Stat reports it; the manager has it rebuilt).
func OpenFragmentStore(fs vfs.FS, dir string) (*FragmentStore, error) {
	if fs == nil {
		fs = vfs.Default
	}
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("stream: make fragment directory: %w", err)
	}
	if err := fs.SyncDir(filepath.Dir(filepath.Clean(dir))); err != nil {
		return nil, fmt.Errorf("stream: sync fragment parent directory: %w", err)
	}
	names, err := fs.List(dir)
	if err != nil {
		return nil, fmt.Errorf("stream: list fragments: %w", err)
	}
	s := &FragmentStore{fs: fs, dir: dir, frags: map[fragKey]*fragFile{}, busy: map[fragKey]bool{}}
	removed := false
	for _, name := range names {
		switch {
		case strings.HasSuffix(name, fragTmpSuffix):
			if err := fs.Remove(filepath.Join(dir, name)); err != nil {
				return nil, fmt.Errorf("stream: remove %s: %w", name, err)
			}
			removed = true
		case strings.HasSuffix(name, fragSuffix):
			k, ok := parseFragName(name)
			if !ok {
				continue // not ours
			}
			f, err := s.load(k)
			if err != nil {
				if !errors.Is(err, engines.ErrCorrupt) {
					return nil, fmt.Errorf("stream: %w", err)
				}
				f = &fragFile{key: k}
				f.corrupt.Store(true)
			}
			s.frags[k] = f
		}
	}
	if removed {
		if err := fs.SyncDir(dir); err != nil {
			return nil, fmt.Errorf("stream: sync fragments: %w", err)
		}
	}
	return s, nil
}

func parseFragName(name string) (fragKey, bool) {
	base := strings.TrimSuffix(name, fragSuffix)
	ext, idx, ok := strings.Cut(base, ".")
	if !ok || len(ext) != 16 {
		return fragKey{}, false
	}
	id, err1 := strconv.ParseUint(ext, 16, 64)
	i, err2 := strconv.Atoi(idx)
	if err1 != nil || err2 != nil || i < 0 || i > 255 {
		return fragKey{}, false
	}
	return fragKey{extent: id, index: i}, true
}

// load reads and checks k's header and CRC table.
func (s *FragmentStore) load(k fragKey) (*fragFile, error) {
	return loadFragment(s.fs, s.path(k), k)
}

func loadFragment(fs vfs.FS, path string, k fragKey) (*fragFile, error) {
	f, err := fs.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open fragment %d.%d: %w", k.extent, k.index, err)
	}
	defer f.Close()
	fileSize, err := f.Size()
	if err != nil {
		return nil, fmt.Errorf("open fragment %d.%d: %w", k.extent, k.index, err)
	}
	h := make([]byte, fragHeaderLen)
	if fileSize < fragHeaderLen {
		return nil, fmt.Errorf("fragment %d.%d is %d bytes: %w", k.extent, k.index, fileSize, engines.ErrCorrupt)
	}
	if _, err := f.ReadAt(h, 0); err != nil {
		return nil, fmt.Errorf("read fragment %d.%d header: %w", k.extent, k.index, err)
	}
	extent, index, size, crc, err := parseFragHeader(h)
	if err != nil {
		return nil, fmt.Errorf("fragment %d.%d: %w", k.extent, k.index, err)
	}
	if extent != k.extent || index != k.index {
		return nil, fmt.Errorf("fragment file %d.%d holds %d.%d: %w", k.extent, k.index, extent, index, engines.ErrCorrupt)
	}
	n := fragChunks(size)
	if want := fragHeaderLen + size + 4*int64(n) + 4; fileSize != want {
		return nil, fmt.Errorf("fragment %d.%d is %d bytes, header says %d: %w", k.extent, k.index, fileSize, want, engines.ErrCorrupt)
	}
	tab := make([]byte, 4*n+4)
	if _, err := f.ReadAt(tab, fragHeaderLen+size); err != nil {
		return nil, fmt.Errorf("read fragment %d.%d crc table: %w", k.extent, k.index, err)
	}
	if got, want := binary.LittleEndian.Uint32(tab[4*n:]), crc32c(tab[:4*n]); got != want {
		return nil, fmt.Errorf("fragment %d.%d crc table crc %08x, want %08x: %w", k.extent, k.index, got, want, engines.ErrCorrupt)
	}
	ff := &fragFile{key: k, size: size, crc: crc, chunks: make([]uint32, n)}
	for i := range n {
		ff.chunks[i] = binary.LittleEndian.Uint32(tab[4*i:])
	}
	return ff, nil
}

// Put durably stores fragment index of extent, of size bytes whose
// CRC32C is crc, from the bytes fill hands to write (in order). When it
// returns nil the fragment is durable and readable; a fragment whose bytes
// do not match size and crc is refused (engines.ErrCorrupt) and nothing
// changes. It replaces an earlier copy.
func (s *FragmentStore) Put(extent uint64, index int, size int64, crc uint32, fill func(write func([]byte) error) error) error {
	k := fragKey{extent, index}
	if size < 0 || index < 0 || index > 255 {
		return fmt.Errorf("put fragment %d.%d of %d bytes: %w", extent, index, size, ErrBadRange)
	}
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return ErrClosed
	case s.busy[k]:
		s.mu.Unlock()
		return fmt.Errorf("fragment %d.%d is being written: %w", extent, index, ErrExists)
	}
	s.busy[k] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.busy, k)
		s.mu.Unlock()
	}()
	tmp := strings.TrimSuffix(s.path(k), fragSuffix) + fragTmpSuffix
	f, err := s.fs.Create(tmp)
	if err != nil {
		return fmt.Errorf("put fragment %d.%d: %w", extent, index, err)
	}
	abort := func(err error) error {
		return errors.Join(err, f.Close(), s.fs.Remove(tmp))
	}
	if _, err := f.Write(appendFragHeader(nil, extent, index, size, crc)); err != nil {
		return abort(fmt.Errorf("put fragment %d.%d: %w", extent, index, err))
	}
	var (
		got      int64
		whole    uint32
		chunks   = make([]uint32, 0, fragChunks(size))
		chunkCRC uint32
		inChunk  int64
	)
	write := func(p []byte) error {
		if got+int64(len(p)) > size {
			return fmt.Errorf("fragment %d.%d: more than %d bytes: %w", extent, index, size, engines.ErrCorrupt)
		}
		whole = crc32cUpdate(whole, p)
		for q := p; len(q) > 0; {
			n := min(int64(len(q)), FragmentChunk-inChunk)
			chunkCRC = crc32cUpdate(chunkCRC, q[:n])
			inChunk += n
			q = q[n:]
			if inChunk == FragmentChunk {
				chunks = append(chunks, chunkCRC)
				chunkCRC, inChunk = 0, 0
			}
		}
		got += int64(len(p))
		_, err := f.Write(p)
		return err
	}
	if err := fill(write); err != nil {
		return abort(fmt.Errorf("put fragment %d.%d: %w", extent, index, err))
	}
	if inChunk > 0 {
		chunks = append(chunks, chunkCRC)
	}
	if got != size || whole != crc {
		return abort(fmt.Errorf("put fragment %d.%d: got %d bytes crc %08x, want %d crc %08x: %w", extent, index, got, whole, size, crc, engines.ErrCorrupt))
	}
	tab := make([]byte, 0, 4*len(chunks)+4)
	for _, c := range chunks {
		tab = binary.LittleEndian.AppendUint32(tab, c)
	}
	tab = binary.LittleEndian.AppendUint32(tab, crc32c(tab))
	if _, err := f.Write(tab); err != nil {
		return abort(fmt.Errorf("put fragment %d.%d: %w", extent, index, err))
	}
	if err := f.Sync(); err != nil {
		return abort(fmt.Errorf("put fragment %d.%d: sync: %w", extent, index, err))
	}
	if err := f.Close(); err != nil {
		return errors.Join(fmt.Errorf("put fragment %d.%d: %w", extent, index, err), s.fs.Remove(tmp))
	}
	if err := s.fs.Rename(tmp, s.path(k)); err != nil {
		return fmt.Errorf("put fragment %d.%d: %w", extent, index, err)
	}
	if err := s.fs.SyncDir(s.dir); err != nil {
		return fmt.Errorf("put fragment %d.%d: sync directory: %w", extent, index, err)
	}
	ff := &fragFile{key: k, size: size, crc: crc, chunks: chunks}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.frags[k] = ff
	return nil
}

func (s *FragmentStore) get(k fragKey) (*fragFile, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	f := s.frags[k]
	if f == nil {
		return nil, fmt.Errorf("fragment %d.%d: %w", k.extent, k.index, ErrNoExtent)
	}
	return f, nil
}

// Stat describes fragment index of extent (ErrNoExtent if absent).
func (s *FragmentStore) Stat(extent uint64, index int) (FragmentInfo, error) {
	f, err := s.get(fragKey{extent, index})
	if err != nil {
		return FragmentInfo{}, err
	}
	return FragmentInfo{Extent: extent, Index: index, Size: f.size, CRC: f.crc, Corrupt: f.corrupt.Load()}, nil
}

// Read returns n bytes at off of fragment index of extent, checking every
// chunk it touches; a bad chunk marks the fragment corrupt and fails with
// engines.ErrCorrupt.
func (s *FragmentStore) Read(extent uint64, index int, off, n int64) ([]byte, error) {
	k := fragKey{extent, index}
	ff, err := s.get(k)
	if err != nil {
		return nil, err
	}
	if ff.corrupt.Load() {
		return nil, fmt.Errorf("fragment %d.%d is corrupt: %w", extent, index, engines.ErrCorrupt)
	}
	if off < 0 || n < 0 || off+n > ff.size {
		return nil, fmt.Errorf("read fragment %d.%d [%d,+%d) of %d: %w", extent, index, off, n, ff.size, ErrBadRange)
	}
	if n == 0 {
		return []byte{}, nil
	}
	c0, c1 := off/FragmentChunk, (off+n+FragmentChunk-1)/FragmentChunk
	start, end := c0*FragmentChunk, min(c1*FragmentChunk, ff.size)
	buf := make([]byte, end-start)
	f, err := s.fs.Open(s.path(k))
	if err != nil {
		return nil, fmt.Errorf("read fragment %d.%d: %w", extent, index, err)
	}
	_, err = f.ReadAt(buf, fragHeaderLen+start)
	err = errors.Join(err, f.Close())
	if err != nil {
		return nil, fmt.Errorf("read fragment %d.%d: %w", extent, index, err)
	}
	for c := c0; c < c1; c++ {
		lo := c*FragmentChunk - start
		hi := min(lo+FragmentChunk, int64(len(buf)))
		if crc32c(buf[lo:hi]) != ff.chunks[c] {
			ff.corrupt.Store(true)
			return nil, fmt.Errorf("fragment %d.%d chunk %d fails its crc: %w", extent, index, c, engines.ErrCorrupt)
		}
	}
	return buf[off-start : off-start+n], nil
}

// Scrub re-reads fragment index of extent whole, checking every chunk and
// the whole-fragment CRC.
func (s *FragmentStore) Scrub(extent uint64, index int) error {
	ff, err := s.get(fragKey{extent, index})
	if err != nil {
		return err
	}
	var whole uint32
	for off := int64(0); off < ff.size; off += 4 * FragmentChunk {
		b, err := s.Read(extent, index, off, min(4*FragmentChunk, ff.size-off))
		if err != nil {
			return err
		}
		whole = crc32cUpdate(whole, b)
	}
	if ff.corrupt.Load() {
		return fmt.Errorf("fragment %d.%d is corrupt: %w", extent, index, engines.ErrCorrupt)
	}
	if whole != ff.crc {
		ff.corrupt.Store(true)
		return fmt.Errorf("fragment %d.%d crc %08x, want %08x: %w", extent, index, whole, ff.crc, engines.ErrCorrupt)
	}
	return nil
}

// Delete removes fragment index of extent durably; absent is a no-op.
func (s *FragmentStore) Delete(extent uint64, index int) error {
	k := fragKey{extent, index}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	_, ok := s.frags[k]
	delete(s.frags, k)
	s.mu.Unlock()
	if !ok {
		return nil
	}
	err := s.fs.Remove(s.path(k))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("delete fragment %d.%d: %w", extent, index, err)
	}
	if err := s.fs.SyncDir(s.dir); err != nil {
		return fmt.Errorf("delete fragment %d.%d: sync directory: %w", extent, index, err)
	}
	return nil
}

// List describes every fragment, by extent then index.
func (s *FragmentStore) List() []FragmentInfo {
	s.mu.Lock()
	fs := slices.Collect(maps.Values(s.frags))
	s.mu.Unlock()
	out := make([]FragmentInfo, 0, len(fs))
	for _, f := range fs {
		out = append(out, FragmentInfo{Extent: f.key.extent, Index: f.key.index, Size: f.size, CRC: f.crc, Corrupt: f.corrupt.Load()})
	}
	slices.SortFunc(out, func(a, b FragmentInfo) int {
		return cmp.Or(cmp.Compare(a.Extent, b.Extent), cmp.Compare(a.Index, b.Index))
	})
	return out
}

// Close makes the store refuse further calls. Idempotent.
func (s *FragmentStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

// crc32cUpdate extends crc with b.
func crc32cUpdate(crc uint32, b []byte) uint32 { return crc32.Update(crc, castagnoli, b) }
