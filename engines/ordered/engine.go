package ordered

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/sstable"
	pebblevfs "github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/vfs"
	"github.com/tabuladb/tabula/internal/keyspace"
)

// Errors of the ordered engine.
var (
	// ErrEmptyKey: a write named the empty key.
	ErrEmptyKey = errors.New("ordered: empty key")
	// ErrBatchShape: GetBatch's slices differ in length.
	ErrBatchShape = errors.New("ordered: GetBatch slices differ in length")
	// ErrOptions: engines.Options this engine cannot honour (an unknown
	// storage, durability or compression; a vfs.FS other than the OS's).
	ErrOptions = errors.New("ordered: unsupported options")
	// ErrNotDurable: Sync of an in-memory engine, which holds nothing on
	// disk to make durable.
	ErrNotDurable = errors.New("ordered: an in-memory engine cannot make its writes durable")
)

// Storage back ends (engines.Options.Storage).
const (
	// StorageMemory keeps the LSM on pebble's in-memory file system:
	// nothing is durable. The default when Options.Dir is empty.
	StorageMemory = "memory"
	// StorageSSD keeps the LSM in Options.Dir (required). The default when
	// Options.Dir is set.
	StorageSSD = "ssd"
)

// LazySyncInterval is how often a "lazy" engine fsyncs its write-ahead
// log: a crash loses at most this much of acknowledged writes.
const LazySyncInterval = 100 * time.Millisecond

// bloomBitsPerKey sizes the sstable bloom filters: 10 bits per key is a
// ~1% false-positive rate, so 99 point misses in 100 read no data block.
const bloomBitsPerKey = 10

func init() {
	engines.Register(engines.KindOrdered, func(opts engines.Options) (engines.Engine, error) {
		return Open(opts)
	})
}

// 256 stripes, as in the point engine: writers of distinct keys collide 1
// time in 256; a batch locks its stripes in ascending order.
const numStripes = 256

// stripe is a writers' lock and, under it, the notes of the writes that
// committed under it since the epoch's snapshot (count.go).
type stripe struct {
	sync.Mutex
	keys  []byte
	notes []note
	_     [8]byte // to 64 bytes, a cache line
}

// closedBit marks the engine closed in Engine.state, whose low bits count
// the calls in flight.
const closedBit = int64(1) << 62

// Engine is the ordered engine: records sorted by key (bytewise) in a
// pebble LSM. It is safe for concurrent use.
//
// Readers take no engine lock: each Get, Scan and Range reads a pebble
// point-in-time view. Writers serialise per key through 256 hash-striped
// mutexes, under which they commit one pebble batch and note the write for
// the key counts (count.go); CompareAndSwap and Delete read the key's
// previous record first, Apply does not. What is durable when a write
// returns: see the package comment.
type Engine struct {
	opts engines.Options
	db   *pebble.DB
	wo   *pebble.WriteOptions
	// replayable: pebble's WAL is off and Close flushes the memtables.
	replayable bool
	// memory: the LSM lives on an in-memory FS (WAL off, nothing durable).
	memory bool
	// fs is pebble's file system the engine lives on.
	fs pebblevfs.FS

	// state is closedBit once Close began, plus the calls in flight;
	// drained receives when the last of them leaves a closed engine.
	state   atomic.Int64
	drained chan struct{}
	closeMu sync.Mutex // serialises Close

	cache      *pebble.Cache
	leaveCache func()

	// The lazy syncer (durability "lazy" with the WAL on): dirty says a
	// write happened since its last sync; stop and done end it.
	dirty atomic.Bool
	stop  chan struct{}
	done  chan struct{}

	// written counts pebble writes (bumped after each commits); synced is
	// its value before the last Sync that succeeded: equal, Sync has
	// nothing new to make durable. syncMu serialises Syncs.
	written atomic.Uint64
	synced  atomic.Uint64
	syncMu  sync.Mutex

	reads, writes, syncs atomic.Int64

	// The key and byte counts (count.go). keys and bytes are exact as of
	// the last cut; snap is the epoch's snapshot (nil: no write since the
	// cut), created under snapMu; pending counts the notes in the stripes;
	// reconciling says a background reconcile runs, bg waits for it.
	countMu     sync.Mutex // serialises cuts and reconciles
	keys, bytes atomic.Int64
	reserved    atomic.Int64 // of keys, those engines.SharedKey names
	snap        atomic.Pointer[pebble.Snapshot]
	snapMu      sync.Mutex
	pending     atomic.Int64
	reconciling atomic.Bool
	bg          sync.WaitGroup
	reconcileAt int64 // pending notes that start a reconcile; set at open

	stripes [numStripes]stripe
}

