package coproc

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/tabuladb/tabula/coproc/abi"
)

// MergeRequest carries what a merge sees besides the partials.
type MergeRequest struct {
	// RequestID and Now are as in CallRequest.
	RequestID string
	Now       time.Time
	// Deadline as in CallRequest.
	Deadline time.Time
}

// Merge combines the per-partition outputs of a scatter-gather call at the
// coordinator. When the module exports "<method>__merge", it runs once with
// the partials as its input (the list encoding of ABI.md, in the order
// given) and what it emits is the result; it has no partition (data
// functions return CodeNoPartition, writes CodeReadOnly). Without a merge
// export the result is the partials concatenated in order. Errors are
// Call's.
func (r *Runtime) Merge(ctx context.Context, key ModuleKey, method string, partials [][]byte) ([]byte, error) {
	return r.MergeWith(ctx, key, method, partials, MergeRequest{})
}

// MergeWith is Merge with a request id, time and deadline.
func (r *Runtime) MergeWith(ctx context.Context, key ModuleKey, method string, partials [][]byte, req MergeRequest) ([]byte, error) {
	m, err := r.lookup(key)
	if err != nil {
		return nil, err
	}
	if !m.man.HasMethod(method) {
		return nil, fmt.Errorf("%w: %q (module %v exports %v)", ErrUnknownMethod, method, key, m.man.Methods)
	}
	if !m.man.HasMerge(method) {
		return bytes.Join(partials, nil), nil
	}
	input := abi.AppendList(nil, partials)
	if len(input) > r.opts.MaxInputBytes {
		return nil, fmt.Errorf("%w: merge input of %d bytes, limit %d", ErrInputTooLarge, len(input), r.opts.MaxInputBytes)
	}
	if req.Now.IsZero() {
		req.Now = r.opts.Now()
	}
	deadline, capped := r.capDeadline(time.Now(), req.Deadline)
	st := &callState{rt: r, m: m, method: method + abi.MergeSuffix, requestID: req.RequestID, now: req.Now}
	status, err := r.run(ctx, m, method+abi.MergeSuffix, input, deadline, st)
	if err != nil {
		return nil, r.explainCap(fmt.Errorf("merge %v %s: %w", key, method, err), capped)
	}
	if status != 0 {
		r.stats.guestErrors.Add(1)
		return st.out, &GuestError{Status: status, Message: st.errMsg}
	}
	return st.out, nil
}
