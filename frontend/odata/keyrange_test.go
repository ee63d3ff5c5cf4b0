package odata

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tabuladb/tabula/frontend/edm"
)

func TestKeyRange(t *testing.T) {
	cases := []struct{ filter, want string }{
		{"", `PK in (-inf,+inf)`},
		{"Age gt 5", `PK in (-inf,+inf)`},
		{"PartitionKey eq 'p'", `PK in ["p","p"]`},
		{"PartitionKey eq 'p' and RowKey ge 'a' and RowKey lt 'b'", `PK in ["p","p"] RK in ["a","b")`},
		{"RowKey lt 'b' and PartitionKey eq 'p' and RowKey ge 'a'", `PK in ["p","p"] RK in ["a","b")`},
		{"'p' eq PartitionKey and 'a' le RowKey and 'b' gt RowKey", `PK in ["p","p"] RK in ["a","b")`},
		{"PartitionKey eq 'p' and RowKey eq 'r'", `PK in ["p","p"] RK in ["r","r"]`},
		{"PartitionKey eq 'p' and RowKey gt 'r' and Age eq 5", `PK in ["p","p"] RK in ("r",+inf)`},
		{"PartitionKey eq 'p' and RowKey le 'r'", `PK in ["p","p"] RK in (-inf,"r"]`},
		// RowKey bounds only with a pinned PartitionKey.
		{"RowKey eq 'r'", `PK in (-inf,+inf)`},
		{"PartitionKey ge 'a' and PartitionKey lt 'b' and RowKey eq 'r'", `PK in ["a","b")`},
		{"PartitionKey gt 'a' and PartitionKey le 'b'", `PK in ("a","b"]`},
		{"PartitionKey ge 'a' and PartitionKey ge 'c' and PartitionKey lt 'x' and PartitionKey le 'd'", `PK in ["c","d"]`},
		{"PartitionKey gt 'a' and PartitionKey ge 'a'", `PK in ("a",+inf)`},
		{"PartitionKey lt 'a' and PartitionKey le 'a'", `PK in (-inf,"a")`},
		// Contradictions.
		{"PartitionKey eq 'a' and PartitionKey eq 'b'", `empty`},
		{"PartitionKey gt 'b' and PartitionKey lt 'a'", `empty`},
		{"PartitionKey gt 'a' and PartitionKey lt 'a'", `empty`},
		{"PartitionKey eq 'p' and RowKey gt 'b' and RowKey lt 'a'", `empty`},
		{"false", `empty`},
		{"false and PartitionKey eq 'p'", `empty`},
		{"PartitionKey eq 1", `empty`}, // never true: keys are strings
		{"not (PartitionKey eq 1)", `empty`},
		// or: the hull.
		{"PartitionKey eq 'a' or PartitionKey eq 'c'", `PK in ["a","c"]`},
		{"PartitionKey eq 'p' and (RowKey eq 'a' or RowKey eq 'c')", `PK in ["p","p"] RK in ["a","c"]`},
		{"(PartitionKey eq 'p' and RowKey lt 'b') or (PartitionKey eq 'p' and RowKey gt 'x')", `PK in ["p","p"]`},
		{"PartitionKey eq 'a' or Age eq 5", `PK in (-inf,+inf)`},
		{"PartitionKey eq 'a' or false", `PK in ["a","a"]`},
		{"(PartitionKey eq 'a' or PartitionKey eq 'b') and PartitionKey ge 'b'", `PK in ["b","b"]`},
		// not: the complement where it is one interval.
		{"not (PartitionKey lt 'm')", `PK in ["m",+inf)`},
		{"not (PartitionKey le 'm')", `PK in ("m",+inf)`},
		{"not (PartitionKey gt 'm')", `PK in (-inf,"m"]`},
		{"not (PartitionKey ge 'm')", `PK in (-inf,"m")`},
		{"not (PartitionKey ne 'p')", `PK in ["p","p"]`},
		{"not (PartitionKey eq 'p')", `PK in (-inf,+inf)`},
		{"PartitionKey ne 'p'", `PK in (-inf,+inf)`},
		{"not (PartitionKey lt 'a' or PartitionKey gt 'c')", `PK in ["a","c"]`},
		{"not (PartitionKey ne 'p' or RowKey lt 'r')", `PK in ["p","p"] RK in ["r",+inf)`},
		{"not (PartitionKey lt 'a' and PartitionKey gt 'c')", `PK in (-inf,+inf)`},
		{"not not (PartitionKey eq 'p')", `PK in ["p","p"]`},
		{"not (Age eq 5) and PartitionKey eq 'p'", `PK in ["p","p"]`},
		{"not true", `empty`},
		{"not false and PartitionKey eq 'p'", `PK in ["p","p"]`},
		{"IsActive and PartitionKey eq 'p'", `PK in ["p","p"]`},
		{"PartitionKey eq 'p' and Timestamp gt datetime'2024-01-01T00:00:00Z'", `PK in ["p","p"]`},
	}
	for _, c := range cases {
		f, err := ParseFilter(c.filter)
		if err != nil {
			t.Errorf("ParseFilter(%q): %v", c.filter, err)
			continue
		}
		if got := f.KeyRange().String(); got != c.want {
			t.Errorf("KeyRange(%q) = %s, want %s", c.filter, got, c.want)
		}
	}
}

