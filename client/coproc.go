package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/tabuladb/tabula/api"
)

// Invocation says where and how a coprocessor handler runs: on one key, a
// batch of keys (one call per partition, in parallel), a key range, or every
// partition (All); the per-partition outputs of a batch, range or All call
// are combined by the module's "<method>__merge" export on a server
// (concatenated in partition order when the module has none). Give exactly
// one of Keys, Range and All.
type Invocation struct {
	// Keys: one key is a point call; several are a batch call.
	Keys [][]byte
	// Range runs the handler on the keys in [Start, End) (nil: unbounded).
	// Point and bulk tables place keys by hash, so every partition may hold
	// some: the handler runs once on every partition with the range as its
	// target (the guest's Range(); its scans see only this partition).
	Range *KeyRange
	// All runs the handler once on every partition (scatter-gather).
	All bool
	// Input is handed to every call.
	Input []byte
	// Version runs a given version instead of the live one.
	Version uint64
	// IdempotencyToken makes a write handler apply once: a call with the
	// same token returns the first result (the server keeps it for its
	// idempotency TTL). Empty: the SDK makes a random one per Invoke, so
	// its own retries never apply a write twice; set it to retry a call
	// that failed with ErrOutcomeUnknown (OutcomeUnknownError.RequestID).
	// A batch's, range's or All call's partitions each get the token with
	// "/p" and their partition id appended, so a retry of the whole call
	// under a newer map reaches each partition with its own token. At most
	// MaxRequestIDBytes bytes. The server binds a token to its call's
	// input, keys and range: reusing one for another call is refused
	// (INVALID_ARGUMENT, reason token_reused), never answered with the
	// first call's result.
	IdempotencyToken string
	// Timeout bounds each guest call (0: the server's default, 1 s).
	Timeout time.Duration
	// AllowPartial returns the merge of the partitions that answered when
	// some fail (All and batch calls), instead of an error.
	AllowPartial bool
}

// KeyRange is a key range [Start, End); a nil bound is unbounded.
type KeyRange struct {
	Start, End []byte
}

