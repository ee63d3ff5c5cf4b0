package client

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tabuladb/tabula/api"
)

// refreshTimeout bounds a map refresh made between retries of a data call:
// if the masters are unreachable too, the call should go on retrying the
// server with the map it has rather than spend its whole deadline there.
const refreshTimeout = 2 * time.Second

// Table is a handle on one table of the client's tenant. It is cheap (make
// one per call if convenient: the partition map is cached by the Client, not
// the handle) and safe for concurrent use.
type Table struct {
	c    *Client
	name string
	ts   *tableState // nil when the name is invalid
	err  error       // the name's validation error
	pin  uint64      // bulk tables: the version reads name (0: the serving one)
}

// Table returns a handle on the table name. It does no I/O; an invalid name
// or a missing table is reported by the first call.
func (c *Client) Table(name string) *Table {
	t := &Table{c: c, name: name}
	if err := api.ValidateName("table", name); err != nil {
		t.err = err
		return t
	}
	t.ts = c.state(name)
	return t
}

// Name is the table's name.
func (t *Table) Name() string { return t.name }

// errf says which operation on which table failed.
func (t *Table) errf(op string, err error) error {
	return fmt.Errorf("client: %s %q: %w", op, t.name, err)
}

// Map returns the table's cached partition map, fetching it from a master
// if there is none yet. The map is shared: do not modify it.
func (t *Table) Map(ctx context.Context) (*api.PartitionMap, error) {
	if t.err != nil {
		return nil, t.errf("map of", t.err)
	}
	if t.c.ctx.Err() != nil {
		return nil, t.errf("map of", ErrClosed)
	}
	ctx, _, cancel := t.c.callCtx(ctx, true)
	defer cancel()
	m, err := t.ts.current(ctx)
	if err != nil {
		return nil, t.errf("map of", err)
	}
	return m, nil
}

// maxValue is the table's value limit.
func maxValue(m *api.PartitionMap) uint64 {
	if v := m.GetTable().GetOptions().GetMaxValueBytes(); v > 0 {
		return v
	}
	return api.DefaultMaxValueBytes
}

// ttlMillis converts a TTL to the wire's whole milliseconds, rounding up so a
// positive TTL never becomes 0 ("the table's default").
func ttlMillis(field string, d time.Duration) (uint64, error) {
	if d < 0 {
		return 0, api.InvalidArgument(field, "ttl_negative", 0, "%s is negative (%v)", field, d)
	}
	ms := uint64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		ms++
	}
	if err := api.ValidateTTL(field, ms); err != nil {
		return 0, err
	}
	return ms, nil
}

// pickFunc chooses the partition a request goes to from the current map. An
// error wrapped in permanentError (bad input) is returned at once; others are
// retried like UNAVAILABLE.
type pickFunc func(m *api.PartitionMap) (*api.Partition, error)

// rpcFunc sends one attempt of a request to a partition's replica.
type rpcFunc func(ctx context.Context, ts api.TableServerClient, h *api.RequestHeader) error

// lsnRPC is an rpcFunc that also returns the LSN the reply carries.
type lsnRPC func(ctx context.Context, ts api.TableServerClient, h *api.RequestHeader) (uint64, error)

// pickRoute routes to the partition holding r.
func pickRoute(r route) pickFunc {
	return func(m *api.PartitionMap) (*api.Partition, error) {
		if p, ok := partitionOf(m, r); ok {
			return p, nil
		}
		if ordered(m) {
			return nil, unavailable("no_partition", "the partition map has no partition for key %q", r.key)
		}
		return nil, unavailable("no_partition", "the partition map has no partition for hash %#x", r.h)
	}
}

// callSpec is one logical request to one partition.
type callSpec struct {
	op      string
	bounded bool // the call's deadline bounds each attempt (unary calls)
	pick    pickFunc
	rpc     lsnRPC
	// reqID marks a write: the id every attempt carries. A write the call
	// gives up on after an attempt that may have applied returns an
	// *OutcomeUnknownError naming it.
	reqID  string
	invoke bool // a coprocessor call: reqID is its idempotency token
	read   readOptions
	class  callClass // what the call is charged as (pace.go)
	// bulkVersion: a bulk read of this version goes to a copy serving
	// it (0: any serving copy, at the version it serves).
	bulkVersion uint64
}