var (
	_ engines.Engine      = (*Engine)(nil)
	_ engines.Writer      = (*Engine)(nil)
	_ engines.BatchGetter = (*Engine)(nil)
)

// Open opens an ordered engine: in memory when opts.Dir is empty or
// opts.Storage is "memory", else pebble files in opts.Dir (created or
// reopened). opts.FS must be nil or vfs.Default: pebble reads and writes
// through its own file-system interface (OpenFS takes one). Open counts the
// stored records (one pass over the keys) for Stats.
func Open(opts engines.Options) (*Engine, error) {
	if opts.FS != nil && opts.FS != vfs.Default {
		return nil, fmt.Errorf("open ordered engine: Options.FS %T: %w (pebble uses its own vfs; see OpenFS)", opts.FS, ErrOptions)
	}
	switch opts.Storage {
	case "":
		if opts.Dir == "" {
			return OpenFS(opts, pebblevfs.NewMem())
		}
		return OpenFS(opts, pebblevfs.Default)
	case StorageMemory:
		opts.Dir = ""
		return OpenFS(opts, pebblevfs.NewMem())
	case StorageSSD:
		if opts.Dir == "" {
			return nil, fmt.Errorf("open ordered engine: storage %q needs Options.Dir: %w", opts.Storage, ErrOptions)
		}
		return OpenFS(opts, pebblevfs.Default)
	default:
		return nil, fmt.Errorf("open ordered engine: storage %q: %w (have %q, %q)", opts.Storage, ErrOptions, StorageMemory, StorageSSD)
	}
}

// OpenFS opens an ordered engine keeping its files in opts.Dir (or the
// root, if empty) of fs, pebble's file system: tests pass a
// pebblevfs.NewCrashableMem to cut power or an errorfs to inject faults.
// opts.Storage and opts.FS are ignored. An engine on a MemFS with an empty
// Dir is an in-memory engine: WAL off, nothing durable.
func OpenFS(opts engines.Options, fs pebblevfs.FS) (*Engine, error) {
	return openFS(opts, fs, nil)
}

