package point

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/diskstore"
	"github.com/tabuladb/tabula/internal/keyspace"
)

// ErrNoDir: the ssd storage needs Options.Dir.
var ErrNoDir = errors.New("point: storage \"ssd\" needs Options.Dir")

// OpenDisk opens (creating or reopening) a point engine over the disk store
// in opts.Dir. ds configures the store; its zero value works (its Now and
// Logger default to opts'). Reopening rebuilds the index by replaying the
// log, and starts the store's collector.
//
// Durability (ds.Durability): with diskstore.DurabilitySync (the default)
// Apply, Delete and CompareAndSwap return only once their records are
// fsynced (concurrent writers share one fsync), so a kill -9 loses nothing
// acknowledged; with DurabilityLazy they return at once and a crash loses
// up to ds.FlushInterval of writes. Sync makes everything durable; Close
// syncs too.
func OpenDisk(opts engines.Options, ds diskstore.Options) (*Engine, error) {
	if opts.Dir == "" {
		return nil, fmt.Errorf("open point engine: %w", ErrNoDir)
	}
	opts = opts.WithDefaults()
	if ds.Now == nil {
		ds.Now = opts.Now
	}
	if ds.Logger == nil {
		ds.Logger = opts.Logger
	}
	ds.ViewKey = viewKey
	s, err := diskstore.Open(opts.Dir, ds)
	if err != nil {
		return nil, fmt.Errorf("open point engine: %w", err)
	}
	e := OpenStore(opts, s)
	e.disk, e.ds = s, ds
	e.recov = map[uint64]recMeta{}
	e.recovGone = map[uint64]struct{}{}
	err = s.RecoverIndexed(e.loadEntries, e.replay)
	if err == nil {
		err = e.flushReplay()
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("open point engine: %w", err), s.Close())
	}
	// Persist the index as recovered (the tail's changes as the chain's
	// next delta, or a new base), so the next open reads none of this log.
	if err := s.FinishIndexRecovery(e.recoveredEntries); err != nil {
		e.opts.Logger.Warn("point: index block after recovery not written; the next open scans more log", "dir", opts.Dir, "err", err)
	}
	e.recov, e.recovBase, e.recovGone, e.recovOps, e.recovRecs = nil, nil, nil, nil, nil
	s.StartGC(mover{e})
	return e, nil
}

// viewKey is the disk store's view of a key (diskstore.Options.ViewKey):
// its routing hash, and whether a split keeps it in both children.
func viewKey(key []byte) (uint64, bool) { return keyspace.Hash(key), engines.SharedKey(key) }

// recMeta is what recovery knows of an indexed location.
type recMeta struct {
	hash       uint64
	bytes, exp int64
	shared     bool // engines.SharedKey of the key
}

// loadEntries indexes the entries of the store's index blocks while the
// store recovers (one goroutine, before the engine is shared): locations of
// distinct live records, so they are inserted without comparing keys.
// The index is sized for them first, and for as many more as tailBytes of
// log may add at their average size, so that neither loading them nor
// replaying the tail splits a bucket: a split rehashes its bucket's keys,
// and during recovery an entry's key is a cold read from disk.
func (e *Engine) loadEntries(ens []diskstore.IndexEntry, tailBytes int64) error {
	if err := e.ix.Grow(len(ens) + tailRecords(ens, tailBytes)); err != nil {
		return err
	}
	e.recovBase = ens
	// Insert in bucket order, in 2 halves at once (the halves touch
	// disjoint buckets): a random order would miss the cache on almost
	// every insert once the index outgrows it.
	sorted, bounds := orderForLoad(ens, e.ix.BucketBits())
	var wg sync.WaitGroup
	var bytes, reserved [2][numShards]int64
	mid := bounds[len(bounds)/2]
	for half, part := range [][]diskstore.IndexEntry{sorted[:mid], sorted[mid:]} {
		wg.Go(func() {
			for _, en := range part {
				e.ix.Upsert(en.Hash, en.Loc, func(uint64) bool { return false })
				sh := en.Hash >> 32 & (numShards - 1)
				bytes[half][sh] += en.Bytes
				if en.Marked { // the key is reserved (notePut's mark)
					reserved[half][sh]++
				}
			}
		})
	}
	wg.Wait()
	for i := range numShards {
		e.shards[i].bytes.Add(bytes[0][i] + bytes[1][i])
		e.shards[i].reserved.Add(reserved[0][i] + reserved[1][i])
	}
	return nil
}

