package point

import (
	"bytes"
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/point/lhash"
	"github.com/tabuladb/tabula/internal/keyspace"
)

// Errors of the point engine.
var (
	// ErrStorageUnavailable: Options.Storage names a back end this build does
	// not have yet.
	ErrStorageUnavailable = errors.New("point: storage back end not available")
	// ErrEmptyKey: a write named the empty key.
	ErrEmptyKey = errors.New("point: empty key")
	// ErrBatchShape: GetBatch's slices differ in length.
	ErrBatchShape = errors.New("point: GetBatch slices differ in length")
)

// StorageMemory is the in-memory back end, the default.
const StorageMemory = "memory"

func init() {
	engines.Register(engines.KindPoint, func(opts engines.Options) (engines.Engine, error) {
		return Open(opts)
	})
}

// 256 stripes: two writers on distinct keys collide 1 time in 256, and a
// batch of up to api.MaxBatchKeys (1000) keys locks at most all of them.
const numStripes = 256

// 8 counter shards, picked by key hash, so that two cores counting reads do
// not bounce one cache line (~40 ns per op on this 2-core box otherwise).
const numShards = 8

type stripe struct {
	sync.Mutex
	_ [56]byte
}

type shard struct {
	reads, writes, bytes atomic.Int64
	_                    [40]byte
}

// Engine is the point engine: a linear-hashing index over a ValueStore. It
// is safe for concurrent use.
//
// Writers serialise per key through 256 hash-striped mutexes (a batch locks
// its stripes in ascending order); readers take no lock. What is durable when
// a write returns is the store's to say: with the memory store, nothing.
type Engine struct {
	opts   engines.Options
	ix     *lhash.Index
	store  ValueStore
	closed atomic.Bool

	stripes [numStripes]stripe
	shards  [numShards]shard
}

var (
	_ engines.Engine      = (*Engine)(nil)
	_ engines.Writer      = (*Engine)(nil)
	_ engines.BatchGetter = (*Engine)(nil)
)

// Open opens a point engine with the back end opts.Storage names ("" or
// "memory" today).
func Open(opts engines.Options) (*Engine, error) {
	switch opts.Storage {
	case "", StorageMemory:
		return OpenStore(opts, NewMemoryStore()), nil
	default:
		return nil, fmt.Errorf("open point engine: storage %q: %w (only %q exists until the SSD disk store lands with the disk-store issue)",
			opts.Storage, ErrStorageUnavailable, StorageMemory)
	}
}

// OpenStore opens a point engine over an empty store; the engine owns it
// from then on and closes it.
func OpenStore(opts engines.Options, store ValueStore) *Engine {
	e := &Engine{opts: opts.WithDefaults(), store: store}
	e.ix = lhash.New(e.hashAt)
	return e
}

// hashAt is the index's Hasher: the hash of the key stored at loc. The index
// calls it under a bucket lock, so loc is live.
func (e *Engine) hashAt(loc uint64) uint64 {
	r, ok, err := e.store.Read(loc, nil)
	if err != nil || !ok {
		// The memory store cannot fail here; a disk store must keep what
		// splits need readable (see lhash.Hasher).
		panic(fmt.Sprintf("point: index entry %d unreadable during split: ok=%v err=%v", loc, ok, err))
	}
	return keyspace.Hash(r.Key)
}

func (e *Engine) shard(h uint64) *shard { return &e.shards[h>>32&(numShards-1)] }

func (e *Engine) stripeOf(h uint64) int { return int(h >> 40 & (numStripes - 1)) }

func (e *Engine) expired(r engines.Record) bool {
	return r.ExpiresAt > 0 && r.ExpiresAt <= e.opts.Now()
}

func recordBytes(r engines.Record) int64 { return int64(len(r.Key) + len(r.Value)) }

func clone(b []byte) []byte { return append(make([]byte, 0, len(b)), b...) }

