package odata

import "github.com/tabuladb/tabula/frontend/edm"

// MaxComparisons is the most discrete comparisons a $filter may hold, the
// Table service's limit. A bare Boolean property counts as one.
const MaxComparisons = 15

// maxDepth bounds the nesting of parentheses and 'not' (ours, not the
// service's: it keeps a hostile filter from recursing deeply).
const maxDepth = 100

// op is a comparison operator.
type op uint8

const (
	opEq op = iota + 1
	opNe
	opGt
	opGe
	opLt
	opLe
)

var opByName = map[string]op{"eq": opEq, "ne": opNe, "gt": opGt, "ge": opGe, "lt": opLt, "le": opLe}

var opNames = [...]string{opEq: "eq", opNe: "ne", opGt: "gt", opGe: "ge", opLt: "lt", opLe: "le"}

// mirror is the operator with its sides swapped: 5 lt Age is Age gt 5.
func (o op) mirror() op {
	switch o {
	case opGt:
		return opLt
	case opGe:
		return opLe
	case opLt:
		return opGt
	case opLe:
		return opGe
	}
	return o
}

// holds says whether a comparison result c (-1, 0, +1) satisfies o.
func (o op) holds(c int) bool {
	switch o {
	case opEq:
		return c == 0
	case opNe:
		return c != 0
	case opGt:
		return c > 0
	case opGe:
		return c >= 0
	case opLt:
		return c < 0
	case opLe:
		return c <= 0
	}
	return false
}

type nodeKind uint8

const (
	kAnd   nodeKind = iota + 1
	kOr             // l or r
	kNot            // not l
	kCmp            // prop op val
	kProp           // a bare Boolean property: prop
	kConst          // true or false: val
	kLit            // a non-Boolean literal; only ever a side of a comparison while parsing
)

// node is one node of a parsed filter. Comparisons are normalised with
// the property on the left.
type node struct {
	kind nodeKind
	l, r *node
	op   op
	prop string
	val  edm.Value
}

// Filter is a parsed $filter. It is immutable and safe for concurrent
// use. A nil *Filter, like the empty filter, matches every entity.
type Filter struct {
	root        *node // nil: the empty filter
	comparisons int
}

// ParseFilter parses the text of a $filter (already URL-decoded). The
// empty (or all-blank) text is the filter that matches everything. Errors
// are *SyntaxError and wrap ErrInvalidFilter.
func ParseFilter(s string) (*Filter, error) {
	p := &parser{lex: lexer{s: s}}
	if err := p.advance(); err != nil {
		return nil, err
	}
	f := &Filter{}
	if p.tok.kind == tEOF {
		return f, nil
	}
	root, err := p.parseOr(0)
	if err != nil {
		return nil, err
	}
	if p.tok.kind != tEOF {
		if p.tok.kind == tRParen {
			return nil, filterErr(p.tok.off, "unbalanced ')'")
		}
		return nil, filterErr(p.tok.off, "expected 'and', 'or' or the end of the filter, found %s", p.tok.describe())
	}
	if err := checkBoolean(root); err != nil {
		return nil, err
	}
	f.root = root.n
	f.comparisons = p.comparisons
	return f, nil
}

// parsed is a node with where its text starts, and whether it is a bare
// operand (a property or a literal: a side of a comparison).
type parsed struct {
	n       *node
	off     int
	operand bool
	text    string // an operand's source text
}

// parser is a recursive-descent parser over the lexer with one token of
// lookahead. Precedence, tightest first: not, comparisons, and, or.
type parser struct {
	lex         lexer
	tok         token
	comparisons int
}

func (p *parser) advance() error {
	t, err := p.lex.next()
	if err != nil {
		return err
	}
	p.tok = t
	return nil
}

// parseOr: and { "or" and }.
func (p *parser) parseOr(depth int) (parsed, error) {
	left, err := p.parseAnd(depth)
	if err != nil {
		return parsed{}, err
	}
	for p.tok.kind == tOr {
		if err := p.advance(); err != nil {
			return parsed{}, err
		}
		right, err := p.parseAnd(depth)
		if err != nil {
			return parsed{}, err
		}
		if err := checkLogical(left, right); err != nil {
			return parsed{}, err
		}
		left = parsed{n: &node{kind: kOr, l: left.n, r: right.n}, off: left.off}
	}
	return left, nil
}

// parseAnd: comparison { "and" comparison }.
func (p *parser) parseAnd(depth int) (parsed, error) {
	left, err := p.parseComparison(depth)
	if err != nil {
		return parsed{}, err
	}
	for p.tok.kind == tAnd {
		if err := p.advance(); err != nil {
			return parsed{}, err
		}
		right, err := p.parseComparison(depth)
		if err != nil {
			return parsed{}, err
		}
		if err := checkLogical(left, right); err != nil {
			return parsed{}, err
		}
		left = parsed{n: &node{kind: kAnd, l: left.n, r: right.n}, off: left.off}
	}
	return left, nil
}

// checkLogical checks that both operands of and/or are Boolean.
func checkLogical(left, right parsed) error {
	if err := checkBoolean(left); err != nil {
		return err
	}
	return checkBoolean(right)
}

// checkBoolean refuses a non-Boolean literal where a condition belongs.
func checkBoolean(x parsed) error {
	if x.n.kind == kLit {
		return filterErr(x.off, "%s is not a condition: compare it, e.g. Name eq %s", x.text, x.text)
	}
	return nil
}

