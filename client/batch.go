package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tabuladb/tabula/api"
)

// maxParallel bounds the per-partition requests one batch call has in
// flight: enough to cover a typical table at once, few enough that a batch
// over a 4096-partition table does not open 4096 streams.
const maxParallel = 64

// GetResult is one key's outcome in BatchGet.
type GetResult struct {
	Value []byte
	Found bool
}

// Mutation is one write in BatchWrite: a put of Value (with TTL, 0 meaning
// the table's default) or, when Delete is set, a delete; applied only if
// Cond holds (the zero Condition always does).
type Mutation struct {
	Key, Value []byte
	Delete     bool
	TTL        time.Duration
	Cond       Condition
}

// ConditionKind says what a Condition requires of a key.
type ConditionKind int

const (
	// CondNone: no condition (the zero value).
	CondNone ConditionKind = iota
	// CondAbsent: the key does not exist (an insert).
	CondAbsent
	// CondPresent: the key exists, with any value.
	CondPresent
	// CondPrefix: the key exists and its value starts with
	// Condition.Prefix (a version or ETag kept at the value's start).
	CondPrefix
)

// Condition is what a key's state must be, before the batch, for a
// BatchWrite to apply its partition's mutations. Conditions are checked
// atomically with the write against the partition's state, including
// writes in flight; an expired record counts as absent. If one fails,
// none of the partition's mutations apply and BatchWrite returns a
// *ConditionFailedError. Mutations with conditions in one partition must
// name distinct keys (INVALID_ARGUMENT duplicate_key otherwise).
//
// Atomicity holds per partition: a batch whose keys span partitions
// applies each partition's share, conditions included, on its own, so
// some partitions may apply while another's condition fails. For an
// all-or-nothing compare-and-set over several keys, keep them in one
// partition (on an ordered table, one key range; on a point table, one
// key's hash partition).
type Condition struct {
	Kind ConditionKind
	// Prefix is the value's required start (CondPrefix only; empty
	// matches any present value).
	Prefix []byte
}

func (c Condition) proto() (*api.Condition, error) {
	var k api.Condition_Kind
	switch c.Kind {
	case CondNone:
		if len(c.Prefix) > 0 {
			return nil, api.InvalidArgument("mutations.cond", "condition_invalid", 0, "a Prefix without Kind CondPrefix")
		}
		return nil, nil
	case CondAbsent:
		k = api.Condition_KIND_ABSENT
	case CondPresent:
		k = api.Condition_KIND_PRESENT
	case CondPrefix:
		k = api.Condition_KIND_PREFIX
	default:
		return nil, api.InvalidArgument("mutations.cond", "condition_invalid", 0, "condition kind %d is none of CondNone, CondAbsent, CondPresent, CondPrefix", c.Kind)
	}
	if len(c.Prefix) > 0 && c.Kind != CondPrefix {
		return nil, api.InvalidArgument("mutations.cond", "condition_invalid", 0, "a Prefix without Kind CondPrefix")
	}
	return &api.Condition{Kind: k, Prefix: c.Prefix}, nil
}

// group splits the items idx (indices into routes) by partition of m, in
// partition order, keeping the items' order within a group. Items whose hash
// has no partition in m form a last group that the pick will send back as
// UNAVAILABLE until the map is whole again.
func group(m *api.PartitionMap, routes []route, idx []int) [][]int {
	byPart := make(map[int][]int)
	var orphans []int
	for _, i := range idx {
		p, ok := partitionOf(m, routes[i])
		if !ok {
			orphans = append(orphans, i)
			continue
		}
		byPart[int(p.GetIndex())] = append(byPart[int(p.GetIndex())], i)
	}
	out := make([][]int, 0, len(byPart)+1)
	for pi := range len(m.GetPartitions()) {
		if g, ok := byPart[pi]; ok {
			out = append(out, g)
			delete(byPart, pi)
		}
	}
	for _, g := range byPart { // indexes the map got wrong; still one partition each
		out = append(out, g)
	}
	if len(orphans) > 0 {
		out = append(out, orphans)
	}
	return out
}

// pickGroup routes a group to the partition of its first item, and asks for
// a regroup when the current map puts the group's items in several.
func pickGroup(routes []route, g []int) pickFunc {
	return func(m *api.PartitionMap) (*api.Partition, error) {
		p, err := pickRoute(routes[g[0]])(m)
		if err != nil {
			return nil, err
		}
		for _, i := range g[1:] {
			if !inPartition(m, p, routes[i]) {
				return nil, errRegroup
			}
		}
		return p, nil
	}
}

