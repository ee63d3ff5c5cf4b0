package tableserver

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/replication/partition"
)

// Engine faults. A disk store that hits a write or sync error refuses
// every later write (the state of its files is unknown) until it is
// reopened, and reopening recovers exactly what is durable. A replicated
// partition's engine is state derived from its commit log, so the replica
// does not wait to be replaced: it closes the engine and opens it again in
// place, with backoff, then re-syncs with the log as a restarted replica
// would (from the applied LSN the reopened engine holds, which may be
// below what it had applied: a lazy engine loses its unsynced tail). While
// it does, it serves nothing (UNAVAILABLE "replica_reopening") and reports
// itself catching up, which the master does not treat as failed. Only if
// the engine does not open (or its disk fails again right away, too
// often) is the replica reported failed and replaced from a healthy one.
//
// Data that fails its checksums (engines.ErrCorrupt) is not a disk
// fault: reopening would read it again. Such a replica fails at once and
// is rebuilt from a healthy one; it never serves the data.
//
// The engine is opened behind a reopenable, which the replica struct and
// the log replica share: the hosting snapshots never change when the
// engine underneath does. The reopen runs on the log replica's tailer
// goroutine, so a snapshot copy or a catch-up never writes across it, and
// the pump does not apply between the new engine's installation and the
// replica's reset (applyMu).

// Reopen timing: attempt k (from 0) waits reopenBackoff<<k, at most
// reopenBackoffMax; reopenAttempts attempts take about 3 s. A disk that
// fails again after a reopen counts as a new fault: more than maxFaults
// of them within faultWindow fail the replica (a flapping disk is
// replaced rather than reopened forever).
const (
	reopenBackoff    = 100 * time.Millisecond
	reopenBackoffMax = 5 * time.Second
	reopenAttempts   = 5
	maxFaults        = 3
	faultWindow      = time.Minute
)

// errReopening: the replica's engine hit a disk error and is being closed
// and opened again; calls on it are refused meanwhile.
var errReopening = errors.New("the replica's engine is being reopened after a disk error")

// probeKey is written and deleted (and synced) by a reopen to check that
// the disk takes writes again before the replica uses the engine. It is a
// reserved key: clients can neither read nor write it.
var probeKey = []byte(api.ReservedKeyPrefix + "log/probe")

// isDiskFault reports whether err is an I/O error of the engine's files (a
// failed write, sync, create), as opposed to corrupt data, a closed
// engine or a refused request.
func isDiskFault(err error) bool {
	if err == nil || errors.Is(err, engines.ErrCorrupt) || errors.Is(err, engines.ErrClosed) || errors.Is(err, errReopening) {
		return false
	}
	var (
		pe *fs.PathError
		le *os.LinkError
		se *os.SyscallError
		en syscall.Errno
	)
	return errors.As(err, &pe) || errors.As(err, &le) || errors.As(err, &se) || errors.As(err, &en) || errors.Is(err, io.ErrShortWrite)
}

// reopenable is a partition's disk engine that its log replica can close
// and open again in place. It implements engines.Engine, engines.Writer,
// engines.BatchGetter and syncer over the current incarnation; a write or
// sync that fails with a disk fault marks the incarnation faulted (every
// later call is refused with errReopening) and tells the owner once.
//
// A reopened incarnation is held back from the request path (its calls
// are refused with errReopening) until the replica has applied again
// what it had applied before the fault: a read that passed the replica's
// checks before the fault never reads an engine that lost what those
// checks promised. The log replica uses the internal view (inner), which
// is not held back.
//
// Safe for concurrent use. Calls count themselves on their incarnation
// while they run, and closing it waits for them, a bounded time (a
// running Scan is cut short at its next record; one blocked in its
// callback, sending to a slow client, is not waited for longer).
type reopenable struct {
	*reopenState
	internal bool
}

// reopenState is what the views of a reopenable share.
type reopenState struct {
	open func() (engines.Engine, error)
	// onFault is told of the first disk fault of each incarnation. Set
	// before the engine is shared (newLogReplica).
	onFault func(error)
	cur     atomic.Pointer[engineGen] // nil while reopening, or once closed
	closed  atomic.Bool
	mu      sync.Mutex // serialises reopen's install with close
}

