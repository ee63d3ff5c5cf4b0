package odata

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/tabuladb/tabula/frontend/edm"
)

// fuzzEntities are a few entities a parsed filter is matched against.
func fuzzEntities(t testing.TB) []*edm.Entity {
	return []*edm.Entity{
		testEntity(t),
		{},
		{PartitionKey: "a", RowKey: "b", Timestamp: time.Unix(0, 0), Props: []edm.Property{
			{Name: "A", Value: edm.F64(math.NaN())},
			{Name: "B", Value: edm.Bool(false)},
			{Name: "Age", Value: edm.I64(5)},
			{Name: "Name", Value: edm.Str("")},
		}},
	}
}

// FuzzParseFilter: ParseFilter never panics; its errors are *SyntaxError
// wrapping ErrInvalidFilter with an offset inside the text; a parsed
// filter matches without panicking, its String parses back to the same
// String, Comparisons and matches, and KeyRange holds every match.
func FuzzParseFilter(f *testing.F) {
	for _, s := range []string{
		"",
		"PartitionKey eq 'p' and RowKey ge 'a' and RowKey lt 'b'",
		"Str eq 'hello ''world'' ü'",
		"Int32 ge 42 or Int64 eq 9007199254740993L",
		"Double lt 3.5 and Big eq -2.5E10 and D gt 5d and X ne NaN and Y lt -INF",
		"When eq datetime'2024-05-06T07:08:09.1234567Z' and Timestamp gt datetime'2024-05-06T07:08+02:00'",
		"Guid eq guid'c9da6455-213d-42c9-9a79-3e9149a57833'",
		"Bin eq X'0001feff' or Bin eq binary'00'",
		"not IsActive and (IsOff or true) or not (5 lt Age)",
		"not (PartitionKey lt 'm' or RowKey ne 'r')",
		"Age eq 2147483648",
		"T eq datetime'2024-02-30T07:08:09Z'",
		"((((A eq 1))))",
	} {
		f.Add(s)
	}
	entities := fuzzEntities(f)
	f.Fuzz(func(t *testing.T, s string) {
		flt, err := ParseFilter(s)
		if err != nil {
			var se *SyntaxError
			if !errors.Is(err, ErrInvalidFilter) || !errors.As(err, &se) || se.Offset < 0 || se.Offset > len(s) {
				t.Fatalf("ParseFilter(%q): error %#v is not a *SyntaxError in the text", s, err)
			}
			return
		}
		if flt.Comparisons() > MaxComparisons {
			t.Fatalf("ParseFilter(%q): %d comparisons", s, flt.Comparisons())
		}
		r := flt.KeyRange()
		text := flt.String()
		again, err := ParseFilter(text)
		if err != nil {
			t.Fatalf("ParseFilter(%q) renders as %q, which does not parse: %v", s, text, err)
		}
		if again.String() != text || again.Comparisons() != flt.Comparisons() || again.KeyRange() != r {
			t.Fatalf("ParseFilter(%q): round trip %q -> %q", s, text, again.String())
		}
		for _, e := range entities {
			m := flt.Match(e)
			if again.Match(e) != m {
				t.Fatalf("ParseFilter(%q): %q and its rendering %q disagree on an entity", s, s, text)
			}
			if m && !r.Contains(e.PartitionKey, e.RowKey) {
				t.Fatalf("ParseFilter(%q): match (%q, %q) outside KeyRange %s", s, e.PartitionKey, e.RowKey, r)
			}
		}
	})
}

// FuzzParseSelect: no panics, errors wrap ErrInvalidSelect, and every
// name returned is valid.
func FuzzParseSelect(f *testing.F) {
	for _, s := range []string{"", "*", "Name,Age", " a , b ,a", "a,,b", "1a"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		names, err := ParseSelect(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidSelect) {
				t.Fatalf("ParseSelect(%q): %v", s, err)
			}
			return
		}
		for _, n := range names {
			if !ValidName(n) {
				t.Fatalf("ParseSelect(%q) returned %q", s, n)
			}
		}
	})
}
