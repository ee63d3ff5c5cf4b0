package point

import (
	"bytes"
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/diskstore"
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

// Storage back ends (engines.Options.Storage).
const (
	// StorageMemory is the in-memory back end, the default.
	StorageMemory = "memory"
	// StorageSSD is the disk store (engines/diskstore) in Options.Dir.
	StorageSSD = "ssd"
)

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
	// reserved counts the index's entries of reserved keys
	// (engines.SharedKey: request outcomes, the applied LSN, ...).
	reserved atomic.Int64
	_        [32]byte
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
	// disk is store when it is the disk store, else nil; ds the options
	// it was opened with (a split's children inherit them).
	disk *diskstore.Store
	ds   diskstore.Options
	// During recovery only (one goroutine, before the engine is shared):
	// recovBase holds the entries loaded from index blocks, recovGone those
	// of them the replayed tail replaced or deleted, and recov the tail's
	// entries (hash and size by location; the index's Hasher answers from it
	// so that tail splits read nothing back). All nil after OpenDisk.
	recov     map[uint64]recMeta
	recovBase []diskstore.IndexEntry
	recovGone map[uint64]struct{}
	// recovOps are replayed records not applied yet, recovOpBytes their
	// size, and recovRecs the records at locations the pending ops will
	// compare keys with, read ahead in one batch (see flushReplay).
	recovOps     []replayOp
	recovOpBytes int
	recovRecs    map[uint64]engines.Record
	// blockMu makes one goroutine at a time write an index block.
	blockMu sync.Mutex

	// snaps are the open snapshots (guarded by snapMu); snapCount is their
	// number, read without the lock on the write path.
	snapMu    sync.Mutex
	snaps     []*Snapshot
	snapCount atomic.Int64

	stripes [numStripes]stripe
	shards  [numShards]shard
}

var (
	_ engines.Engine      = (*Engine)(nil)
	_ engines.Writer      = (*Engine)(nil)
	_ engines.BatchGetter = (*Engine)(nil)
)

// replayableIndexInterval cuts index blocks of a Replayable engine by
// time: a restart replays at most this much of its own log (and then the
// owner's log from the LSN reached).
const replayableIndexInterval = 10 * time.Second

// replayableFlushInterval is how often a Replayable ssd engine writes and
// fsyncs its log in the background.
const replayableFlushInterval = time.Second