// runParallel calls fn(0..n-1), at most maxParallel at once, and returns the
// first error (by index), noting how many others failed.
func runParallel(n int, fn func(i int) error) error {
	if n == 1 {
		return fn(0)
	}
	errs := make([]error, n)
	sem := make(chan struct{}, maxParallel)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = fn(i)
		})
	}
	wg.Wait()
	// The first error, but an unknown outcome first of all: the caller
	// must learn that some part may have applied.
	var first error
	failed := 0
	for _, err := range errs {
		if err != nil {
			if first == nil || (errors.Is(err, ErrOutcomeUnknown) && !errors.Is(first, ErrOutcomeUnknown)) {
				first = err
			}
			failed++
		}
	}
	if failed > 1 {
		return fmt.Errorf("%w (and %d more partition requests failed)", first, failed-1)
	}
	return first
}

// BatchGet reads many keys: one request per partition (in chunks of at most
// api.MaxBatchKeys keys), the partitions in parallel, each retried on its
// own. Results are in the order of keys; duplicates are allowed. Each
// partition's keys are read at one point in time, but different partitions
// are not read atomically together. ReadAny, MinLSN and a Session apply to
// every partition's read; ReportLSN reports only for a batch within one
// partition.
func (t *Table) BatchGet(ctx context.Context, keys [][]byte, opts ...ReadOption) ([]GetResult, error) {
	const op = "batch get from"
	if t.err != nil {
		return nil, t.errf(op, t.err)
	}
	routes := make([]route, len(keys))
	idx := make([]int, len(keys))
	for i, k := range keys {
		if err := api.ValidateKey("keys", k); err != nil {
			return nil, t.errf(op, fmt.Errorf("key %d: %w", i, err))
		}
		routes[i] = routeOf(k)
		idx[i] = i
	}
	results := make([]GetResult, len(keys))
	if len(keys) == 0 {
		return results, nil
	}
	ro := readOpts(opts)
	// One deadline for the whole batch, regroups included.
	ctx, _, cancel := t.c.callCtx(ctx, true)
	defer cancel()
	// A bulk table's batch reads one version in every partition: one the
	// copies serve by the map at the start (during a rollout, the old or
	// the new one, in proportion to the rows serving each), or the pinned
	// one. If a server has unloaded it meanwhile, the whole batch runs
	// again on a version the new map serves, so no answer mixes versions.
	var avoid map[uint64]bool // versions an attempt found unserved
	for attempt := 0; ; attempt++ {
		m, err := t.ts.current(ctx)
		if err != nil {
			return nil, t.errf(op, err)
		}
		version := t.pin
		if version == 0 {
			version = t.c.chooseBulkVersion(m, avoid)
		}
		var lsns lsnSet
		err = t.batchGet(ctx, keys, routes, idx, results, version, ro, &lsns)
		if err == nil {
			if ro.lsn != nil {
				*ro.lsn = lsns.single()
			}
			return results, nil
		}
		if api.CodeOf(err) != api.ErrorCode_ERROR_CODE_VERSION_GONE || t.pin != 0 || attempt >= versionGoneRetries || ctx.Err() != nil {
			return nil, err
		}
		if avoid == nil {
			avoid = map[uint64]bool{}
		}
		avoid[version] = true
		t.refreshQuietly(ctx)
	}
}

// versionGoneRetries bounds the whole-batch retries of a BatchGet on a bulk
// table whose version is unloaded under it (each one follows a map change).
const versionGoneRetries = 8

// lsnSet collects the LSNs of a multi-partition call's parts. Safe for
// concurrent use.
type lsnSet struct {
	mu    sync.Mutex
	parts map[uint64]uint64 // partition id → LSN; guarded by mu
}

func (s *lsnSet) add(partition, lsn uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.parts == nil {
		s.parts = make(map[uint64]uint64)
	}
	s.parts[partition] = max(s.parts[partition], lsn)
}

// single is the LSN when the call touched one partition, else 0.
func (s *lsnSet) single() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.parts) != 1 {
		return 0
	}
	for _, l := range s.parts {
		return l
	}
	return 0
}