// do runs a request that reports no LSN (see call).
func (t *Table) do(ctx context.Context, op string, bounded bool, pick pickFunc, rpc rpcFunc) error {
	_, _, err := t.call(ctx, callSpec{op: op, bounded: bounded, pick: pick,
		rpc: func(ctx context.Context, ts api.TableServerClient, h *api.RequestHeader) (uint64, error) {
			return 0, rpc(ctx, ts, h)
		}})
	return err
}

// call sends a request to a partition's primary (any replica for a
// ReadAny read) and retries it under the client's policy until it
// succeeds, fails for good, or runs out of time. It returns the partition
// that answered and the LSN of the reply.
//
//   - NOT_OWNER, STALE_EPOCH: patch the cached map from the error's
//     partition entry when it is newer, else fetch the map; retry at once
//     the first time, later with backoff.
//   - UNAVAILABLE (also a partition with no primary): back off, then fetch
//     the map (the server may be dead and its partitions moved). A ReadAny
//     read tries another replica at once, then the primary.
//   - SERVER_BUSY: back off at least the server's retry_after_ms.
//   - NOT_FOUND from a server whose map is older than ours (a table just
//     created): back off and retry. Otherwise fetch the map once and retry
//     only if the table was re-created (its id changed), since the cached
//     map may be of the dropped one.
//   - anything else: return at once.
//
// A backoff ends early when the cached map changes (the watch delivered a
// failover), and resets; an attempt in flight to a partition whose entry
// changes is cut short and retried on the new map at once.
func (t *Table) call(ctx context.Context, spec callSpec) (partition, lsn uint64, _ error) {
	c := t.c
	ctx, deadline, cancel := c.callCtx(ctx, spec.bounded)
	defer cancel()
	var (
		last      error
		where     string // the partition and server of the last failure
		rerouted  bool   // the immediate retry after a routing error is used
		refetched bool   // the NOT_FOUND re-check is used
		backoffs  int
		ambiguous bool            // a write attempt may have applied
		tried     map[string]bool // ReadAny: replicas that failed
	)
	op := spec.op
	if spec.read.any {
		tried = make(map[string]bool)
	}
	giveUp := func() error {
		err := c.giveUp(ctx, fmt.Sprintf("client: %s %q%s", op, t.name, where), last)
		if ambiguous {
			return &OutcomeUnknownError{RequestID: spec.reqID, Err: err, invoke: spec.invoke}
		}
		return err
	}
	for {
		if c.ctx.Err() != nil {
			return 0, 0, giveUp()
		}
		changed := t.ts.changedCh()
		m, err := t.ts.current(ctx)
		if err != nil {
			if ctx.Err() != nil || c.ctx.Err() != nil {
				if last == nil {
					last = err
				}
				return 0, 0, giveUp()
			}
			return 0, 0, t.errf(op, err)
		}
		var (
			header *api.RequestHeader
			target *api.Replica
			moved  bool // the attempt was cut short by a map change
		)
		p, err := spec.pick(m)
		if err == nil {
			// Reads of a bulk table go to any serving copy, spreading the
			// load; a copy that fails is skipped for the next attempt.
			spread := spec.read.any || spec.reqID == "" && !spec.invoke && m.GetTable().GetKind() == api.TableKind_TABLE_KIND_BULK
			if spread && tried == nil {
				tried = make(map[string]bool)
			}
			bulkTable := m.GetTable().GetKind() == api.TableKind_TABLE_KIND_BULK
			version := spec.bulkVersion
			if version == 0 && bulkTable {
				version = t.pin
			}
			// A batch or scan that picked its version may pick another
			// (bulkCopyFor's giveUp); a pinned read may not.
			chose := spec.bulkVersion != 0 && t.pin == 0
			switch {
			case spread && bulkTable:
				target = c.bulkCopyFor(p, version, tried, chose)
				served := func(ok func(uint64) bool) bool {
					return slices.ContainsFunc(p.GetReplicas(), func(r *api.Replica) bool { return r.GetBulkServes() != 0 && ok(r.GetBulkServes()) })
				}
				if target == nil && !served(func(v uint64) bool { return version == 0 || v == version }) &&
					(!chose || !served(func(v uint64) bool { return v != version })) {
					// No copy serves it by this map: a copy loading it
					// (a new copy after a move) answers that it is not
					// loaded yet, and the retry waits for it; with no
					// version at all, any copy says so. (A batch or scan
					// whose version another copy here would replace picks
					// that instead.)
					want := version
					if want == 0 {
						want = m.GetBulk().GetCurrent()
					}
					if target = holderOf(p, want); target == nil && version == 0 {
						target = c.replicaFor(p, tried)
					}
				}
			case spread:
				target = c.replicaFor(p, tried)
			default:
				target = primaryOf(p)
			}
			switch {
			case target == nil && bulkTable && spread:
				err = bulkNotServed(p, version)
				if chose {
					// A batch or scan picked the version: it starts
					// over on one the map serves.
					err = &permanentError{err}
				}
			case target == nil:
				err = unavailable("no_primary", "partition %d has no primary", p.GetId())
			default:
				// Bulk tables: the version asked for, else the one the
				// copy serves by this map; a server that has unloaded it
				// answers VERSION_GONE and the retry takes the new map's.
				if version == 0 {
					version = target.GetBulkServes()
				}
				if version == 0 {
					version = m.GetBulk().GetCurrent()
				}
				header = &api.RequestHeader{Tenant: c.opts.Tenant, Table: t.name, PartitionId: p.GetId(), Epoch: p.GetEpoch(),
					BulkVersion: version, ReadAny: spec.read.any, MinLsn: spec.read.minLSN,
					MaxStalenessMs: maxStalenessMs(spec.read.maxLag)}
				if s := spec.read.session; s != nil {
					header.MinLsn = max(header.MinLsn, s.LSN(t.name, p.GetId()))
				}
				ts, cerr := c.server(target.GetAddr())
				if cerr != nil {
					err = cerr
				} else {
					actx, acancel := context.WithCancelCause(ctx)
					stop := func() bool { return false }
					if !(spread && bulkTable) {
						// A map change that moves the partition cuts the
						// attempt short. Not for bulk reads: a copy
						// added or leaving (a rollout's rows) changes the
						// entry while the copy read keeps its version; one
						// that no longer holds it says so, and a dead one
						// is given up on after spreadAttemptTimeout.
						stop = context.AfterFunc(t.ts.moved(p), func() { acancel(errMoved) })
					}
					var slow *time.Timer
					if spread && len(p.GetReplicas()) > 1 {
						// A copy that does not answer (stopped, or far
						// behind) holds a read only so long: another copy
						// gets it then, rather than the deadline.
						slow = time.AfterFunc(spreadAttemptTimeout, func() { acancel(errSlowCopy) })
					}
					var got uint64
					if err = c.pacers.wait(actx, target.GetAddr(), spec.class); err == nil {
						sc, _ := ts.(*serverClient)
						if sc != nil {
							sc.inflight.Add(1)
						}
						got, err = spec.rpc(actx, ts, header)
						if sc != nil {
							sc.inflight.Add(-1)
						}
					}
					stop()
					if slow != nil {
						slow.Stop()
					}
					moved = err != nil && ctx.Err() == nil && errors.Is(context.Cause(actx), errMoved)
					if err != nil && ctx.Err() == nil && errors.Is(context.Cause(actx), errSlowCopy) {
						err = unavailable("copy_slow", "the copy of partition %d at %s did not answer within %v", p.GetId(), target.GetAddr(), spreadAttemptTimeout)
					}
					acancel(nil)
					if err == nil {
						if s := spec.read.session; s != nil {
							s.note(t.name, p.GetId(), got)
						}
						return p.GetId(), got, nil
					}
					if spec.reqID != "" && maybeApplied(err) {
						ambiguous = true
					}
				}
				if err != nil {
					where = fmt.Sprintf(" (partition %d at %s)", p.GetId(), target.GetAddr())
				}
			}
		}
		if errors.Is(err, errRegroup) {
			return 0, 0, err
		}
		if perm := (*permanentError)(nil); errors.As(err, &perm) {
			return 0, 0, perm.err
		}
		if last == nil || !endedByDeadline(ctx, err) || moved {
			last = err
		}
		if errors.Is(err, ErrClosed) || ctx.Err() != nil || c.ctx.Err() != nil {
			return 0, 0, giveUp()
		}
		if moved {
			// The partition's entry changed while the attempt was in
			// flight: route by the new map at once.
			c.log.Debug("tabula: retrying", "op", op, "table", t.name, "where", where, "wait", time.Duration(0), "err", err)
			continue
		}
		d := api.DetailOf(err)
		if target != nil && tried != nil {
			tried[target.GetAddr()] = true
			if d.GetCode() == api.ErrorCode_ERROR_CODE_UNAVAILABLE || d.GetCode() == api.ErrorCode_ERROR_CODE_NOT_OWNER {
				// Another replica may well answer: try it at once, the
				// primary last.
				if d.GetCode() == api.ErrorCode_ERROR_CODE_NOT_OWNER {
					t.ts.patch(d.GetPartition())
				}
				if next := c.replicaFor(p, maps.Clone(tried)); next != nil && !tried[next.GetAddr()] {
					c.log.Debug("tabula: retrying", "op", op, "table", t.name, "where", where, "wait", time.Duration(0), "err", err)
					continue
				}
			}
		}
		var wait time.Duration
		refresh := false
		switch d.GetCode() {
		case api.ErrorCode_ERROR_CODE_NOT_OWNER, api.ErrorCode_ERROR_CODE_STALE_EPOCH:
			refresh = !t.ts.patch(d.GetPartition())
			if !rerouted {
				rerouted = true
				if refresh {
					t.refreshQuietly(ctx)
				}
				continue
			}
			wait = c.jitter.backoff(backoffs, backoffBase, backoffCap)
			backoffs++
		case api.ErrorCode_ERROR_CODE_UNAVAILABLE:
			// A server that answered (log_reconfiguring, behind_min_lsn,
			// replica_behind, outcome_unknown) keeps its partition: no map fetch needed;
			// a transport failure may mean a dead server.
			refresh = !hasDetail(err)
			wait = c.jitter.backoff(backoffs, backoffBase, backoffCap)
			backoffs++
		case api.ErrorCode_ERROR_CODE_SERVER_BUSY:
			if target != nil {
				c.pacers.refused(target.GetAddr(), d)
			}
			wait = max(c.jitter.backoff(backoffs, backoffBase, backoffCap), time.Duration(d.GetRetryAfterMs())*time.Millisecond)
			backoffs++
		case api.ErrorCode_ERROR_CODE_VERSION_GONE:
			// Our map is behind the version switches: take the new map.
			if t.pin != 0 {
				return 0, 0, fmt.Errorf("client: %s %q%s: %w", op, t.name, where, err)
			}
			refresh = true
			wait = c.jitter.backoff(backoffs, backoffBase, backoffCap)
			backoffs++
		case api.ErrorCode_ERROR_CODE_NOT_FOUND:
			if header != nil && d.GetMapVersion() != 0 && d.GetMapVersion() < m.GetVersion() {
				// The server has not yet seen the map we routed by (a
				// table just created): it will.
				wait = c.jitter.backoff(backoffs, backoffBase, backoffCap)
				backoffs++
				break
			}
			if refetched || header == nil {
				return 0, 0, t.errf(op, err)
			}
			refetched = true
			nm, ferr := t.ts.refresh(ctx)
			if ferr != nil {
				return 0, 0, t.errf(op, ferr)
			}
			if nm.GetTable().GetId() == m.GetTable().GetId() {
				return 0, 0, t.errf(op, err)
			}
			continue
		default:
			return 0, 0, fmt.Errorf("client: %s %q%s: %w", op, t.name, where, err)
		}
		c.log.Debug("tabula: retrying", "op", op, "table", t.name, "where", where, "wait", wait, "err", err)
		switch pauseOrChange(ctx, deadline, wait, changed) {
		case pauseEnded:
			return 0, 0, giveUp()
		case pauseChanged:
			// The watch delivered a new map: retry by it now, and back
			// off from the start if it is not ready yet.
			backoffs = 0
			continue
		}
		if refresh {
			t.refreshQuietly(ctx)
		}
	}
}