// openFS is OpenFS with tune, if set, adjusting pebble's options last
// (tests shrink the memtable to force flushes).
func openFS(opts engines.Options, fs pebblevfs.FS, tune func(*pebble.Options)) (*Engine, error) {
	opts = opts.WithDefaults()
	e := &Engine{opts: opts, drained: make(chan struct{}, 1), fs: fs, reconcileAt: reconcileAt}
	_, memFS := fs.(*pebblevfs.MemFS)
	e.memory = memFS && opts.Dir == ""
	e.replayable = opts.Replayable && !e.memory

	po := &pebble.Options{
		FS:                 fs,
		FormatMajorVersion: pebble.FormatNewest,
		Logger:             slogLogger{opts},
		// Pebble's WAL is off when the owner's commit log is the durable
		// record (Replayable), and in memory, where nothing survives.
		DisableWAL: e.replayable || e.memory,
	}
	for i := range po.Levels {
		po.Levels[i].FilterPolicy = bloom.FilterPolicy(bloomBitsPerKey)
	}
	switch opts.Compression {
	case "", "none":
		po.ApplyCompressionSettings(func() pebble.DBCompressionSettings {
			return pebble.UniformDBCompressionSettings(sstable.NoCompression)
		})
	case "s2":
		// Snappy: S2 is its extension; pebble has no S2 proper.
		po.ApplyCompressionSettings(func() pebble.DBCompressionSettings {
			return pebble.UniformDBCompressionSettings(sstable.SnappyCompression)
		})
	default:
		return nil, fmt.Errorf("open ordered engine: compression %q: %w (want \"none\" or \"s2\")", opts.Compression, ErrOptions)
	}
	switch {
	case e.replayable || e.memory:
		// Nothing to sync per write: the owner's log (or nothing) is the
		// durable record.
		e.wo = pebble.NoSync
	case opts.Durability == "" || opts.Durability == "sync":
		e.wo = pebble.Sync
	case opts.Durability == "lazy":
		e.wo = pebble.NoSync
		e.stop, e.done = make(chan struct{}), make(chan struct{})
	default:
		return nil, fmt.Errorf("open ordered engine: durability %q: %w (want \"sync\" or \"lazy\")", opts.Durability, ErrOptions)
	}
	if opts.CacheBudget != nil {
		// A pebble cache cannot be resized: it is sized to the share it
		// gets when it joins and keeps that size (members joining later
		// shrink the others, not it).
		e.cache = pebble.NewCache(opts.CacheBudget.Share())
		e.leaveCache = opts.CacheBudget.Join(fixedCache{})
		po.Cache = e.cache
	}
	if tune != nil {
		tune(po)
	}
	dir := opts.Dir
	if dir == "" {
		dir = "db"
	}
	db, err := pebble.Open(dir, po)
	if err != nil {
		e.releaseCache()
		return nil, fmt.Errorf("open ordered engine in %q: %w", dir, wrapPebble(err))
	}
	e.db = db
	if err := e.count(); err != nil {
		e.releaseCache()
		return nil, errors.Join(fmt.Errorf("open ordered engine in %q: %w", dir, err), db.Close())
	}
	if e.stop != nil {
		go e.syncLoop()
	}
	return e, nil
}

// syncLoop fsyncs the WAL every LazySyncInterval if anything was written.
func (e *Engine) syncLoop() {
	defer close(e.done)
	t := time.NewTicker(LazySyncInterval)
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
			if e.dirty.Swap(false) {
				if err := e.syncWAL(); err != nil {
					e.opts.Logger.Error("ordered: lazy WAL sync failed; retrying", "err", err)
					e.dirty.Store(true)
				}
			}
		}
	}
}

// syncWAL makes every write so far durable: an empty record written with
// Sync waits for the WAL fsync that covers everything before it.
func (e *Engine) syncWAL() error {
	if err := e.db.LogData(nil, pebble.Sync); err != nil {
		return fmt.Errorf("sync WAL: %w", wrapPebble(err))
	}
	e.syncs.Add(1)
	return nil
}

// Sync makes every write that returned before it was called durable, by
// the means the engine's mode has:
//
//   - Replayable (pebble's WAL off): it flushes the memtables to sstables;
//     pebble fsyncs them and the MANIFEST naming them before Flush
//     returns, so the applied LSN the owner wrote with its last record
//     survives a crash (RATIONALE.md, "The ordered engine").
//   - "sync" and "lazy" (the WAL on): it fsyncs the WAL.
//   - In memory: nothing can be durable; it returns ErrNotDurable.
//
// A Sync with no write since the last one that succeeded returns at once.
// A flush that fails is retried by pebble in the background and Sync
// waits for it. Safe for concurrent use.
func (e *Engine) Sync() error {
	if !e.enter() {
		return engines.ErrClosed
	}
	defer e.exit()
	if e.memory {
		return ErrNotDurable
	}
	e.syncMu.Lock()
	defer e.syncMu.Unlock()
	// Writes counted by now committed before the flush (or WAL sync)
	// below starts, so it covers them.
	w := e.written.Load()
	if w == e.synced.Load() {
		return nil
	}
	if e.replayable {
		if err := e.db.Flush(); err != nil {
			return fmt.Errorf("sync: flush memtables: %w", wrapPebble(err))
		}
		e.syncs.Add(1)
	} else if err := e.syncWAL(); err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	e.synced.Store(w)
	return nil
}

