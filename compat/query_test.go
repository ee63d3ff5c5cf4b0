package compat

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/data/aztables"
)

// queryRows are the entities of the filter tests: p1/r0..r9 with a
// property of every Edm type, p2/r0..r2 and q1/r0..r1.
func queryRows() []aztables.EDMEntity {
	var out []aztables.EDMEntity
	for i := range 10 {
		props := map[string]any{
			"Str":    fmt.Sprintf("s%d", i),
			"Int32":  int32(i * 10),
			"Int64":  aztables.EDMInt64(1<<53 + int64(i)),
			"Double": float64(i) + 0.5,
			"Bool":   i%2 == 0,
			"When":   aztables.EDMDateTime(when.Add(time.Duration(i) * time.Hour)),
			"Guid":   aztables.EDMGUID(fmt.Sprintf("00000000-0000-0000-0000-00000000000%d", i)),
			"Bin":    aztables.EDMBinary([]byte{byte(i), 0xff}),
		}
		if i == 3 {
			props["Str"] = `it's "q" ü`
		}
		if i < 3 {
			props["Opt"] = "o"
		}
		out = append(out, ent("p1", fmt.Sprintf("r%d", i), props))
	}
	for i := range 3 {
		out = append(out, ent("p2", fmt.Sprintf("r%d", i), map[string]any{"Int32": int32(1000 + i)}))
	}
	for i := range 2 {
		out = append(out, ent("q1", fmt.Sprintf("r%d", i), map[string]any{"Int32": int32(2000 + i)}))
	}
	return out
}

// p1 lists p1 rows by index.
func p1(is ...int) []string {
	var out []string
	for _, i := range is {
		out = append(out, fmt.Sprintf("p1/r%d", i))
	}
	return out
}