func (t *Table) batchGet(ctx context.Context, keys [][]byte, routes []route, idx []int, results []GetResult, version uint64, ro readOptions, lsns *lsnSet) error {
	const op = "batch get from"
	m, err := t.ts.current(ctx)
	if err != nil {
		return t.errf(op, err)
	}
	var chunks [][]int
	for _, g := range group(m, routes, idx) {
		for len(g) > api.MaxBatchKeys {
			chunks = append(chunks, g[:api.MaxBatchKeys])
			g = g[api.MaxBatchKeys:]
		}
		chunks = append(chunks, g)
	}
	return runParallel(len(chunks), func(ci int) error {
		g := chunks[ci]
		req := &api.BatchGetRequest{Keys: make([][]byte, len(g))}
		for j, i := range g {
			req.Keys[j] = keys[i]
		}
		pid, lsn, err := t.call(ctx, callSpec{op: op, bounded: true, pick: pickGroup(routes, g), read: ro, class: classRead, bulkVersion: version, rpc: func(ctx context.Context, ts api.TableServerClient, h *api.RequestHeader) (uint64, error) {
			h.BulkVersion = version
			req.Header = h
			resp, err := ts.BatchGet(ctx, req)
			if api.CodeOf(err) == api.ErrorCode_ERROR_CODE_VERSION_GONE {
				// The whole batch retries on the new version, not this part.
				return 0, &permanentError{err}
			}
			if err != nil {
				return 0, err
			}
			if len(resp.GetResults()) != len(g) {
				return 0, &permanentError{t.errf(op, api.Errorf(api.ErrorCode_ERROR_CODE_UNSPECIFIED, "bad_response",
					"server answered %d results for %d keys", len(resp.GetResults()), len(g)))}
			}
			for j, r := range resp.GetResults() {
				v := r.GetValue()
				if r.GetFound() && v == nil {
					v = []byte{}
				}
				results[g[j]] = GetResult{Value: v, Found: r.GetFound()}
			}
			return resp.GetLsn(), nil
		}})
		if errors.Is(err, errRegroup) {
			return t.batchGet(ctx, keys, routes, g, results, version, ro, lsns)
		}
		if err == nil {
			lsns.add(pid, lsn)
		}
		return err
	})
}

// failedCondition returns the index in its request of the mutation whose
// condition err reports failed (FAILED_PRECONDITION condition_failed,
// field "mutations[i]"), if it is that error.
func failedCondition(err error, n int) (int, bool) {
	d := api.DetailOf(err)
	if err == nil || d.GetCode() != api.ErrorCode_ERROR_CODE_FAILED_PRECONDITION || d.GetReason() != "condition_failed" {
		return 0, false
	}
	var i int
	if _, serr := fmt.Sscanf(d.GetField(), "mutations[%d]", &i); serr != nil || i < 0 || i >= n {
		return 0, false
	}
	return i, true
}

