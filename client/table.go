package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/keyspace"
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
	return uint64((d + time.Millisecond - 1) / time.Millisecond), nil
}

// pickFunc chooses the partition a request goes to from the current map. An
// error wrapped in permanentError (bad input) is returned at once; others are
// retried like UNAVAILABLE.
type pickFunc func(m *api.PartitionMap) (*api.Partition, error)

// rpcFunc sends one attempt of a request to a partition's primary.
type rpcFunc func(ctx context.Context, ts api.TableServerClient, h *api.RequestHeader) error

// pickHash routes to the partition holding hash h.
func pickHash(h uint64) pickFunc {
	return func(m *api.PartitionMap) (*api.Partition, error) {
		if p, ok := partitionOf(m, h); ok {
			return p, nil
		}
		return nil, unavailable("no_partition", "the partition map has no partition for hash %#x", h)
	}
}

// do sends a request to a partition's primary and retries it under the
// client's policy until it succeeds, fails for good, or runs out of time:
//
//   - NOT_OWNER, STALE_EPOCH: patch the cached map from the error's
//     partition entry when it is newer, else fetch the map; retry at once
//     the first time, later with backoff.
//   - UNAVAILABLE (also a partition with no primary): back off, then fetch
//     the map (the server may be dead and its partitions moved).
//   - SERVER_BUSY: back off at least the server's retry_after_ms.
//   - NOT_FOUND from a server whose map is older than ours (a table just
//     created): back off and retry. Otherwise fetch the map once and retry
//     only if the table was re-created (its id changed), since the cached
//     map may be of the dropped one.
//   - anything else: return at once.
//
// bounded puts the call's deadline on each attempt too (unary calls); scans
// pass false and are bounded by ctx alone once they stream.
func (t *Table) do(ctx context.Context, op string, bounded bool, pick pickFunc, rpc rpcFunc) error {
	c := t.c
	ctx, deadline, cancel := c.callCtx(ctx, bounded)
	defer cancel()
	var (
		last      error
		where     string // the partition and server of the last failure
		rerouted  bool   // the immediate retry after a routing error is used
		refetched bool   // the NOT_FOUND re-check is used
		backoffs  int
	)
	giveUp := func() error { return c.giveUp(ctx, fmt.Sprintf("client: %s %q%s", op, t.name, where), last) }
	for {
		if c.ctx.Err() != nil {
			return giveUp()
		}
		m, err := t.ts.current(ctx)
		if err != nil {
			if ctx.Err() != nil || c.ctx.Err() != nil {
				if last == nil {
					last = err
				}
				return giveUp()
			}
			return t.errf(op, err)
		}
		var header *api.RequestHeader
		p, err := pick(m)
		if err == nil {
			if r := primaryOf(p); r == nil {
				err = unavailable("no_primary", "partition %d has no primary", p.GetId())
			} else {
				// Bulk tables: the serving version by this map (the rpc
				// may name another); a server that has unloaded it
				// answers VERSION_GONE and the retry takes the new map's.
				header = &api.RequestHeader{Tenant: c.opts.Tenant, Table: t.name, PartitionId: p.GetId(), Epoch: p.GetEpoch(),
					BulkVersion: m.GetBulk().GetCurrent()}
				cc, cerr := c.conn(r.GetAddr())
				if cerr != nil {
					err = cerr
				} else {
					err = rpc(ctx, api.NewTableServerClient(cc), header)
				}
				if err != nil {
					where = fmt.Sprintf(" (partition %d at %s)", p.GetId(), r.GetAddr())
				}
			}
		}
		if err == nil {
			return nil
		}
		if errors.Is(err, errRegroup) {
			return err
		}
		if perm := (*permanentError)(nil); errors.As(err, &perm) {
			return perm.err
		}
		if last == nil || !endedByDeadline(ctx, err) {
			last = err
		}
		if errors.Is(err, ErrClosed) || ctx.Err() != nil || c.ctx.Err() != nil {
			return giveUp()
		}
		d := api.DetailOf(err)
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
			refresh = true
			wait = c.jitter.backoff(backoffs, backoffBase, backoffCap)
			backoffs++
		case api.ErrorCode_ERROR_CODE_SERVER_BUSY:
			wait = max(c.jitter.backoff(backoffs, backoffBase, backoffCap), time.Duration(d.GetRetryAfterMs())*time.Millisecond)
			backoffs++
		case api.ErrorCode_ERROR_CODE_VERSION_GONE:
			// Our map is behind the version switches: take the new map.
			if t.pin != 0 {
				return fmt.Errorf("client: %s %q%s: %w", op, t.name, where, err)
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
				return t.errf(op, err)
			}
			refetched = true
			nm, ferr := t.ts.refresh(ctx)
			if ferr != nil {
				return t.errf(op, ferr)
			}
			if nm.GetTable().GetId() == m.GetTable().GetId() {
				return t.errf(op, err)
			}
			continue
		default:
			return fmt.Errorf("client: %s %q%s: %w", op, t.name, where, err)
		}
		c.log.Debug("tabula: retrying", "op", op, "table", t.name, "where", where, "wait", wait, "err", err)
		if !pause(ctx, deadline, wait) {
			return giveUp()
		}
		if refresh {
			t.refreshQuietly(ctx)
		}
	}
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
// expired. Reads go to the partition's primary, so they are strong.
func (t *Table) Get(ctx context.Context, key []byte) ([]byte, error) {
	const op = "get from"
	if err := t.check(op, "key", key); err != nil {
		return nil, err
	}
	var resp *api.GetResponse
	err := t.do(ctx, op, true, pickHash(keyspace.Hash(key)), func(ctx context.Context, ts api.TableServerClient, h *api.RequestHeader) error {
		var err error
		if t.pin != 0 {
			h.BulkVersion = t.pin
		}
		resp, err = ts.Get(ctx, &api.GetRequest{Header: h, Key: key})
		return err
	})
	if err != nil {
		return nil, err
	}
	if !resp.GetFound() {
		return nil, ErrKeyNotFound
	}
	if resp.GetValue() == nil {
		return []byte{}, nil
	}
	return resp.GetValue(), nil
}