// pauseResult says how a wait between retries ended.
type pauseResult int

const (
	pauseWaited  pauseResult = iota // the full wait passed
	pauseChanged                    // the map changed first
	pauseEnded                      // ctx ended, or the wait would pass the deadline
)

// pauseOrChange waits d before the next retry, or until changed is closed.
func pauseOrChange(ctx context.Context, deadline time.Time, d time.Duration, changed <-chan struct{}) pauseResult {
	select {
	case <-changed:
		if ctx.Err() != nil {
			return pauseEnded
		}
		return pauseChanged
	default:
	}
	if !time.Now().Add(d).Before(deadline) {
		return pauseEnded
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return pauseWaited
	case <-changed:
		return pauseChanged
	case <-ctx.Done():
		return pauseEnded
	}
}

// hasDetail reports whether err carries a Tabula ErrorDetail: a server
// answered it, as opposed to a transport failure.
func hasDetail(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		var se interface{ GRPCStatus() *status.Status }
		if !errors.As(err, &se) {
			return false
		}
		st = se.GRPCStatus()
	}
	for _, d := range st.Details() {
		if _, ok := d.(*api.ErrorDetail); ok {
			return true
		}
	}
	return false
}

// maybeApplied reports whether a write attempt that failed with err may
// have been applied: the server said so (UNAVAILABLE outcome_unknown: its
// primary changed under the write), or the attempt failed in transport
// after the request may have reached the server (a deadline, a cancel, a
// connection broken mid-call). A server's refusal (any other answer with
// an ErrorDetail) and a connection that could not be made ("Error while
// dialing": nothing was sent) certainly did not apply.
func maybeApplied(err error) bool {
	if hasDetail(err) {
		return api.DetailOf(err).GetReason() == "outcome_unknown"
	}
	if errors.Is(err, ErrClosed) {
		return false
	}
	switch status.Code(err) {
	case codes.InvalidArgument, codes.ResourceExhausted, codes.Unimplemented, codes.NotFound, codes.PermissionDenied, codes.Unauthenticated:
		return false
	case codes.Unavailable:
		return !strings.Contains(status.Convert(err).Message(), "Error while dialing")
	}
	return true
}