// engineGen is one incarnation of the engine.
type engineGen struct {
	e  engines.Engine
	w  engines.Writer
	bg engines.BatchGetter
	sy syncer
	// refs counts the calls running; closing refuses new ones and cuts a
	// Scan short; drained is closed (once) when closing and refs is 0.
	refs    atomic.Int64
	closing atomic.Bool
	drained chan struct{}
	once    sync.Once
	// fault is the first disk fault; held refuses the request path.
	fault atomic.Pointer[error]
	held  atomic.Bool
}

// Bounds on waiting for the calls on an incarnation being closed: a
// reopen (the replica serves nothing meanwhile) and a Close (the map
// watch closes a partition that moved away).
const (
	reopenDrainWait = 5 * time.Second
	closeDrainWait  = time.Second
)

var (
	_ engines.Engine      = (*reopenable)(nil)
	_ engines.Writer      = (*reopenable)(nil)
	_ engines.BatchGetter = (*reopenable)(nil)
	_ syncer              = (*reopenable)(nil)
)

func newGen(e engines.Engine) *engineGen {
	g := &engineGen{e: e, drained: make(chan struct{})}
	g.w, _ = e.(engines.Writer)
	g.bg, _ = e.(engines.BatchGetter)
	g.sy, _ = e.(syncer)
	return g
}

// openEngine opens an engine of kind with opts, behind a reopenable if
// reopen (a replicated partition's disk engine, whose log replica
// reopens it after a disk error).
func openEngine(reopen bool, kind engines.Kind, opts engines.Options) (engines.Engine, error) {
	e, err := engines.Open(kind, opts)
	if err != nil || !reopen {
		return e, err
	}
	return newReopenable(e, func() (engines.Engine, error) { return engines.Open(kind, opts) }), nil
}

// newReopenable wraps e, opened by open, which opens it again.
func newReopenable(e engines.Engine, open func() (engines.Engine, error)) *reopenable {
	r := &reopenable{reopenState: &reopenState{open: open}}
	r.cur.Store(newGen(e))
	return r
}

// inner is the log replica's view: calls on an incarnation held back
// from the request path go through.
func (r *reopenable) inner() *reopenable {
	return &reopenable{reopenState: r.reopenState, internal: true}
}

// serve lets the request path use the current incarnation.
func (r *reopenable) serve() {
	if g := r.cur.Load(); g != nil {
		g.held.Store(false)
	}
}

// acquire returns the current incarnation, held shared: the caller must
// release it.
func (r *reopenable) acquire() (*engineGen, error) {
	for {
		g := r.cur.Load()
		if g == nil {
			if r.closed.Load() {
				return nil, engines.ErrClosed
			}
			return nil, errReopening
		}
		if p := g.fault.Load(); p != nil {
			return nil, fmt.Errorf("%w (%v)", errReopening, *p)
		}
		if !r.internal && g.held.Load() {
			return nil, fmt.Errorf("%w (catching up on the log)", errReopening)
		}
		g.refs.Add(1)
		if !g.closing.Load() {
			return g, nil
		}
		g.release() // closing meanwhile: look again
	}
}

func (g *engineGen) release() {
	if g.refs.Add(-1) == 0 && g.closing.Load() {
		g.once.Do(func() { close(g.drained) })
	}
}

// check notes a disk fault of a write or sync.
func (r *reopenable) check(g *engineGen, err error) error {
	if isDiskFault(err) && g.fault.CompareAndSwap(nil, &err) && r.onFault != nil {
		r.onFault(err)
	}
	return err
}

// Get implements engines.Engine.
func (r *reopenable) Get(key []byte) ([]byte, int64, error) {
	g, err := r.acquire()
	if err != nil {
		return nil, 0, err
	}
	defer g.release()
	return g.e.Get(key)
}

// Scan implements engines.Engine. Closing the incarnation cuts it short
// with errReopening.
func (r *reopenable) Scan(fn func(engines.Record) error) error {
	g, err := r.acquire()
	if err != nil {
		return err
	}
	defer g.release()
	return g.e.Scan(func(rec engines.Record) error {
		if g.closing.Load() {
			return errReopening
		}
		return fn(rec)
	})
}

