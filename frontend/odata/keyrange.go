package odata

import (
	"strconv"
	"strings"

	"github.com/tabuladb/tabula/frontend/edm"
)

// Bound is one end of a key interval. The zero Bound is unbounded.
type Bound struct {
	Set       bool   // false: unbounded (Key and Inclusive are then zero)
	Key       string // the bounding key
	Inclusive bool   // whether Key itself is inside
}

// Range is the part of a table, in (PartitionKey, RowKey) order, that
// holds every entity a filter can match: the gateway scans only it and
// still applies Match to what it reads. It is a value, safe to copy.
//
// RowLow and RowHigh are set only when the PartitionKey is pinned to one
// value (Partition reports it); otherwise they are unbounded. Empty says
// the filter matches no entity at all (PartitionKey eq 'a' and
// PartitionKey eq 'b'); the other fields are then zero.
type Range struct {
	Empty                       bool
	PartitionLow, PartitionHigh Bound
	RowLow, RowHigh             Bound
}

// Partition returns the PartitionKey when the range pins it to one value.
func (r Range) Partition() (string, bool) {
	lo, hi := r.PartitionLow, r.PartitionHigh
	if r.Empty || !lo.Set || !hi.Set || !lo.Inclusive || !hi.Inclusive || lo.Key != hi.Key {
		return "", false
	}
	return lo.Key, true
}

// Contains says whether an entity with these keys lies in the range.
func (r Range) Contains(pk, rk string) bool {
	if r.Empty {
		return false
	}
	return interval{r.PartitionLow, r.PartitionHigh}.contains(pk) &&
		interval{r.RowLow, r.RowHigh}.contains(rk)
}

// String shows the range for logs and test failures:
// "PK in ['p','p'] RK in ['a','b')", "PK in (-inf,+inf)", "empty".
func (r Range) String() string {
	if r.Empty {
		return "empty"
	}
	var b strings.Builder
	b.WriteString("PK in ")
	interval{r.PartitionLow, r.PartitionHigh}.format(&b)
	if r.RowLow.Set || r.RowHigh.Set {
		b.WriteString(" RK in ")
		interval{r.RowLow, r.RowHigh}.format(&b)
	}
	return b.String()
}

// KeyRange is the key range the filter confines a query to. It is
// conservative: every entity Match accepts lies in it (the property test
// in keyrange_test.go checks that on random filters). It is exact for
// conjunctions of PartitionKey and RowKey comparisons with string
// literals; under 'or' it is the smallest range holding both sides, and
// under 'not' it uses the complement where that is one interval (not
// (PartitionKey lt 'm') is PartitionKey ge 'm') and is unbounded
// otherwise.
func (f *Filter) KeyRange() Range {
	if f == nil || f.root == nil {
		return Range{}
	}
	b := f.root.keyBoxes().t
	if b.empty() {
		return Range{Empty: true}
	}
	r := Range{PartitionLow: b.pk.lo, PartitionHigh: b.pk.hi}
	if _, pinned := r.Partition(); pinned {
		r.RowLow, r.RowHigh = b.rk.lo, b.rk.hi
	}
	return r
}

// interval is a set of strings between two bounds.
type interval struct{ lo, hi Bound }

func (iv interval) contains(k string) bool {
	if iv.lo.Set {
		if c := strings.Compare(k, iv.lo.Key); c < 0 || c == 0 && !iv.lo.Inclusive {
			return false
		}
	}
	if iv.hi.Set {
		if c := strings.Compare(k, iv.hi.Key); c > 0 || c == 0 && !iv.hi.Inclusive {
			return false
		}
	}
	return true
}

func (iv interval) empty() bool {
	if !iv.lo.Set || !iv.hi.Set {
		return false
	}
	c := strings.Compare(iv.lo.Key, iv.hi.Key)
	return c > 0 || c == 0 && !(iv.lo.Inclusive && iv.hi.Inclusive)
}

// intersect is exact.
func (iv interval) intersect(o interval) interval {
	return interval{tighterLow(iv.lo, o.lo), tighterHigh(iv.hi, o.hi)}
}

// hull is the smallest interval holding both; callers drop empty ones
// first.
func (iv interval) hull(o interval) interval {
	lo, hi := iv.lo, iv.hi
	if tighterLow(lo, o.lo) == lo {
		lo = o.lo
	}
	if tighterHigh(hi, o.hi) == hi {
		hi = o.hi
	}
	return interval{lo, hi}
}

