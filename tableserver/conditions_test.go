package tableserver_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
)

// condTable is one partition of a three-replica table in the fixture's
// cluster, for the conditional batch tests.
type condTable struct {
	name string
	p    *api.Partition
	s    api.TableServerClient
}

func (c *condTable) hdr() *api.RequestHeader {
	return &api.RequestHeader{Tenant: api.DefaultTenant, Table: c.name, PartitionId: c.p.GetId(), Epoch: c.p.GetEpoch()}
}

// batch sends one batch. A refusal that applied nothing because the
// server's map lags its lease (map_behind, which the SDK retries too) is
// retried, so a map change made by another table of the cluster does not
// fail these tests.
func (c *condTable) batch(ctx context.Context, reqID string, muts ...*api.Mutation) error {
	for {
		_, err := c.s.BatchWrite(ctx, &api.BatchWriteRequest{Header: c.hdr(), Mutations: muts, RequestId: reqID})
		if !mapBehind(ctx, err) {
			return err
		}
	}
}

func (c *condTable) put(ctx context.Context, req *api.PutRequest) error {
	for {
		_, err := c.s.Put(ctx, req)
		if !mapBehind(ctx, err) {
			return err
		}
	}
}

func (c *condTable) get(t *testing.T, ctx context.Context, key string) (string, bool) {
	t.Helper()
	for {
		g, err := c.s.Get(ctx, &api.GetRequest{Header: c.hdr(), Key: []byte(key)})
		if mapBehind(ctx, err) {
			continue
		}
		if err != nil {
			t.Fatalf("get %q: %v", key, err)
		}
		return string(g.GetValue()), g.GetFound()
	}
}

// mapBehind reports whether err is the transient map_behind refusal, after
// a short pause; false once ctx is done.
func mapBehind(ctx context.Context, err error) bool {
	if api.DetailOf(err).GetReason() != "map_behind" || ctx.Err() != nil {
		return false
	}
	time.Sleep(10 * time.Millisecond)
	return true
}

func put(key, value string, cond api.Condition_Kind, prefix string) *api.Mutation {
	m := &api.Mutation{Op: api.Mutation_OP_PUT, Key: []byte(key), Value: []byte(value)}
	if cond != api.Condition_KIND_NONE || prefix != "" {
		m.Condition = &api.Condition{Kind: cond, Prefix: []byte(prefix)}
	}
	return m
}

func del(key string, cond api.Condition_Kind, prefix string) *api.Mutation {
	m := put(key, "", cond, prefix)
	m.Op, m.Value = api.Mutation_OP_DELETE, nil
	return m
}

// wantCondFailed checks err is the refusal of a failed condition of
// mutations[index] whose message says why.
func wantCondFailed(t *testing.T, err error, index int, why string) {
	t.Helper()
	d := api.DetailOf(err)
	if d.GetCode() != api.ErrorCode_ERROR_CODE_FAILED_PRECONDITION || d.GetReason() != "condition_failed" || d.GetField() != fmt.Sprintf("mutations[%d]", index) {
		t.Fatalf("err = %v (detail %v); want FAILED_PRECONDITION condition_failed on mutations[%d]", err, d, index)
	}
	if !strings.Contains(err.Error(), why) {
		t.Fatalf("err = %v; want it to say %q", err, why)
	}
}

func newCondTables(t *testing.T, f *fixture) []*condTable {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []*condTable
	for _, tc := range []struct {
		name string
		kind api.TableKind
		opts *api.TableOptions
	}{
		{"point3", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 1, Replication: 3}},
		// The keys used here (before "t") fall in the first range.
		{"ordered3", api.TableKind_TABLE_KIND_ORDERED, &api.TableOptions{SplitPoints: [][]byte{[]byte("t")}, Replication: 3}},
	} {
		resp, err := f.master.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: tc.name, Kind: tc.kind, Options: tc.opts})
		if err != nil {
			t.Fatalf("create %s: %v", tc.name, err)
		}
		p := resp.GetMap().GetPartitions()[0]
		c := &condTable{name: tc.name, p: p, s: f.server(t, p)}
		// Wait until the replicas serve writes.
		if _, err := eventually(t, func() (struct{}, error) {
			return struct{}{}, c.batch(ctx, "", put("boot", "x", api.Condition_KIND_NONE, ""))
		}); err != nil {
			t.Fatalf("%s: first write: %v", tc.name, err)
		}
		out = append(out, c)
	}
	return out
}

