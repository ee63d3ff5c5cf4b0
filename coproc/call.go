package coproc

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"sync"
	"time"

	"github.com/tetratelabs/wazero/sys"

	"github.com/tabuladb/tabula/coproc/abi"
	"github.com/tabuladb/tabula/engines"
)

// CallRequest is one guest call on one partition.
type CallRequest struct {
	// Partition is the data the call runs next to. Required.
	Partition Partition
	// Input is handed to the handler. At most Options.MaxInputBytes.
	Input []byte
	// Keys are the call's target keys on this partition: the key of a point
	// call, this partition's share of a batch call. The guest reads them
	// with keys().
	Keys [][]byte
	// Range is the target range of a range or scatter-gather call; the guest
	// reads it with range().
	Range KeyRange
	// RequestID identifies the client request; the guest reads it, and it
	// seeds the guest's randomness.
	RequestID string
	// Now is the call's wall time as the guest sees it. Zero: Options.Now().
	Now time.Time
	// IdempotencyToken, when set, makes a call that writes apply once: a
	// retry with the same token returns the first call's output without
	// running again (see ABI.md, Idempotency).
	IdempotencyToken string
	// Deadline stops the guest. Zero: Options.DefaultTimeout from now. The
	// context's deadline applies too; the earlier wins.
	Deadline time.Time
}

// CallResult is what a call returned.
type CallResult struct {
	// Output is what the guest emitted.
	Output []byte
	// Status is the handler's return (0: success). Non-zero comes with a
	// *GuestError.
	Status int32
	// Message is the guest's set_error text.
	Message string
	// Writes is the number of mutations the call committed (0 when it
	// wrote nothing, failed, or was replayed).
	Writes int
	// Replayed: the result is the stored result of an earlier call with
	// the same idempotency token; nothing ran or applied.
	Replayed bool
	// Attempts is how often the guest ran (more than 1 after conflicts).
	Attempts int
}

// stagedWrite is one key's pending state in a call.
type stagedWrite struct {
	del       bool
	value     []byte
	expiresAt int64
}

// callState is the per-call state host functions reach through the context.
type callState struct {
	rt        *Runtime
	m         *module
	in        *instance
	method    string
	requestID string
	now       time.Time
	part      Partition // nil in a merge
	info      PartitionInfo
	keys      [][]byte
	rng       KeyRange
	trackRead bool // record reads for the commit check (the module writes)

	out     []byte
	errMsg  string
	pending []byte // a result too large for the guest's buffer (see result)
	scratch []byte
	abort   error // why a host function stopped the call
	oom     bool  // the guest printed the Go runtime's out-of-memory message

	staged      map[string]*stagedWrite
	order       []string // staged keys in first-write order
	stagedBytes int
	reads       map[string]Read
	scans       map[int32]*scanIter
	nextScan    int32
}

// states recycles callStates: a call's state is ~400 bytes, the largest
// allocation of a call.
var states = sync.Pool{New: func() any { return new(callState) }}

func acquireState() *callState { return states.Get().(*callState) }

// releaseState returns st to the pool. The call's output (handed to the
// caller) and everything else it referenced are dropped; only a small
// scratch buffer is kept.
func releaseState(st *callState) {
	scratch := st.scratch[:0]
	if cap(scratch) > 64<<10 {
		scratch = nil
	}
	*st = callState{scratch: scratch}
	states.Put(st)
}

type stateKey struct{}

func stateOf(ctx context.Context) *callState {
	st, _ := ctx.Value(stateKey{}).(*callState)
	return st
}

