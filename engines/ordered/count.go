package ordered

import (
	"bytes"
	"errors"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/tabuladb/tabula/engines"
)

// Stats.Keys and Stats.Bytes without a read before every write.
//
// A put does not read the key's previous record (RATIONALE.md, "The ordered
// engine": that read was 88% of a put's CPU). Instead the counts are exact
// as of an epoch snapshot, and every write since then is noted, in commit
// order, in its key's stripe (under the stripe lock it commits under): the
// key and its new value length, or a delete. Reconciling an epoch cuts it
// (all stripe locks held: the notes taken, the snapshot retired), then for
// each distinct noted key reads its record in the retired snapshot (sorted
// seeks of one iterator) and adds its last note's effect minus that:
//
//	keys  += Σ (last note is a put) - (stored at the snapshot)
//	bytes += Σ (len(key)+len(value) if a put) - (len(key)+len(old value) if stored)
//
// Keys no note names did not change between the snapshot and the cut, so
// the counts are exact at the cut. The next epoch's snapshot is taken by
// the first writer after the cut, before it commits, so it holds exactly
// the state at the cut. Stats reconciles before it answers, so Stats.Keys
// and Stats.Bytes stay exact; a writer whose notes pass reconcileAt starts
// a background reconcile, which bounds the notes' memory and the snapshot's
// age. The reads move from every put to one per distinct key per epoch,
// off the put's path.

// reconcileAt is the number of pending notes (over all stripes) at which a
// writer starts a background reconcile: 64 Ki notes hold their keys and
// 16 bytes each, ~2 MiB of 16-byte keys, ~5 MiB of the gateway's ~60-byte
// ones. Engine.reconcileAt is set
// from it at open; tests lower it to make epochs short.
const reconcileAt = 64 << 10

// note is one write since the epoch's snapshot: its key is
// stripe.keys[previous note's end:end].
type note struct {
	end  int
	vlen int // the new value's length; -1: a delete
}

// noteLocked records a write of key (vlen -1: a delete) that committed
// under s's lock, which the caller holds.
func (s *stripe) noteLocked(key []byte, vlen int) {
	s.keys = append(s.keys, key...)
	s.notes = append(s.notes, note{end: len(s.keys), vlen: vlen})
}

// beginWrite makes sure the epoch has its snapshot before a write commits.
// The caller holds the stripe lock(s) of its keys, so no reconcile can cut
// between this and its notes.
func (e *Engine) beginWrite() {
	if e.snap.Load() != nil {
		return
	}
	e.snapMu.Lock()
	if e.snap.Load() == nil {
		e.snap.Store(e.db.NewSnapshot())
	}
	e.snapMu.Unlock()
}

// endWrite counts n notes just made and starts a background reconcile if
// they pass reconcileAt and none is running.
func (e *Engine) endWrite(n int) {
	if e.pending.Add(int64(n)) < e.reconcileAt || !e.reconciling.CompareAndSwap(false, true) {
		return
	}
	e.bg.Add(1)
	go func() {
		defer e.bg.Done()
		defer e.reconciling.Store(false)
		if !e.enter() {
			return // Close reconciles
		}
		defer e.exit()
		e.reconcile()
	}()
}

// epoch is what a cut takes: the retired snapshot and the notes made since it.
type epoch struct {
	snap  *pebble.Snapshot
	keys  [numStripes][]byte
	notes [numStripes][]note
}

// cutLocked ends the current epoch; the caller holds countMu. With all
// stripes locked no write is between its snapshot and its notes, so every
// write the notes name is in the state the next snapshot will hold. With
// view it also returns a snapshot of the state at the cut.
func (e *Engine) cutLocked(view bool) (*epoch, *pebble.Snapshot) {
	var all stripeSet
	for i := range all {
		all[i] = ^uint64(0)
	}
	ep := &epoch{}
	e.lockSet(&all)
	ep.snap = e.snap.Swap(nil)
	for i := range e.stripes {
		s := &e.stripes[i]
		ep.keys[i], ep.notes[i] = s.keys, s.notes
		// Sized as the last epoch's: a steady writer appends without
		// growing them, an idle stripe holds nothing.
		s.keys, s.notes = nil, nil
		if n := len(ep.notes[i]); n > 0 {
			s.keys, s.notes = make([]byte, 0, len(ep.keys[i])), make([]note, 0, n)
		}
	}
	e.pending.Store(0)
	var snap *pebble.Snapshot
	if view {
		snap = e.db.NewSnapshot()
	}
	e.unlockSet(&all)
	return ep, snap
}

