package odata

import "github.com/tabuladb/tabula/frontend/edm"

// tri is a value of OData's three-valued logic: a comparison with a
// property the entity lacks, of another type, or with NaN is null.
type tri uint8

const (
	triFalse tri = iota
	triTrue
	triNull
)

// Match says whether the filter accepts e, as the Table service would
// return it. A comparison is null (neither true nor false) when e lacks
// the property, when the property's type differs from the literal's, or
// when either is a Double NaN; and, or and not follow three-valued logic
// (false and null = false, true or null = true, not null = null), and e
// matches only when the whole filter is true. So neither 'X ne 1' nor
// 'not (X eq 1)' matches an entity without X.
func (f *Filter) Match(e *edm.Entity) bool {
	if f == nil || f.root == nil {
		return true
	}
	return f.root.eval(e) == triTrue
}

func (n *node) eval(e *edm.Entity) tri {
	switch n.kind {
	case kAnd:
		l := n.l.eval(e)
		if l == triFalse {
			return triFalse
		}
		r := n.r.eval(e)
		if r == triFalse {
			return triFalse
		}
		if l == triTrue && r == triTrue {
			return triTrue
		}
		return triNull
	case kOr:
		l := n.l.eval(e)
		if l == triTrue {
			return triTrue
		}
		r := n.r.eval(e)
		if r == triTrue {
			return triTrue
		}
		if l == triFalse && r == triFalse {
			return triFalse
		}
		return triNull
	case kNot:
		switch n.l.eval(e) {
		case triTrue:
			return triFalse
		case triFalse:
			return triTrue
		}
		return triNull
	case kCmp:
		v, ok := e.Get(n.prop)
		if !ok {
			return triNull
		}
		c, ok := edm.Compare(v, n.val)
		if !ok {
			return triNull
		}
		return truth(n.op.holds(c))
	case kProp:
		v, ok := e.Get(n.prop)
		if !ok || v.Type() != edm.Boolean {
			return triNull
		}
		return truth(v.AsBool())
	case kConst:
		return truth(n.val.AsBool())
	}
	return triNull
}

func truth(b bool) tri {
	if b {
		return triTrue
	}
	return triFalse
}

// Comparisons is the number of discrete comparisons in the filter (a bare
// Boolean property counts as one); at most MaxComparisons.
func (f *Filter) Comparisons() int {
	if f == nil {
		return 0
	}
	return f.comparisons
}