// Range scans a key range of an ordered engine (rangeScanner), as Scan
// scans everything.
func (r *reopenable) Range(lo, hi []byte, reverse bool, fn func(engines.Record) error) error {
	g, err := r.acquire()
	if err != nil {
		return err
	}
	defer g.release()
	rg, ok := g.e.(rangeScanner)
	if !ok {
		return fmt.Errorf("engine %T: %w", g.e, errNoRange)
	}
	return rg.Range(lo, hi, reverse, func(rec engines.Record) error {
		if g.closing.Load() {
			return errReopening
		}
		return fn(rec)
	})
}

// Stats implements engines.Engine: zero while reopening.
func (r *reopenable) Stats() engines.Stats {
	g, err := r.acquire()
	if err != nil {
		return engines.Stats{}
	}
	defer g.release()
	return g.e.Stats()
}

// Apply implements engines.Writer.
func (r *reopenable) Apply(batch []engines.Mutation) error {
	g, err := r.acquire()
	if err != nil {
		return err
	}
	defer g.release()
	if g.w == nil {
		return engines.ErrReadOnly
	}
	return r.check(g, g.w.Apply(batch))
}

// Delete implements engines.Writer.
func (r *reopenable) Delete(key []byte) (bool, error) {
	g, err := r.acquire()
	if err != nil {
		return false, err
	}
	defer g.release()
	if g.w == nil {
		return false, engines.ErrReadOnly
	}
	existed, err := g.w.Delete(key)
	return existed, r.check(g, err)
}

// CompareAndSwap implements engines.Writer.
func (r *reopenable) CompareAndSwap(c engines.CAS) (engines.CASResult, error) {
	g, err := r.acquire()
	if err != nil {
		return engines.CASResult{}, err
	}
	defer g.release()
	if g.w == nil {
		return engines.CASResult{}, engines.ErrReadOnly
	}
	res, err := g.w.CompareAndSwap(c)
	return res, r.check(g, err)
}

// GetBatch implements engines.BatchGetter (a loop of Gets for engines
// without one).
func (r *reopenable) GetBatch(keys [][]byte, values [][]byte, expires []int64, found []bool) error {
	g, err := r.acquire()
	if err != nil {
		return err
	}
	defer g.release()
	if g.bg != nil {
		return g.bg.GetBatch(keys, values, expires, found)
	}
	for i, k := range keys {
		v, exp, err := g.e.Get(k)
		switch {
		case errors.Is(err, engines.ErrNotFound):
			values[i], expires[i], found[i] = nil, 0, false
		case err != nil:
			return err
		default:
			values[i], expires[i], found[i] = v, exp, true
		}
	}
	return nil
}

// Sync implements syncer.
func (r *reopenable) Sync() error {
	g, err := r.acquire()
	if err != nil {
		return err
	}
	defer g.release()
	if g.sy == nil {
		// Success here would let the replica report an applied LSN
		// durable that the engine holds only in memory.
		return fmt.Errorf("engine %T: %w", g.e, errNoSync)
	}
	return r.check(g, g.sy.Sync())
}

// Close implements engines.Engine. Idempotent.
func (r *reopenable) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed.Swap(true) {
		return nil
	}
	if g := r.cur.Swap(nil); g != nil {
		return g.retire(closeDrainWait)
	}
	return nil
}

// retire closes the incarnation once the calls on it are done (a Scan
// stops at its next record), or wait passed.
func (g *engineGen) retire(wait time.Duration) error {
	g.closing.Store(true)
	if g.refs.Load() == 0 {
		g.once.Do(func() { close(g.drained) })
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-g.drained:
	case <-t.C:
	}
	return g.e.Close()
}

// closeCurrent closes the current incarnation (the faulted one); calls
// are refused with errReopening until install.
func (r *reopenable) closeCurrent() error {
	r.mu.Lock()
	g := r.cur.Swap(nil)
	r.mu.Unlock()
	if g == nil {
		return nil
	}
	return g.retire(reopenDrainWait)
}