// tailRecords is how many records tailBytes of log holds at most if they
// are the size of ens's on average (a quarter more, for the spread).
func tailRecords(ens []diskstore.IndexEntry, tailBytes int64) int {
	if tailBytes <= 0 {
		return 0
	}
	avg := int64(diskstore.RecordHeaderLen + 16)
	if len(ens) > 0 {
		var sum int64
		for _, en := range ens {
			sum += en.Bytes
		}
		avg = int64(diskstore.RecordHeaderLen) + max(sum/int64(len(ens)), 1)
	}
	return int(tailBytes / avg * 5 / 4)
}

// loadGroupBits is log2 of the groups orderForLoad sorts into: 4096 groups
// of the index's buckets, each a few KiB of it.
const loadGroupBits = 12

// orderForLoad returns ens grouped by the primary-bucket bits of their
// hashes (a counting sort, stable) and the start of every group (plus
// len(ens) at the end).
func orderForLoad(ens []diskstore.IndexEntry, bucketBits int) ([]diskstore.IndexEntry, []int) {
	shift := max(bucketBits-loadGroupBits, 0)
	mask := uint64(1)<<bucketBits - 1
	group := func(h uint64) uint64 { return (h & mask) >> shift }
	bounds := make([]int, 1<<loadGroupBits+1)
	for _, en := range ens {
		bounds[group(en.Hash)+1]++
	}
	for i := 1; i < len(bounds); i++ {
		bounds[i] += bounds[i-1]
	}
	next := append([]int(nil), bounds[:len(bounds)-1]...)
	out := make([]diskstore.IndexEntry, len(ens))
	for _, en := range ens {
		g := group(en.Hash)
		out[next[g]] = en
		next[g]++
	}
	return out, bounds
}

// recoveredEntries is every entry of the recovered index: the loaded ones
// the tail did not replace or delete, and the tail's.
func (e *Engine) recoveredEntries() []diskstore.IndexEntry {
	entries := make([]diskstore.IndexEntry, 0, len(e.recovBase)+len(e.recov))
	for _, en := range e.recovBase {
		if _, gone := e.recovGone[en.Loc]; !gone {
			entries = append(entries, en)
		}
	}
	for loc, m := range e.recov {
		entries = append(entries, diskstore.IndexEntry{Hash: m.hash, Loc: loc, Bytes: m.bytes, ExpiresAt: m.exp, Marked: m.shared})
	}
	return entries
}

// recovDrop forgets, during recovery, the entry at loc (replaced or deleted
// by a replayed record).
func (e *Engine) recovDrop(loc uint64) {
	if e.recov == nil {
		return
	}
	if _, ok := e.recov[loc]; ok {
		delete(e.recov, loc)
		return
	}
	e.recovGone[loc] = struct{}{}
}

// replayOp is a logged record replay has met and not applied yet.
type replayOp struct {
	loc  uint64
	h    uint64
	rec  engines.Record // a copy
	tomb bool
}

// Replay batches: the records queued before their keys are compared with
// the index's entries in one read-ahead (see flushReplay).
const (
	replayBatchOps   = 4096
	replayBatchBytes = 8 << 20
)

// replay queues one logged record while the store recovers (one goroutine,
// before the engine is shared); flushReplay applies the queue in log order.
func (e *Engine) replay(loc uint64, r engines.Record, tombstone bool) error {
	rec := engines.Record{Key: clone(r.Key), ExpiresAt: r.ExpiresAt}
	if !tombstone {
		rec.Value = clone(r.Value)
	}
	e.recovOps = append(e.recovOps, replayOp{loc: loc, h: keyspace.Hash(r.Key), rec: rec, tomb: tombstone})
	e.recovOpBytes += len(rec.Key) + len(rec.Value)
	if len(e.recovOps) >= replayBatchOps || e.recovOpBytes >= replayBatchBytes {
		return e.flushReplay()
	}
	return nil
}

// flushReplay applies the queued records in log order. Putting a key
// compares it with the keys of the index entries of its hash tag, each
// a record to read: during recovery those are cold on disk, and read one
// at a time they made the replay of a few thousand overwrites the bulk of
// a restart (~250 ms of 400 for 1M keys after a crash). So the entries
// every queued record will be compared with are gathered first and read
// in one ReadBatchCold (sorted, parallel preads); the queued records
// themselves are known. The comparisons are then the same, exact ones,
// from memory; a record the read-ahead missed (an error, or an entry that
// appeared meanwhile) is read as before.
func (e *Engine) flushReplay() error {
	if len(e.recovOps) == 0 {
		return nil
	}
	known := make(map[uint64]engines.Record, 2*len(e.recovOps))
	var want []uint64
	for _, op := range e.recovOps {
		e.ix.Lookup(op.h, func(l uint64) bool {
			if _, ok := known[l]; !ok {
				known[l] = engines.Record{}
				want = append(want, l)
			}
			return false
		})
	}
	recs := make([]engines.Record, len(want))
	found := make([]bool, len(want))
	errs := make([]error, len(want))
	e.disk.ReadBatchCold(want, recs, found, errs)
	for i, l := range want {
		if found[i] && errs[i] == nil {
			known[l] = recs[i]
		} else {
			delete(known, l) // read it again, when compared, as before
		}
	}
	e.recovRecs = known
	defer func() { e.recovRecs = nil }()
	for i := range e.recovOps {
		op := &e.recovOps[i]
		if err := e.applyReplayed(op.loc, op.h, op.rec, op.tomb); err != nil {
			return err
		}
		if !op.tomb {
			known[op.loc] = op.rec
		}
		e.recovOps[i] = replayOp{}
	}
	e.recovOps, e.recovOpBytes = e.recovOps[:0], 0
	return nil
}