// Open opens a point engine with the back end opts.Storage names: "" or
// "memory" (in memory, nothing durable) or "ssd" (the disk store in
// opts.Dir, created or reopened, with the default diskstore.Options: every
// acknowledged write is fsynced; see OpenDisk).
func Open(opts engines.Options) (*Engine, error) {
	switch opts.Storage {
	case "", StorageMemory:
		if opts.Compression != "" && opts.Compression != "none" {
			return nil, fmt.Errorf("open point engine: compression %q applies to the ssd storage only", opts.Compression)
		}
		return OpenStore(opts, NewMemoryStore()), nil
	case StorageSSD:
		ds := diskstore.Options{Compression: diskstore.Compression(opts.Compression), FS: opts.FS, CacheBudget: opts.CacheBudget}
		if err := ds.Validate(); err != nil {
			return nil, fmt.Errorf("open point engine: %w", err)
		}
		switch opts.Durability {
		case "", "sync":
			ds.Durability = diskstore.DurabilitySync
		case "lazy":
			ds.Durability = diskstore.DurabilityLazy
		default:
			return nil, fmt.Errorf("open point engine: durability %q: want \"sync\" or \"lazy\"", opts.Durability)
		}
		if opts.Replayable {
			// The owner's log holds every write: no fsync per write, and
			// index blocks by size (or every replayableIndexInterval) rather
			// than every 250 ms, each of which was a file created and
			// fsynced on the write path of every replica.
			ds.Durability = diskstore.DurabilityLazy
			ds.IndexBlockInterval = replayableIndexInterval
			// Nor a write and fsync every 50 ms: a restart replays the
			// log past what the files hold, and the owner syncs when it
			// needs a durable point (log truncation). Bursts still flush
			// by size (FlushBytes).
			ds.FlushInterval = replayableFlushInterval
		}
		return OpenDisk(opts, ds)
	default:
		return nil, fmt.Errorf("open point engine: storage %q: %w (have %q, %q)",
			opts.Storage, ErrStorageUnavailable, StorageMemory, StorageSSD)
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
// calls it under a bucket lock, so loc is live (the collector moves index
// entries before it frees a segment).
func (e *Engine) hashAt(loc uint64) uint64 {
	if e.recov != nil {
		if m, ok := e.recov[loc]; ok {
			return m.hash
		}
	}
	r, ok, err := e.store.Read(loc, nil)
	if err != nil {
		// A disk record that fails its checksum (or an I/O error) during a
		// split: its key cannot be rehashed. Corruption must not panic the
		// server, so the entry is placed as if its hash were 0 — it may
		// then read as absent instead of corrupt, but is never served.
		e.opts.Logger.Error("point: index entry unreadable during a split; its key may read as absent", "loc", loc, "err", err)
		return 0
	}
	if !ok {
		panic(fmt.Sprintf("point: index entry %d holds no record during a split", loc))
	}
	return keyspace.Hash(r.Key)
}

// readRec reads the record at loc to compare its key, as store.Read;
// during recovery from the records read ahead when it is among them.
func (e *Engine) readRec(loc uint64, buf []byte) (engines.Record, bool, error) {
	if e.recovRecs != nil {
		if r, ok := e.recovRecs[loc]; ok {
			return r, true, nil
		}
	}
	return e.store.Read(loc, buf)
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
	return e.findBuf(h, key, nil)
}

// findBuf is find reading records into buf (see ValueStore.Read): the
// record found may alias it.
func (e *Engine) findBuf(h uint64, key []byte, buf []byte) (rec engines.Record, loc uint64, ok bool, err error) {
	loc, ok = e.ix.Lookup(h, func(l uint64) bool {
		r, present, rerr := e.readRec(l, buf)
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
	return e.get(h, key)
}

// get is Get without the checks and the count.
func (e *Engine) get(h uint64, key []byte) ([]byte, int64, error) {
	bp := readBufs.Get().(*[]byte)
	defer readBufs.Put(bp)
	rec, _, ok, err := e.findBuf(h, key, *bp)
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

// readBufs are the buffers Gets read records into (the value is copied
// out, so one buffer per concurrent Get instead of one per record; larger
// records get their own).
var readBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// GetBatch fills values[i], expires[i] and found[i] for keys[i], each as
// Get would. With the memory store it is a loop of Gets (there is no I/O to
// sort or overlap); with the disk store see getBatchDisk.
func (e *Engine) GetBatch(keys [][]byte, values [][]byte, expires []int64, found []bool) error {
	if len(values) != len(keys) || len(expires) != len(keys) || len(found) != len(keys) {
		return fmt.Errorf("get batch of %d keys into %d values, %d expiries, %d flags: %w",
			len(keys), len(values), len(expires), len(found), ErrBatchShape)
	}
	if e.closed.Load() {
		return engines.ErrClosed
	}
	if e.disk != nil {
		return e.getBatchDisk(keys, values, expires, found)
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
	rec, loc, ok, err := e.find(h, key)
	if err != nil || !ok || !e.expired(rec) {
		return
	}
	// The tombstone goes first: once the index forgets the record, the
	// collector may free its segment, and only the tombstone then keeps an
	// older version from coming back at restart. It needs no commit: the
	// collector syncs before it frees anything.
	if err := e.store.Tombstone(key, loc); err != nil {
		return // the record stays, still expired; a later read retries
	}
	_ = e.unlinkLocked(h, loc, rec) // cannot fail under the stripe lock
}

// Scan calls fn for every live record. With the disk store it scans a
// Snapshot: exactly the records live when it started, each once, in log
// order, with no engine lock held while fn runs and the collector running
// beside it. With the memory store it reads the store in location order
// and passes a record on only if the index still points at it, so a
// replaced version still awaiting its free is not reported.
func (e *Engine) Scan(fn func(engines.Record) error) error {
	if e.closed.Load() {
		return engines.ErrClosed
	}
	if e.disk != nil {
		sn, err := e.Snapshot()
		if err != nil {
			return err
		}
		defer sn.Close()
		return sn.Scan(fn)
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
// yet dropped. With the disk store it also reports the log's live and
// garbage bytes (record bytes with headers; GarbageBytes includes segment
// headers and tombstones), its segment count and the read cache's hits and
// misses (every record read: Get, GetBatch, and the reads writers make to
// find a key's previous version); the memory store leaves them 0.
func (e *Engine) Stats() engines.Stats {
	s := engines.Stats{Keys: uint64(e.ix.Len()), IndexBytes: e.ix.MemoryBytes()}
	var b, reserved int64
	for i := range e.shards {
		sh := &e.shards[i]
		s.Reads += uint64(sh.reads.Load())
		s.Writes += uint64(sh.writes.Load())
		b += sh.bytes.Load()
		reserved += sh.reserved.Load()
	}
	s.Bytes = uint64(max(b, 0))
	s.ReservedKeys = uint64(min(max(reserved, 0), int64(s.Keys)))
	if e.disk != nil {
		ds := e.disk.Stats()
		s.LiveBytes = uint64(ds.LiveBytes)
		s.GarbageBytes = uint64(max(ds.GarbageBytes, 0))
		s.Segments = uint64(ds.Segments)
		s.CacheHits = uint64(ds.CacheHits)
		s.CacheMisses = uint64(ds.CacheMisses)
		s.Syncs, s.GCRuns, s.GCBytesMoved = uint64(ds.Syncs), uint64(ds.GCRuns), uint64(ds.GCBytesMoved)
	}
	return s
}

// Close closes the engine and its store. It is idempotent.
func (e *Engine) Close() error {
	if !e.closed.CompareAndSwap(false, true) {
		return nil
	}
	e.closeSnapshots()
	if e.disk != nil && e.disk.IndexBlocks() {
		// The last delta block, so that the next open reads no log.
		if err := e.writeIndexBlock(); err != nil {
			e.opts.Logger.Warn("point: index block at close; the next open scans more log", "err", err)
		}
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

// upsertLocked points key at loc (a stored, committed record of n bytes),
// accounts its bytes and notes the change for the index blocks. It returns
// the version it replaced, if any (still to be freed), and the last error
// met reading an entry to compare keys. Caller holds key's stripe.
func (e *Engine) upsertLocked(h uint64, key []byte, loc uint64, n, exp int64) (old uint64, prev engines.Record, replaced bool, rerr error) {
	old, replaced = e.ix.Upsert(h, loc, func(l uint64) bool {
		r, present, err := e.readRec(l, nil)
		if err != nil {
			rerr = err
		}
		if err == nil && present && bytes.Equal(r.Key, key) {
			prev = r
			return true
		}
		return false
	})
	sh := e.shard(h)
	sh.bytes.Add(n)
	if !replaced {
		old = 0
		if engines.SharedKey(key) {
			sh.reserved.Add(1)
		}
	}
	e.notePut(h, key, loc, old, n, exp)
	if replaced {
		sh.bytes.Add(-recordBytes(prev))
	}
	return old, prev, replaced, rerr
}

// putLocked points key at loc and frees the version it replaces. Caller
// holds key's stripe.
func (e *Engine) putLocked(h uint64, key []byte, loc uint64, n, exp int64) error {
	old, prev, replaced, rerr := e.upsertLocked(h, key, loc, n, exp)
	if rerr != nil && e.disk != nil {
		// An entry that could not be read may have been this key's: the
		// index may now hold it twice. Keep that out of the index blocks:
		// restarts replay the log from the last block on instead.
		e.disk.StopIndexBlocks(fmt.Errorf("put: compare an index entry: %w", rerr))
	}
	if replaced {
		if err := e.store.Free(old, prev); err != nil {
			return fmt.Errorf("free replaced record at %d: %w", old, err)
		}
	}
	return nil
}

// unlinkLocked removes the index entry of key's record rec at loc and frees
// it. Caller holds key's stripe and has made the delete durable (a
// committed tombstone) if it must be.
func (e *Engine) unlinkLocked(h, loc uint64, rec engines.Record) error {
	if _, ok := e.ix.Delete(h, func(l uint64) bool { return l == loc }); !ok {
		// Every index writer of the key holds its stripe, so the entry
		// cannot have moved since the caller found it.
		return fmt.Errorf("unlink record at %d: entry gone under the stripe lock", loc)
	}
	e.shard(h).bytes.Add(-recordBytes(rec))
	if engines.SharedKey(rec.Key) {
		e.shard(h).reserved.Add(-1)
	}
	if e.disk != nil {
		e.disk.NoteIndexDelete(h, loc)
		e.recovDrop(loc)
		e.snapKeep(loc)
	}
	if err := e.store.Free(loc, rec); err != nil {
		return fmt.Errorf("free deleted record at %d: %w", loc, err)
	}
	return nil
}

// prior is a key's current record, as a writer saw it under the stripe lock.
type prior struct {
	rec engines.Record
	loc uint64
	ok  bool
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
	live := engines.LastWins(batch)
	var (
		hbuf [16]uint64
		set  stripeSet
	)
	hs := hbuf[:0]
	for _, i := range live {
		h := keyspace.Hash(batch[i].Key)
		hs = append(hs, h)
		set.add(e.stripeOf(h))
	}
	defer e.maybeIndexBlock() // after the stripes are unlocked
	e.lockSet(&set)
	defer e.unlockSet(&set)
	// Under the stripes: read what deletes remove, store the batch as one
	// unit, commit it, and only then publish it.
	ops := make([]diskstore.Op, 0, len(live))
	prevs := make([]prior, len(live))
	for j, i := range live {
		m := &batch[i]
		if m.Delete {
			rec, loc, ok, err := e.find(hs[j], m.Key)
			if err != nil {
				return fmt.Errorf("apply mutation %d of %d: %w", i, len(batch), err)
			}
			prevs[j] = prior{rec, loc, ok}
			if ok {
				ops = append(ops, diskstore.Op{Record: engines.Record{Key: m.Key}, Tombstone: true, Shadowed: loc})
			}
			continue
		}
		ops = append(ops, diskstore.Op{Record: engines.Record{Key: m.Key, Value: m.Value, ExpiresAt: m.ExpiresAt}, Cold: m.Cold})
	}
	locs, err := e.write(ops)
	if err != nil {
		return fmt.Errorf("apply batch of %d: %w", len(batch), err)
	}
	var errs []error
	k := 0
	for j, i := range live {
		m := &batch[i]
		e.shard(hs[j]).writes.Add(1)
		if m.Delete {
			if p := prevs[j]; p.ok {
				k++
				if err := e.unlinkLocked(hs[j], p.loc, p.rec); err != nil {
					errs = append(errs, err)
				}
			}
			continue
		}
		if err := e.putLocked(hs[j], m.Key, locs[k], int64(len(m.Key)+len(m.Value)), m.ExpiresAt); err != nil {
			// The index already holds the record; a failed free only leaks.
			errs = append(errs, err)
		}
		k++
	}
	return errors.Join(errs...)
}

// write stores ops as one unit and commits them. On error nothing of ops
// is published and their puts are freed.
func (e *Engine) write(ops []diskstore.Op) ([]uint64, error) {
	locs := make([]uint64, len(ops))
	if len(ops) == 0 {
		return locs, nil
	}
	if err := e.store.Write(ops, locs); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	if err := e.store.Commit(); err != nil {
		for i := range ops {
			if !ops[i].Tombstone {
				_ = e.store.Free(locs[i], ops[i].Record) // never indexed
			}
		}
		return nil, fmt.Errorf("commit: %w", err)
	}
	return locs, nil
}

// Delete removes key and reports whether a live record was there.
func (e *Engine) Delete(key []byte) (bool, error) {
	if e.closed.Load() {
		return false, engines.ErrClosed
	}
	h := keyspace.Hash(key)
	mu := &e.stripes[e.stripeOf(h)]
	defer e.maybeIndexBlock() // after the stripe is unlocked
	mu.Lock()
	defer mu.Unlock()
	e.shard(h).writes.Add(1)
	rec, loc, ok, err := e.find(h, key)
	if err != nil {
		return false, fmt.Errorf("delete: %w", err)
	}
	if !ok {
		return false, nil
	}
	if _, err := e.write([]diskstore.Op{{Record: engines.Record{Key: key}, Tombstone: true, Shadowed: loc}}); err != nil {
		return false, fmt.Errorf("delete: %w", err)
	}
	if err := e.unlinkLocked(h, loc, rec); err != nil {
		return true, fmt.Errorf("delete: %w", err)
	}
	return !e.expired(rec), nil
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
	defer e.maybeIndexBlock() // after the stripe is unlocked
	mu.Lock()
	defer mu.Unlock()
	e.shard(h).writes.Add(1)
	rec, loc, found, err := e.find(h, c.Key)
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
			if _, err := e.write([]diskstore.Op{{Record: engines.Record{Key: c.Key}, Tombstone: true, Shadowed: loc}}); err != nil {
				return res, fmt.Errorf("compare and swap: %w", err)
			}
			if err := e.unlinkLocked(h, loc, rec); err != nil {
				return res, fmt.Errorf("compare and swap: %w", err)
			}
		}
	} else {
		locs, err := e.write([]diskstore.Op{{Record: engines.Record{Key: c.Key, Value: c.New.Value, ExpiresAt: c.New.ExpiresAt}}})
		if err != nil {
			return res, fmt.Errorf("compare and swap: %w", err)
		}
		if err := e.putLocked(h, c.Key, locs[0], int64(len(c.Key)+len(c.New.Value)), c.New.ExpiresAt); err != nil {
			return res, fmt.Errorf("compare and swap: %w", err)
		}
	}
	res.Swapped = true
	return res, nil
}
