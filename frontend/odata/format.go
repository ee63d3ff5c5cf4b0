package odata

import (
	"encoding/hex"
	"math"
	"strconv"
	"strings"

	"github.com/tabuladb/tabula/frontend/edm"
)

// String renders the filter canonically: comparisons with the property on
// the left, literals in one spelling (Int64 with L, Doubles always with a
// '.', an exponent, INF or NaN, DateTimes with seven fractional digits and
// Z, binary as X'…'), single spaces, and parentheses only where
// precedence needs them. ParseFilter of the result gives a filter with
// the same String, Match and KeyRange. The empty filter renders as "".
func (f *Filter) String() string {
	if f == nil || f.root == nil {
		return ""
	}
	var b strings.Builder
	f.root.render(&b)
	return b.String()
}

// precedence: higher binds tighter.
func (n *node) precedence() int {
	switch n.kind {
	case kOr:
		return 1
	case kAnd:
		return 2
	case kCmp:
		return 3
	}
	return 4 // not, a bare property, a constant
}

func (n *node) render(b *strings.Builder) {
	switch n.kind {
	case kAnd, kOr:
		word := " and "
		if n.kind == kOr {
			word = " or "
		}
		// Left-associative: a left child of the same precedence needs no
		// parentheses, a right one does.
		renderChild(b, n.l, n.l.precedence() < n.precedence())
		b.WriteString(word)
		renderChild(b, n.r, n.r.precedence() <= n.precedence())
	case kNot:
		b.WriteString("not ")
		renderChild(b, n.l, n.l.precedence() < 4)
	case kCmp:
		b.WriteString(n.prop)
		b.WriteByte(' ')
		b.WriteString(opNames[n.op])
		b.WriteByte(' ')
		b.WriteString(FormatLiteral(n.val))
	case kProp:
		b.WriteString(n.prop)
	case kConst, kLit:
		b.WriteString(FormatLiteral(n.val))
	}
}

func renderChild(b *strings.Builder, n *node, parens bool) {
	if parens {
		b.WriteByte('(')
	}
	n.render(b)
	if parens {
		b.WriteByte(')')
	}
}

// FormatLiteral renders v as a $filter literal of its Edm type, in the
// spelling String uses (a string's quotes doubled, "5", "5L", "2.5", "true",
// "datetime'2024-05-06T07:08:09.1234567Z'", "guid'…'", "X'00ff'"). An
// invalid Value renders as "".
func FormatLiteral(v edm.Value) string {
	switch v.Type() {
	case edm.String:
		return "'" + strings.ReplaceAll(v.AsString(), "'", "''") + "'"
	case edm.Int32:
		return strconv.FormatInt(v.AsInt(), 10)
	case edm.Int64:
		return strconv.FormatInt(v.AsInt(), 10) + "L"
	case edm.Double:
		d := v.AsDouble()
		switch {
		case math.IsNaN(d):
			return "NaN"
		case math.IsInf(d, 1):
			return "INF"
		case math.IsInf(d, -1):
			return "-INF"
		}
		s := strconv.FormatFloat(d, 'g', -1, 64)
		if !strings.ContainsAny(s, ".e") {
			s += ".0"
		}
		return s
	case edm.Boolean:
		return strconv.FormatBool(v.AsBool())
	case edm.DateTime:
		return "datetime'" + v.AsTime().Format("2006-01-02T15:04:05.0000000Z07:00") + "'"
	case edm.Guid:
		return "guid'" + v.AsString() + "'"
	case edm.Binary:
		return "X'" + hex.EncodeToString(v.AsBytes()) + "'"
	}
	return ""
}