// TestQueryFilters: $filter over every literal type, comparisons,
// and/or/not, parentheses, key ranges within and across partitions;
// results in PartitionKey, RowKey order.
func TestQueryFilters(t *testing.T) {
	t.Parallel()
	c := newTable(t)
	start := time.Now().UTC().Add(-time.Hour)
	rows := queryRows()
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(rows), func(i, j int) { rows[i], rows[j] = rows[j], rows[i] }) // insertion order is not result order
	for _, e := range rows {
		add(t, c, e)
	}
	all := []string{}
	for i := range 10 {
		all = append(all, fmt.Sprintf("p1/r%d", i))
	}
	all = append(all, "p2/r0", "p2/r1", "p2/r2", "q1/r0", "q1/r1")

	cases := []struct {
		filter string
		want   []string
	}{
		// Edm.String
		{`Str eq 's2'`, p1(2)},
		{`Str eq 'it''s "q" ü'`, p1(3)},
		{`Str ge 's5' and Str lt 's8'`, p1(5, 6, 7)},
		{`Str gt 's8'`, p1(9)},
		// Edm.Int32
		{`Int32 eq 40`, p1(4)},
		{`Int32 ge 70 and Int32 le 90`, p1(7, 8, 9)},
		{`Int32 lt 20`, p1(0, 1)},
		{`Int32 ne 0 and PartitionKey eq 'p1'`, p1(1, 2, 3, 4, 5, 6, 7, 8, 9)},
		{`Int32 ge 1001`, []string{"p2/r1", "p2/r2", "q1/r0", "q1/r1"}},
		// Edm.Int64
		{`Int64 eq 9007199254740997L`, p1(5)},
		{`Int64 gt 9007199254740999L`, p1(8, 9)},
		// Edm.Double
		{`Double lt 2.0`, p1(0, 1)},
		{`Double eq 4.5`, p1(4)},
		{`Double ge 8.5`, p1(8, 9)},
		// Edm.Boolean
		{`Bool eq true`, p1(0, 2, 4, 6, 8)},
		{`Bool eq false and Int32 gt 50`, p1(7, 9)},
		// Edm.DateTime
		{`When eq datetime'2024-05-06T09:08:09.1234567Z'`, p1(2)},
		{`When ge datetime'2024-05-06T15:08:09.1234567Z'`, p1(8, 9)},
		{`When lt datetime'2024-05-06T08:08:09Z'`, p1(0)},
		// Edm.Guid
		{`Guid eq guid'00000000-0000-0000-0000-000000000004'`, p1(4)},
		// Edm.Binary
		{`Bin eq X'05ff'`, p1(5)},
		{`Bin eq binary'06ff'`, p1(6)},
		// and, or, not, parentheses
		{`not (Int32 lt 80)`, []string{"p1/r8", "p1/r9", "p2/r0", "p2/r1", "p2/r2", "q1/r0", "q1/r1"}},
		{`Int32 eq 10 or Int32 eq 30`, p1(1, 3)},
		{`(Int32 eq 10 or Int32 eq 20) and Bool eq true`, p1(2)},
		{`PartitionKey eq 'p1' and not (RowKey ne 'r1')`, p1(1)},
		{`Int32 eq 40 and Int32 eq 50`, nil},
		// A property an entity lacks matches no comparison, eq or ne.
		{`Opt eq 'o'`, p1(0, 1, 2)},
		{`Opt ne 'o'`, nil},
		{`Missing eq 'x'`, nil},
		// Timestamp is a property too.
		{`Timestamp ge datetime'` + start.Format("2006-01-02T15:04:05.0000000Z") + `'`, all},
		// Keys: point, range within a partition, ranges across them.
		{`PartitionKey eq 'p1' and RowKey eq 'r4'`, p1(4)},
		{`PartitionKey eq 'p1' and RowKey ge 'r3' and RowKey le 'r5'`, p1(3, 4, 5)},
		{`PartitionKey eq 'p2'`, []string{"p2/r0", "p2/r1", "p2/r2"}},
		{`PartitionKey ge 'p2' and PartitionKey lt 'q2'`, []string{"p2/r0", "p2/r1", "p2/r2", "q1/r0", "q1/r1"}},
		{`PartitionKey gt 'p1' and RowKey eq 'r1'`, []string{"p2/r1", "q1/r1"}},
		{`RowKey eq 'r0'`, []string{"p1/r0", "p2/r0", "q1/r0"}},
	}
	for _, tc := range cases {
		got := keys(query(t, c, filterOpts(tc.filter)))
		if !sameStrings(got, tc.want) {
			t.Errorf("filter %s:\n got  %s\n want %s", tc.filter, joinKeys(got), joinKeys(tc.want))
		}
	}
	// No filter: everything, in key order.
	if got := keys(query(t, c, nil)); !sameStrings(got, all) {
		t.Errorf("no filter:\n got  %s\n want %s", joinKeys(got), joinKeys(all))
	}
}

// TestQuerySelect: $select returns the named properties only, with
// odata.etag; types survive the projection.
func TestQuerySelect(t *testing.T) {
	t.Parallel()
	c := newTable(t)
	for _, e := range queryRows()[:3] {
		add(t, c, e)
	}
	sel := "Str,Int64,When"
	pager := c.NewListEntitiesPager(&aztables.ListEntitiesOptions{Select: &sel, Filter: ptr("RowKey eq 'r1'")})
	resp, err := pager.NextPage(testCtx(t))
	if err != nil {
		t.Fatalf("query: %v", err)
	}
	if len(resp.Entities) != 1 {
		t.Fatalf("got %d entities", len(resp.Entities))
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(resp.Entities[0], &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"Str", "Int64", "When", "odata.etag"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("$select=%s: %s missing in %s", sel, k, resp.Entities[0])
		}
	}
	for _, k := range []string{"Int32", "Double", "Bool", "Guid", "Bin", "Opt"} {
		if _, ok := raw[k]; ok {
			t.Errorf("$select=%s: %s present in %s", sel, k, resp.Entities[0])
		}
	}
	var e aztables.EDMEntity
	if err := json.Unmarshal(resp.Entities[0], &e); err != nil {
		t.Fatal(err)
	}
	if e.Properties["Int64"] != aztables.EDMInt64(1<<53+1) || !time.Time(e.Properties["When"].(aztables.EDMDateTime)).Equal(when.Add(time.Hour)) {
		t.Errorf("projected values: %+v", e.Properties)
	}
}