// reconcile brings Keys and Bytes up to date with the writes so far. Safe
// for concurrent use (reconciles serialise on countMu); the caller is
// inside enter.
func (e *Engine) reconcile() {
	e.countMu.Lock()
	defer e.countMu.Unlock()
	if e.snap.Load() == nil {
		return // no write since the last cut
	}
	ep, _ := e.cutLocked(false)
	defer ep.snap.Close()
	dk, db, dr, err := ep.delta()
	if err != nil {
		// A record unreadable in the snapshot (corruption): its change is
		// counted as if it had been absent; the next Open recounts.
		e.opts.Logger.Error("ordered: reconcile key counts; they may be off until the engine reopens", "err", err)
	}
	e.keys.Add(dk)
	e.bytes.Add(db)
	e.reserved.Add(dr)
}

// keyNote is a note with its key, for sorting; seq orders one key's notes.
type keyNote struct {
	key  []byte
	seq  int
	vlen int
}

// delta is the change in key and byte counts the epoch's notes make to
// the state in its snapshot.
func (ep *epoch) delta() (dk, dbytes, dreserved int64, err error) {
	var n int
	for _, ns := range ep.notes {
		n += len(ns)
	}
	if n == 0 {
		return 0, 0, 0, nil
	}
	all := make([]keyNote, 0, n)
	for i, ns := range ep.notes {
		start := 0
		for _, nt := range ns {
			all = append(all, keyNote{key: ep.keys[i][start:nt.end], seq: len(all), vlen: nt.vlen})
			start = nt.end
		}
	}
	// One key's notes are in one stripe, in commit order: seq keeps it.
	slices.SortFunc(all, func(a, b keyNote) int {
		if c := bytes.Compare(a.key, b.key); c != 0 {
			return c
		}
		return a.seq - b.seq
	})
	it, err := ep.snap.NewIter(nil)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("reconcile key counts: %w", wrapPebble(err))
	}
	var errs error
	for i := 0; i < len(all); {
		j := i + 1
		for j < len(all) && bytes.Equal(all[j].key, all[i].key) {
			j++
		}
		k, last := all[i].key, all[j-1]
		i = j
		var r int64 // counts reserved keys (engines.SharedKey) besides
		if engines.SharedKey(k) {
			r = 1
		}
		if last.vlen >= 0 {
			dk++
			dreserved += r
			dbytes += int64(len(k)) + int64(last.vlen)
		}
		// Ascending seeks: pebble steps forward instead of seeking afresh
		// when the next key is near.
		if !it.SeekGE(k) || !bytes.Equal(it.Key(), k) {
			continue
		}
		raw, verr := it.ValueAndErr()
		if verr == nil {
			var v []byte
			v, _, verr = decodeValue(raw)
			if verr == nil {
				dk--
				dreserved -= r
				dbytes -= int64(len(k) + len(v))
				continue
			}
		}
		if errs == nil {
			errs = fmt.Errorf("reconcile key counts: key %q: %w", k, wrapPebble(verr))
		}
	}
	if err := it.Close(); err != nil && errs == nil {
		errs = fmt.Errorf("reconcile key counts: %w", wrapPebble(err))
	}
	return dk, dbytes, dreserved, errs
}

// count sets Keys and Bytes from the stored records: at Open, and after an
// excise removed records without writes. Notes pending are dropped: the
// snapshot counted holds their writes, and no write commits between it and
// the next epoch's snapshot (writers take that before they commit).
func (e *Engine) count() error {
	e.countMu.Lock()
	defer e.countMu.Unlock()
	// The view is taken at the cut, so it holds exactly the state the
	// next epoch's snapshot will.
	ep, snap := e.cutLocked(true)
	if ep.snap != nil {
		ep.snap.Close()
	}
	defer snap.Close()
	it, err := snap.NewIter(nil)
	if err != nil {
		return fmt.Errorf("count records: %w", wrapPebble(err))
	}
	var n, b, r int64
	for ok := it.First(); ok; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			return errors.Join(fmt.Errorf("count records: %w", wrapPebble(err)), it.Close())
		}
		val, _, err := decodeValue(v)
		if err != nil {
			return errors.Join(fmt.Errorf("count records: key %q: %w", it.Key(), err), it.Close())
		}
		n++
		b += int64(len(it.Key()) + len(val))
		if engines.SharedKey(it.Key()) {
			r++
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("count records: %w", wrapPebble(err))
	}
	e.keys.Store(n)
	e.bytes.Store(b)
	e.reserved.Store(r)
	return nil
}
