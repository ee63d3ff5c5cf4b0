package client_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
)

// scanKeys runs a range scan and returns the keys it delivered.
func scanKeys(t *testing.T, tbl *client.Table, rs client.RangeScan) []string {
	t.Helper()
	var keys []string
	err := tbl.ScanRange(testCtx(t), rs, func(k, v []byte) error {
		if !bytes.Equal(v, append([]byte("v-"), k...)) {
			return fmt.Errorf("key %q has value %q", k, v)
		}
		keys = append(keys, string(k))
		return nil
	})
	if err != nil {
		t.Fatalf("scan %+v: %v", rs, err)
	}
	return keys
}

// TestOrderedTable: an ordered table is cut into key ranges at its split
// points, replicated like a point table; every key goes to the partition
// whose range holds it, and range scans cross partitions in key order,
// both ways, with limits.
func TestOrderedTable(t *testing.T) {
	tc := startCluster(t, 3)
	c := newClient(t, tc)
	ctx := testCtx(t)
	m, err := c.CreateTable(ctx, "sorted", api.TableKind_TABLE_KIND_ORDERED, &api.TableOptions{
		SplitPoints: [][]byte{[]byte("g"), []byte("p")}, Replication: 3})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(m.GetPartitions()); n != 3 || m.GetTable().GetOptions().GetPartitions() != 3 {
		t.Fatalf("%d partitions (options say %d), want 3", n, m.GetTable().GetOptions().GetPartitions())
	}
	if p := m.GetPartitions()[1]; string(p.GetKeyStart()) != "g" || string(p.GetKeyEnd()) != "p" {
		t.Fatalf("partition 1 holds [%q, %q), want [g, p)", p.GetKeyStart(), p.GetKeyEnd())
	}
	tbl := c.Table("sorted")
	var all []string
	for ch := 'a'; ch <= 'z'; ch++ {
		for _, suffix := range []string{"", "1", "zz"} {
			all = append(all, string(ch)+suffix)
		}
	}
	slices.Sort(all)
	// Written in a scrambled order, half one by one, half in batches
	// (each batch spans partitions).
	for i := 0; i < len(all); i += 2 {
		k := all[(i*7)%len(all)]
		if err := tbl.Put(ctx, []byte(k), []byte("v-"+k)); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
	}
	var muts []client.Mutation
	for i := 1; i < len(all); i += 2 {
		k := all[(i*7)%len(all)]
		muts = append(muts, client.Mutation{Key: []byte(k), Value: []byte("v-" + k)})
	}
	if err := tbl.BatchWrite(ctx, muts); err != nil {
		t.Fatal(err)
	}
	for _, k := range all {
		if v, err := tbl.Get(ctx, []byte(k)); err != nil || string(v) != "v-"+k {
			t.Fatalf("get %s: %q, %v", k, v, err)
		}
	}
	rev := slices.Clone(all)
	slices.Reverse(rev)
	between := func(lo, hi string) []string {
		var out []string
		for _, k := range all {
			if k >= lo && (hi == "" || k < hi) {
				out = append(out, k)
			}
		}
		return out
	}
	for _, tc := range []struct {
		name string
		rs   client.RangeScan
		want []string
	}{
		{"everything", client.RangeScan{}, all},
		{"everything reversed", client.RangeScan{Reverse: true}, rev},
		{"across a split", client.RangeScan{KeyRange: client.KeyRange{Start: []byte("e"), End: []byte("r")}}, between("e", "r")},
		{"from a split point", client.RangeScan{KeyRange: client.KeyRange{Start: []byte("g")}}, between("g", "")},
		{"up to a split point", client.RangeScan{KeyRange: client.KeyRange{End: []byte("p")}}, between("", "p")},
		{"limit across partitions", client.RangeScan{KeyRange: client.KeyRange{Start: []byte("f")}, Limit: 7}, between("f", "")[:7]},
		{"reversed across a split with a limit", client.RangeScan{KeyRange: client.KeyRange{End: []byte("q")}, Reverse: true, Limit: 8},
			func() []string { b := between("", "q"); slices.Reverse(b); return b[:8] }()},
		{"empty stretch", client.RangeScan{KeyRange: client.KeyRange{Start: []byte("b2"), End: []byte("bz")}}, nil},
	} {
		if got := scanKeys(t, tbl, tc.rs); !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
	// Swaps and deletes route by range too.
	res, err := tbl.CompareAndSwap(ctx, client.CAS{Key: []byte("h"), Expected: []byte("v-h"), Value: []byte("v-h")})
	if err != nil || !res.Swapped {
		t.Fatalf("swap h: %+v, %v", res, err)
	}
	if existed, err := tbl.Delete(ctx, []byte("q1")); err != nil || !existed {
		t.Fatalf("delete q1: %t, %v", existed, err)
	}
	if got := scanKeys(t, tbl, client.RangeScan{KeyRange: client.KeyRange{Start: []byte("q"), End: []byte("r")}}); !slices.Equal(got, []string{"q", "qzz"}) {
		t.Errorf("after delete: %q", got)
	}
	// A scan's callback error comes back as is and stops it.
	stop := fmt.Errorf("enough")
	n := 0
	if err := tbl.ScanRange(ctx, client.RangeScan{}, func(k, v []byte) error { n++; return stop }); err != stop || n != 1 {
		t.Errorf("stopping scan: %v after %d records", err, n)
	}
	// Refusals.
	if _, err := c.CreateTable(ctx, "bad", api.TableKind_TABLE_KIND_ORDERED, &api.TableOptions{SplitPoints: [][]byte{[]byte("p"), []byte("g")}}); api.DetailOf(err).GetReason() != "split_points_unordered" {
		t.Errorf("unordered split points: %v", err)
	}
	pt := createTable(t, c, "hashed", &api.TableOptions{Partitions: 2, Replication: 1})
	if err := pt.ScanRange(ctx, client.RangeScan{}, func(k, v []byte) error { return nil }); api.DetailOf(err).GetReason() != "scan_range_not_ordered" {
		t.Errorf("range scan of a point table: %v", err)
	}
	if err := tbl.ScanRange(ctx, client.RangeScan{KeyRange: client.KeyRange{Start: []byte("m"), End: []byte("c")}}, func(k, v []byte) error { return nil }); api.DetailOf(err).GetReason() != "range_empty" {
		t.Errorf("empty range: %v", err)
	}
	_ = context.Background
}