// Call runs method of the module under key on req.Partition: one guest call
// for the whole request on this partition. The guest's writes are staged
// and committed as one atomic Partition.Commit, together with the
// idempotency record when req.IdempotencyToken is set, iff the handler
// returns 0 without trapping; otherwise nothing is applied. When the commit
// conflicts with a concurrent writer the guest runs again (up to
// Options.MaxConflictRetries times).
//
// Errors: ErrModuleNotFound, ErrUnknownMethod, ErrInputTooLarge, ErrBusy
// before the guest runs; ErrDeadline, ErrMemoryLimit, ErrTrap,
// ErrGuestFault, ErrOutputTooLarge, ErrWritesTooLarge when the runtime
// stopped it (the instance is discarded); a *GuestError (ErrGuestFailed)
// when the handler returned non-zero; ErrConflict, ErrReadOnly, ErrTokenReused
// or the partition's error from the commit. The result is valid with a
// *GuestError too.
func (r *Runtime) Call(ctx context.Context, key ModuleKey, method string, req CallRequest) (CallResult, error) {
	m, err := r.lookup(key)
	if err != nil {
		return CallResult{}, err
	}
	if !m.man.HasMethod(method) {
		return CallResult{}, fmt.Errorf("%w: %q (module %v exports %v)", ErrUnknownMethod, method, key, m.man.Methods)
	}
	if req.Partition == nil {
		return CallResult{}, fmt.Errorf("coproc: call %v %s: no partition", key, method)
	}
	for i, k := range req.Keys {
		if isReserved(k) {
			return CallResult{}, fmt.Errorf("%w: target key %d starts with the reserved prefix %q", ErrReservedKey, i, abi.ReservedPrefix)
		}
	}
	if len(req.Input) > r.opts.MaxInputBytes {
		return CallResult{}, fmt.Errorf("%w: %d bytes, limit %d", ErrInputTooLarge, len(req.Input), r.opts.MaxInputBytes)
	}
	if err := checkToken(req.IdempotencyToken, req.RequestID); err != nil {
		return CallResult{}, err
	}
	// One clock read serves the guest's now() and the deadline (a read
	// costs ~0.15 µs on some VMs) unless Options.Now is not the real clock.
	start := time.Now()
	if req.Now.IsZero() {
		req.Now = start
		if !r.realClock {
			req.Now = r.opts.Now()
		}
	}
	var capped bool
	req.Deadline, capped = r.capDeadline(start, req.Deadline)
	var idemKey []byte
	var digest [32]byte
	if req.IdempotencyToken != "" {
		idemKey = IdempotencyKey(req.IdempotencyToken)
		digest = inputDigest(req.Input, req.Keys, req.Range)
	}
	info := req.Partition.Info()
	res := CallResult{}
	var st *callState
	defer func() {
		if st != nil {
			releaseState(st)
		}
	}()
	for attempt := 1; ; attempt++ {
		if idemKey != nil {
			v, found, err := req.Partition.Get(idemKey)
			if err != nil {
				return res, fmt.Errorf("coproc: read idempotency record: %w", err)
			}
			if found {
				rec, err := decodeIdemRecord(v)
				if err != nil {
					return res, err
				}
				if rec.module != key.Name || rec.method != method {
					return res, fmt.Errorf("%w: token %q was used for %s.%s", ErrTokenReused, req.IdempotencyToken, rec.module, rec.method)
				}
				if rec.hasDigest && rec.digest != digest {
					return res, fmt.Errorf("%w: token %q was used for a call of %s.%s with other input, keys or range; use a new token for a new call", ErrTokenReused, req.IdempotencyToken, rec.module, rec.method)
				}
				r.stats.replays.Add(1)
				return CallResult{Output: rec.output, Replayed: true, Attempts: attempt - 1}, nil
			}
		}
		if st != nil {
			releaseState(st)
		}
		st = acquireState()
		st.rt, st.m, st.method, st.requestID, st.now = r, m, method, req.RequestID, req.Now
		st.part, st.info, st.keys, st.rng = req.Partition, info, req.Keys, req.Range
		st.trackRead = m.man.Writes && info.Primary
		status, err := r.run(ctx, m, method, req.Input, req.Deadline, st)
		res = CallResult{Output: st.out, Status: status, Message: st.errMsg, Attempts: attempt}
		if err != nil {
			return res, r.explainCap(fmt.Errorf("call %v %s: %w", key, method, err), capped)
		}
		if status != 0 {
			r.stats.guestErrors.Add(1)
			return res, &GuestError{Status: status, Message: st.errMsg}
		}
		if len(st.order) == 0 {
			return res, nil
		}
		batch := st.batch()
		reads := st.readList()
		if idemKey != nil {
			rec := encodeIdemRecord(idemRecord{module: key.Name, method: method, digest: digest, hasDigest: true, output: st.out})
			batch = append(batch, engines.Mutation{Key: idemKey, Value: rec, ExpiresAt: req.Now.Add(r.opts.IdempotencyTTL).UnixMilli()})
			reads = append(reads, Read{Key: idemKey, Existed: false})
		}
		err = req.Partition.Commit(ctx, reads, batch)
		switch {
		case err == nil:
			r.stats.commits.Add(1)
			res.Writes = len(batch)
			if idemKey != nil {
				res.Writes--
			}
			return res, nil
		case errors.Is(err, ErrConflict) && attempt <= r.opts.MaxConflictRetries:
			r.stats.conflicts.Add(1)
			continue
		default:
			if errors.Is(err, ErrConflict) {
				r.stats.conflicts.Add(1)
			}
			return res, fmt.Errorf("call %v %s: commit: %w", key, method, err)
		}
	}
}

