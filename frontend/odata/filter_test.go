package odata

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/tabuladb/tabula/frontend/edm"
)

func mustGUID(t testing.TB, s string) edm.Value {
	t.Helper()
	g, err := edm.ParseGUID(s)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// testEntity has one property of every Edm type.
func testEntity(t testing.TB) *edm.Entity {
	return &edm.Entity{
		PartitionKey: "p1",
		RowKey:       "r1",
		Timestamp:    time.Date(2024, 5, 6, 7, 8, 9, 123456700, time.UTC),
		Props: []edm.Property{
			{Name: "Str", Value: edm.Str("hello 'world' ü")},
			{Name: "Int32", Value: edm.I32(42)},
			{Name: "Neg", Value: edm.I32(-7)},
			{Name: "Int64", Value: edm.I64(9007199254740993)},
			{Name: "Double", Value: edm.F64(3.25)},
			{Name: "Big", Value: edm.F64(-2.5e10)},
			{Name: "NaNProp", Value: edm.F64(math.NaN())},
			{Name: "Inf", Value: edm.F64(math.Inf(1))},
			{Name: "IsActive", Value: edm.Bool(true)},
			{Name: "IsOff", Value: edm.Bool(false)},
			{Name: "When", Value: edm.Time(time.Date(2024, 5, 6, 7, 8, 9, 123456700, time.UTC))},
			{Name: "Day", Value: edm.Time(time.Date(2008, 7, 10, 0, 0, 0, 0, time.UTC))},
			{Name: "Guid", Value: mustGUID(t, "c9da6455-213d-42c9-9a79-3e9149a57833")},
			{Name: "Bin", Value: edm.Bin([]byte{0x00, 0x01, 0xfe, 0xff})},
			{Name: "Empty", Value: edm.Str("")},
			{Name: "_under9", Value: edm.I32(1)},
			{Name: "Größe", Value: edm.I32(180)},
		},
	}
}

func TestMatch(t *testing.T) {
	e := testEntity(t)
	cases := []struct {
		filter string
		want   bool
	}{
		// The empty filter.
		{"", true},
		{"   ", true},
		// Strings, with the '' escape.
		{"Str eq 'hello ''world'' ü'", true},
		{"Str eq 'hello'", false},
		{"Str ne 'hello'", true},
		{"Str gt 'hello'", true},
		{"Str lt 'hellp'", true},
		{"Str ge 'hello ''world'' ü'", true},
		{"Str le 'hello ''world'' ü'", true},
		{"Empty eq ''", true},
		{"Empty lt 'a'", true},
		// Int32.
		{"Int32 eq 42", true},
		{"Int32 ge 42", true},
		{"Int32 gt 42", false},
		{"Int32 lt 43", true},
		{"Int32 le 41", false},
		{"Int32 ne 41", true},
		{"Neg eq -7", true},
		{"Neg lt 0", true},
		{"Int32 eq 042", true},
		{"Int32 eq -2147483648 or Int32 eq 2147483647", false},
		// Int64.
		{"Int64 eq 9007199254740993L", true},
		{"Int64 eq 9007199254740992L", false},
		{"Int64 gt 9007199254740992l", true},
		{"Int64 lt 9223372036854775807L", true},
		// Doubles in every spelling.
		{"Double eq 3.25", true},
		{"Double eq 3.25d", true},
		{"Double eq 3.25D", true},
		{"Double eq 325E-2", true},
		{"Double eq 0.325e+1", true},
		{"Double gt 3d", true},
		{"Double lt 3.5", true},
		{"Big eq -2.5E10", true},
		{"Big lt -1e10", true},
		{"Double lt INF", true},
		{"Double gt -INF", true},
		{"Inf eq INF", true},
		// NaN never matches, not even under not.
		{"NaNProp eq NaN", false},
		{"NaNProp ne 1.0", false},
		{"NaNProp lt 1.0", false},
		{"not (NaNProp eq 1.0)", false},
		{"Double eq NaN", false},
		{"Double ne NaN", false},
		// Booleans.
		{"IsActive eq true", true},
		{"IsActive eq false", false},
		{"IsOff eq false", true},
		{"IsOff lt true", true},
		{"IsActive gt false", true},
		// Boolean literals in any case, as the service reads them.
		{"IsActive eq True", true},
		{"IsOff eq FALSE", true},
		{"(IsActive eq tRuE )and(IsOff eq False)", true},
		{"IsActive eq False", false},
		// Bare Boolean properties.
		{"IsActive", true},
		{"IsOff", false},
		{"not IsActive", false},
		{"not IsOff", true},
		{"(IsActive)", true},
		{"not (IsOff)", true},
		{"Str", false},         // not a Boolean: null
		{"not Str", false},     // not null is null
		{"Missing", false},     // missing: null
		{"not Missing", false}, // not null is null
		{"IsActive and Int32 eq 42", true},
		{"IsOff or Int32 eq 42", true},
		// Constants as conditions.
		{"true", true},
		{"false", false},
		{"not false", true},
		{"(true and RowKey eq 'r1') and ((false or PartitionKey eq 'p1') or PartitionKey eq 'x')", true},
		{"false or Int32 eq 42", true},
		// DateTimes.
		{"When eq datetime'2024-05-06T07:08:09.1234567Z'", true},
		{"When eq datetime'2024-05-06T07:08:09.1234567'", true},
		{"When eq datetime'2024-05-06T09:08:09.1234567+02:00'", true},
		{"When eq datetime'2024-05-06T02:08:09.1234567-05:00'", true},
		{"When gt datetime'2024-05-06T07:08:09.123456Z'", true},
		{"When lt datetime'2024-05-06T07:08:09.12346Z'", true},
		{"When gt datetime'2024-05-06T07:08:09Z'", true},
		{"Day eq datetime'2008-07-10T00:00:00Z'", true},
		{"Day eq datetime'2008-07-10T00:00Z'", true},
		{"Day eq datetime'2008-07-10T00:00:00.0Z'", true},
		{"Day lt datetime'2008-07-10T00:00:00.0000001Z'", true},
		{"Day gt datetime'1677-09-21T00:12:43.1452242Z'", true},
		{"Day lt datetime'2262-04-11T23:47:16.8547758Z'", true},
		{"Timestamp eq datetime'2024-05-06T07:08:09.1234567Z'", true},
		{"Timestamp ge datetime'2024-01-01T00:00:00Z' and Timestamp lt datetime'2025-01-01T00:00:00Z'", true},
		{"Timestamp lt datetime'2024-01-01T00:00:00Z'", false},
		// GUIDs, any case.
		{"Guid eq guid'c9da6455-213d-42c9-9a79-3e9149a57833'", true},
		{"Guid eq guid'C9DA6455-213D-42C9-9A79-3E9149A57833'", true},
		{"Guid ne guid'00000000-0000-0000-0000-000000000000'", true},
		{"Guid gt guid'00000000-0000-0000-0000-000000000000'", true},
		// Binary, both spellings.
		{"Bin eq X'0001feff'", true},
		{"Bin eq X'0001FEFF'", true},
		{"Bin eq binary'0001feff'", true},
		{"Bin gt X'0001'", true},
		{"Bin lt X'01'", true},
		{"Bin eq X''", false},
		// Keys.
		{"PartitionKey eq 'p1'", true},
		{"PartitionKey eq 'p1' and RowKey eq 'r1'", true},
		{"PartitionKey eq 'p1' and RowKey eq 'r2'", false},
		{"PartitionKey ge 'p' and PartitionKey lt 'q'", true},
		{"RowKey gt 'r0' and RowKey le 'r1'", true},
		// Literal on the left.
		{"42 eq Int32", true},
		{"41 lt Int32", true},
		{"43 lt Int32", false},
		{"42 le Int32", true},
		{"43 gt Int32", true},
		{"42 ge Int32", true},
		{"'p1' eq PartitionKey", true},
		{"'a' lt PartitionKey and 'z' gt PartitionKey", true},
		// Type mismatch: no match, and neither is its negation.
		{"Int32 eq 42L", false},
		{"Int32 ne 42L", false},
		{"Int32 eq 42.0", false},
		{"Int64 lt 2147483647", false},
		{"Double eq 3", false},
		{"Str eq 5", false},
		{"not (Int32 eq 42L)", false},
		{"PartitionKey eq 1", false},
		{"Guid eq 'c9da6455-213d-42c9-9a79-3e9149a57833'", false},
		{"IsActive eq 1", false},
		// Missing properties: null.
		{"Missing eq 1", false},
		{"Missing ne 1", false},
		{"not (Missing eq 1)", false},
		{"not (Missing ne 1)", false},
		{"Missing eq 1 or Int32 eq 42", true},
		{"Missing eq 1 and Int32 eq 42", false},
		{"not (Missing eq 1 and Int32 eq 41)", true},  // null and false = false; not false = true
		{"not (Missing eq 1 or Int32 eq 42)", false},  // null or true = true
		{"not (Missing eq 1 or Int32 eq 41)", false},  // null or false = null
		{"not (Missing eq 1 and Int32 eq 42)", false}, // null and true = null
		{"missing eq 1", false},
		{"int32 eq 42", false}, // names are case-sensitive
		// Precedence: and before or; not before both.
		{"Int32 eq 1 and Int32 eq 2 or Int32 eq 42", true},
		{"Int32 eq 42 or Int32 eq 1 and Int32 eq 2", true},
		{"(Int32 eq 42 or Int32 eq 1) and Int32 eq 2", false},
		{"Int32 eq 42 or (Int32 eq 1 and Int32 eq 2)", true},
		{"not IsOff and Int32 eq 42", true},
		{"not IsActive or Int32 eq 42", true},
		{"not (IsActive or Int32 eq 42)", false},
		{"not not IsActive", true},
		{"not (not (Int32 eq 42))", true},
		{"PartitionKey eq 'p1' and not (RowKey ne 'r1')", true},
		{"not(Int32 eq 41)", true},
		{"(Int32 eq 42)and(Str ne 'x')", true},
		{"((((Int32 eq 42))))", true},
		{"\tInt32\neq\r42 ", true},
		// Other names.
		{"_under9 eq 1", true},
		{"Größe gt 170", true},
	}
	for _, c := range cases {
		f, err := ParseFilter(c.filter)
		if err != nil {
			t.Errorf("ParseFilter(%q): %v", c.filter, err)
			continue
		}
		if got := f.Match(e); got != c.want {
			t.Errorf("%q: Match = %t, want %t (parsed as %q)", c.filter, got, c.want, f.String())
		}
		// The canonical text parses to a filter that matches alike.
		g, err := ParseFilter(f.String())
		if err != nil {
			t.Errorf("%q: reparse of %q: %v", c.filter, f.String(), err)
			continue
		}
		if g.String() != f.String() || g.Match(e) != c.want || g.Comparisons() != f.Comparisons() {
			t.Errorf("%q: round trip %q -> %q differs", c.filter, f.String(), g.String())
		}
	}
}

func TestMatchNilAndEmpty(t *testing.T) {
	var f *Filter
	e := testEntity(t)
	if !f.Match(e) || f.Comparisons() != 0 || f.String() != "" || f.KeyRange() != (Range{}) {
		t.Error("a nil filter must match everything")
	}
}

func TestString(t *testing.T) {
	cases := []struct{ in, want string }{
		{"5 lt Age", "Age gt 5"},
		{"5 le Age", "Age ge 5"},
		{"5 gt Age", "Age lt 5"},
		{"5 ge Age", "Age le 5"},
		{"'a' ne Name", "Name ne 'a'"},
		{"Age  eq   5", "Age eq 5"},
		{"((A eq 1) and (B eq 2))", "A eq 1 and B eq 2"},
		{"A eq 1 and (B eq 2 and C eq 3)", "A eq 1 and (B eq 2 and C eq 3)"},
		{"(A eq 1 and B eq 2) and C eq 3", "A eq 1 and B eq 2 and C eq 3"},
		{"(A eq 1 or B eq 2) and C eq 3", "(A eq 1 or B eq 2) and C eq 3"},
		{"A eq 1 or B eq 2 and C eq 3", "A eq 1 or B eq 2 and C eq 3"},
		{"not (A eq 1)", "not (A eq 1)"},
		{"not(IsActive)", "not IsActive"},
		{"not not (IsActive)", "not not IsActive"},
		{"S eq 'it''s'", "S eq 'it''s'"},
		{"L eq 5l", "L eq 5L"},
		{"D eq 2d", "D eq 2.0"},
		{"D eq -0.0", "D eq -0.0"},
		{"D eq 1E+21", "D eq 1e+21"},
		{"D eq 1.5E-7", "D eq 1.5e-07"},
		{"D eq 100.00", "D eq 100.0"},
		{"D eq -INF", "D eq -INF"},
		{"T eq datetime'2024-05-06T07:08Z'", "T eq datetime'2024-05-06T07:08:00.0000000Z'"},
		{"T eq datetime'2024-05-06T07:08:09.5+01:30'", "T eq datetime'2024-05-06T05:38:09.5000000Z'"},
		{"G eq guid'C9DA6455-213D-42C9-9A79-3E9149A57833'", "G eq guid'c9da6455-213d-42c9-9a79-3e9149a57833'"},
		{"B eq binary'ABCD'", "B eq X'abcd'"},
		{"true eq IsActive", "IsActive eq true"},
		{"(true)", "true"},
	}
	for _, c := range cases {
		f, err := ParseFilter(c.in)
		if err != nil {
			t.Errorf("ParseFilter(%q): %v", c.in, err)
			continue
		}
		if got := f.String(); got != c.want {
			t.Errorf("String(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestComparisons(t *testing.T) {
	cases := []struct {
		in   string
		want int
	}{
		{"", 0},
		{"true", 0},
		{"A eq 1", 1},
		{"IsActive", 1},
		{"not IsActive", 1},
		{"(IsActive)", 1},
		{"not (IsActive)", 1},
		{"IsActive eq true", 1},
		{"A eq 1 and (B eq 2 or not C) and D", 4},
	}
	for _, c := range cases {
		f, err := ParseFilter(c.in)
		if err != nil {
			t.Errorf("ParseFilter(%q): %v", c.in, err)
			continue
		}
		if got := f.Comparisons(); got != c.want {
			t.Errorf("Comparisons(%q) = %d, want %d", c.in, got, c.want)
		}
	}
	terms := make([]string, MaxComparisons)
	for i := range terms {
		terms[i] = "A eq 1"
	}
	if _, err := ParseFilter(strings.Join(terms, " or ")); err != nil {
		t.Errorf("%d comparisons refused: %v", MaxComparisons, err)
	}
	terms[MaxComparisons-1] = "IsActive"
	if _, err := ParseFilter(strings.Join(terms, " or ")); err != nil {
		t.Errorf("%d comparisons with a bare property refused: %v", MaxComparisons, err)
	}
	for _, extra := range []string{"A eq 1", "IsActive", "not IsActive", "(IsActive)"} {
		_, err := ParseFilter(strings.Join(append(terms, extra), " and "))
		if err == nil || !strings.Contains(err.Error(), "more than 15 comparisons") {
			t.Errorf("%d comparisons ending in %q: err = %v", MaxComparisons+1, extra, err)
		}
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct{ in, want string }{
		{"Age eq", "expected a literal after 'eq', found the end of the filter at offset 6"},
		{"Age eq and B eq 1", "expected a literal after 'eq'"},
		{"Age eq )", "expected a literal after 'eq'"},
		{"Age", ""}, // valid: a bare property
		{"eq 5", "expected a property or a literal before 'eq'"},
		{"Age eq 5 eq 6", "comparisons cannot be chained"},
		{"Age eq Height", "compares property Age with property Height"},
		{"IsOff lt IsActive", "compares property IsOff with property IsActive"},
		{"5 eq 5", "compares two literals"},
		{"true eq false", "compares two literals"},
		{"not Age eq 5", "'not' binds tighter than 'eq'"},
		{"Age eq not B", "must be a property or a literal"},
		{"(Age) eq 5", "must be a property or a literal, not a parenthesised expression"},
		{"(Age eq 5", "expected ')' to close the '(' at offset 0"},
		{"Age eq 5)", "unbalanced ')'"},
		{"()", "empty parentheses"},
		{"Age eq 5 and", "unexpected end of the filter"},
		{"and Age eq 5", "expected a condition, found 'and'"},
		{"Age eq 5 Name eq 'x'", "expected 'and', 'or' or the end of the filter, found property Name"},
		{"5", "5 is not a condition"},
		{"'abc' and A eq 1", "'abc' is not a condition"},
		{"not 5", "5 is not a condition"},
		{"(5)", "5 is not a condition"},
		{"A eq 1 or 2.5", "2.5 is not a condition"},
		// Case-sensitive keywords.
		{"Age EQ 5", "expected 'and', 'or' or the end of the filter, found property EQ"},
		{"Age eq 5 AND B eq 1", "found property AND"},
		{"When eq DateTime'2024-05-06T07:08:09Z'", "unknown literal prefix DateTime'…'"},
		{"G eq GUID'c9da6455-213d-42c9-9a79-3e9149a57833'", "unknown literal prefix GUID"},
		{"B eq x'00'", "x'…' literals are not supported"},
		// Strings.
		{"Name eq 'abc", "unterminated quoted literal (a quote inside one is written '') at offset 8"},
		{"Name eq 'it's'", "unterminated quoted literal"},
		// Numbers.
		{"Age eq 2147483648", "integer 2147483648 is out of the Edm.Int32 range; write 2147483648L for an Edm.Int64"},
		{"Age eq -2147483649", "out of the Edm.Int32 range"},
		{"Age eq 9223372036854775808L", "out of the Edm.Int64 range"},
		{"Age eq 1.5L", "Int64 literal 1.5L has a fraction or exponent"},
		{"Age eq 1e400", "out of the Edm.Double range"},
		{"Age eq 1.", "expected a digit after the decimal point"},
		{"Age eq .5", "unexpected character '.'"},
		{"Age eq 1e", "expected a digit in the exponent"},
		{"Age eq 1e+", "expected a digit in the exponent"},
		{"Age eq 1.5M", "Edm.Decimal literal 1.5M is not supported"},
		{"Age eq 1.5f", "Edm.Single literal 1.5f is not supported"},
		{"Age eq 5x", "unexpected character 'x' after number 5"},
		{"Age eq 5and B eq 1", "unexpected character 'a' after number 5"},
		{"Age eq 1.2.3", "unexpected character '.' after number 1.2"},
		{"Age eq - 5", "'-' must be followed by a number"},
		{"Age eq -INFX", "after -INF"},
		{"Age eq +5", "unexpected character '+'"},
		{"Age eq 0x10", "unexpected character 'x' after number 0"},
		// DateTimes.
		{"T eq datetime'2024-05-06'", "bad datetime literal \"2024-05-06\": expected 'T'"},
		{"T eq datetime'2024-05-06T07:08:09.12345678Z'", "more than 7 fractional digits"},
		{"T eq datetime'2024-13-06T07:08:09Z'", "field out of range"},
		{"T eq datetime'2024-02-30T07:08:09Z'", "no such day"},
		{"T eq datetime'2024-05-06T24:00:00Z'", "field out of range"},
		{"T eq datetime'2024-05-06T07:08:09.Z'", "expected digits after the decimal point"},
		{"T eq datetime'2024-05-06T07:08:09ZZ'", "unexpected text after the time"},
		{"T eq datetime'2024-05-06T07:08:09+2:00'", "expected a two-digit offset hour"},
		{"T eq datetime'0001-01-01T00:00:00+01:00'", "outside the range 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z"},
		{"T eq datetime'0000-01-01T00:00:00Z'", "field out of range"},
		{"T eq datetime '2024-05-06T07:08:09Z'", "compares property T with property datetime"},
		{"T eq datetimeoffset'2024-05-06T07:08:09Z'", "datetimeoffset'…' literals are not supported"},
		// GUIDs and binaries.
		{"G eq guid'c9da6455213d42c99a793e9149a57833'", "bad guid literal"},
		{"G eq guid'c9da6455-213d-42c9-9a79-3e9149a5783g'", "bad guid literal"},
		{"G eq guid'00-00000-0000-0000-0000-000000000000'", "bad guid literal"}, // a fifth dash: edm.ParseGUID panics on it
		{"B eq X'abc'", "bad binary literal \"abc\": want an even number of hex digits"},
		{"B eq X'zz'", "bad binary literal"},
		// Unsupported OData.
		{"Name eq null", "null is not supported"},
		{"startswith(Name, 'a')", "function startswith() is not supported"},
		{"Age add 5 eq 10", "found property add"},
		{"Age eq 5 & B eq 1", "unexpected character '&'"},
		{"Name eq 'a' / 2", "unexpected character '/'"},
		// Names.
		{"A" + strings.Repeat("b", 255) + " eq 1", "property name of 256 characters is longer than 255"},
		{"Age eq 5 and \xff", "invalid UTF-8"},
	}
	for _, c := range cases {
		f, err := ParseFilter(c.in)
		if c.want == "" {
			if err != nil {
				t.Errorf("ParseFilter(%q): %v", c.in, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("ParseFilter(%q) = %q, want an error containing %q", c.in, f.String(), c.want)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseFilter(%q) error %q, want it to contain %q", c.in, err, c.want)
		}
		if !errors.Is(err, ErrInvalidFilter) {
			t.Errorf("ParseFilter(%q) error %v is not ErrInvalidFilter", c.in, err)
		}
		var se *SyntaxError
		if !errors.As(err, &se) || se.Offset < 0 || se.Offset > len(c.in) || se.Option != "$filter" {
			t.Errorf("ParseFilter(%q) error %#v: want a *SyntaxError with an offset in the text", c.in, err)
		}
	}
	// Nesting is bounded.
	deep := strings.Repeat("(", maxDepth+5) + "A eq 1" + strings.Repeat(")", maxDepth+5)
	if _, err := ParseFilter(deep); err == nil || !strings.Contains(err.Error(), "nested more than") {
		t.Errorf("deep nesting: err = %v", err)
	}
	if _, err := ParseFilter(strings.Repeat("not ", maxDepth+5) + "A"); err == nil {
		t.Error("deep not: no error")
	}
	ok := strings.Repeat("(", 50) + "A eq 1" + strings.Repeat(")", 50)
	if _, err := ParseFilter(ok); err != nil {
		t.Errorf("50 parentheses: %v", err)
	}
	long := "A" + strings.Repeat("b", 254)
	if _, err := ParseFilter(long + " eq 1"); err != nil {
		t.Errorf("255-character name: %v", err)
	}
}

func BenchmarkMatch(b *testing.B) {
	e := testEntity(b)
	f, err := ParseFilter("PartitionKey eq 'p1' and RowKey ge 'r0' and RowKey lt 'r2' and (Int32 gt 40 or Str eq 'x') and not (IsOff) and When ge datetime'2024-01-01T00:00:00Z'")
	if err != nil {
		b.Fatal(err)
	}
	if !f.Match(e) {
		b.Fatal("no match")
	}
	b.ReportAllocs()
	for b.Loop() {
		f.Match(e)
	}
}

func BenchmarkParseFilter(b *testing.B) {
	const s = "PartitionKey eq 'p1' and RowKey ge 'r0' and RowKey lt 'r2' and (Int32 gt 40 or Str eq 'x') and not (IsOff) and When ge datetime'2024-01-01T00:00:00Z'"
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseFilter(s); err != nil {
			b.Fatal(err)
		}
	}
}