// TestBatchConditions: each condition kind passing and failing, all or
// nothing, duplicates, expiry, invalid conditions, on a point and an
// ordered table replicated three times.
func TestBatchConditions(t *testing.T) {
	f := newFixture(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, c := range newCondTables(t, f) {
		t.Run(c.name, func(t *testing.T) {
			none := api.Condition_KIND_NONE
			absent, present, prefix := api.Condition_KIND_ABSENT, api.Condition_KIND_PRESENT, api.Condition_KIND_PREFIX
			// ABSENT passes on new keys, fails on an existing one.
			if err := c.batch(ctx, "", put("a", "1a", absent, ""), put("b", "1b", absent, "")); err != nil {
				t.Fatalf("insert absent keys: %v", err)
			}
			err := c.batch(ctx, "", put("c", "1c", absent, ""), put("a", "2a", absent, ""))
			wantCondFailed(t, err, 1, "must be absent but is present")
			if _, found := c.get(t, ctx, "c"); found {
				t.Fatal("c was written by a batch whose condition failed")
			}
			// PRESENT.
			if err := c.batch(ctx, "", put("a", "2a", present, ""), del("b", present, "")); err != nil {
				t.Fatalf("present: %v", err)
			}
			err = c.batch(ctx, "", put("a", "3a", present, ""), put("b", "2b", present, ""))
			wantCondFailed(t, err, 1, "must be present but is absent")
			// PREFIX: the value's first bytes, as an ETag.
			if err := c.batch(ctx, "", put("a", "3a", prefix, "2")); err != nil {
				t.Fatalf("prefix: %v", err)
			}
			err = c.batch(ctx, "", put("a", "4a", prefix, "2"))
			wantCondFailed(t, err, 0, "must have a value starting 32 but its value starts 33")
			err = c.batch(ctx, "", del("b", prefix, "1"))
			wantCondFailed(t, err, 0, "but is absent")
			if err := c.batch(ctx, "", put("a", "4a", prefix, "")); err != nil {
				t.Fatalf("empty prefix on a present key: %v", err)
			}
			if v, _ := c.get(t, ctx, "a"); v != "4a" {
				t.Fatalf("a = %q, want 4a", v)
			}

			// All or nothing: the sixth mutation's condition fails, the
			// first five (unconditional or passing) apply nothing.
			var muts []*api.Mutation
			for i := range 5 {
				muts = append(muts, put(fmt.Sprintf("k%d", i), "old", none, ""))
			}
			if err := c.batch(ctx, "", muts...); err != nil {
				t.Fatal(err)
			}
			muts = muts[:0]
			for i := range 5 {
				cond := []api.Condition_Kind{none, present, prefix, none, present}[i]
				muts = append(muts, put(fmt.Sprintf("k%d", i), "new", cond, ""))
			}
			muts = append(muts, put("a", "5a", absent, ""))
			wantCondFailed(t, c.batch(ctx, "", muts...), 5, "must be absent")
			for i := range 5 {
				if v, _ := c.get(t, ctx, fmt.Sprintf("k%d", i)); v != "old" {
					t.Fatalf("k%d = %q after a failed batch, want old", i, v)
				}
			}
			if v, _ := c.get(t, ctx, "a"); v != "4a" {
				t.Fatalf("a = %q after a failed batch, want 4a", v)
			}

			// A conditional batch names each key once; an unconditional
			// one may name a key twice (the later wins).
			err = c.batch(ctx, "", put("d", "1", absent, ""), put("e", "1", none, ""), put("d", "2", none, ""))
			if d := api.DetailOf(err); d.GetCode() != api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT || d.GetReason() != "duplicate_key" || d.GetField() != "mutations[2].key" {
				t.Fatalf("duplicate key: %v (%v); want INVALID_ARGUMENT duplicate_key on mutations[2].key", err, d)
			}
			if err := c.batch(ctx, "", put("d", "1", none, ""), put("d", "2", none, "")); err != nil {
				t.Fatalf("unconditional duplicate: %v", err)
			}
			if v, _ := c.get(t, ctx, "d"); v != "2" {
				t.Fatalf("d = %q, want 2", v)
			}

			// Malformed conditions.
			for _, m := range []*api.Mutation{put("f", "", absent, "x"), put("f", "", none, "x"), put("f", "", api.Condition_Kind(9), "")} {
				if d := api.DetailOf(c.batch(ctx, "", m)); d.GetCode() != api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT || d.GetReason() != "condition_invalid" {
					t.Fatalf("condition %v: %v; want INVALID_ARGUMENT condition_invalid", m.GetCondition(), d)
				}
			}

			// An expired record is absent.
			if err := c.put(ctx, &api.PutRequest{Header: c.hdr(), Key: []byte("g"), Value: []byte("1"), TtlMs: 30}); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				if _, found := c.get(t, ctx, "g"); !found {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("g never expired")
				}
				time.Sleep(5 * time.Millisecond)
			}
			wantCondFailed(t, c.batch(ctx, "", put("g", "2", present, "")), 0, "must be present but is absent")
			if err := c.batch(ctx, "", put("g", "2", absent, "")); err != nil {
				t.Fatalf("absent over an expired record: %v", err)
			}
		})
	}
}