// run takes an instance, writes the input and calls the export. It returns
// the handler's status; the instance goes back to the pool unless the call
// failed in the runtime.
func (r *Runtime) run(ctx context.Context, m *module, export string, input []byte, deadline time.Time, st *callState) (int32, error) {
	if deadline.IsZero() {
		deadline = time.Now().Add(r.opts.DefaultTimeout)
	}
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	// The fast path takes an idle instance and an execution slot without
	// waiting; only a wait needs a context with the deadline.
	in := m.pool.tryGet()
	if in == nil {
		wctx, cancel := context.WithDeadline(ctx, deadline)
		var err error
		in, err = m.pool.get(wctx)
		cancel()
		if err != nil {
			return 0, err
		}
	}
	select {
	case r.exec <- struct{}{}:
	default:
		wctx, cancel := context.WithDeadline(ctx, deadline)
		select {
		case r.exec <- struct{}{}:
			cancel()
		case <-wctx.Done():
			cancel()
			m.pool.release(in)
			r.stats.busy.Add(1)
			return 0, fmt.Errorf("%w: %d guest calls executing, none ended before the deadline: %w", ErrBusy, cap(r.exec), wctx.Err())
		}
	}
	t0 := time.Now()
	defer func() {
		r.cpu.add(m.key.Tenant, time.Since(t0))
		<-r.exec
	}()
	r.stats.calls.Add(1)
	st.in = in
	in.beginCall(st)
	defer st.closeScans()
	if in.cc == nil {
		in.cc = newCallCtx()
	}
	cc := in.cc
	cc.arm(r.wd, ctx, st, deadline)
	status, err := in.invoke(cc, export, input)
	if !cc.disarm(r.wd) {
		in.cc = nil
	}
	if err != nil {
		err = st.classify(cc, err)
		in.endCall()
		m.pool.discard(in)
		return 0, err
	}
	in.endCall()
	m.pool.release(in)
	return status, nil
}

// minReserve is the smallest input buffer the host asks a guest for, so
// that small inputs of later calls fit the buffer already reserved.
const minReserve = 4096

// invoke writes input into the guest's input buffer and calls the export.
// The buffer tabula_reserve returned stays the guest's input buffer until
// the next reserve (ABI.md), so reserve is called only when the input
// outgrows it: most calls enter the guest once.
func (in *instance) invoke(ctx context.Context, export string, input []byte) (int32, error) {
	fn := in.handler(export)
	if fn == nil {
		return 0, fmt.Errorf("%w: %q", ErrUnknownMethod, export)
	}
	n := uint32(len(input))
	if n > in.inCap {
		size := max(n, minReserve)
		in.inCap = 0
		in.stack[0] = uint64(size)
		if err := in.reserve.CallWithStack(ctx, in.stack); err != nil {
			return 0, err
		}
		ptr := uint32(in.stack[0])
		if _, ok := in.mod.Memory().Read(ptr, size); !ok {
			st := in.cur
			st.abort = fmt.Errorf("%w: %s returned %#x, not a buffer of %d bytes", ErrGuestFault, abi.ReserveExport, ptr, size)
			return 0, st.abort
		}
		in.inPtr, in.inCap = ptr, size
	}
	if n > 0 && !in.mod.Memory().Write(in.inPtr, input) {
		st := in.cur
		st.abort = fmt.Errorf("%w: input buffer %#x is outside guest memory", ErrGuestFault, in.inPtr)
		return 0, st.abort
	}
	in.stack[0] = uint64(n)
	if err := fn.CallWithStack(ctx, in.stack); err != nil {
		return 0, err
	}
	return int32(uint32(in.stack[0])), nil
}

// classify turns the error of a failed guest call into the package's errors.
func (st *callState) classify(ctx context.Context, err error) error {
	rt := st.rt
	if st.abort != nil {
		switch {
		case errors.Is(st.abort, ErrGuestFault):
			rt.stats.traps.Add(1)
		}
		return st.abort
	}
	var exit *sys.ExitError
	isExit := errors.As(err, &exit)
	if isExit && exit.ExitCode() == sys.ExitCodeDeadlineExceeded || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		rt.stats.timeouts.Add(1)
		return fmt.Errorf("%w: stopped the guest: %w", ErrDeadline, context.DeadlineExceeded)
	}
	if isExit && exit.ExitCode() == sys.ExitCodeContextCanceled || errors.Is(ctx.Err(), context.Canceled) {
		rt.stats.timeouts.Add(1)
		return fmt.Errorf("coproc: call canceled: %w", context.Canceled)
	}
	tail := st.in.stderr.tail()
	if st.oom || st.nearMemoryCap() {
		rt.stats.memoryLimits.Add(1)
		return fmt.Errorf("%w (%d pages): %s", ErrMemoryLimit, rt.opts.MemoryLimitPages, firstNonEmpty(tail, err.Error()))
	}
	rt.stats.traps.Add(1)
	if isExit {
		if tail != "" {
			return fmt.Errorf("%w: exited with code %d: %s", ErrTrap, exit.ExitCode(), tail)
		}
		return fmt.Errorf("%w: exited with code %d", ErrTrap, exit.ExitCode())
	}
	return fmt.Errorf("%w: %w", ErrTrap, err)
}

