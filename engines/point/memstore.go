package point

import (
	"sync"
	"sync/atomic"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/diskstore"
)

// A chunk holds 16384 record pointers (128 KiB), so the directory of chunks
// stays short (61 pointers per million records) and growing it copies little.
const (
	memChunkShift = 14
	memChunkSize  = 1 << memChunkShift
)

type memChunk [memChunkSize]atomic.Pointer[memRecord]

// memRecord is immutable once published: a reader holding it after the slot
// was freed and reused still sees one whole record.
type memRecord struct {
	kv        []byte // key then value, one allocation
	klen      int
	expiresAt int64
}

// memStore is the "memory" storage back end: records on the Go heap, a
// location is a slot number. Slots are reused LIFO; the garbage collector is
// the epoch that keeps a replaced record alive for readers still holding it.
//
// While a scan runs, no slot is reused: every write takes a fresh slot past
// all existing ones, and the scan reads the slot directory afresh as it goes,
// so a record rewritten during the scan is met again ahead of it (never
// behind, where it would be missed). Slots freed meanwhile wait in deferred
// until the last scan ends.
type memStore struct {
	// chunks is the slot directory; replaced (copied) when it grows.
	chunks atomic.Pointer[[]*memChunk]

	// mu guards the allocator below.
	mu sync.Mutex
	// free lists freed slots; guarded by mu.
	free []uint64
	// next is the first never-used slot; guarded by mu.
	next uint64
	// scans counts running scans; deferred holds slots freed while one ran.
	// Both guarded by mu.
	scans    int
	deferred []uint64
}

// NewMemoryStore returns an empty in-memory ValueStore.
func NewMemoryStore() ValueStore {
	s := &memStore{}
	d := []*memChunk{}
	s.chunks.Store(&d)
	return s
}

func (s *memStore) slot(loc uint64) *atomic.Pointer[memRecord] {
	d := *s.chunks.Load()
	ci := loc >> memChunkShift
	if ci >= uint64(len(d)) {
		return nil
	}
	return &d[ci][loc&(memChunkSize-1)]
}

func (s *memStore) Append(r engines.Record) (uint64, error) {
	kv := make([]byte, len(r.Key)+len(r.Value))
	copy(kv, r.Key)
	copy(kv[len(r.Key):], r.Value)
	rec := &memRecord{kv: kv, klen: len(r.Key), expiresAt: r.ExpiresAt}

	s.mu.Lock()
	var loc uint64
	if n := len(s.free); n > 0 && s.scans == 0 {
		loc = s.free[n-1]
		s.free = s.free[:n-1]
	} else {
		loc = s.next
		s.next++
		if d := *s.chunks.Load(); loc>>memChunkShift >= uint64(len(d)) {
			nd := make([]*memChunk, len(d)+1)
			copy(nd, d)
			nd[len(d)] = new(memChunk)
			s.chunks.Store(&nd)
		}
	}
	s.mu.Unlock()
	s.slot(loc).Store(rec)
	return loc, nil
}

func (s *memStore) Read(loc uint64, _ []byte) (engines.Record, bool, error) {
	p := s.slot(loc)
	if p == nil {
		return engines.Record{}, false, nil
	}
	rec := p.Load()
	if rec == nil {
		return engines.Record{}, false, nil
	}
	return rec.record(), true, nil
}

func (r *memRecord) record() engines.Record {
	return engines.Record{Key: r.kv[:r.klen:r.klen], Value: r.kv[r.klen:], ExpiresAt: r.expiresAt}
}

// Write appends the puts of ops; tombstones have nothing to record.
func (s *memStore) Write(ops []diskstore.Op, locs []uint64) error {
	for i := range ops {
		if ops[i].Tombstone {
			locs[i] = 0
			continue
		}
		loc, err := s.Append(ops[i].Record)
		if err != nil {
			for j := range i {
				if !ops[j].Tombstone {
					_ = s.Free(locs[j], ops[j].Record)
				}
			}
			return err
		}
		locs[i] = loc
	}
	return nil
}

// Tombstone has nothing to record: memory does not survive a restart.
func (s *memStore) Tombstone([]byte, uint64) error { return nil }

// Commit has nothing to make durable.
func (s *memStore) Commit() error { return nil }

func (s *memStore) Free(loc uint64, _ engines.Record) error {
	s.slot(loc).Store(nil)
	s.mu.Lock()
	if s.scans > 0 {
		s.deferred = append(s.deferred, loc)
	} else {
		s.free = append(s.free, loc)
	}
	s.mu.Unlock()
	return nil
}

func (s *memStore) Scan(fn func(loc uint64, r engines.Record) error) error {
	s.mu.Lock()
	s.scans++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if s.scans--; s.scans == 0 {
			s.free = append(s.free, s.deferred...)
			s.deferred = nil
		}
		s.mu.Unlock()
	}()
	// The directory is reloaded per chunk so chunks added during the scan
	// (by writes that moved records forward) are read too. The scan ends
	// once it catches up with the writers.
	for ci := 0; ; ci++ {
		d := *s.chunks.Load()
		if ci >= len(d) {
			return nil
		}
		c := d[ci]
		for i := range c {
			rec := c[i].Load()
			if rec == nil {
				continue
			}
			if err := fn(uint64(ci)<<memChunkShift|uint64(i), rec.record()); err != nil {
				return err
			}
		}
	}
}

// Close keeps the records: in-flight readers may still use them, and the
// garbage collector frees them with the store.
func (s *memStore) Close() error { return nil }