// TestBatchConditionsRetry: a retry of an applied conditional batch returns
// its first outcome (though its condition no longer holds); a batch whose
// condition failed applied nothing, and its retry checks again.
func TestBatchConditionsRetry(t *testing.T) {
	f := newFixture(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, c := range newCondTables(t, f) {
		t.Run(c.name, func(t *testing.T) {
			absent := api.Condition_KIND_ABSENT
			ins := []*api.Mutation{put("a", "1", absent, ""), put("b", "1", absent, "")}
			for i := range 3 {
				if err := c.batch(ctx, "req-1", ins...); err != nil {
					t.Fatalf("attempt %d: %v", i, err)
				}
			}
			if err := c.batch(ctx, "req-2", ins...); api.DetailOf(err).GetReason() != "condition_failed" {
				t.Fatalf("another request id: %v; want condition_failed", err)
			}
			upd := []*api.Mutation{put("c", "1", api.Condition_KIND_PRESENT, "")}
			wantCondFailed(t, c.batch(ctx, "req-3", upd...), 0, "must be present")
			if err := c.put(ctx, &api.PutRequest{Header: c.hdr(), Key: []byte("c"), Value: []byte("0")}); err != nil {
				t.Fatal(err)
			}
			if err := c.batch(ctx, "req-3", upd...); err != nil {
				t.Fatalf("retry after the condition came to hold: %v", err)
			}
			if v, _ := c.get(t, ctx, "c"); v != "1" {
				t.Fatalf("c = %q, want 1", v)
			}
		})
	}
}

// TestBatchConditionsConcurrent: conditions see the writes in flight. Eight
// inserts of one key at once: exactly one wins. Eight attempts of one
// request at once: all return its outcome, none fails against its own
// write in flight.
func TestBatchConditionsConcurrent(t *testing.T) {
	f := newFixture(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, c := range newCondTables(t, f) {
		t.Run(c.name, func(t *testing.T) {
			const n = 8
			for round := range 10 {
				key := fmt.Sprintf("race%d", round)
				errs := make([]error, n)
				var wg sync.WaitGroup
				for i := range n {
					wg.Go(func() {
						errs[i] = c.batch(ctx, "", put(key, fmt.Sprint(i), api.Condition_KIND_ABSENT, ""), put(fmt.Sprintf("%s-%d", key, i), "x", api.Condition_KIND_NONE, ""))
					})
				}
				wg.Wait()
				winner := -1
				for i, err := range errs {
					switch {
					case err == nil && winner >= 0:
						t.Fatalf("round %d: inserts %d and %d both won", round, winner, i)
					case err == nil:
						winner = i
					default:
						wantCondFailed(t, err, 0, "must be absent but is present")
						if _, found := c.get(t, ctx, fmt.Sprintf("%s-%d", key, i)); found {
							t.Fatalf("round %d: the losing batch %d applied its other mutation", round, i)
						}
					}
				}
				if winner < 0 {
					t.Fatalf("round %d: no insert won", round)
				}
				if v, _ := c.get(t, ctx, key); v != fmt.Sprint(winner) {
					t.Fatalf("round %d: %s = %q, want the winner's %d", round, key, v, winner)
				}

				// The same request, eight times at once.
				reqKey := fmt.Sprintf("same%d", round)
				for i := range n {
					wg.Go(func() {
						errs[i] = c.batch(ctx, "same-"+reqKey, put(reqKey, "v", api.Condition_KIND_ABSENT, ""))
					})
				}
				wg.Wait()
				for i, err := range errs {
					if err != nil {
						t.Fatalf("round %d: attempt %d of one request: %v", round, i, err)
					}
				}
			}
		})
	}
}

// TestBatchConditionPrefixLimit: a prefix longer than the value limit is
// refused before anything is checked.
func TestBatchConditionPrefixLimit(t *testing.T) {
	f := newFixture(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := f.m.GetPartitions()[0]
	s := f.server(t, p)
	m := &api.Mutation{Op: api.Mutation_OP_DELETE, Key: []byte("k"), Condition: &api.Condition{Kind: api.Condition_KIND_PREFIX, Prefix: bytes.Repeat([]byte("x"), 1025)}}
	_, err := eventually(t, func() (*api.BatchWriteResponse, error) {
		return s.BatchWrite(ctx, &api.BatchWriteRequest{Header: hdr(p), Mutations: []*api.Mutation{m}})
	})
	if d := api.DetailOf(err); d.GetReason() != "prefix_too_large" || d.GetLimit() != 1024 {
		t.Fatalf("long prefix: %v (%v); want prefix_too_large, limit 1024", err, d)
	}
}