// applyReplayed applies one logged record to the index during recovery.
func (e *Engine) applyReplayed(loc, h uint64, r engines.Record, tombstone bool) error {
	if tombstone {
		prev, old, ok, err := e.find(h, r.Key)
		if err != nil || !ok {
			return err
		}
		return e.unlinkLocked(h, old, prev)
	}
	var rerr error
	e.recov[loc] = recMeta{h, recordBytes(r), r.ExpiresAt, engines.SharedKey(r.Key)}
	return errors.Join(e.putMatching(h, r.Key, loc, r.ExpiresAt, recordBytes(r), &rerr), rerr)
}

// notePut tells the disk store's index blocks that h now points at loc
// (a record of key), replacing old (0: none). Caller holds h's stripe.
func (e *Engine) notePut(h uint64, key []byte, loc, old uint64, n, exp int64) {
	if e.disk == nil {
		return
	}
	e.disk.NoteIndexPut(h, loc, old, n, exp, engines.SharedKey(key))
	if old != 0 && old != loc {
		e.recovDrop(old)
		e.snapKeep(old)
	}
}

// maybeIndexBlock writes a delta index block if enough log was appended
// since the last one. Writers call it after unlocking their stripes.
func (e *Engine) maybeIndexBlock() {
	if e.disk == nil || e.closed.Load() || !e.disk.IndexDeltaDue() {
		return
	}
	if err := e.writeIndexBlock(); err != nil {
		e.opts.Logger.Warn("point: index block not written; restarts scan the log from the last one", "dir", e.opts.Dir, "err", err)
	}
}

// writeIndexBlock cuts the index changes with every stripe held (so no
// writer is between storing a record and noting its index change: the cut
// holds exactly the changes of the records before its log position), then
// persists them. One at a time.
func (e *Engine) writeIndexBlock() error {
	e.blockMu.Lock()
	defer e.blockMu.Unlock()
	for i := range e.stripes {
		e.stripes[i].Lock()
	}
	cut := e.disk.CutIndexDelta()
	for i := range e.stripes {
		e.stripes[i].Unlock()
	}
	return e.disk.WriteIndexDelta(cut)
}

// putMatching is putLocked that reports read errors of the entries it
// compares (recovery must not treat an unreadable entry as another key).
func (e *Engine) putMatching(h uint64, key []byte, loc uint64, exp, n int64, rerr *error) error {
	old, prev, replaced, err := e.upsertLocked(h, key, loc, n, exp)
	if err != nil {
		*rerr = err
	}
	if replaced {
		return e.store.Free(old, prev)
	}
	return nil
}

// Sync makes every write so far durable (whatever the durability mode).
// With the memory store it does nothing.
func (e *Engine) Sync() error {
	if e.closed.Load() {
		return engines.ErrClosed
	}
	if e.disk == nil {
		return nil
	}
	return e.disk.Sync()
}

// DiskStats returns the disk store's counters (log, live and garbage bytes,
// segments, collector work), and false for the memory store.
func (e *Engine) DiskStats() (diskstore.Stats, bool) {
	if e.disk == nil {
		return diskstore.Stats{}, false
	}
	return e.disk.Stats(), true
}

// GC runs the disk store's collector to completion in the caller's
// goroutine and returns how many segments it freed (tests, operators).
func (e *Engine) GC() (int, error) {
	if e.disk == nil {
		return 0, nil
	}
	return e.disk.GC(mover{e})
}

// mover is the engine's side of the collector (diskstore.Mover).
type mover struct{ e *Engine }

var _ diskstore.Mover = mover{}

