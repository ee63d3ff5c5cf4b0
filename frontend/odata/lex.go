package odata

import (
	"encoding/hex"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/tabuladb/tabula/frontend/edm"
)

// tokKind is a $filter token's kind.
type tokKind uint8

const (
	tEOF tokKind = iota
	tLParen
	tRParen
	tAnd
	tOr
	tNot
	tCmp     // op holds the operator
	tLiteral // val holds the typed value
	tIdent   // text holds the property name
)

// token is one lexed $filter token; off is its byte offset.
type token struct {
	kind tokKind
	off  int
	text string // the source text (for tIdent: the name)
	op   op
	val  edm.Value
}

// describe names a token for error messages.
func (t token) describe() string {
	switch t.kind {
	case tEOF:
		return "the end of the filter"
	case tIdent:
		return "property " + t.text
	}
	return "'" + t.text + "'"
}

// maxNameLen is the longest property name the service accepts.
const maxNameLen = 255

// lexer splits a $filter into tokens on demand.
type lexer struct {
	s   string
	pos int
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// identStart and identPart are C# identifier rules, restricted to the
// categories the Table service documents: letters and underscore to start,
// then letters, decimal digits and underscore.
func identStart(r rune) bool { return r == '_' || unicode.IsLetter(r) }

func identPart(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) }

// next returns the next token, or a *SyntaxError.
func (l *lexer) next() (token, error) {
	for l.pos < len(l.s) && isSpace(l.s[l.pos]) {
		l.pos++
	}
	start := l.pos
	if l.pos >= len(l.s) {
		return token{kind: tEOF, off: start}, nil
	}
	c := l.s[l.pos]
	switch {
	case c == '(':
		l.pos++
		return token{kind: tLParen, off: start, text: "("}, nil
	case c == ')':
		l.pos++
		return token{kind: tRParen, off: start, text: ")"}, nil
	case c == '\'':
		str, err := l.quoted()
		if err != nil {
			return token{}, err
		}
		return token{kind: tLiteral, off: start, text: l.s[start:l.pos], val: edm.Str(str)}, nil
	case isDigit(c) || c == '-':
		return l.number()
	}
	r, size := utf8.DecodeRuneInString(l.s[l.pos:])
	if !identStart(r) {
		if r == utf8.RuneError && size <= 1 {
			return token{}, filterErr(start, "invalid UTF-8")
		}
		return token{}, filterErr(start, "unexpected character %q", r)
	}
	for l.pos < len(l.s) {
		r, size := utf8.DecodeRuneInString(l.s[l.pos:])
		if !identPart(r) {
			break
		}
		l.pos += size
	}
	word := l.s[start:l.pos]
	tok := token{off: start, text: word}
	switch word {
	case "and":
		tok.kind = tAnd
	case "or":
		tok.kind = tOr
	case "not":
		tok.kind = tNot
	case "eq", "ne", "gt", "ge", "lt", "le":
		tok.kind, tok.op = tCmp, opByName[word]
	case "INF":
		tok.kind, tok.val = tLiteral, edm.F64(math.Inf(1))
	case "NaN":
		tok.kind, tok.val = tLiteral, edm.F64(math.NaN())
	case "null":
		return token{}, filterErr(start, "null is not supported: a comparison with a property an entity lacks never matches")
	default:
		// Boolean literals are the one case-insensitive word: the
		// service reads myBool eq True (Azurite's suite sends it).
		if strings.EqualFold(word, "true") || strings.EqualFold(word, "false") {
			tok.kind, tok.val = tLiteral, edm.Bool(len(word) == 4)
			return tok, nil
		}
		if l.pos < len(l.s) && l.s[l.pos] == '\'' {
			return l.typed(word, start)
		}
		if l.pos < len(l.s) && l.s[l.pos] == '(' {
			return token{}, filterErr(start, "function %s() is not supported: the Table service has no OData functions (for a prefix match use a range: Name ge 'A' and Name lt 'B')", word)
		}
		if n := utf8.RuneCountInString(word); n > maxNameLen {
			return token{}, filterErr(start, "property name of %d characters is longer than %d", n, maxNameLen)
		}
		tok.kind = tIdent
	}
	return tok, nil
}

// quoted reads a quoted literal at l.pos, a doubled quote standing for
// one, and returns its unescaped text.
func (l *lexer) quoted() (string, error) {
	start := l.pos
	l.pos++ // opening quote
	var b strings.Builder
	from := l.pos
	for {
		i := strings.IndexByte(l.s[l.pos:], '\'')
		if i < 0 {
			return "", filterErr(start, "unterminated quoted literal (a quote inside one is written '')")
		}
		l.pos += i
		if l.pos+1 < len(l.s) && l.s[l.pos+1] == '\'' {
			b.WriteString(l.s[from : l.pos+1])
			l.pos += 2
			from = l.pos
			continue
		}
		if b.Len() == 0 {
			str := l.s[from:l.pos]
			l.pos++
			return str, nil
		}
		b.WriteString(l.s[from:l.pos])
		l.pos++
		return b.String(), nil
	}
}