// find returns the record the index holds for key (expired or not). It takes
// no lock: the index retries if the record moves under it.
func (e *Engine) find(h uint64, key []byte) (rec engines.Record, loc uint64, ok bool, err error) {
	loc, ok = e.ix.Lookup(h, func(l uint64) bool {
		r, present, rerr := e.store.Read(l, nil)
		if rerr != nil {
			err = rerr
			return false
		}
		if present && bytes.Equal(r.Key, key) {
			rec = r
			return true
		}
		return false
	})
	if err != nil && !ok {
		return engines.Record{}, 0, false, fmt.Errorf("read key at %d: %w", loc, err)
	}
	return rec, loc, ok, nil
}

// Get returns a copy of key's value and its expiry, or ErrNotFound.
func (e *Engine) Get(key []byte) ([]byte, int64, error) {
	if e.closed.Load() {
		return nil, 0, engines.ErrClosed
	}
	h := keyspace.Hash(key)
	e.shard(h).reads.Add(1)
	rec, _, ok, err := e.find(h, key)
	switch {
	case err != nil:
		return nil, 0, fmt.Errorf("get: %w", err)
	case !ok:
		return nil, 0, engines.ErrNotFound
	case e.expired(rec):
		e.dropExpired(h, key)
		return nil, 0, engines.ErrNotFound
	}
	return clone(rec.Value), rec.ExpiresAt, nil
}

// GetBatch is a loop of Gets: with records in memory there is no I/O to sort
// or overlap.
func (e *Engine) GetBatch(keys [][]byte, values [][]byte, expires []int64, found []bool) error {
	if len(values) != len(keys) || len(expires) != len(keys) || len(found) != len(keys) {
		return fmt.Errorf("get batch of %d keys into %d values, %d expiries, %d flags: %w",
			len(keys), len(values), len(expires), len(found), ErrBatchShape)
	}
	for i, k := range keys {
		v, exp, err := e.Get(k)
		switch {
		case err == nil:
			values[i], expires[i], found[i] = v, exp, true
		case errors.Is(err, engines.ErrNotFound):
			values[i], expires[i], found[i] = nil, 0, false
		default:
			return fmt.Errorf("get batch key %d: %w", i, err)
		}
	}
	return nil
}

// dropExpired removes key if its record is (still) expired: TTL records are
// freed lazily by the reads that find them.
func (e *Engine) dropExpired(h uint64, key []byte) {
	mu := &e.stripes[e.stripeOf(h)]
	mu.Lock()
	defer mu.Unlock()
	var rec engines.Record
	old, ok := e.ix.Delete(h, func(l uint64) bool {
		r, present, err := e.store.Read(l, nil)
		if err == nil && present && bytes.Equal(r.Key, key) && e.expired(r) {
			rec = r
			return true
		}
		return false
	})
	if ok {
		e.shard(h).bytes.Add(-recordBytes(rec))
		_ = e.store.Free(old) // the memory store cannot fail; the index no longer points there either way
	}
}

// Scan calls fn for every live record. It reads the store in location
// order and passes a record on only if the index still points at it, so a
// replaced version still awaiting its free is not reported.
func (e *Engine) Scan(fn func(engines.Record) error) error {
	if e.closed.Load() {
		return engines.ErrClosed
	}
	return e.store.Scan(func(loc uint64, r engines.Record) error {
		if e.expired(r) {
			return nil
		}
		_, ok := e.ix.Lookup(keyspace.Hash(r.Key), func(l uint64) bool {
			if l != loc {
				return false
			}
			cur, present, err := e.store.Read(l, nil)
			return err == nil && present && bytes.Equal(cur.Key, r.Key)
		})
		if !ok {
			return nil
		}
		return fn(r)
	})
}

// Stats returns the engine's counters. Keys may include expired records not
// yet dropped.
func (e *Engine) Stats() engines.Stats {
	s := engines.Stats{Keys: uint64(e.ix.Len()), IndexBytes: e.ix.MemoryBytes()}
	var b int64
	for i := range e.shards {
		sh := &e.shards[i]
		s.Reads += uint64(sh.reads.Load())
		s.Writes += uint64(sh.writes.Load())
		b += sh.bytes.Load()
	}
	s.Bytes = uint64(max(b, 0))
	return s
}