// nearMemoryCap reports whether the instance's memory is within one Go heap
// arena (4 MiB) of the cap: a failed call there ran out of memory.
func (st *callState) nearMemoryCap() bool {
	mem := st.in.mod.Memory()
	if mem == nil {
		return false
	}
	limit := uint64(st.rt.opts.MemoryLimitPages) * 65536
	return uint64(mem.Size())+4<<20 > limit
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// batch is the staged writes as one batch, in first-write order.
func (st *callState) batch() []engines.Mutation {
	b := make([]engines.Mutation, 0, len(st.order)+1)
	for _, k := range st.order {
		w := st.staged[k]
		b = append(b, engines.Mutation{Key: []byte(k), Delete: w.del, Value: w.value, ExpiresAt: w.expiresAt})
	}
	return b
}

func (st *callState) readList() []Read {
	reads := make([]Read, 0, len(st.reads)+1)
	for _, rd := range st.reads {
		reads = append(reads, rd)
	}
	slices.SortFunc(reads, func(a, b Read) int { return compareBytes(a.Key, b.Key) })
	return reads
}

func compareBytes(a, b []byte) int {
	switch {
	case string(a) < string(b):
		return -1
	case string(a) > string(b):
		return 1
	}
	return 0
}

// scanIter is an open scan: the partition's records in range with the
// call's staged writes over them (read-your-writes), then the staged keys
// the partition did not have.
type scanIter struct {
	next   func() ([]byte, []byte, bool)
	stop   func()
	err    *error
	staged map[string]*stagedWrite // staged writes in range when opened
	seen   map[string]bool
	extra  []string // staged puts not seen in the partition, yielded last
	done   bool
	// peek is a record that did not fit in the previous batch.
	peekK, peekV []byte
	peeked       bool
}

func (st *callState) openScan(r KeyRange) *scanIter {
	var scanErr error
	seq := func(yield func([]byte, []byte) bool) {
		err := st.part.Scan(r, func(k, v []byte) error {
			if !yield(k, v) {
				return errStopScan
			}
			return nil
		})
		if err != nil && !errors.Is(err, errStopScan) {
			scanErr = err
		}
	}
	next, stop := iter.Pull2(iter.Seq2[[]byte, []byte](seq))
	it := &scanIter{next: next, stop: stop, err: &scanErr}
	for k, w := range st.staged {
		if r.Contains([]byte(k)) {
			if it.staged == nil {
				it.staged = make(map[string]*stagedWrite)
				it.seen = make(map[string]bool)
			}
			it.staged[k] = &stagedWrite{del: w.del, value: w.value, expiresAt: w.expiresAt}
		}
	}
	return it
}

var errStopScan = errors.New("coproc: scan stopped")

// nextRecord returns the next record; the slices are valid until the next call.
func (it *scanIter) nextRecord() (k, v []byte, ok bool, err error) {
	if it.peeked {
		it.peeked = false
		return it.peekK, it.peekV, true, nil
	}
	for !it.done {
		k, v, ok := it.next()
		if !ok {
			it.done = true
			if *it.err != nil {
				return nil, nil, false, *it.err
			}
			for sk, w := range it.staged {
				if !w.del && !it.seen[sk] {
					it.extra = append(it.extra, sk)
				}
			}
			slices.Sort(it.extra)
			break
		}
		if isReserved(k) {
			continue
		}
		if w, ok := it.staged[string(k)]; ok {
			it.seen[string(k)] = true
			if w.del {
				continue
			}
			v = w.value
		}
		return k, v, true, nil
	}
	if len(it.extra) > 0 {
		k := it.extra[0]
		it.extra = it.extra[1:]
		return []byte(k), it.staged[k].value, true, nil
	}
	return nil, nil, false, nil
}

func (it *scanIter) unread(k, v []byte) {
	it.peekK = append(it.peekK[:0], k...)
	it.peekV = append(it.peekV[:0], v...)
	it.peeked = true
}

func (st *callState) closeScans() {
	for _, it := range st.scans {
		it.stop()
	}
	st.scans = nil
}