// parseComparison: unary [ cmpOp unary ].
func (p *parser) parseComparison(depth int) (parsed, error) {
	left, err := p.parseUnary(depth)
	if err != nil {
		return parsed{}, err
	}
	if p.tok.kind != tCmp {
		if left.operand && left.n.kind == kProp {
			p.comparisons++ // a bare Boolean property is a comparison with true
			if p.comparisons > MaxComparisons {
				return parsed{}, filterErr(left.off, "more than %d comparisons (the Table service's limit)", MaxComparisons)
			}
		}
		return left, nil
	}
	opTok := p.tok
	if err := p.advance(); err != nil {
		return parsed{}, err
	}
	if p.tok.kind == tEOF || p.tok.kind == tRParen || p.tok.kind == tAnd || p.tok.kind == tOr || p.tok.kind == tCmp {
		return parsed{}, filterErr(p.tok.off, "expected a literal after '%s', found %s", opTok.text, p.tok.describe())
	}
	right, err := p.parseUnary(depth)
	if err != nil {
		return parsed{}, err
	}
	if p.tok.kind == tCmp {
		return parsed{}, filterErr(p.tok.off, "comparisons cannot be chained: join them with 'and' or 'or'")
	}
	for _, side := range []parsed{left, right} {
		if !side.operand {
			what := "a parenthesised expression"
			if side.n.kind == kNot {
				what = "a 'not' expression ('not' binds tighter than '" + opTok.text + "': write not (A " + opTok.text + " B))"
			}
			return parsed{}, filterErr(side.off, "a side of '%s' must be a property or a literal, not %s", opTok.text, what)
		}
	}
	lp, rp := left.n.kind == kProp, right.n.kind == kProp
	var n *node
	switch {
	case lp && rp:
		return parsed{}, filterErr(left.off, "'%s' compares property %s with property %s: one side must be a literal", opTok.text, left.n.prop, right.n.prop)
	case !lp && !rp:
		return parsed{}, filterErr(left.off, "'%s' compares two literals: one side must be a property", opTok.text)
	case lp:
		n = &node{kind: kCmp, prop: left.n.prop, op: opTok.op, val: right.n.val}
	default:
		n = &node{kind: kCmp, prop: right.n.prop, op: opTok.op.mirror(), val: left.n.val}
	}
	p.comparisons++
	if p.comparisons > MaxComparisons {
		return parsed{}, filterErr(left.off, "more than %d comparisons (the Table service's limit)", MaxComparisons)
	}
	return parsed{n: n, off: left.off}, nil
}

// parseUnary: "not" unary | primary.
func (p *parser) parseUnary(depth int) (parsed, error) {
	if depth > maxDepth {
		return parsed{}, filterErr(p.tok.off, "nested more than %d deep", maxDepth)
	}
	if p.tok.kind != tNot {
		return p.parsePrimary(depth)
	}
	off := p.tok.off
	if err := p.advance(); err != nil {
		return parsed{}, err
	}
	x, err := p.parseUnary(depth + 1)
	if err != nil {
		return parsed{}, err
	}
	if err := checkBoolean(x); err != nil {
		return parsed{}, err
	}
	if x.operand && x.n.kind == kProp {
		// not IsActive: the bare property is a comparison with true.
		p.comparisons++
		if p.comparisons > MaxComparisons {
			return parsed{}, filterErr(x.off, "more than %d comparisons (the Table service's limit)", MaxComparisons)
		}
	}
	return parsed{n: &node{kind: kNot, l: x.n}, off: off}, nil
}

// parsePrimary: "(" or ")" | property | literal.
func (p *parser) parsePrimary(depth int) (parsed, error) {
	t := p.tok
	switch t.kind {
	case tLParen:
		if err := p.advance(); err != nil {
			return parsed{}, err
		}
		if p.tok.kind == tRParen {
			return parsed{}, filterErr(p.tok.off, "empty parentheses")
		}
		x, err := p.parseOr(depth + 1)
		if err != nil {
			return parsed{}, err
		}
		if p.tok.kind != tRParen {
			return parsed{}, filterErr(p.tok.off, "expected ')' to close the '(' at offset %d, found %s", t.off, p.tok.describe())
		}
		if err := checkBoolean(x); err != nil {
			return parsed{}, err
		}
		if err := p.advance(); err != nil {
			return parsed{}, err
		}
		return parsed{n: x.n, off: t.off}, nil
	case tIdent:
		if err := p.advance(); err != nil {
			return parsed{}, err
		}
		return parsed{n: &node{kind: kProp, prop: t.text}, off: t.off, operand: true, text: t.text}, nil
	case tLiteral:
		if err := p.advance(); err != nil {
			return parsed{}, err
		}
		n := &node{kind: kLit, val: t.val}
		if t.val.Type() == edm.Boolean {
			n.kind = kConst
		}
		return parsed{n: n, off: t.off, operand: true, text: t.text}, nil
	case tEOF:
		return parsed{}, filterErr(t.off, "unexpected end of the filter: expected a condition")
	case tRParen:
		return parsed{}, filterErr(t.off, "unexpected ')': expected a condition")
	case tCmp:
		return parsed{}, filterErr(t.off, "expected a property or a literal before '%s'", t.text)
	}
	return parsed{}, filterErr(t.off, "expected a condition, found %s", t.describe())
}
