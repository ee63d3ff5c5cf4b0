package tableserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/tabuladb/tabula/replication/partition"
	"github.com/tabuladb/tabula/replication/stream"
)

// tailInterval is how often the tailer looks at the log when nothing woke
// it: the wait for the commit point to move is bounded by it too.
const tailInterval = 50 * time.Millisecond

// tailLoop feeds the core the committed records of the log while this
// replica is a secondary or a new primary catching up, and finishes a
// primary's move to the next extent.
func (l *logReplica) tailLoop() {
	defer l.wg.Done()
	t := time.NewTicker(tailInterval)
	defer t.Stop()
	var lastErr string
	var lastLog, failingSince time.Time
	for {
		if !l.followAgain.Swap(false) {
			select {
			case <-l.ctx.Done():
				return
			case <-l.tick:
			case <-t.C:
			}
		} else if l.ctx.Err() != nil {
			return
		}
		if l.reopenDue() {
			l.reopen() // reopen.go: the engine hit a disk error
			continue
		}
		err := l.tailOnce()
		if errors.Is(err, errLogTruncated) {
			l.mu.Lock()
			secondary := l.want.role == partition.RoleSecondary
			primary := l.want.role == partition.RolePrimary
			if secondary {
				l.needCopy, l.starts = true, nil
			}
			l.mu.Unlock()
			if secondary {
				l.log.Warn("the log no longer holds what this replica needs; copying a snapshot", "err", err)
				continue
			}
			if primary {
				// It cannot catch up, and must not serve what it has:
				// failed, the master hands the role to an in-sync
				// secondary and replaces this replica by a copy.
				l.fail(err)
				continue
			}
		}
		if err == nil || l.ctx.Err() != nil {
			lastErr, failingSince = "", time.Time{}
			continue
		}
		if failingSince.IsZero() {
			failingSince = time.Now()
		}
		// Retried every tick: log a new error at once, the same one every
		// few seconds; as a warning only once it has gone on for a while
		// (a map a step behind, a source restarting: a new table's
		// replicas and every restart meet those, and they pass).
		if msg := err.Error(); msg != lastErr || time.Since(lastLog) > 5*time.Second {
			lvl := slog.LevelInfo
			if time.Since(failingSince) >= tailWarnAfter {
				lvl = slog.LevelWarn
			}
			l.log.Log(context.Background(), lvl, "reading the commit log; retrying", "failing_for", time.Since(failingSince).Round(time.Millisecond), "err", err)
			lastErr, lastLog = msg, time.Now()
		}
	}
}

// tailWarnAfter is how long reading the commit log fails before the
// failures are logged as warnings.
const tailWarnAfter = 5 * time.Second

func (l *logReplica) tailOnce() error {
	l.mu.Lock()
	want, caught := l.want, l.caughtUp
	l.mu.Unlock()
	l.mu.Lock()
	copying := l.needCopy
	split, proposeSplit := l.split.lsn != 0, l.split.pending != nil && !l.split.launched && l.split.lsn == 0 &&
		want.role == partition.RolePrimary && caught && l.core.Role() == partition.RolePrimary
	if proposeSplit {
		l.split.launched = true
		l.wg.Add(1)
		go l.proposeSplit(want.epoch, l.split.pending)
	}
	merging := l.merge.applied != 0
	if l.merge.pending != nil && l.merge.aligned && !l.merge.launched && !merging && l.split.pending == nil &&
		want.role == partition.RolePrimary && caught && l.core.Role() == partition.RolePrimary {
		l.merge.launched = true
		l.wg.Add(1)
		go l.proposeMerge(want.epoch, l.merge.pending)
	}
	l.mu.Unlock()
	switch {
	case split, merging:
		return nil // the children read their own logs
	case want.role == partition.RoleSecondary && copying:
		return l.copyIn(want)
	case want.role == partition.RolePrimary && copying:
		// Promoted before it copied anything (a new partition's first
		// primary, or its copy cut short): it replays the log from the
		// start, over an empty engine.
		if err := l.empty(); err != nil {
			return fmt.Errorf("empty the replica: %w", err)
		}
		l.mu.Lock()
		l.needCopy = false
		l.mu.Unlock()
		return l.catchUp(want)
	case want.role == partition.RoleSecondary && want.extent == 0 && l.tailExtent == 0:
		return nil // the master has not allocated the log yet
	case want.role == partition.RoleSecondary:
		return l.follow()
	case want.role == partition.RolePrimary && !caught:
		return l.catchUp(want)
	case want.role == partition.RolePrimary && want.extent != 0:
		return l.continueLog(want)
	}
	return nil
}

