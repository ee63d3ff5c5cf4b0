package coproc

import (
	"context"
	"sync/atomic"
	"time"
)

// callCtx is the context a guest call runs under: the caller's values, the
// call's state for the host functions, and a Done channel closed at the
// call's deadline or when the caller's context ends. wazero closes the
// module when Done closes (WithCloseOnContextDone), which stops the guest.
//
// An instance reuses one callCtx, and its timer, from call to call while
// neither fired: context.WithDeadline would allocate a context and a timer
// per call, which is most of a call's platform cost. A callCtx that fired
// (or may still fire) is dropped and the next call gets a fresh one.
type callCtx struct {
	parent   context.Context
	st       *callState
	deadline time.Time
	done     chan struct{}
	fired    atomic.Bool
	err      error // set before fired, read after
	timer    *time.Timer
	// stopParent unregisters the context.AfterFunc on parent (nil when
	// parent can never be done).
	stopParent func() bool
}

var _ context.Context = (*callCtx)(nil)

func newCallCtx() *callCtx {
	c := &callCtx{done: make(chan struct{})}
	c.timer = time.AfterFunc(time.Hour, func() { c.fire(context.DeadlineExceeded) })
	c.timer.Stop()
	return c
}

// arm starts a call under parent with st until deadline.
func (c *callCtx) arm(parent context.Context, st *callState, deadline time.Time) {
	c.parent, c.st, c.deadline = parent, st, deadline
	c.timer.Reset(time.Until(deadline))
	if parent.Done() != nil {
		c.stopParent = context.AfterFunc(parent, func() { c.fire(parent.Err()) })
	}
}

// disarm ends the call. It reports whether c may serve another call: false
// when it fired or a firing may still be under way.
func (c *callCtx) disarm() (reusable bool) {
	reusable = c.timer.Stop()
	if c.stopParent != nil {
		reusable = c.stopParent() && reusable
		c.stopParent = nil
	}
	c.parent, c.st = nil, nil
	return reusable && !c.fired.Load()
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