// tighterLow is the larger of two lower bounds.
func tighterLow(a, b Bound) Bound {
	switch {
	case !a.Set:
		return b
	case !b.Set:
		return a
	}
	if c := strings.Compare(a.Key, b.Key); c > 0 || c == 0 && !a.Inclusive {
		return a
	}
	return b
}

// tighterHigh is the smaller of two upper bounds.
func tighterHigh(a, b Bound) Bound {
	switch {
	case !a.Set:
		return b
	case !b.Set:
		return a
	}
	if c := strings.Compare(a.Key, b.Key); c < 0 || c == 0 && !a.Inclusive {
		return a
	}
	return b
}

func (iv interval) format(b *strings.Builder) {
	if iv.lo.Set {
		if iv.lo.Inclusive {
			b.WriteByte('[')
		} else {
			b.WriteByte('(')
		}
		b.WriteString(strconv.Quote(iv.lo.Key))
	} else {
		b.WriteString("(-inf")
	}
	b.WriteByte(',')
	if iv.hi.Set {
		b.WriteString(strconv.Quote(iv.hi.Key))
		if iv.hi.Inclusive {
			b.WriteByte(']')
		} else {
			b.WriteByte(')')
		}
	} else {
		b.WriteString("+inf)")
	}
}

// box is a set of (PartitionKey, RowKey) pairs: a product of intervals,
// or nothing.
type box struct {
	none   bool
	pk, rk interval
}

var (
	allBox  = box{}
	noneBox = box{none: true}
)

func (b box) empty() bool { return b.none || b.pk.empty() || b.rk.empty() }

func (b box) intersect(o box) box {
	if b.empty() || o.empty() {
		return noneBox
	}
	return box{pk: b.pk.intersect(o.pk), rk: b.rk.intersect(o.rk)}
}

func (b box) hull(o box) box {
	switch {
	case b.empty():
		return o
	case o.empty():
		return b
	}
	return box{pk: b.pk.hull(o.pk), rk: b.rk.hull(o.rk)}
}

// boxes over-approximate the entities for which a node is true (t) and
// false (f); with three-valued logic they are not complements.
type boxes struct{ t, f box }

func (n *node) keyBoxes() boxes {
	switch n.kind {
	case kAnd:
		l, r := n.l.keyBoxes(), n.r.keyBoxes()
		return boxes{t: l.t.intersect(r.t), f: l.f.hull(r.f)}
	case kOr:
		l, r := n.l.keyBoxes(), n.r.keyBoxes()
		return boxes{t: l.t.hull(r.t), f: l.f.intersect(r.f)}
	case kNot:
		x := n.l.keyBoxes()
		return boxes{t: x.f, f: x.t}
	case kConst:
		if n.val.AsBool() {
			return boxes{t: allBox, f: noneBox}
		}
		return boxes{t: noneBox, f: allBox}
	case kCmp:
		if n.prop != "PartitionKey" && n.prop != "RowKey" {
			return boxes{t: allBox, f: allBox}
		}
		if n.val.Type() != edm.String {
			return boxes{t: noneBox, f: noneBox} // always null: keys are strings
		}
		t, f := cmpIntervals(n.op, n.val.AsString())
		if n.prop == "PartitionKey" {
			return boxes{t: box{pk: t}, f: box{pk: f}}
		}
		return boxes{t: box{rk: t}, f: box{rk: f}}
	}
	return boxes{t: allBox, f: allBox}
}

// cmpIntervals returns the keys for which 'key op k' is true and false;
// where the false set is two intervals (eq) its hull, everything, is
// returned.
func cmpIntervals(o op, k string) (t, f interval) {
	incl := Bound{Set: true, Key: k, Inclusive: true}
	excl := Bound{Set: true, Key: k}
	switch o {
	case opEq:
		return interval{incl, incl}, interval{}
	case opNe:
		return interval{}, interval{incl, incl}
	case opLt:
		return interval{hi: excl}, interval{lo: incl}
	case opLe:
		return interval{hi: incl}, interval{lo: excl}
	case opGt:
		return interval{lo: excl}, interval{hi: incl}
	case opGe:
		return interval{lo: incl}, interval{hi: excl}
	}
	return interval{}, interval{}
}