// continueLog moves a primary in its term to the next extent of its log
// once the master has sealed the one it appended to.
func (l *logReplica) continueLog(want roleWant) error {
	l.mu.Lock()
	old := l.extent
	l.mu.Unlock()
	if old == want.extent {
		return nil
	}
	ctx, cancel := context.WithTimeout(l.ctx, 5*time.Second)
	defer cancel()
	p, err := masterStreams{l.s}.Extent(ctx, old)
	if err != nil {
		return fmt.Errorf("extent %d of %s: %w", old, l.stream, err)
	}
	if !p.Sealed {
		return nil // the master is sealing it
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.want != want || l.extent != old || !l.caughtUp {
		return nil // moved on meanwhile
	}
	if err := l.restartLogLocked(want, p.Length); err != nil {
		return err
	}
	l.log.Debug("log continues on the next extent", "extent", want.extent, "sealed", old, "length", p.Length)
	select {
	case l.kick <- struct{}{}:
	default:
	}
	return nil
}

// observe hands records to the core (duplicates and records already
// applied are ignored by it) and wakes the pump to apply them.
func (l *logReplica) observe(recs []partition.Record) error {
	if len(recs) == 0 {
		return nil
	}
	l.mu.Lock()
	if l.reopening != nil {
		l.mu.Unlock()
		return errReopening // the tailer reopens the engine first
	}
	var err error
	for _, rec := range recs {
		if err = l.core.Observe(rec); err != nil {
			break
		}
	}
	l.mu.Unlock()
	select {
	case l.kick <- struct{}{}:
	default:
	}
	return err
}

// follow reads the log from the tail position: sealed extents to their
// end, the open extent up to the commit point the primary told this
// server's replica of it. While the tail is in the open extent the map
// names, it reads the local replica only: the master is asked for the
// stream's extents when one seals or the map names another.
func (l *logReplica) follow() error {
	ctx, cancel := context.WithTimeout(l.ctx, 5*time.Second)
	defer cancel()
	l.mu.Lock()
	ext, off, open := l.tailExtent, l.tailOff, l.want.extent
	l.mu.Unlock()
	if ext != 0 && ext == open {
		if local, err := l.s.extents.Extent(ext); err == nil && !local.Info().Sealed {
			before := heardOf(local)
			wctx, wcancel := context.WithTimeout(ctx, tailInterval)
			end, err := local.WaitCommitted(wctx, off)
			wcancel()
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return err
			}
			// Waiting on the commit point was this round's pause: the
			// next round waits on it again at once, so a record is
			// applied here ~1 ms after its commit, not at the next tick.
			l.followAgain.Store(true)
			end = max(end, local.CommittedLength())
			if end > off {
				if err := l.readLocal(local, ext, off, end); err != nil {
					return err
				}
			}
			if end >= off {
				l.mu.Lock()
				l.tailOff = end
				l.synced = true // at the commit point of the open extent
				l.mu.Unlock()
				l.noteInStep(local, end, before)
			}
			if !local.Info().Sealed {
				return nil
			}
		}
	}
	info, err := masterStreams{l.s}.Stream(ctx, l.stream)
	if err != nil {
		return fmt.Errorf("stream %s: %w", l.stream, err)
	}
	l.mu.Lock()
	ext, off = l.tailExtent, l.tailOff
	l.mu.Unlock()
	i := 0
	if ext != 0 {
		for i < len(info.Extents) && info.Extents[i].ID != ext {
			i++
		}
		if i == len(info.Extents) {
			return l.tailGone(ext)
		}
	}
	for ; i < len(info.Extents); i++ {
		e := info.Extents[i]
		if e.ID != ext {
			off = 0
		}
		if l.holdsAll(e) {
			l.mu.Lock()
			l.tailExtent, l.tailOff = e.ID, e.Length
			l.mu.Unlock()
			ext, off = e.ID, e.Length
			continue
		}
		var end int64
		var local *stream.Extent // the open extent's replica here
		var before heardCommit
		if e.Sealed {
			end = e.Length
		} else {
			var err error
			local, err = l.s.extents.Extent(e.ID)
			if err != nil {
				return nil // not created here yet: the next round
			}
			before = heardOf(local)
			wctx, wcancel := context.WithTimeout(ctx, tailInterval)
			end, err = local.WaitCommitted(wctx, off)
			wcancel()
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return err
			}
			end = max(end, local.CommittedLength())
		}
		if end > off {
			if err := l.readExtent(ctx, e, off, end); err != nil {
				return err
			}
		}
		l.mu.Lock()
		l.tailExtent, l.tailOff = e.ID, end
		l.mu.Unlock()
		ext, off = e.ID, end
		if !e.Sealed {
			l.noteInStep(local, end, before)
			return nil // the open extent is the log's end
		}
	}
	return nil
}