// Relocate re-appends the record at loc if the index still points there
// (else it is garbage), or drops it with a tombstone if it expired.
func (m mover) Relocate(loc uint64, r engines.Record) error {
	e := m.e
	h := keyspace.Hash(r.Key)
	mu := &e.stripes[e.stripeOf(h)]
	mu.Lock()
	defer mu.Unlock()
	if _, ok := e.ix.Lookup(h, func(l uint64) bool { return l == loc }); !ok {
		return nil
	}
	if e.expired(r) {
		if err := e.disk.Tombstone(r.Key, loc); err != nil {
			return err
		}
		return e.unlinkLocked(h, loc, r)
	}
	nloc, err := e.disk.AppendRelocated(r)
	if err != nil {
		return err
	}
	// Replace exactly the entry at loc (the stripe keeps writers out, so it
	// is still there).
	if _, ok := e.ix.Upsert(h, nloc, func(l uint64) bool { return l == loc }); !ok {
		return fmt.Errorf("relocate record at %d: entry gone under the stripe lock", loc)
	}
	e.notePut(h, r.Key, nloc, loc, recordBytes(r), r.ExpiresAt)
	return e.store.Free(loc, r)
}

// RelocateTombstone keeps a tombstone only while its key is absent.
func (m mover) RelocateTombstone(key []byte, keep func() error) error {
	e := m.e
	h := keyspace.Hash(key)
	mu := &e.stripes[e.stripeOf(h)]
	mu.Lock()
	defer mu.Unlock()
	_, _, ok, err := e.find(h, key)
	if err != nil {
		return err
	}
	if ok {
		return nil
	}
	return keep()
}

// batchScratch is GetBatch's per-call memory, pooled.
type batchScratch struct {
	hs    []uint64
	idx   []int // keys with an index entry
	locs  []uint64
	recs  []engines.Record
	found []bool
	errs  []error
	sink  uint64 // what the touch loads read (kept so they are not dropped)
}

var batchPool = sync.Pool{New: func() any { return new(batchScratch) }}

// getBatchDisk looks every key up in the index first, then has the store
// read all the locations at once (sorted, coalesced, in parallel; see
// diskstore.Store.ReadBatch), and checks each record's key. An index entry
// is taken by its 16-bit tag alone, so a record of another key (a tag
// collision, or a location that went stale because the key was written or
// relocated by the collector after the lookup) fails the key check, and
// that key falls back to a plain Get. A record that is the key's but was
// replaced after the lookup is still a value the key held during the call.
// Values of one batch may share allocations (each capped to its length).
func (e *Engine) getBatchDisk(keys [][]byte, values [][]byte, expires []int64, found []bool) error {
	sc := batchPool.Get().(*batchScratch)
	defer func() {
		clear(sc.recs) // drop references to read buffers
		clear(sc.errs)
		batchPool.Put(sc)
	}()
	sc.hs, sc.idx, sc.locs = sc.hs[:0], sc.idx[:0], sc.locs[:0]
	// Hash every key and touch its bucket first: independent loads, so
	// their cache misses overlap instead of being paid one Lookup at a
	// time. The reads are counted per shard once per batch.
	var sink uint64
	var reads [numShards]int64
	for i, k := range keys {
		values[i], expires[i], found[i] = nil, 0, false
		h := keyspace.Hash(k)
		sc.hs = append(sc.hs, h)
		reads[h>>32&(numShards-1)]++
		sink += e.ix.Touch(h)
	}
	sc.sink = sink
	for i, n := range reads {
		if n != 0 {
			e.shards[i].reads.Add(n)
		}
	}
	for i, h := range sc.hs {
		if loc, ok := e.ix.Lookup(h, func(uint64) bool { return true }); ok {
			sc.idx = append(sc.idx, i)
			sc.locs = append(sc.locs, loc)
		}
	}
	n := len(sc.locs)
	sc.recs = slices.Grow(sc.recs[:0], n)[:n]
	sc.found = slices.Grow(sc.found[:0], n)[:n]
	sc.errs = slices.Grow(sc.errs[:0], n)[:n]
	e.disk.ReadBatch(sc.locs, sc.recs, sc.found, sc.errs)
	for j, i := range sc.idx {
		r := &sc.recs[j]
		switch {
		case sc.errs[j] != nil || !sc.found[j] || !bytes.Equal(r.Key, keys[i]):
			sc.found[j] = false // fall back to Get
			v, exp, err := e.get(sc.hs[i], keys[i])
			switch {
			case err == nil:
				values[i], expires[i], found[i] = v, exp, true
			case !errors.Is(err, engines.ErrNotFound):
				return fmt.Errorf("get batch key %d: %w", i, err)
			}
		case e.expired(*r):
			sc.found[j] = false
			e.dropExpired(sc.hs[i], keys[i])
		default:
			// ReadBatch's records are ours to keep: no second copy.
			values[i], expires[i], found[i] = r.Value, r.ExpiresAt, true
		}
	}
	return nil
}