// Invoke runs coprocessor name's method next to the data and returns its
// output (merged across partitions for batch, range and All calls).
func (t *Table) Invoke(ctx context.Context, name, method string, inv Invocation) ([]byte, error) {
	const op = "invoke on"
	if t.err != nil {
		return nil, t.errf(op, t.err)
	}
	if err := api.ValidateName("name", name); err != nil {
		return nil, t.errf(op, err)
	}
	targets := 0
	for _, given := range []bool{len(inv.Keys) > 0, inv.Range != nil, inv.All} {
		if given {
			targets++
		}
	}
	if targets != 1 {
		return nil, t.errf(op, api.InvalidArgument("keys", "no_target", 0, "give exactly one of keys, a range or all partitions"))
	}
	var rangeStart, rangeEnd []byte
	if r := inv.Range; r != nil {
		if r.Start != nil && r.End != nil && string(r.Start) >= string(r.End) {
			return nil, t.errf(op, api.InvalidArgument("range", "range_empty", 0, "range [%q, %q) is empty", r.Start, r.End))
		}
		rangeStart, rangeEnd = r.Start, r.End
	}
	scatter := inv.All || inv.Range != nil
	routes := make([]route, len(inv.Keys))
	for i, k := range inv.Keys {
		if err := api.ValidateKey("keys", k); err != nil {
			return nil, t.errf(op, fmt.Errorf("key %d: %w", i, err))
		}
		routes[i] = routeOf(k)
	}
	ctx, _, cancel := t.c.callCtx(ctx, true)
	defer cancel()
	m, err := t.ts.current(ctx)
	if err != nil {
		return nil, t.errf(op, err)
	}
	// The live version is resolved from this client's map, not the
	// server's: after RollbackCoproc or WaitCoprocLive returns (both
	// refresh the map), calls run the version they made live even on a
	// server whose map has not caught up yet. Other clients follow the
	// alias through their map watch, as the servers do.
	version := inv.Version
	if version == 0 {
		for _, c := range m.GetCoprocessors() {
			if c.GetName() == name {
				version = c.GetLive()
			}
		}
	}
	token := inv.IdempotencyToken
	if token == "" {
		token = newRequestID()
	} else if len(token) > MaxRequestIDBytes {
		return nil, t.errf(op, api.InvalidArgument("idempotency_token", "token_too_long", MaxRequestIDBytes,
			"idempotency token of %d bytes; the limit is %d", len(token), MaxRequestIDBytes))
	}
	var timeoutMs uint32
	if inv.Timeout > 0 {
		timeoutMs = uint32(max(1, inv.Timeout.Milliseconds()))
	}
	// Every attempt of a partition's call carries the same token (and, as
	// request id, the same seed of the guest's randomness).
	call := func(pick pickFunc, keys [][]byte, partToken string) ([]byte, error) {
		var out []byte
		_, _, err := t.call(ctx, callSpec{op: op, bounded: true, pick: pick, reqID: token, invoke: true,
			rpc: func(ctx context.Context, ts api.TableServerClient, h *api.RequestHeader) (uint64, error) {
				resp, err := ts.Invoke(ctx, &api.InvokeRequest{Header: h, Name: name, Version: version, Method: method,
					Input: inv.Input, Keys: keys, IdempotencyToken: partToken, RequestId: partToken, TimeoutMs: timeoutMs,
					RangeStart: rangeStart, RangeEnd: rangeEnd})
				if err != nil {
					return 0, err
				}
				out = resp.GetOutput()
				return 0, nil
			}})
		return out, err
	}
	if !scatter && len(inv.Keys) == 1 {
		return call(pickRoute(routes[0]), inv.Keys, token)
	}
	// Batch: the keys grouped by partition; range and All: every partition.
	var groups [][]int
	var picks []pickFunc
	// Each partition call's idempotency token is derived from the
	// partition's id, not the call's position in this grouping: a retry
	// of the whole invocation under a newer map groups the same keys the
	// same way only by partition.
	var tokens []string
	if scatter {
		for _, p := range m.GetPartitions() {
			picks = append(picks, pickRoute(route{h: p.GetStart(), key: p.GetKeyStart()}))
			groups = append(groups, nil)
			tokens = append(tokens, fmt.Sprintf("%s/p%d", token, p.GetId()))
		}
	} else {
		idx := make([]int, len(inv.Keys))
		for i := range idx {
			idx[i] = i
		}
		for i, g := range group(m, routes, idx) {
			groups = append(groups, g)
			picks = append(picks, pickGroup(routes, g))
			if p, ok := partitionOf(m, routes[g[0]]); ok {
				tokens = append(tokens, fmt.Sprintf("%s/p%d", token, p.GetId()))
			} else {
				tokens = append(tokens, fmt.Sprintf("%s/g%d", token, i))
			}
		}
	}
	partials := make([][]byte, len(groups))
	errs := make([]error, len(groups))
	_ = runParallel(len(groups), func(i int) error {
		keys := make([][]byte, len(groups[i]))
		for j, k := range groups[i] {
			keys[j] = inv.Keys[k]
		}
		partials[i], errs[i] = call(picks[i], keys, tokens[i])
		return errs[i]
	})
	var ok [][]byte
	var failed []error
	for i, err := range errs {
		if err != nil {
			failed = append(failed, err)
			continue
		}
		ok = append(ok, partials[i])
	}
	if len(failed) > 0 && (!inv.AllowPartial || len(ok) == 0) {
		return nil, fmt.Errorf("client: invoke %s.%s on %q: %d of %d partition calls failed: %w", name, method, t.name, len(failed), len(groups), joinDistinct(failed))
	}
	if len(ok) == 1 {
		return ok[0], nil
	}
	// Merge on a server (any partition's: they all compiled the module).
	var out []byte
	err = t.do(ctx, "merge on", true, pickRoute(route{}), func(ctx context.Context, ts api.TableServerClient, h *api.RequestHeader) error {
		resp, err := ts.CoprocMerge(ctx, &api.CoprocMergeRequest{Header: h, Name: name, Version: version, Method: method, Partials: ok})
		if err != nil {
			return err
		}
		out = resp.GetOutput()
		return nil
	})
	if api.DetailOf(err).GetReason() == "unknown_method" {
		// No merge export: the partitions' outputs in partition order.
		var cat []byte
		for _, p := range ok {
			cat = append(cat, p...)
		}
		return cat, nil
	}
	return out, err
}

// DeployCoproc registers the WebAssembly module in file wasmPath as the
// next version of the table's coprocessor name and returns its version.
// The live alias moves to it once every server hosting the table has
// compiled it; WaitCoprocLive waits for that.
func (t *Table) DeployCoproc(ctx context.Context, name, wasmPath string) (uint64, error) {
	wasm, err := os.ReadFile(wasmPath)
	if err != nil {
		return 0, fmt.Errorf("client: deploy %s: %w", name, err)
	}
	return t.DeployCoprocBytes(ctx, name, wasm)
}