// enter admits a call unless the engine is closed; exit must follow.
func (e *Engine) enter() bool {
	if e.state.Add(1)&closedBit != 0 {
		e.exit()
		return false
	}
	return true
}

func (e *Engine) exit() {
	if e.state.Add(-1) == closedBit {
		select {
		case e.drained <- struct{}{}:
		default:
		}
	}
}

func (e *Engine) releaseCache() {
	if e.leaveCache != nil {
		e.leaveCache()
	}
	if e.cache != nil {
		e.cache.Unref()
	}
}

// Close waits for the calls in flight, stops the syncer, makes what was
// written durable (a Replayable engine flushes its memtables, so a clean
// restart replays nothing of the owner's log; a lazy one syncs its WAL)
// and closes pebble. It is idempotent; calls after it return ErrClosed.
func (e *Engine) Close() error {
	e.closeMu.Lock()
	defer e.closeMu.Unlock()
	for {
		v := e.state.Load()
		if v&closedBit != 0 {
			return nil
		}
		if e.state.CompareAndSwap(v, v|closedBit) {
			break
		}
	}
	for e.state.Load() != closedBit {
		<-e.drained
	}
	e.bg.Wait()
	// Stats after Close answers from the counters: bring them up to date.
	e.reconcile()
	var errs []error
	if e.stop != nil {
		close(e.stop)
		<-e.done
		if e.dirty.Load() {
			errs = append(errs, e.syncWAL())
		}
	}
	if e.replayable {
		if err := e.db.Flush(); err != nil {
			errs = append(errs, fmt.Errorf("flush memtables: %w", wrapPebble(err)))
		}
	}
	if err := e.db.Close(); err != nil {
		errs = append(errs, wrapPebble(err))
	}
	e.releaseCache()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close ordered engine: %w", err)
	}
	return nil
}

func (e *Engine) expired(exp int64) bool { return exp > 0 && exp <= e.opts.Now() }

// lookup reads key's stored record: its value (a copy when copyOut, else
// nil), expiry and value length, or ok false if pebble holds none.
func (e *Engine) lookup(key []byte, copyOut bool) (val []byte, exp int64, n int, ok bool, err error) {
	raw, closer, err := e.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, 0, 0, false, nil
	}
	if err != nil {
		return nil, 0, 0, false, wrapPebble(err)
	}
	defer closer.Close()
	v, exp, err := decodeValue(raw)
	if err != nil {
		return nil, 0, 0, false, fmt.Errorf("key %q: %w", key, err)
	}
	if copyOut {
		val = append(make([]byte, 0, len(v)), v...)
	}
	return val, exp, len(v), true, nil
}

// Get returns a copy of key's value and its expiry, or ErrNotFound. A
// record found expired is dropped (a delete, under the key's stripe).
func (e *Engine) Get(key []byte) ([]byte, int64, error) {
	if !e.enter() {
		return nil, 0, engines.ErrClosed
	}
	defer e.exit()
	return e.get(key)
}

func (e *Engine) get(key []byte) ([]byte, int64, error) {
	e.reads.Add(1)
	v, exp, _, ok, err := e.lookup(key, true)
	switch {
	case err != nil:
		return nil, 0, fmt.Errorf("get: %w", err)
	case !ok:
		return nil, 0, engines.ErrNotFound
	case e.expired(exp):
		e.dropExpired(key)
		return nil, 0, engines.ErrNotFound
	}
	return v, exp, nil
}

// dropExpired deletes key if its record is (still) expired: pebble has no
// compaction filter, so TTL records are freed by the reads that find them
// (and by overwrites and deletes). A failure leaves the record, still
// expired, for a later read.
func (e *Engine) dropExpired(key []byte) {
	mu := &e.stripes[stripeOf(key)]
	mu.Lock()
	defer mu.Unlock()
	_, exp, _, ok, err := e.lookup(key, false)
	if err != nil || !ok || !e.expired(exp) {
		return
	}
	e.beginWrite()
	if err := e.db.Delete(key, e.wo); err != nil {
		return
	}
	e.noteWrite()
	mu.noteLocked(key, -1)
	e.endWrite(1)
}

