package coproc

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Server-wide limits on calls (see RATIONALE.md, "Coprocessor deadline cap"
// and "Idempotency tokens").
const (
	// DefaultMaxDeadline is Options.MaxDeadline's default.
	DefaultMaxDeadline = 30 * time.Second
	// MaxTokenBytes is the longest idempotency token (and request id) a
	// call takes: the SDK's 64-byte token with its per-partition suffix
	// fits with room to spare. The token is part of a key stored for
	// Options.IdempotencyTTL, so its length is bounded as a key's is.
	MaxTokenBytes = 128
)

// capDeadline is a call's deadline: requested (zero: DefaultTimeout from
// start), cut to MaxDeadline from start. capped reports whether the cap
// cut it.
func (r *Runtime) capDeadline(start, requested time.Time) (deadline time.Time, capped bool) {
	if requested.IsZero() {
		requested = start.Add(r.opts.DefaultTimeout)
	}
	if limit := start.Add(r.opts.MaxDeadline); requested.After(limit) {
		return limit, true
	}
	return requested, false
}

// explainCap names the cap in a deadline error when the cap, not the
// caller, set the deadline.
func (r *Runtime) explainCap(err error, capped bool) error {
	if capped && errors.Is(err, ErrDeadline) {
		return fmt.Errorf("%w (the server caps a call's deadline at %v)", err, r.opts.MaxDeadline)
	}
	return err
}

// checkToken refuses an over-long idempotency token or request id.
func checkToken(token, requestID string) error {
	if len(token) > MaxTokenBytes {
		return fmt.Errorf("%w: idempotency token of %d bytes; the limit is %d", ErrTokenTooLong, len(token), MaxTokenBytes)
	}
	if len(requestID) > MaxTokenBytes {
		return fmt.Errorf("%w: request id of %d bytes; the limit is %d", ErrTokenTooLong, len(requestID), MaxTokenBytes)
	}
	return nil
}

// tenantCPU accounts the time guest code of each tenant held an execution
// slot. Safe for concurrent use; a tenant's counter is created once.
type tenantCPU struct {
	m sync.Map // tenant string → *atomic.Int64 nanoseconds
}

func (c *tenantCPU) add(tenant string, d time.Duration) {
	v, ok := c.m.Load(tenant)
	if !ok {
		v, _ = c.m.LoadOrStore(tenant, new(atomic.Int64))
	}
	v.(*atomic.Int64).Add(int64(d))
}

// TenantCPU returns, per tenant, the time its guest calls and merges have
// executed on this runtime since it was created: the time each held one
// of the Options.MaxConcurrency execution slots, from entering the guest
// to leaving it (a guest runs on one goroutine and does not block, so this
// is its CPU time, plus whatever the OS took from it meanwhile). Tenants
// that never ran are absent. Safe for concurrent use.
func (r *Runtime) TenantCPU() map[string]time.Duration {
	out := map[string]time.Duration{}
	r.cpu.m.Range(func(k, v any) bool {
		out[k.(string)] = time.Duration(v.(*atomic.Int64).Load())
		return true
	})
	return out
}

// TenantCPUOf is TenantCPU of one tenant.
func (r *Runtime) TenantCPUOf(tenant string) time.Duration {
	if v, ok := r.cpu.m.Load(tenant); ok {
		return time.Duration(v.(*atomic.Int64).Load())
	}
	return 0
}