// refreshQuietly fetches the map between retries; a failure is logged, not
// returned, since the retry may well succeed with the map at hand.
func (t *Table) refreshQuietly(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, refreshTimeout)
	defer cancel()
	if _, err := t.ts.refresh(ctx); err != nil {
		t.c.log.Debug("tabula: partition map refresh failed", "table", t.name, "err", err)
	}
}

// check validates the handle and a key before any I/O.
func (t *Table) check(op, field string, key []byte) error {
	if t.err != nil {
		return t.errf(op, t.err)
	}
	if err := api.ValidateKey(field, key); err != nil {
		return t.errf(op, err)
	}
	return nil
}

// Get returns the value of key, or ErrKeyNotFound when it is absent or
// expired. Reads go to the partition's primary, so they are strong
// (linearizable); ReadAny lets any replica answer, MinLSN or a Session
// bound how stale that answer may be, and ReportLSN gives the LSN it
// reflects.
func (t *Table) Get(ctx context.Context, key []byte, opts ...ReadOption) ([]byte, error) {
	const op = "get from"
	if err := t.check(op, "key", key); err != nil {
		return nil, err
	}
	ro := readOpts(opts)
	var resp *api.GetResponse
	_, lsn, err := t.call(ctx, callSpec{op: op, bounded: true, pick: pickRoute(routeOf(key)), read: ro, class: classRead,
		rpc: func(ctx context.Context, ts api.TableServerClient, h *api.RequestHeader) (uint64, error) {
			var err error
			if t.pin != 0 {
				h.BulkVersion = t.pin
			}
			resp, err = ts.Get(ctx, &api.GetRequest{Header: h, Key: key})
			return resp.GetLsn(), err
		}})
	if err != nil {
		return nil, err
	}
	if ro.lsn != nil {
		*ro.lsn = lsn
	}
	if !resp.GetFound() {
		return nil, ErrKeyNotFound
	}
	if resp.GetValue() == nil {
		return []byte{}, nil
	}
	return resp.GetValue(), nil
}