// typed reads prefix'…': datetime, guid, X and binary.
func (l *lexer) typed(prefix string, start int) (token, error) {
	bodyOff := l.pos + 1
	body, err := l.quoted()
	if err != nil {
		return token{}, err
	}
	tok := token{kind: tLiteral, off: start, text: l.s[start:l.pos]}
	switch prefix {
	case "datetime":
		v, msg := parseDateTime(body)
		if msg != "" {
			return token{}, filterErr(bodyOff, "bad datetime literal %q: %s", body, msg)
		}
		tok.val = v
	case "guid":
		if !guidShape(body) {
			return token{}, filterErr(bodyOff, "bad guid literal %q: want xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", body)
		}
		v, err := edm.ParseGUID(body)
		if err != nil {
			return token{}, filterErr(bodyOff, "bad guid literal %q: %v", body, err)
		}
		tok.val = v
	case "X", "binary":
		b, err := hex.DecodeString(body)
		if err != nil {
			return token{}, filterErr(bodyOff, "bad binary literal %q: want an even number of hex digits", body)
		}
		tok.val = edm.Bin(b)
	case "datetimeoffset", "time", "decimal", "single", "float", "byte", "sbyte", "int16", "x":
		return token{}, filterErr(start, "%s'…' literals are not supported by the Table service (its types are Edm.String, Int32, Int64, Double, Boolean, DateTime, Guid and Binary; binary is X'…')", prefix)
	default:
		return token{}, filterErr(start, "unknown literal prefix %s'…' (known: datetime'…', guid'…', X'…', binary'…')", prefix)
	}
	return tok, nil
}

// guidShape says whether s is 8-4-4-4-12 hex digits. It is checked
// before edm.ParseGUID, which panics on a string of 36 characters with
// its four dashes in place and a fifth elsewhere.
func guidShape(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !isDigit(c) && (c|0x20 < 'a' || c|0x20 > 'f') {
				return false
			}
		}
	}
	return true
}

// number reads an Int32 (5, -5), Int64 (5L), or Double (2.5, 1E+10,
// 2.5d, 5d, -INF) literal.
func (l *lexer) number() (token, error) {
	start := l.pos
	if l.s[l.pos] == '-' {
		if strings.HasPrefix(l.s[l.pos+1:], "INF") {
			l.pos += 4
			if l.pos < len(l.s) {
				if r, _ := utf8.DecodeRuneInString(l.s[l.pos:]); identPart(r) {
					return token{}, filterErr(start, "unexpected character %q after -INF", r)
				}
			}
			return token{kind: tLiteral, off: start, text: "-INF", val: edm.F64(math.Inf(-1))}, nil
		}
		if l.pos+1 >= len(l.s) || !isDigit(l.s[l.pos+1]) {
			return token{}, filterErr(start, "'-' must be followed by a number: arithmetic is not supported")
		}
		l.pos++
	}
	digits := func() bool {
		from := l.pos
		for l.pos < len(l.s) && isDigit(l.s[l.pos]) {
			l.pos++
		}
		return l.pos > from
	}
	digits()
	double := false
	if l.pos < len(l.s) && l.s[l.pos] == '.' {
		l.pos++
		if !digits() {
			return token{}, filterErr(l.pos, "expected a digit after the decimal point")
		}
		double = true
	}
	if l.pos < len(l.s) && (l.s[l.pos] == 'e' || l.s[l.pos] == 'E') {
		l.pos++
		if l.pos < len(l.s) && (l.s[l.pos] == '+' || l.s[l.pos] == '-') {
			l.pos++
		}
		if !digits() {
			return token{}, filterErr(l.pos, "expected a digit in the exponent")
		}
		double = true
	}
	numEnd := l.pos
	text := l.s[start:numEnd]
	kind := edm.Int32
	if double {
		kind = edm.Double
	}
	if l.pos < len(l.s) {
		switch l.s[l.pos] {
		case 'L', 'l':
			if double {
				return token{}, filterErr(start, "Int64 literal %s has a fraction or exponent", l.s[start:l.pos+1])
			}
			kind = edm.Int64
			l.pos++
		case 'd', 'D':
			kind = edm.Double
			l.pos++
		case 'M', 'm':
			return token{}, filterErr(start, "Edm.Decimal literal %s is not supported by the Table service (use a Double: %sd)", l.s[start:l.pos+1], text)
		case 'f', 'F':
			return token{}, filterErr(start, "Edm.Single literal %s is not supported by the Table service (use a Double: %sd)", l.s[start:l.pos+1], text)
		}
	}
	if l.pos < len(l.s) {
		if r, _ := utf8.DecodeRuneInString(l.s[l.pos:]); identPart(r) || r == '.' {
			return token{}, filterErr(l.pos, "unexpected character %q after number %s", r, l.s[start:l.pos])
		}
	}
	tok := token{kind: tLiteral, off: start, text: l.s[start:l.pos]}
	switch kind {
	case edm.Int32:
		v, err := strconv.ParseInt(text, 10, 32)
		if err != nil {
			return token{}, filterErr(start, "integer %s is out of the Edm.Int32 range; write %sL for an Edm.Int64", text, text)
		}
		tok.val = edm.I32(int32(v))
	case edm.Int64:
		v, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return token{}, filterErr(start, "integer %s is out of the Edm.Int64 range", tok.text)
		}
		tok.val = edm.I64(v)
	default:
		v, err := strconv.ParseFloat(text, 64)
		if err != nil {
			return token{}, filterErr(start, "number %s is out of the Edm.Double range", tok.text)
		}
		tok.val = edm.F64(v)
	}
	return tok, nil
}