// BatchWrite applies mutations. The mutations of each partition go in one
// request that the partition applies atomically (all or none; in the order
// given, so a later mutation of a key wins); the partitions are written in
// parallel and NOT atomically together: if BatchWrite returns an error, some
// partitions' mutations may have been applied and others not. Each
// partition's mutations must fit one request (api.MaxBatchKeys mutations,
// api.MaxBatchBytes of keys and values) or the whole call fails with
// INVALID_ARGUMENT before anything is written, since splitting them would
// break the atomicity.
//
// Each partition's request carries a request id derived from the call's
// (WithRequestID, else a random one): its retries apply at most once. A
// call that gives up after a partition's attempt that may have applied
// returns ErrOutcomeUnknown (some partitions may be applied, others not);
// calling again with the same mutations in the same order and
// WithRequestID(err's RequestID) applies each partition's share at most
// once. ReportLSN reports only for a batch within one partition; a Session
// records every partition's LSN. WithTTL does not apply (Mutation.TTL does).
//
// Mutations may carry conditions (Mutation.Cond; see Condition): if one
// fails, its partition's mutations apply none, and BatchWrite returns a
// *ConditionFailedError naming the mutation's index in muts. Other
// partitions' shares may still have applied: the call is atomic per
// partition only.
func (t *Table) BatchWrite(ctx context.Context, muts []Mutation, opts ...WriteOption) error {
	const op = "batch write to"
	if t.err != nil {
		return t.errf(op, t.err)
	}
	wo, err := writeOpts(opts)
	if err != nil {
		return t.errf(op, err)
	}
	if len(muts) == 0 {
		return nil
	}
	routes := make([]route, len(muts))
	idx := make([]int, len(muts))
	pbs := make([]*api.Mutation, len(muts))
	for i, mu := range muts {
		if err := api.ValidateKey("mutations.key", mu.Key); err != nil {
			return t.errf(op, fmt.Errorf("mutation %d: %w", i, err))
		}
		ttl, err := ttlMillis("mutations.ttl", mu.TTL)
		if err != nil {
			return t.errf(op, fmt.Errorf("mutation %d: %w", i, err))
		}
		cond, err := mu.Cond.proto()
		if err != nil {
			return t.errf(op, fmt.Errorf("mutation %d: %w", i, err))
		}
		pb := &api.Mutation{Op: api.Mutation_OP_PUT, Key: mu.Key, Value: mu.Value, TtlMs: ttl, Condition: cond}
		if mu.Delete {
			pb = &api.Mutation{Op: api.Mutation_OP_DELETE, Key: mu.Key, Condition: cond}
		}
		pbs[i] = pb
		routes[i] = routeOf(mu.Key)
		idx[i] = i
	}
	ctx, _, cancel := t.c.callCtx(ctx, true)
	defer cancel()
	m, err := t.ts.current(ctx)
	if err != nil {
		return t.errf(op, err)
	}
	limit := maxValue(m)
	for i, mu := range muts {
		if mu.Delete {
			continue
		}
		if err := api.ValidateValue("mutations.value", mu.Value, limit); err != nil {
			return t.errf(op, fmt.Errorf("mutation %d: %w", i, err))
		}
	}
	var lsns lsnSet
	if err := t.batchWrite(ctx, pbs, routes, idx, wo, &lsns); err != nil {
		return err
	}
	if wo.lsn != nil {
		*wo.lsn = lsns.single()
	}
	return nil
}

func (t *Table) batchWrite(ctx context.Context, pbs []*api.Mutation, routes []route, idx []int, wo writeOptions, lsns *lsnSet) error {
	const op = "batch write to"
	m, err := t.ts.current(ctx)
	if err != nil {
		return t.errf(op, err)
	}
	groups := group(m, routes, idx)
	for _, g := range groups {
		if err := checkWriteGroup(pbs, g); err != nil {
			return t.errf(op, err)
		}
	}
	return runParallel(len(groups), func(gi int) error {
		g := groups[gi]
		req := &api.BatchWriteRequest{Mutations: make([]*api.Mutation, len(g)), RequestId: groupRequestID(wo.reqID, g[0])}
		for j, i := range g {
			req.Mutations[j] = pbs[i]
		}
		pid, lsn, err := t.call(ctx, callSpec{op: op, bounded: true, pick: pickGroup(routes, g), reqID: wo.reqID, class: classWrite,
			rpc: func(ctx context.Context, ts api.TableServerClient, h *api.RequestHeader) (uint64, error) {
				req.Header = h
				resp, err := ts.BatchWrite(ctx, req)
				return resp.GetLsn(), err
			}})
		if errors.Is(err, errRegroup) {
			return t.batchWrite(ctx, pbs, routes, g, wo, lsns)
		}
		if i, ok := failedCondition(err, len(g)); ok {
			return &ConditionFailedError{Index: g[i], Err: err}
		}
		if err == nil {
			lsns.add(pid, lsn)
			if wo.session != nil {
				wo.session.note(t.name, pid, lsn)
			}
		}
		return err
	})
}

// checkWriteGroup refuses a partition's mutations that do not fit one
// request.
func checkWriteGroup(pbs []*api.Mutation, g []int) error {
	if len(g) > api.MaxBatchKeys {
		return api.InvalidArgument("mutations", "batch_too_many", api.MaxBatchKeys,
			"%d mutations fall in one partition; the limit per partition is %d (a partition's mutations are applied atomically, so they are not split)",
			len(g), api.MaxBatchKeys)
	}
	var bytes uint64
	for _, i := range g {
		bytes += uint64(len(pbs[i].GetKey()) + len(pbs[i].GetValue()))
	}
	if bytes > api.MaxBatchBytes {
		return api.InvalidArgument("mutations", "batch_too_large", api.MaxBatchBytes,
			"the mutations of one partition hold %d bytes; the limit per partition is %d", bytes, api.MaxBatchBytes)
	}
	return nil
}