// WriteOption modifies one write.
type WriteOption func(*writeOptions)

type writeOptions struct {
	ttl time.Duration
}

// WithTTL makes the written record expire after d, rounded up to whole
// milliseconds. 0 means the table's default TTL; a negative d is an
// INVALID_ARGUMENT error.
func WithTTL(d time.Duration) WriteOption {
	return func(o *writeOptions) { o.ttl = d }
}

// Put sets key to value. When Put returns nil the write is acknowledged by
// the partition's primary (and durable as the table's storage makes it).
// Put is idempotent, so it is retried like a read.
func (t *Table) Put(ctx context.Context, key, value []byte, opts ...WriteOption) error {
	const op = "put to"
	if err := t.check(op, "key", key); err != nil {
		return err
	}
	var wo writeOptions
	for _, o := range opts {
		o(&wo)
	}
	ttl, err := ttlMillis("ttl", wo.ttl)
	if err != nil {
		return t.errf(op, err)
	}
	h := keyspace.Hash(key)
	pick := func(m *api.PartitionMap) (*api.Partition, error) {
		if err := api.ValidateValue("value", value, maxValue(m)); err != nil {
			return nil, &permanentError{t.errf(op, err)}
		}
		return pickHash(h)(m)
	}
	return t.do(ctx, op, true, pick, func(ctx context.Context, ts api.TableServerClient, hd *api.RequestHeader) error {
		_, err := ts.Put(ctx, &api.PutRequest{Header: hd, Key: key, Value: value, TtlMs: ttl})
		return err
	})
}

// Delete removes key and reports whether it existed. If a first attempt
// was lost in transit after the server applied it, the retry reports
// existed=false.
func (t *Table) Delete(ctx context.Context, key []byte) (existed bool, err error) {
	const op = "delete from"
	if err := t.check(op, "key", key); err != nil {
		return false, err
	}
	var resp *api.DeleteResponse
	err = t.do(ctx, op, true, pickHash(keyspace.Hash(key)), func(ctx context.Context, ts api.TableServerClient, h *api.RequestHeader) error {
		var err error
		resp, err = ts.Delete(ctx, &api.DeleteRequest{Header: h, Key: key})
		return err
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
}

// CompareAndSwap atomically checks and replaces one key's state. A
// mismatch is not an error: it is Swapped=false with the current state.
// If an attempt was applied but its reply lost (a transport failure), the
// retry sees the state the first attempt wrote and reports Swapped=false
// with Current equal to the new value; callers that must tell the two apart
// can compare Current with the value they wrote.
func (t *Table) CompareAndSwap(ctx context.Context, c CAS) (CASResult, error) {
	const op = "compare-and-swap in"
	if err := t.check(op, "key", c.Key); err != nil {
		return CASResult{}, err
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
	h := keyspace.Hash(c.Key)
	pick := func(m *api.PartitionMap) (*api.Partition, error) {
		limit := maxValue(m)
		if err := api.ValidateValue("expected", expected, limit); err != nil {
			return nil, &permanentError{t.errf(op, err)}
		}
		if err := api.ValidateValue("value", value, limit); err != nil {
			return nil, &permanentError{t.errf(op, err)}
		}
		return pickHash(h)(m)
	}
	var resp *api.CompareAndSwapResponse
	err = t.do(ctx, op, true, pick, func(ctx context.Context, ts api.TableServerClient, h *api.RequestHeader) error {
		var err error
		resp, err = ts.CompareAndSwap(ctx, &api.CompareAndSwapRequest{
			Header: h, Key: c.Key, ExpectExists: !c.ExpectAbsent, Expected: expected,
			Delete: c.Delete, Value: value, TtlMs: ttl,
		})
		return err
	})
	if err != nil {
		return CASResult{}, err
	}
	return CASResult{Swapped: resp.GetSwapped(), Existed: resp.GetExisted(), Current: resp.GetCurrent()}, nil
}