// DeployCoprocBytes is DeployCoproc of module bytes.
func (t *Table) DeployCoprocBytes(ctx context.Context, name string, wasm []byte) (uint64, error) {
	if t.err != nil {
		return 0, t.errf("deploy to", t.err)
	}
	var resp *api.CoprocDeployResponse
	err := t.c.masterCall(ctx, fmt.Sprintf("client: deploy coprocessor %q to %q", name, t.name), func(ctx context.Context, mc api.MasterClient) error {
		var err error
		resp, err = mc.CoprocDeploy(ctx, &api.CoprocDeployRequest{Tenant: t.c.opts.Tenant, Table: t.name, Name: name, Wasm: wasm})
		return err
	})
	if err != nil {
		return 0, err
	}
	return resp.GetVersion(), nil
}

// Coprocs lists the table's coprocessors and their versions.
func (t *Table) Coprocs(ctx context.Context) ([]*api.Coprocessor, error) {
	if t.err != nil {
		return nil, t.errf("list coprocessors of", t.err)
	}
	var resp *api.CoprocListResponse
	err := t.c.masterCall(ctx, fmt.Sprintf("client: list coprocessors of %q", t.name), func(ctx context.Context, mc api.MasterClient) error {
		var err error
		resp, err = mc.CoprocList(ctx, &api.CoprocListRequest{Tenant: t.c.opts.Tenant, Table: t.name})
		return err
	})
	return resp.GetCoprocessors(), err
}

// WaitCoprocLive waits until coprocessor name's live version is at least
// version, then refreshes the cached map so invocations use it.
func (t *Table) WaitCoprocLive(ctx context.Context, name string, version uint64) error {
	for attempt := 0; ; attempt++ {
		cs, err := t.Coprocs(ctx)
		if err != nil {
			return err
		}
		for _, c := range cs {
			if c.GetName() == name && c.GetLive() >= version {
				_, err := t.ts.refresh(ctx)
				return err
			}
		}
		if !sleepCtx(ctx, t.c.jitter.backoff(attempt, 20*time.Millisecond, 500*time.Millisecond)) {
			return fmt.Errorf("client: coprocessor %q version %d of %q is not live: %w", name, version, t.name, ctx.Err())
		}
	}
}

// RollbackCoproc points coprocessor name's live alias at version.
func (t *Table) RollbackCoproc(ctx context.Context, name string, version uint64) error {
	if t.err != nil {
		return t.errf("roll back coprocessor of", t.err)
	}
	err := t.c.masterCall(ctx, fmt.Sprintf("client: roll back coprocessor %q of %q", name, t.name), func(ctx context.Context, mc api.MasterClient) error {
		_, err := mc.CoprocRollback(ctx, &api.CoprocRollbackRequest{Tenant: t.c.opts.Tenant, Table: t.name, Name: name, Version: version})
		return err
	})
	if err != nil {
		return err
	}
	// Refresh the cached map so this client's next calls run version.
	_, err = t.ts.refresh(ctx)
	return err
}

// joinDistinct joins errs keeping one of each kind (the same code and
// reason, or the same text when they carry no detail), with how many
// partitions answered it: a coprocessor that fails everywhere is one
// line, not one per partition. The errors kept stay reachable with
// errors.Is and errors.As.
func joinDistinct(errs []error) error {
	type kind struct {
		code   api.ErrorCode
		reason string
		text   string
	}
	var order []kind
	first := map[kind]error{}
	count := map[kind]int{}
	for _, err := range errs {
		k := kind{text: err.Error()}
		if d := api.DetailOf(err); d.GetCode() != api.ErrorCode_ERROR_CODE_UNSPECIFIED {
			k = kind{code: d.GetCode(), reason: d.GetReason()}
		}
		if _, ok := first[k]; !ok {
			first[k] = err
			order = append(order, k)
		}
		count[k]++
	}
	out := make([]error, 0, len(order))
	for _, k := range order {
		err := first[k]
		if n := count[k]; n > 1 {
			err = fmt.Errorf("%w (the same on %d more partitions)", err, n-1)
		}
		out = append(out, err)
	}
	if len(out) == 1 {
		return out[0]
	}
	return errors.Join(out...)
}
