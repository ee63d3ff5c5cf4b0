package coproc

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// callCtx is the context a guest call runs under: the caller's values, the
// call's state for the host functions, and a Done channel that the runtime's
// watchdog closes at the call's deadline or once the caller's context ends.
// wazero closes the module when Done closes (WithCloseOnContextDone), which
// stops the guest.
//
// An instance reuses one callCtx from call to call while it has not fired:
// context.WithDeadline would allocate a context and a timer per call, and
// even a reused timer plus a context.AfterFunc on the caller's context cost
// about a third of a no-op call. A callCtx that fired is dropped and the
// next call gets a fresh one.
type callCtx struct {
	st       *callState
	parent   context.Context // the caller's, for Value
	deadline time.Time
	done     chan struct{}
	fired    atomic.Bool
	err      error // set before done closes, read after
}

var _ context.Context = (*callCtx)(nil)

func newCallCtx() *callCtx { return &callCtx{done: make(chan struct{})} }

// arm starts a call under parent with st until deadline, watched by w.
func (c *callCtx) arm(w *watchdog, parent context.Context, st *callState, deadline time.Time) {
	// Set before add and cleared after remove, under the watchdog's lock
	// in between: the watchdog reads deadline and parent while it holds it.
	c.parent, c.st, c.deadline = parent, st, deadline
	w.add(c)
}

// disarm ends the call. It reports whether c may serve another call (false
// when it fired).
func (c *callCtx) disarm(w *watchdog) (reusable bool) {
	w.remove(c)
	c.parent, c.st = nil, nil
	return !c.fired.Load()
}

func (c *callCtx) fire(err error) {
	if c.fired.CompareAndSwap(false, true) {
		c.err = err
		close(c.done)
	}
}

// Deadline implements context.Context.
func (c *callCtx) Deadline() (time.Time, bool) { return c.deadline, true }

// Done implements context.Context.
func (c *callCtx) Done() <-chan struct{} { return c.done }

// Err implements context.Context.
func (c *callCtx) Err() error {
	select {
	case <-c.done:
		return c.err
	default:
		return nil
	}
}

// Value implements context.Context.
func (c *callCtx) Value(key any) any {
	if _, ok := key.(stateKey); ok {
		return c.st
	}
	if p := c.parent; p != nil {
		return p.Value(key)
	}
	return nil
}

// watchdog stops guest calls at their deadlines: one goroutine per
// Runtime that, while calls are in flight, checks them every tick and fires
// the calls whose deadline passed or whose caller's context ended. A call
// costs a map insert and delete under a mutex; a runaway guest is stopped
// within a tick (plus wazero's reaction) of its deadline.
type watchdog struct {
	tick time.Duration
	mu   sync.Mutex
	// calls in flight. Guarded by mu.
	calls map[*callCtx]struct{}
	wake  chan struct{}
	stop  chan struct{}
	done  chan struct{}
}

// watchdogTick is how often in-flight calls are checked.
const watchdogTick = time.Millisecond

func newWatchdog(tick time.Duration) *watchdog {
	w := &watchdog{tick: tick, calls: make(map[*callCtx]struct{}), wake: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	return w
}

func (w *watchdog) add(c *callCtx) {
	w.mu.Lock()
	w.calls[c] = struct{}{}
	first := len(w.calls) == 1
	w.mu.Unlock()
	if first {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// remove forgets c; once it returns, the watchdog does not fire c.
func (w *watchdog) remove(c *callCtx) {
	w.mu.Lock()
	delete(w.calls, c)
	w.mu.Unlock()
}

func (w *watchdog) run() {
	defer close(w.done)
	t := time.NewTimer(w.tick)
	for {
		// Idle until a call starts.
		select {
		case <-w.stop:
			return
		case <-w.wake:
		}
		for {
			t.Reset(w.tick)
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
			if w.check(time.Now()) == 0 {
				break
			}
		}
	}
}

// check fires the calls past their deadline or whose caller gave up, and
// returns how many are in flight.
func (w *watchdog) check(now time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	for c := range w.calls {
		switch {
		case !now.Before(c.deadline):
			c.fire(context.DeadlineExceeded)
		default:
			if err := c.parent.Err(); err != nil {
				c.fire(err)
			}
		}
	}
	return len(w.calls)
}

func (w *watchdog) close() {
	close(w.stop)
	<-w.done
}
