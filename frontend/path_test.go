package frontend

import (
	"strings"
	"testing"
)

// quoteKey writes a key literal as the SDKs do: quotes doubled.
func quoteKey(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func TestParseEntityPath(t *testing.T) {
	for _, tc := range []struct {
		in     string
		table  string
		pk, rk string
		set    bool
		bad    bool
	}{
		{in: "People", table: "People"},
		{in: "People()", table: "People"},
		{in: "People(PartitionKey='p',RowKey='r')", table: "People", pk: "p", rk: "r", set: true},
		{in: "People(RowKey='r',PartitionKey='p')", table: "People", pk: "p", rk: "r", set: true},
		{in: "People(PartitionKey='it''s',RowKey='')", table: "People", pk: "it's", rk: "", set: true},
		{in: "People(PartitionKey='a,b',RowKey='c)d')", table: "People", pk: "a,b", rk: "c)d", set: true},
		{in: "People(PartitionKey='p')", bad: true},
		{in: "People(PartitionKey='p',RowKey='r'", bad: true},
		{in: "People(PartitionKey=p,RowKey='r')", bad: true},
		{in: "People(Other='p',RowKey='r')", bad: true},
		{in: "People(PartitionKey='p,RowKey='r')", bad: true},
	} {
		table, k, err := parseEntityPath(tc.in)
		if (err != nil) != tc.bad {
			t.Errorf("%q: error %v, want bad=%t", tc.in, err, tc.bad)
			continue
		}
		if !tc.bad && (table != tc.table || k.set != tc.set || k.pk != tc.pk || k.rk != tc.rk) {
			t.Errorf("%q: %q %+v", tc.in, table, k)
		}
	}
}

// FuzzParseEntityPath: any path parses or is refused, never panics; a
// parsed entity path written back the way the SDKs write it parses to
// the same keys.
func FuzzParseEntityPath(f *testing.F) {
	for _, s := range []string{"t", "t()", "t(PartitionKey='p',RowKey='r')", "t(PartitionKey='''',RowKey='a''b')", "t(PartitionKey='", "t(,)", "t(RowKey='',PartitionKey='')"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		table, k, err := parseEntityPath(s)
		if err != nil || !k.set {
			return
		}
		again := table + "(PartitionKey=" + quoteKey(k.pk) + ",RowKey=" + quoteKey(k.rk) + ")"
		table2, k2, err := parseEntityPath(again)
		if err != nil || table2 != table || k2 != k {
			t.Fatalf("%q parsed to %q %+v; written back as %q it parses to %q %+v (%v)", s, table, k, again, table2, k2, err)
		}
	})
}