// openFresh opens the engine again (recovery restores what is durable)
// and checks that its disk takes writes: a probe key written, deleted and
// synced. The engine is not installed yet.
func (r *reopenable) openFresh() (engines.Engine, error) {
	e, err := r.open()
	if err != nil {
		return nil, err
	}
	w, _ := e.(engines.Writer)
	sy, _ := e.(syncer)
	if w == nil {
		return nil, errors.Join(fmt.Errorf("reopened engine %T takes no writes", e), e.Close())
	}
	err = w.Apply([]engines.Mutation{{Key: probeKey, Value: []byte{1}}})
	if err == nil {
		err = w.Apply([]engines.Mutation{{Key: probeKey, Delete: true}})
	}
	if err == nil && sy != nil {
		err = sy.Sync()
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("probe write: %w", err), e.Close())
	}
	return e, nil
}

// install makes e the current incarnation, held back from the request
// path until serve if held, unless the engine was closed meanwhile: then
// e is closed and the error wraps engines.ErrClosed.
func (r *reopenable) install(e engines.Engine, held bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed.Load() {
		return errors.Join(engines.ErrClosed, e.Close())
	}
	g := newGen(e)
	g.held.Store(held)
	r.cur.Store(g)
	return nil
}

// engineFault is the reopenable's onFault: the engine hit a disk error.
// The replica stops serving and its tailer reopens the engine.
func (l *logReplica) engineFault(err error) {
	l.mu.Lock()
	if l.fatal != nil || l.reopening != nil || l.split.lsn != 0 || l.merge.applied != 0 {
		l.mu.Unlock()
		return
	}
	l.reopening = err
	l.mu.Unlock()
	l.log.Warn("engine write failed; the replica stops serving and reopens its engine", "err", err)
	select {
	case l.tick <- struct{}{}:
	default:
	}
}

// applyFailed handles an error of applying the log to the engine: a disk
// fault reopens the engine, corrupt data fails the replica. It reports
// whether err was one of those (false: the caller fails the replica).
func (l *logReplica) applyFailed(err error) bool {
	switch {
	case errors.Is(err, errReopening):
		return true // the reopenable reported the fault already
	case isDiskFault(err) && l.re != nil:
		l.engineFault(err)
		return true
	case errors.Is(err, engines.ErrCorrupt):
		l.fail(fmt.Errorf("apply the log: %w", err))
		return true
	}
	return false
}

// reopenDue reports whether the engine must be reopened.
func (l *logReplica) reopenDue() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reopening != nil && l.fatal == nil
}

// reopeningErr is the answer to a request while the engine is reopened,
// or has yet to apply again what it had applied before.
func (l *logReplica) reopeningErr(serverID string) error {
	l.mu.Lock()
	cause, hold, applied := l.reopening, l.holdUntil, l.core.Applied()
	l.mu.Unlock()
	if cause == nil && hold != 0 {
		return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "replica_reopening",
			"partition %d on %s reopened its engine after a disk error and is applying the log again (LSN %d of %d); retry shortly or read another replica", l.pid, serverID, applied, hold)
	}
	if cause == nil {
		return nil
	}
	return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "replica_reopening",
		"partition %d on %s is reopening its engine after a disk error (%v); retry shortly or read another replica", l.pid, serverID, cause)
}