// minDateTime and maxDateTime are the extreme DateTimes edm.Value holds.
var (
	minDateTime = edm.MinTime
	maxDateTime = edm.MaxTime
)

// parseDateTime reads yyyy-mm-ddThh:mm[:ss[.fffffff]][Z|±hh:mm]; no zone
// means UTC. It returns a reason when s is not one.
func parseDateTime(s string) (edm.Value, string) {
	p := dtParser{s: s}
	year := p.num(4, "a four-digit year")
	p.lit('-')
	month := p.num(2, "a two-digit month")
	p.lit('-')
	day := p.num(2, "a two-digit day")
	p.lit('T')
	hour := p.num(2, "a two-digit hour")
	p.lit(':')
	minute := p.num(2, "two-digit minutes")
	sec, nsec := 0, 0
	if p.peek(':') {
		p.lit(':')
		sec = p.num(2, "two-digit seconds")
		if p.peek('.') {
			p.lit('.')
			from := p.i
			frac := 0
			for p.i < len(p.s) && isDigit(p.s[p.i]) {
				frac = frac*10 + int(p.s[p.i]-'0')
				p.i++
			}
			n := p.i - from
			switch {
			case p.msg != "":
			case n == 0:
				p.fail("expected digits after the decimal point")
			case n > 7:
				p.fail("more than 7 fractional digits (the resolution is 100 ns)")
			default:
				for ; n < 9; n++ {
					frac *= 10
				}
				nsec = frac
			}
		}
	}
	offset := 0
	switch {
	case p.peek('Z'):
		p.lit('Z')
	case p.peek('+') || p.peek('-'):
		sign := 1
		if p.s[p.i] == '-' {
			sign = -1
		}
		p.i++
		oh := p.num(2, "a two-digit offset hour")
		p.lit(':')
		om := p.num(2, "two-digit offset minutes")
		if oh > 14 || om > 59 {
			p.fail("offset out of range")
		}
		offset = sign * (oh*60 + om) * 60
	}
	if p.msg == "" && p.i != len(p.s) {
		p.fail("unexpected text after the time")
	}
	if p.msg != "" {
		return edm.Value{}, p.msg
	}
	if year < 1 || month < 1 || month > 12 || day < 1 || hour > 23 || minute > 59 || sec > 59 {
		return edm.Value{}, "field out of range"
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.FixedZone("", offset))
	if t.Day() != day {
		return edm.Value{}, "no such day"
	}
	if tt := t.UTC().Truncate(edm.Ticks); tt.Before(minDateTime) || tt.After(maxDateTime) {
		return edm.Value{}, "outside the range " + minDateTime.Format(time.RFC3339) + " to " + maxDateTime.Format(time.RFC3339) + " that edm.Value holds"
	}
	return edm.Time(t), ""
}

// dtParser is a cursor over a datetime literal that records the first
// problem and then does nothing.
type dtParser struct {
	s   string
	i   int
	msg string
}

func (p *dtParser) fail(msg string) {
	if p.msg == "" {
		p.msg = msg
	}
}

func (p *dtParser) peek(c byte) bool { return p.msg == "" && p.i < len(p.s) && p.s[p.i] == c }

func (p *dtParser) lit(c byte) {
	if p.peek(c) {
		p.i++
		return
	}
	p.fail("expected '" + string(c) + "'")
}

func (p *dtParser) num(n int, what string) int {
	if p.msg != "" {
		return 0
	}
	v := 0
	for k := 0; k < n; k++ {
		if p.i >= len(p.s) || !isDigit(p.s[p.i]) {
			p.fail("expected " + what)
			return 0
		}
		v = v*10 + int(p.s[p.i]-'0')
		p.i++
	}
	return v
}