// write runs one partition's write under wo's request id and reports its
// LSN to wo's ReportLSN and Session.
func (t *Table) write(ctx context.Context, op string, wo writeOptions, pick pickFunc, rpc lsnRPC) error {
	pid, lsn, err := t.call(ctx, callSpec{op: op, bounded: true, pick: pick, rpc: rpc, reqID: wo.reqID, class: classWrite})
	if err != nil {
		return err
	}
	if wo.lsn != nil {
		*wo.lsn = lsn
	}
	if wo.session != nil {
		wo.session.note(t.name, pid, lsn)
	}
	return nil
}

// Put sets key to value. When Put returns nil the write is acknowledged:
// committed to the partition's log on its replicas (durable as the table's
// storage makes it). ReportLSN gives its LSN. Retries carry the call's
// request id, so the write applies at most once; a call that gives up
// after an attempt that may have applied returns ErrOutcomeUnknown.
func (t *Table) Put(ctx context.Context, key, value []byte, opts ...WriteOption) error {
	const op = "put to"
	if err := t.check(op, "key", key); err != nil {
		return err
	}
	wo, err := writeOpts(opts)
	if err != nil {
		return t.errf(op, err)
	}
	ttl, err := ttlMillis("ttl", wo.ttl)
	if err != nil {
		return t.errf(op, err)
	}
	r := routeOf(key)
	pick := func(m *api.PartitionMap) (*api.Partition, error) {
		if err := api.ValidateValue("value", value, maxValue(m)); err != nil {
			return nil, &permanentError{t.errf(op, err)}
		}
		return pickRoute(r)(m)
	}
	return t.write(ctx, op, wo, pick, func(ctx context.Context, ts api.TableServerClient, hd *api.RequestHeader) (uint64, error) {
		resp, err := ts.Put(ctx, &api.PutRequest{Header: hd, Key: key, Value: value, TtlMs: ttl, RequestId: wo.reqID})
		return resp.GetLsn(), err
	})
}