func TestRangeHelpers(t *testing.T) {
	f, err := ParseFilter("PartitionKey eq 'p' and RowKey ge 'a' and RowKey lt 'b'")
	if err != nil {
		t.Fatal(err)
	}
	r := f.KeyRange()
	want := Range{
		PartitionLow:  Bound{Set: true, Key: "p", Inclusive: true},
		PartitionHigh: Bound{Set: true, Key: "p", Inclusive: true},
		RowLow:        Bound{Set: true, Key: "a", Inclusive: true},
		RowHigh:       Bound{Set: true, Key: "b"},
	}
	if r != want {
		t.Fatalf("KeyRange = %#v, want %#v", r, want)
	}
	if pk, ok := r.Partition(); !ok || pk != "p" {
		t.Errorf("Partition = %q, %t", pk, ok)
	}
	for _, c := range []struct {
		pk, rk string
		in     bool
	}{{"p", "a", true}, {"p", "azzz", true}, {"p", "b", false}, {"p", "", false}, {"q", "a", false}, {"", "a", false}} {
		if got := r.Contains(c.pk, c.rk); got != c.in {
			t.Errorf("Contains(%q, %q) = %t", c.pk, c.rk, got)
		}
	}
	if (Range{Empty: true}).Contains("", "") {
		t.Error("the empty range contains something")
	}
	if _, ok := (Range{}).Partition(); ok {
		t.Error("the whole table pins a partition")
	}
	if !(Range{}).Contains("x", "y") {
		t.Error("the whole table misses a key")
	}
}

var propSeed = flag.Uint64("odata.seed", 0, "seed of TestKeyRangeContainsMatches (0: time-based)")

// TestKeyRangeContainsMatches checks on random filters over random
// entities that every entity Match accepts lies in KeyRange, and that an
// Empty range goes with no match at all.
func TestKeyRangeContainsMatches(t *testing.T) {
	seed := *propSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -odata.seed=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	keys := []string{"", "a", "ab", "b", "c"}
	entities := make([]*edm.Entity, 0, 200)
	for _, pk := range keys {
		for _, rk := range keys {
			for k := 0; k < 4; k++ {
				e := &edm.Entity{PartitionKey: pk, RowKey: rk}
				if rng.IntN(3) > 0 {
					e.Props = append(e.Props, edm.Property{Name: "N", Value: edm.I32(int32(rng.IntN(3)))})
				}
				if rng.IntN(3) > 0 {
					e.Props = append(e.Props, edm.Property{Name: "B", Value: edm.Bool(rng.IntN(2) == 0)})
				}
				entities = append(entities, e)
			}
		}
	}
	iters := 20000
	if testing.Short() {
		iters = 2000
	}
	matched := 0
	for i := 0; i < iters; i++ {
		text := genFilter(rng, keys, 0)
		f, err := ParseFilter(text)
		if err != nil {
			t.Fatalf("generated filter %q: %v", text, err)
		}
		r := f.KeyRange()
		for _, e := range entities {
			if !f.Match(e) {
				continue
			}
			matched++
			if !r.Contains(e.PartitionKey, e.RowKey) {
				t.Fatalf("seed %d: %q matches (%q, %q) outside its KeyRange %s", seed, text, e.PartitionKey, e.RowKey, r)
			}
		}
	}
	if matched == 0 {
		t.Fatal("the generator never produced a matching filter")
	}
}

// genFilter makes a random filter of at most a few comparisons over the
// keys, an Int32 N, a Boolean B and a missing M (depth 3: at most 8
// comparisons).
func genFilter(rng *rand.Rand, keys []string, depth int) string {
	if depth < 3 && rng.IntN(3) > 0 {
		switch rng.IntN(4) {
		case 0:
			return "not (" + genFilter(rng, keys, depth+1) + ")"
		case 1, 2:
			return "(" + genFilter(rng, keys, depth+1) + ") and (" + genFilter(rng, keys, depth+1) + ")"
		default:
			return "(" + genFilter(rng, keys, depth+1) + ") or (" + genFilter(rng, keys, depth+1) + ")"
		}
	}
	ops := []string{"eq", "ne", "gt", "ge", "lt", "le"}
	op := ops[rng.IntN(len(ops))]
	switch rng.IntN(10) {
	case 0, 1, 2:
		return fmt.Sprintf("PartitionKey %s %s", op, FormatLiteral(edm.Str(keys[rng.IntN(len(keys))])))
	case 3, 4, 5:
		return fmt.Sprintf("RowKey %s %s", op, FormatLiteral(edm.Str(keys[rng.IntN(len(keys))])))
	case 6:
		return fmt.Sprintf("N %s %d", op, rng.IntN(3))
	case 7:
		return []string{"B", "true", "false", "M eq 1"}[rng.IntN(4)]
	case 8:
		return fmt.Sprintf("%s %s PartitionKey", FormatLiteral(edm.Str(keys[rng.IntN(len(keys))])), op)
	}
	return fmt.Sprintf("PartitionKey %s %d", op, rng.IntN(3)) // a type mismatch
}