// TestQueryTopContinuation: $top is the page size; the continuation
// (NextPartitionKey, NextRowKey) walks every page, within one partition
// and across partitions, with and without a filter.
func TestQueryTopContinuation(t *testing.T) {
	t.Parallel()
	c := newTable(t)
	ctx := testCtx(t)
	var want []string
	// 22 rows in one partition, 22 over three: added in batches.
	for _, pk := range []string{"a", "b1", "b2", "b3"} {
		n := 22
		if pk != "a" {
			n = []int{7, 8, 7}[pk[1]-'1']
		}
		var acts []aztables.TransactionAction
		for i := range n {
			e := ent(pk, fmt.Sprintf("r%02d", i), map[string]any{"I": int32(i)})
			acts = append(acts, aztables.TransactionAction{ActionType: aztables.TransactionTypeAdd, Entity: marshal(t, e)})
			want = append(want, pk+"/"+e.RowKey)
		}
		if _, err := c.SubmitTransaction(ctx, acts, nil); err != nil {
			t.Fatalf("load %s: %v", pk, err)
		}
	}
	check := func(name string, opts *aztables.ListEntitiesOptions, want []string, minPages int) {
		t.Helper()
		ps := query(t, c, opts)
		for i, p := range ps {
			if len(p.entities) > int(*opts.Top) {
				t.Errorf("%s: page %d holds %d > $top %d", name, i, len(p.entities), *opts.Top)
			}
			if i < len(ps)-1 && p.nextPK == "" && p.nextRK == "" {
				t.Errorf("%s: page %d has no continuation but a next page", name, i)
			}
		}
		if got := keys(ps); !sameStrings(got, want) {
			t.Errorf("%s:\n got  %s\n want %s", name, joinKeys(got), joinKeys(want))
		}
		if len(ps) < minPages {
			t.Errorf("%s: %d pages, want at least %d", name, len(ps), minPages)
		}
	}
	check("one partition, $top 5", &aztables.ListEntitiesOptions{Top: ptr[int32](5), Filter: ptr("PartitionKey eq 'a'")}, want[:22], 5)
	// Exactly 5 pages of 5, 5, 5, 5, 2 in one partition, as the service
	// answers (a page ends early only at the 5 s budget or a partition
	// boundary).
	if ps := query(t, c, &aztables.ListEntitiesOptions{Top: ptr[int32](5), Filter: ptr("PartitionKey eq 'a'")}); len(ps) != 5 || len(ps[4].entities) != 2 {
		var sizes []int
		for _, p := range ps {
			sizes = append(sizes, len(p.entities))
		}
		t.Errorf("one partition, $top 5: page sizes %v, want [5 5 5 5 2]", sizes)
	}
	check("three partitions, $top 5", &aztables.ListEntitiesOptions{Top: ptr[int32](5), Filter: ptr("PartitionKey gt 'a'")}, want[22:], 5)
	check("everything, $top 4", &aztables.ListEntitiesOptions{Top: ptr[int32](4)}, want, 11)
	var odd []string
	for i := 1; i < 22; i += 2 {
		odd = append(odd, fmt.Sprintf("a/r%02d", i))
	}
	check("filtered, $top 3", &aztables.ListEntitiesOptions{Top: ptr[int32](3), Filter: ptr("PartitionKey eq 'a' and (I eq 1 or I eq 3 or I eq 5 or I eq 7 or I eq 9 or I eq 11 or I eq 13 or I eq 15 or I eq 17 or I eq 19 or I eq 21)")}, odd, 4)

	// Resuming from a continuation the caller kept.
	pager := c.NewListEntitiesPager(&aztables.ListEntitiesOptions{Top: ptr[int32](10), Filter: ptr("PartitionKey eq 'a'")})
	first, err := pager.NextPage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if first.NextPartitionKey == nil || first.NextRowKey == nil {
		t.Fatalf("first page of 10 of 22: no continuation")
	}
	rest := query(t, c, &aztables.ListEntitiesOptions{Top: ptr[int32](100), Filter: ptr("PartitionKey eq 'a'"),
		NextPartitionKey: first.NextPartitionKey, NextRowKey: first.NextRowKey})
	if got := keys(rest); !slices.Equal(got, want[10:22]) {
		t.Errorf("resumed query:\n got  %s\n want %s", joinKeys(got), joinKeys(want[10:22]))
	}
}