// Delete removes key and reports whether it existed. Retries carry the
// call's request id, so a retry after a lost reply reports what the first
// attempt found; a call that gives up after an attempt that may have
// applied returns ErrOutcomeUnknown. WithTTL does not apply.
func (t *Table) Delete(ctx context.Context, key []byte, opts ...WriteOption) (existed bool, err error) {
	const op = "delete from"
	if err := t.check(op, "key", key); err != nil {
		return false, err
	}
	wo, err := writeOpts(opts)
	if err != nil {
		return false, t.errf(op, err)
	}
	var resp *api.DeleteResponse
	err = t.write(ctx, op, wo, pickRoute(routeOf(key)), func(ctx context.Context, ts api.TableServerClient, h *api.RequestHeader) (uint64, error) {
		var err error
		resp, err = ts.Delete(ctx, &api.DeleteRequest{Header: h, Key: key, RequestId: wo.reqID})
		return resp.GetLsn(), err
	})
	if err != nil {
		return false, err
	}
	return resp.GetExisted(), nil
}

// CAS is a compare-and-swap on one key: if the key's current state matches
// the expectation (absent when ExpectAbsent, else present with exactly the
// value Expected — nil Expected means the empty value), it is replaced by the
// new state (deleted when Delete, else Value with TTL).
type CAS struct {
	Key          []byte
	ExpectAbsent bool
	Expected     []byte
	Delete       bool
	Value        []byte
	// TTL of the new value: 0 means the table's default.
	TTL time.Duration
}