// GetBatch fills values[i], expires[i] and found[i] for keys[i], each as
// Get would (a loop of Gets: with bloom filters a miss costs no block read,
// and pebble has no multi-get to overlap reads with).
func (e *Engine) GetBatch(keys [][]byte, values [][]byte, expires []int64, found []bool) error {
	if len(values) != len(keys) || len(expires) != len(keys) || len(found) != len(keys) {
		return fmt.Errorf("get batch of %d keys into %d values, %d expiries, %d flags: %w",
			len(keys), len(values), len(expires), len(found), ErrBatchShape)
	}
	if !e.enter() {
		return engines.ErrClosed
	}
	defer e.exit()
	for i, k := range keys {
		v, exp, err := e.get(k)
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

// Scan calls fn for every live record in ascending key order. It reads one
// pebble point-in-time view: every record unchanged during the scan is seen
// exactly once, and writes during it are not seen. No engine lock is held
// while fn runs; fn may call Get but must not write (it would not deadlock,
// but see engines.Engine). The Record's slices are valid only during fn.
func (e *Engine) Scan(fn func(engines.Record) error) error {
	return e.Range(nil, nil, false, fn)
}

// Range calls fn for every live record with lo <= key < hi, in ascending
// key order, or descending when reverse; a nil lo or hi is unbounded. Its
// consistency contract is Scan's: one point-in-time view, each record once,
// expired records skipped, fn's first error stops it and is returned, the
// Record's slices valid only during fn. An empty range (lo >= hi) calls fn
// never.
//
// Range is the ordered-read capability the lead may lift into an engines
// interface (engines.Ranger) with exactly this signature.
func (e *Engine) Range(lo, hi []byte, reverse bool, fn func(engines.Record) error) error {
	if !e.enter() {
		return engines.ErrClosed
	}
	defer e.exit()
	if lo != nil && hi != nil && bytes.Compare(lo, hi) >= 0 {
		return nil
	}
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return fmt.Errorf("range: %w", wrapPebble(err))
	}
	now := e.opts.Now()
	var ferr error
	step, ok := it.Next, it.First()
	if reverse {
		step, ok = it.Prev, it.Last()
	}
	for ; ok; ok = step() {
		raw, err := it.ValueAndErr()
		if err != nil {
			ferr = fmt.Errorf("range: %w", wrapPebble(err))
			break
		}
		v, exp, err := decodeValue(raw)
		if err != nil {
			ferr = fmt.Errorf("range: key %q: %w", it.Key(), err)
			break
		}
		if exp > 0 && exp <= now {
			continue
		}
		if err := fn(engines.Record{Key: it.Key(), Value: v, ExpiresAt: exp}); err != nil {
			ferr = err
			break
		}
	}
	if err := it.Close(); err != nil && ferr == nil {
		ferr = fmt.Errorf("range: %w", wrapPebble(err))
	}
	return ferr
}

// Stats returns the engine's counters. Keys and Bytes count every stored
// record, including expired ones not yet dropped, exactly: writes do not
// read the records they replace, so Stats first reconciles the writes since
// the last reconcile, reading one record per distinct key they wrote
// (count.go); after Close they are the counts at Close. Open engines also report
// pebble's view: LiveBytes the sstables' size, Segments their number,
// IndexBytes the memtables' size, CacheHits and CacheMisses the block
// cache's, Syncs the lazy WAL syncs and the flushes of Sync.
func (e *Engine) Stats() engines.Stats {
	s := engines.Stats{
		Keys:         uint64(max(e.keys.Load(), 0)),
		ReservedKeys: uint64(max(e.reserved.Load(), 0)),
		Bytes:        uint64(max(e.bytes.Load(), 0)),
		Reads:        uint64(e.reads.Load()),
		Writes:       uint64(e.writes.Load()),
		Syncs:        uint64(e.syncs.Load()),
	}
	if !e.enter() {
		return s
	}
	defer e.exit()
	e.reconcile()
	s.Keys, s.Bytes = uint64(max(e.keys.Load(), 0)), uint64(max(e.bytes.Load(), 0))
	s.ReservedKeys = min(uint64(max(e.reserved.Load(), 0)), s.Keys)
	m := e.db.Metrics()
	s.IndexBytes = m.MemTable.Size
	for _, l := range m.Levels {
		s.LiveBytes += uint64(l.TablesSize)
		s.Segments += uint64(l.TablesCount)
	}
	s.CacheHits, s.CacheMisses = uint64(m.BlockCache.Hits), uint64(m.BlockCache.Misses)
	return s
}

// Apply applies batch atomically as one pebble batch: readers see all of it
// or none, and after a crash it is there whole or not at all. If a key
// appears more than once its last mutation wins. Writers of its keys wait
// (the stripes of all its keys are held, in ascending order). It reads
// nothing: puts and deletes go to pebble blind (a delete of an absent key
// writes a tombstone), and the key counts catch up later (count.go).
func (e *Engine) Apply(batch []engines.Mutation) error {
	for i := range batch {
		if len(batch[i].Key) == 0 {
			return fmt.Errorf("apply mutation %d of %d: %w", i, len(batch), ErrEmptyKey)
		}
	}
	if !e.enter() {
		return engines.ErrClosed
	}
	defer e.exit()
	if len(batch) == 0 {
		return nil
	}
	// A batch of one (the common put) skips LastWins' allocation.
	one := [1]int{0}
	live := one[:]
	if len(batch) > 1 {
		live = engines.LastWins(batch)
	}
	var set stripeSet
	for _, i := range live {
		set.add(stripeOf(batch[i].Key))
	}
	e.lockSet(&set)
	defer e.unlockSet(&set)
	b := e.db.NewBatch()
	defer b.Close()
	for _, i := range live {
		m := &batch[i]
		var err error
		if m.Delete {
			err = b.Delete(m.Key, nil)
		} else {
			err = setRecord(b, m.Key, m.Value, m.ExpiresAt)
		}
		if err != nil {
			return fmt.Errorf("apply mutation %d of %d: %w", i, len(batch), err)
		}
	}
	e.writes.Add(int64(len(live)))
	e.beginWrite()
	if err := e.commit(b); err != nil {
		return fmt.Errorf("apply batch of %d: %w", len(batch), err)
	}
	for _, i := range live {
		m := &batch[i]
		vlen := len(m.Value)
		if m.Delete {
			vlen = -1
		}
		e.stripes[stripeOf(m.Key)].noteLocked(m.Key, vlen)
	}
	e.endWrite(len(live))
	return nil
}

// setRecord adds a put of key to b, encoding the value in place.
func setRecord(b *pebble.Batch, key, value []byte, exp int64) error {
	op := b.SetDeferred(len(key), storedLen(value, exp))
	copy(op.Key, key)
	appendValue(op.Value[:0], value, exp)
	return op.Finish()
}

func (e *Engine) commit(b *pebble.Batch) error {
	if err := b.Commit(e.wo); err != nil {
		return wrapPebble(err)
	}
	e.noteWrite()
	return nil
}

func (e *Engine) noteWrite() {
	e.written.Add(1)
	if e.stop != nil && !e.dirty.Load() {
		e.dirty.Store(true)
	}
}

// Delete removes key and reports whether a live record was there.
func (e *Engine) Delete(key []byte) (bool, error) {
	if !e.enter() {
		return false, engines.ErrClosed
	}
	defer e.exit()
	mu := &e.stripes[stripeOf(key)]
	mu.Lock()
	defer mu.Unlock()
	e.writes.Add(1)
	_, exp, _, ok, err := e.lookup(key, false)
	if err != nil {
		return false, fmt.Errorf("delete: %w", err)
	}
	if !ok {
		return false, nil
	}
	e.beginWrite()
	if err := e.db.Delete(key, e.wo); err != nil {
		return false, fmt.Errorf("delete: %w", wrapPebble(err))
	}
	e.noteWrite()
	mu.noteLocked(key, -1)
	e.endWrite(1)
	return !e.expired(exp), nil
}

// CompareAndSwap applies c if key's current state is the expected one,
// holding the key's stripe from the read to the commit.
func (e *Engine) CompareAndSwap(c engines.CAS) (engines.CASResult, error) {
	if !e.enter() {
		return engines.CASResult{}, engines.ErrClosed
	}
	defer e.exit()
	if len(c.Key) == 0 {
		return engines.CASResult{}, fmt.Errorf("compare and swap: %w", ErrEmptyKey)
	}
	mu := &e.stripes[stripeOf(c.Key)]
	mu.Lock()
	defer mu.Unlock()
	e.writes.Add(1)
	cur, exp, _, found, err := e.lookup(c.Key, true)
	if err != nil {
		return engines.CASResult{}, fmt.Errorf("compare and swap: %w", err)
	}
	var res engines.CASResult
	if found && !e.expired(exp) {
		res.Existed, res.Current = true, cur
	}
	if res.Existed != c.ExpectExists || (res.Existed && !bytes.Equal(cur, c.ExpectedValue)) {
		return res, nil
	}
	switch {
	case c.New.Delete && found:
		e.beginWrite()
		if err := e.db.Delete(c.Key, e.wo); err != nil {
			return res, fmt.Errorf("compare and swap: %w", wrapPebble(err))
		}
		e.noteWrite()
		mu.noteLocked(c.Key, -1)
		e.endWrite(1)
	case !c.New.Delete:
		b := e.db.NewBatch()
		defer b.Close()
		if err := setRecord(b, c.Key, c.New.Value, c.New.ExpiresAt); err != nil {
			return res, fmt.Errorf("compare and swap: %w", err)
		}
		e.beginWrite()
		if err := e.commit(b); err != nil {
			return res, fmt.Errorf("compare and swap: %w", err)
		}
		mu.noteLocked(c.Key, len(c.New.Value))
		e.endWrite(1)
	}
	res.Swapped = true
	return res, nil
}

func stripeOf(key []byte) int { return int(keyspace.Hash(key) >> 40 & (numStripes - 1)) }

// stripeSet is the set of stripes a batch locks, as a bitmap, so locking in
// ascending order needs no sort.
type stripeSet [numStripes / 64]uint64

func (s *stripeSet) add(i int) { s[i/64] |= 1 << (i % 64) }

func (e *Engine) lockSet(s *stripeSet) {
	for w, bw := range s {
		for bw != 0 {
			i := bits.TrailingZeros64(bw)
			bw &^= 1 << i
			e.stripes[w*64+i].Lock()
		}
	}
}

func (e *Engine) unlockSet(s *stripeSet) {
	for w, bw := range s {
		for bw != 0 {
			i := bits.TrailingZeros64(bw)
			bw &^= 1 << i
			e.stripes[w*64+i].Unlock()
		}
	}
}

// wrapPebble marks pebble's corruption errors (a block failing its
// checksum) as engines.ErrCorrupt.
func wrapPebble(err error) error {
	if err != nil && errors.Is(err, pebble.ErrCorruption) && !errors.Is(err, engines.ErrCorrupt) {
		return fmt.Errorf("%w: %w", engines.ErrCorrupt, err)
	}
	return err
}

// fixedCache is a budget member that keeps its size: it only makes the
// budget count the pebble cache among its shares.
type fixedCache struct{}

func (fixedCache) SetMaxBytes(int64) {}

// slogLogger passes pebble's log lines to the engine's logger.
type slogLogger struct{ opts engines.Options }

func (l slogLogger) Infof(format string, args ...any) {
	l.opts.Logger.Debug("ordered: pebble: " + fmt.Sprintf(format, args...))
}

func (l slogLogger) Errorf(format string, args ...any) {
	l.opts.Logger.Error("ordered: pebble: " + fmt.Sprintf(format, args...))
}

// Fatalf is pebble reporting a broken invariant: log it and panic.
func (l slogLogger) Fatalf(format string, args ...any) {
	msg := "ordered: pebble: " + fmt.Sprintf(format, args...)
	l.opts.Logger.Error(msg)
	panic(msg)
}

var _ io.Closer = (*Engine)(nil)