// tailGone handles a tail extent the log no longer has (truncated while
// this replica was not counted, e.g. deposed or cut off): the tail goes
// back to the log's start, whose first extent then says whether the log
// still holds what comes after the applied LSN (errLogTruncated if not:
// a secondary copies a snapshot, a primary reports itself failed).
func (l *logReplica) tailGone(ext uint64) error {
	l.mu.Lock()
	l.tailExtent, l.tailOff, l.starts = 0, 0, nil
	l.mu.Unlock()
	return fmt.Errorf("extent %d of %s is gone from the stream (truncated); reading the log from its start", ext, l.stream)
}

// holdsAll reports whether the core has every record of extent e already:
// e is sealed and its last record's LSN is at most the core's last. The
// tailer passes over such an extent without reading it (the core would
// ignore each record). A replica that copied a snapshot, or restarted,
// would otherwise read the log from its first extent, and an old extent
// may be unreadable for a while: a seal keeps only the longest replicas,
// and its only full copy may be on a server that drained and exited
// before the stream layer copied it back (seen in cmd/tabula
// TestRollingRestart: a new replica stuck catching up behind an extent it
// did not need).
func (l *logReplica) holdsAll(e stream.ExtentPlacement) bool {
	if !e.Sealed || e.LastSeq == 0 || e.SeqRestart {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return e.LastSeq <= l.core.Last()
}

// readLocal observes the records of the local replica of extent id in
// [from, to).
func (l *logReplica) readLocal(local *stream.Extent, id uint64, from, to int64) error {
	var recs []partition.Record
	err := local.ReadEntries(from, to, func(en stream.Entry) error {
		rec, err := partition.DecodeRecord(en.Payload())
		if err != nil {
			return fmt.Errorf("extent %d offset %d: %w", id, en.Offset, err)
		}
		recs = append(recs, rec)
		return nil
	})
	if err != nil {
		return err
	}
	if err := l.noteRead(id, from, recs); err != nil {
		return err
	}
	return l.observe(recs)
}

// readExtent observes the records of extent e in [from, to): from the
// local replica when this server holds it, else from another replica.
func (l *logReplica) readExtent(ctx context.Context, e stream.ExtentPlacement, from, to int64) error {
	var recs []partition.Record
	first := true
	collect := func(en stream.Entry) error {
		rec, err := partition.DecodeRecord(en.Payload())
		if err != nil {
			return fmt.Errorf("extent %d offset %d: %w", e.ID, en.Offset, err)
		}
		if first {
			first = false
			if err := l.noteRead(e.ID, from, []partition.Record{rec}); err != nil {
				return err
			}
		}
		recs = append(recs, rec)
		if len(recs) >= 256 {
			err = l.observe(recs)
			recs = recs[:0]
		}
		return err
	}
	if local, err := l.s.extents.Extent(e.ID); err == nil && local.Info().Length >= to {
		if err := local.ReadEntries(from, to, collect); err != nil {
			return err
		}
		return l.observe(recs)
	}
	if !e.Sealed {
		return fmt.Errorf("extent %d is open and not on this server", e.ID)
	}
	// Not held here (a replica placed after the extent was sealed): read
	// it from another replica.
	if err := l.s.streams.ReadExtent(ctx, e, from, to, collect); err != nil {
		return err
	}
	return l.observe(recs)
}

// catchUp makes a new primary: it applies every record of the sealed log
// (the master sealed the last extent before it allocated want.extent),
// then the core becomes primary at the log's end and the replica serves
// once the engine has applied it.
func (l *logReplica) catchUp(want roleWant) error {
	if want.extent == 0 {
		return nil // the master is still sealing and allocating
	}
	ctx, cancel := context.WithTimeout(l.ctx, time.Minute)
	defer cancel()
	info, err := masterStreams{l.s}.Stream(ctx, l.stream)
	if err != nil {
		return fmt.Errorf("stream %s: %w", l.stream, err)
	}
	l.mu.Lock()
	ext, off := l.tailExtent, l.tailOff
	l.mu.Unlock()
	if ext != 0 && !slices.ContainsFunc(info.Extents, func(e stream.ExtentPlacement) bool { return e.ID == ext }) {
		// Without this, the loop below passed over every extent looking
		// for the tail and the replica became primary on what it had.
		return l.tailGone(ext)
	}
	started := ext == 0
	for _, e := range info.Extents {
		if e.ID == want.extent {
			break
		}
		if !started && e.ID != ext {
			continue
		}
		if !started || e.ID != ext {
			started = true
		}
		if e.ID != ext {
			off = 0
		}
		if !e.Sealed {
			return fmt.Errorf("extent %d before the open extent %d is not sealed", e.ID, want.extent)
		}
		if e.Length > off && !l.holdsAll(e) {
			if err := l.readExtent(ctx, e, off, e.Length); err != nil {
				return err
			}
		}
		l.mu.Lock()
		l.tailExtent, l.tailOff = e.ID, e.Length
		l.mu.Unlock()
		ext, off = e.ID, e.Length
	}
	// A primary must not inherit records in the open extent that it did
	// not write in this life: a restarted primary whose open extent holds
	// entries asks for a seal first.
	if local, err := l.s.extents.Extent(want.extent); err == nil && local.Info().Length > 0 {
		l.mu.Lock()
		start := !l.resealing
		l.resealing = true
		l.mu.Unlock()
		if start {
			l.log.Info("open extent holds records from before this process; asking for a seal", "extent", want.extent)
			l.wg.Add(1)
			go l.reseal(want.epoch, want.extent, errors.New("primary restarted with records in the open extent"))
		}
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.want != want {
		return nil // the map moved on meanwhile
	}
	if l.core.Role() != partition.RolePrimary || l.core.Epoch() != want.epoch {
		if err := l.core.BecomePrimary(want.epoch, l.core.Last()); err != nil {
			return err
		}
	}
	if !l.core.Serving() {
		return nil // the pump is still applying; the next round finishes
	}
	l.caughtUp, l.extent, l.resealing, l.appended = true, want.extent, false, nil
	l.tailExtent, l.tailOff = want.extent, 0
	l.log.Info("serving as primary", "epoch", want.epoch, "extent", want.extent, "lsn", l.core.Last())
	return nil
}
