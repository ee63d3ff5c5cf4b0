package client_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
)

// wantCondFailed checks err is a *ConditionFailedError naming index.
func wantCondFailed(t *testing.T, what string, err error, index int) {
	t.Helper()
	var cf *client.ConditionFailedError
	if !errors.As(err, &cf) {
		t.Fatalf("%s: %v; want a *client.ConditionFailedError", what, err)
	}
	if cf.Index != index {
		t.Fatalf("%s: condition failed at mutation %d (%v); want %d", what, cf.Index, err, index)
	}
	if d := api.DetailOf(err); d.GetCode() != api.ErrorCode_ERROR_CODE_FAILED_PRECONDITION || d.GetReason() != "condition_failed" {
		t.Fatalf("%s: detail %v; want FAILED_PRECONDITION condition_failed", what, d)
	}
}

// TestBatchWriteConditions: conditional batches through the SDK on a point
// and an ordered table, three replicas each: every kind passing and
// failing, all or nothing, retries by request id, racing inserts.
func TestBatchWriteConditions(t *testing.T) {
	tc := startCluster(t, 3)
	c := newClient(t, tc)
	ctx := testCtx(t)
	if _, err := c.CreateTable(ctx, "cpoint", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 1, Replication: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateTable(ctx, "cordered", api.TableKind_TABLE_KIND_ORDERED, &api.TableOptions{SplitPoints: [][]byte{[]byte("m")}, Replication: 3}); err != nil {
		t.Fatal(err)
	}
	absent := client.Condition{Kind: client.CondAbsent}
	present := client.Condition{Kind: client.CondPresent}
	prefix := func(p string) client.Condition { return client.Condition{Kind: client.CondPrefix, Prefix: []byte(p)} }
	put := func(k, v string, cond client.Condition) client.Mutation {
		return client.Mutation{Key: []byte(k), Value: []byte(v), Cond: cond}
	}
	for _, name := range []string{"cpoint", "cordered"} {
		t.Run(name, func(t *testing.T) {
			tbl := c.Table(name)
			get := func(k string) string {
				t.Helper()
				v, err := tbl.Get(ctx, []byte(k))
				if errors.Is(err, client.ErrKeyNotFound) {
					return "<absent>"
				}
				if err != nil {
					t.Fatalf("get %s: %v", k, err)
				}
				return string(v)
			}
			// Keys before "m": one partition of the ordered table too.
			if err := tbl.BatchWrite(ctx, []client.Mutation{put("a", "1a", absent), put("b", "1b", absent)}); err != nil {
				t.Fatalf("insert: %v", err)
			}
			wantCondFailed(t, "insert over a present key", tbl.BatchWrite(ctx, []client.Mutation{put("c", "1c", absent), put("b", "2b", absent)}), 1)
			if err := tbl.BatchWrite(ctx, []client.Mutation{put("a", "2a", present), {Key: []byte("b"), Delete: true, Cond: prefix("1")}}); err != nil {
				t.Fatalf("update and delete: %v", err)
			}
			wantCondFailed(t, "update of an absent key", tbl.BatchWrite(ctx, []client.Mutation{put("b", "x", present)}), 0)
			wantCondFailed(t, "wrong prefix", tbl.BatchWrite(ctx, []client.Mutation{put("c", "1c", absent), put("a", "3a", prefix("1"))}), 1)
			if got := get("a") + "," + get("b") + "," + get("c"); got != "2a,<absent>,<absent>" {
				t.Fatalf("a,b,c = %s; want 2a,<absent>,<absent>", got)
			}

			// All or nothing: the sixth mutation fails, the five before it
			// apply nothing.
			var muts []client.Mutation
			for i := range 5 {
				muts = append(muts, put(fmt.Sprintf("k%d", i), "old", client.Condition{}))
			}
			if err := tbl.BatchWrite(ctx, muts); err != nil {
				t.Fatal(err)
			}
			for i := range muts {
				muts[i] = put(fmt.Sprintf("k%d", i), "new", prefix("ol"))
			}
			muts = append(muts, put("a", "x", absent))
			wantCondFailed(t, "sixth fails", tbl.BatchWrite(ctx, muts), 5)
			for i := range 5 {
				if v := get(fmt.Sprintf("k%d", i)); v != "old" {
					t.Fatalf("k%d = %q after a failed batch; want old", i, v)
				}
			}

			// A retry by request id returns the first outcome.
			ins := []client.Mutation{put("r", "1", absent)}
			for i := range 2 {
				if err := tbl.BatchWrite(ctx, ins, client.WithRequestID("cond-retry")); err != nil {
					t.Fatalf("attempt %d: %v", i, err)
				}
			}
			wantCondFailed(t, "a new request", tbl.BatchWrite(ctx, ins), 0)

			// Racing inserts of one key: exactly one wins.
			const n = 8
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() { errs[i] = tbl.BatchWrite(ctx, []client.Mutation{put("race", fmt.Sprint(i), absent)}) })
			}
			wg.Wait()
			winner := -1
			for i, err := range errs {
				if err == nil {
					if winner >= 0 {
						t.Fatalf("inserts %d and %d both won", winner, i)
					}
					winner = i
					continue
				}
				wantCondFailed(t, fmt.Sprintf("racing insert %d", i), err, 0)
			}
			if winner < 0 || get("race") != fmt.Sprint(winner) {
				t.Fatalf("race = %q; want the winner's (%d)", get("race"), winner)
			}

			// Refused before anything is sent or checked.
			for _, m := range []client.Mutation{
				put("e", "x", client.Condition{Kind: client.CondAbsent, Prefix: []byte("p")}),
				put("e", "x", client.Condition{Prefix: []byte("p")}),
				put("e", "x", client.Condition{Kind: 9}),
			} {
				wantCode(t, fmt.Sprintf("condition %+v", m.Cond), tbl.BatchWrite(ctx, []client.Mutation{m}), api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT)
			}
			err := tbl.BatchWrite(ctx, []client.Mutation{put("e", "1", absent), put("e", "2", client.Condition{})})
			if d := api.DetailOf(err); d.GetReason() != "duplicate_key" {
				t.Fatalf("duplicate key: %v; want duplicate_key", err)
			}
		})
	}

	// A batch across partitions is atomic per partition: the failed
	// condition's partition applies nothing, the other applies its share;
	// the error names the mutation's index in the caller's slice.
	t.Run("span", func(t *testing.T) {
		tbl := c.Table("cordered")
		if err := tbl.Put(ctx, []byte("n-exists"), []byte("1")); err != nil {
			t.Fatal(err)
		}
		muts := []client.Mutation{
			put("s-a1", "1", client.Condition{}), // the second range ("m" on)
			put("a-1", "1", client.Condition{}),
			put("a-2", "1", absent),
			put("n-exists", "2", absent), // mutations[1] of the second range's request
			put("z-1", "1", client.Condition{}),
		}
		err := tbl.BatchWrite(ctx, muts)
		wantCondFailed(t, "span", err, 3)
		if !strings.Contains(err.Error(), "mutation 3") {
			t.Fatalf("error %q does not name mutation 3", err)
		}
		for k, want := range map[string]bool{"a-1": true, "a-2": true, "s-a1": false, "z-1": false} {
			_, err := tbl.Get(ctx, []byte(k))
			if got := err == nil; got != want {
				t.Fatalf("%s present = %v (%v); want %v", k, got, err, want)
			}
		}
	})
}