// CASResult is what a CompareAndSwap found.
type CASResult struct {
	// Swapped reports whether the new state was written.
	Swapped bool
	// Existed and Current are the key's state before the call: when not
	// swapped, the state that did not match the expectation.
	Existed bool
	Current []byte
	// LSN is the call's position in the partition's log (also when not
	// swapped); 0 for tables without a log.
	LSN uint64
}

// maxSwapBytes bounds a CompareAndSwap's key and two values: they travel
// in one message, which must stay under api.MaxMessageBytes with its
// framing.
const maxSwapBytes = api.MaxMessageBytes - 1<<20

// CompareAndSwap atomically checks and replaces one key's state. A
// mismatch is not an error: it is Swapped=false with the current state.
// Retries carry the call's request id, so a retry after a lost reply
// returns the first attempt's result (Swapped=true if it swapped); a call
// that gives up after an attempt that may have applied returns
// ErrOutcomeUnknown. Of the options, WithRequestID, ReportLSN and Session
// apply (the TTL is CAS.TTL).
func (t *Table) CompareAndSwap(ctx context.Context, c CAS, opts ...WriteOption) (CASResult, error) {
	const op = "compare-and-swap in"
	if err := t.check(op, "key", c.Key); err != nil {
		return CASResult{}, err
	}
	wo, err := writeOpts(opts)
	if err != nil {
		return CASResult{}, t.errf(op, err)
	}
	ttl, err := ttlMillis("ttl", c.TTL)
	if err != nil {
		return CASResult{}, t.errf(op, err)
	}
	expected, value := c.Expected, c.Value
	if c.ExpectAbsent {
		expected = nil
	}
	if c.Delete {
		value = nil
	}
	// One message carries both values: each may be within the table's
	// limit and the two together still too large to send, and on the
	// Calls stream a message over the limit ends the stream, failing
	// every call beside it.
	if n := len(c.Key) + len(expected) + len(value); n > maxSwapBytes {
		return CASResult{}, t.errf(op, api.InvalidArgument("value", "message_too_large", maxSwapBytes,
			"the key, expected and new value together are %d bytes; one swap carries at most %d", n, maxSwapBytes))
	}
	r := routeOf(c.Key)
	pick := func(m *api.PartitionMap) (*api.Partition, error) {
		limit := maxValue(m)
		if err := api.ValidateValue("expected", expected, limit); err != nil {
			return nil, &permanentError{t.errf(op, err)}
		}
		if err := api.ValidateValue("value", value, limit); err != nil {
			return nil, &permanentError{t.errf(op, err)}
		}
		return pickRoute(r)(m)
	}
	var resp *api.CompareAndSwapResponse
	err = t.write(ctx, op, wo, pick, func(ctx context.Context, ts api.TableServerClient, h *api.RequestHeader) (uint64, error) {
		var err error
		resp, err = ts.CompareAndSwap(ctx, &api.CompareAndSwapRequest{
			Header: h, Key: c.Key, ExpectExists: !c.ExpectAbsent, Expected: expected,
			Delete: c.Delete, Value: value, TtlMs: ttl, RequestId: wo.reqID,
		})
		return resp.GetLsn(), err
	})
	if err != nil {
		return CASResult{}, err
	}
	return CASResult{Swapped: resp.GetSwapped(), Existed: resp.GetExisted(), Current: resp.GetCurrent(), LSN: resp.GetLsn()}, nil
}