// Close closes the engine and its store. It is idempotent.
func (e *Engine) Close() error {
	if !e.closed.CompareAndSwap(false, true) {
		return nil
	}
	if err := e.store.Close(); err != nil {
		return fmt.Errorf("close point engine: %w", err)
	}
	return nil
}

// stripeSet is the set of stripes a batch locks, as a bitmap, so locking in
// ascending order needs no sort and no allocation.
type stripeSet [numStripes / 64]uint64

func (s *stripeSet) add(i int) { s[i/64] |= 1 << (i % 64) }

func (e *Engine) lockSet(s *stripeSet) {
	for w, bitsw := range s {
		for bitsw != 0 {
			i := bits.TrailingZeros64(bitsw)
			bitsw &^= 1 << i
			e.stripes[w*64+i].Lock()
		}
	}
}

func (e *Engine) unlockSet(s *stripeSet) {
	for w, bitsw := range s {
		for bitsw != 0 {
			i := bits.TrailingZeros64(bitsw)
			bitsw &^= 1 << i
			e.stripes[w*64+i].Unlock()
		}
	}
}

// putLocked points key at loc (a stored record of n bytes) and frees the
// version it replaces. Caller holds key's stripe.
func (e *Engine) putLocked(h uint64, key []byte, loc uint64, n int64) error {
	var prev engines.Record
	old, replaced := e.ix.Upsert(h, loc, func(l uint64) bool {
		r, present, err := e.store.Read(l, nil)
		if err == nil && present && bytes.Equal(r.Key, key) {
			prev = r
			return true
		}
		return false
	})
	sh := e.shard(h)
	sh.bytes.Add(n)
	if replaced {
		sh.bytes.Add(-recordBytes(prev))
		if err := e.store.Free(old); err != nil {
			return fmt.Errorf("free replaced record at %d: %w", old, err)
		}
	}
	return nil
}

// deleteLocked removes key and reports whether a live record was there.
// Caller holds key's stripe.
func (e *Engine) deleteLocked(h uint64, key []byte) (existed bool, err error) {
	var prev engines.Record
	old, ok := e.ix.Delete(h, func(l uint64) bool {
		r, present, rerr := e.store.Read(l, nil)
		if rerr == nil && present && bytes.Equal(r.Key, key) {
			prev = r
			return true
		}
		return false
	})
	if !ok {
		return false, nil
	}
	e.shard(h).bytes.Add(-recordBytes(prev))
	if err := e.store.Free(old); err != nil {
		return true, fmt.Errorf("free deleted record at %d: %w", old, err)
	}
	return !e.expired(prev), nil
}

// Apply applies batch atomically: it validates it, stores every new record
// (undoing on failure), and only then points the index at them, holding the
// stripes of all its keys so no other writer interleaves. If a key appears
// more than once, its last mutation wins and the others are skipped, so no
// reader sees a state of the key the batch only passes through.
func (e *Engine) Apply(batch []engines.Mutation) error {
	if e.closed.Load() {
		return engines.ErrClosed
	}
	for i := range batch {
		if len(batch[i].Key) == 0 {
			return fmt.Errorf("apply mutation %d of %d: %w", i, len(batch), ErrEmptyKey)
		}
	}
	live := lastWins(batch)
	var (
		hbuf [16]uint64
		lbuf [16]uint64
		set  stripeSet
	)
	hs, locs := hbuf[:0], lbuf[:0]
	for _, i := range live {
		h := keyspace.Hash(batch[i].Key)
		hs = append(hs, h)
		set.add(e.stripeOf(h))
	}
	for j, i := range live {
		m := &batch[i]
		if m.Delete {
			locs = append(locs, 0)
			continue
		}
		loc, err := e.store.Append(engines.Record{Key: m.Key, Value: m.Value, ExpiresAt: m.ExpiresAt})
		if err != nil {
			for k := range j {
				if !batch[live[k]].Delete {
					_ = e.store.Free(locs[k]) // never indexed; best effort
				}
			}
			return fmt.Errorf("apply mutation %d of %d: store: %w", i, len(batch), err)
		}
		locs = append(locs, loc)
	}
	e.lockSet(&set)
	defer e.unlockSet(&set)
	var errs []error
	for j, i := range live {
		m := &batch[i]
		var err error
		if m.Delete {
			_, err = e.deleteLocked(hs[j], m.Key)
		} else {
			err = e.putLocked(hs[j], m.Key, locs[j], int64(len(m.Key)+len(m.Value)))
		}
		if err != nil {
			// The index already holds the batch; a failed free only leaks.
			errs = append(errs, err)
		}
		e.shard(hs[j]).writes.Add(1)
	}
	return errors.Join(errs...)
}