// reopen closes the faulted engine and opens it again with backoff, then
// resets the replica to the reopened engine's applied LSN. Run by the
// tailer. If the engine does not open within reopenAttempts, or the disk
// faulted too often lately, or the data is corrupt, the replica fails.
func (l *logReplica) reopen() {
	l.mu.Lock()
	cause := l.reopening
	now := time.Now()
	kept := l.faults[:0]
	for _, t := range l.faults {
		if now.Sub(t) < faultWindow {
			kept = append(kept, t)
		}
	}
	l.faults = append(kept, now)
	faults := len(l.faults)
	l.mu.Unlock()
	if l.re == nil {
		l.fail(fmt.Errorf("engine disk error, and the engine cannot be reopened in place: %w", cause))
		return
	}
	if err := l.re.closeCurrent(); err != nil {
		l.log.Warn("closing the faulted engine", "err", err)
	}
	if faults > maxFaults {
		l.fail(fmt.Errorf("the engine's disk failed %d times within %v; last: %w", faults, faultWindow, cause))
		return
	}
	start := time.Now()
	var e engines.Engine
	var err error
	for attempt := 0; attempt < reopenAttempts; attempt++ {
		t := time.NewTimer(min(reopenBackoff<<attempt, reopenBackoffMax))
		select {
		case <-l.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		e, err = l.re.openFresh()
		if err == nil {
			break
		}
		if errors.Is(err, engines.ErrCorrupt) {
			l.fail(fmt.Errorf("reopen the engine: %w", err))
			return
		}
		l.log.Warn("reopening the engine failed; retrying", "attempt", attempt+1, "of", reopenAttempts, "err", err)
	}
	if err != nil {
		l.fail(fmt.Errorf("the engine did not reopen after a disk error (%d attempts in %v): %w", reopenAttempts, time.Since(start).Round(time.Millisecond), err))
		return
	}
	applied, err := readAppliedLSN(e)
	if err != nil {
		err = errors.Join(err, e.Close())
		l.fail(fmt.Errorf("reopened engine: read the applied LSN: %w", err))
		return
	}
	l.applyMu.Lock()
	defer l.applyMu.Unlock()
	l.mu.Lock()
	// What the request path may have been promised: the applied LSN
	// before this fault, or before an earlier one not yet made up for.
	was := max(l.core.Applied(), l.holdUntil)
	l.mu.Unlock()
	if err := l.re.install(e, applied < was); err != nil {
		l.log.Debug("the partition closed while its engine reopened", "err", err)
		return
	}
	l.mu.Lock()
	l.resetLocked(applied)
	l.holdUntil = 0
	if applied < was {
		l.holdUntil = was
	}
	l.mu.Unlock()
	l.log.Info("engine reopened; re-syncing with the log from its applied LSN", "applied", applied, "was", was,
		"took", time.Since(start).Round(time.Millisecond))
	l.wake()
}

// resetLocked starts the replica again at applied, as a restart would:
// a new core, writes in flight answered as of unknown outcome (the log
// decides them), the log read again from its start (records at or below
// applied are skipped), nothing flushed. Caller holds mu and applyMu.
func (l *logReplica) resetLocked(applied uint64) {
	l.core.Close()
	l.answerLocked(l.core.Ready())
	for tok, ch := range l.waiters {
		delete(l.waiters, tok)
		ch <- writeResult{err: api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "outcome_unknown",
			"partition %d: the replica reopened its engine; the write may still apply: retry with the same request id", l.pid)}
	}
	l.core = partition.New(partition.Config{}, applied)
	if l.want.role == partition.RoleSecondary {
		if err := l.core.BecomeSecondary(l.want.epoch); err != nil {
			l.log.Error("cannot become secondary", "err", err)
		}
		l.extent = l.want.extent
	} else {
		l.extent = 0
	}
	clear(l.overlay)
	l.notifyAppliedLocked()
	l.appended = nil
	l.caughtUp, l.synced = false, false
	l.needCopy = applied == 0
	l.tailExtent, l.tailOff = 0, 0
	l.starts, l.flushed = nil, 0
	l.incarnation++
	l.reopening = nil
}

// releaseHoldLocked lets the request path use the reopened engine once
// the replica has applied again what it had applied before the fault.
// Caller holds mu.
func (l *logReplica) releaseHoldLocked() {
	if l.holdUntil == 0 || l.reopening != nil || l.core.Applied() < l.holdUntil {
		return
	}
	l.log.Info("reopened engine caught up; serving again", "applied", l.core.Applied())
	l.holdUntil = 0
	l.re.serve()
}

// SizeMedian implements engines.SizeMedianer when the engine does.
func (r *reopenable) SizeMedian(lo, hi []byte) ([]byte, float64, int, error) {
	g, err := r.acquire()
	if err != nil {
		return nil, 0, 0, err
	}
	defer g.release()
	sm, ok := g.e.(engines.SizeMedianer)
	if !ok {
		return nil, 0, 0, nil
	}
	return sm.SizeMedian(lo, hi)
}