// lastWins returns the indexes of batch's mutations that are the last for
// their key, in batch order.
func lastWins(batch []engines.Mutation) []int {
	out := make([]int, 0, len(batch))
	if len(batch) <= 16 {
	next:
		for i := range batch {
			for j := i + 1; j < len(batch); j++ {
				if bytes.Equal(batch[i].Key, batch[j].Key) {
					continue next
				}
			}
			out = append(out, i)
		}
		return out
	}
	last := make(map[string]int, len(batch))
	for i := range batch {
		last[string(batch[i].Key)] = i
	}
	for i := range batch {
		if last[string(batch[i].Key)] == i {
			out = append(out, i)
		}
	}
	return out
}

// Delete removes key and reports whether a live record was there.
func (e *Engine) Delete(key []byte) (bool, error) {
	if e.closed.Load() {
		return false, engines.ErrClosed
	}
	h := keyspace.Hash(key)
	mu := &e.stripes[e.stripeOf(h)]
	mu.Lock()
	defer mu.Unlock()
	e.shard(h).writes.Add(1)
	existed, err := e.deleteLocked(h, key)
	if err != nil {
		return existed, fmt.Errorf("delete: %w", err)
	}
	return existed, nil
}

// CompareAndSwap applies c if key's current state is the expected one.
func (e *Engine) CompareAndSwap(c engines.CAS) (engines.CASResult, error) {
	if e.closed.Load() {
		return engines.CASResult{}, engines.ErrClosed
	}
	if len(c.Key) == 0 {
		return engines.CASResult{}, fmt.Errorf("compare and swap: %w", ErrEmptyKey)
	}
	h := keyspace.Hash(c.Key)
	mu := &e.stripes[e.stripeOf(h)]
	mu.Lock()
	defer mu.Unlock()
	e.shard(h).writes.Add(1)
	rec, _, found, err := e.find(h, c.Key)
	if err != nil {
		return engines.CASResult{}, fmt.Errorf("compare and swap: %w", err)
	}
	var res engines.CASResult
	if found && !e.expired(rec) {
		res.Existed, res.Current = true, clone(rec.Value)
	}
	if res.Existed != c.ExpectExists || (res.Existed && !bytes.Equal(rec.Value, c.ExpectedValue)) {
		return res, nil
	}
	if c.New.Delete {
		if found {
			if _, err := e.deleteLocked(h, c.Key); err != nil {
				return res, fmt.Errorf("compare and swap: %w", err)
			}
		}
	} else {
		loc, err := e.store.Append(engines.Record{Key: c.Key, Value: c.New.Value, ExpiresAt: c.New.ExpiresAt})
		if err != nil {
			return res, fmt.Errorf("compare and swap: store: %w", err)
		}
		if err := e.putLocked(h, c.Key, loc, int64(len(c.Key)+len(c.New.Value))); err != nil {
			return res, fmt.Errorf("compare and swap: %w", err)
		}
	}
	res.Swapped = true
	return res, nil
}
