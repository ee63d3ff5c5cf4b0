package entity

import (
	"bytes"
	"encoding/base64"
	"math"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/tabuladb/tabula/frontend/edm"
)

const typeSuffix = "@odata.type"

// DecodeJSON reads an entity from a request body in the service's JSON
// format (any metadata level) and requires PartitionKey and RowKey in
// it (PropertiesNeedValue otherwise), as Insert Entity and batch inserts
// do. Properties keep their order; the Timestamp is zero (the server
// sets it). The rules are in doc.go; errors are *Error. It does not
// check limits or names: call Validate on the entity to be stored.
func DecodeJSON(body []byte) (*edm.Entity, error) {
	e, hasPK, hasRK, err := DecodeJSONKeysOptional(body)
	if err != nil {
		return nil, err
	}
	if !hasPK || !hasRK {
		return nil, ErrPropertiesNeedValue.with("the body has no PartitionKey or no RowKey")
	}
	return e, nil
}

// DecodeJSONKeysOptional is DecodeJSON for requests whose URL names the
// entity (Update, Merge, Insert Or Replace, Insert Or Merge): a key the
// body leaves out comes back as "" with its has flag false, and the
// caller takes it from the URL (and, when the body has it, checks the
// two agree).
//
// The decoder is one pass over body, without reflection. It reports the
// first failure in body order as encoding/json's token stream (what it
// replaced) did: a member's name and value are read and checked (a
// duplicate, an object or array value, an annotation that is not a
// string) before the next member is parsed; the annotations and the
// values' types are checked after the closing brace. The strings of the
// entity (keys, names, String values) share one allocation.
func DecodeJSONKeysOptional(body []byte) (e *edm.Entity, hasPK, hasRK bool, err error) {
	d := reader{b: body}
	if c, ok := d.peek(); !ok || c != '{' {
		return nil, false, false, ErrInvalidInput.with("the body is not a JSON object")
	}
	d.i++
	var (
		mbuf   [16]member
		abuf   [8]annotation
		ms     = mbuf[:0]     // properties, nulls included, in body order
		as     = abuf[:0]     // "X@odata.type" members, in body order
		pk, rk member         // their values
		names  map[string]int // member index by name, once ms is long
		bases  map[string]int // annotation index by base name, once as is long
	)
	const linear = 24 // members searched one by one below this count
	for first := true; ; first = false {
		c, ok := d.peek()
		switch {
		case !ok:
			return nil, false, false, d.eof()
		case c == '}':
			d.i++
		case !first && c != ',':
			return nil, false, false, d.unexpected("after object member")
		default:
			if !first {
				d.i++
				if c, ok = d.peek(); !ok {
					return nil, false, false, d.eof()
				}
			}
			if c != '"' {
				return nil, false, false, d.unexpected("looking for an object key")
			}
		}
		if c == '}' {
			break
		}
		name, err := d.str()
		if err != nil {
			return nil, false, false, err
		}
		if err := d.colon(); err != nil {
			return nil, false, false, err
		}
		if base, ok := bytes.CutSuffix(name, []byte(typeSuffix)); ok && len(base) > 0 {
			k, v, plain, err := d.scalar(name)
			if err != nil {
				return nil, false, false, err
			}
			if k != kindString {
				return nil, false, false, ErrInvalidInput.with("%s is not a string", name)
			}
			if !plain {
				v = d.unquote(v)
			}
			dup := false
			if bases != nil {
				_, dup = bases[string(base)]
			} else {
				for i := range as {
					if string(as[i].base) == string(base) {
						dup = true
						break
					}
				}
			}
			if dup {
				return nil, false, false, ErrDuplicatePropertiesSpecified.with("%s appears twice", name)
			}
			as = append(as, annotation{base: base, typ: v})
			if bases != nil {
				bases[string(base)] = len(as) - 1
			} else if len(as) > linear {
				bases = make(map[string]int, 2*len(as))
				for i := range as {
					bases[string(as[i].base)] = i
				}
			}
			continue
		}
		if bytes.HasPrefix(name, []byte("odata.")) || bytes.Contains(name, []byte("@odata.")) || string(name) == "Timestamp" {
			// Metadata a client echoes back, and the server-set
			// Timestamp: ignored, whatever the value.
			if err := d.skip(); err != nil {
				return nil, false, false, err
			}
			continue
		}
		k, v, plain, err := d.scalar(name)
		if err != nil {
			return nil, false, false, err
		}
		m := member{name: name, kind: k, val: v, plain: plain, annot: -1}
		isPK, isRK := string(name) == "PartitionKey", string(name) == "RowKey"
		dup := isPK && hasPK || isRK && hasRK
		if !isPK && !isRK {
			if names != nil {
				_, dup = names[string(name)]
			} else {
				for i := range ms {
					if string(ms[i].name) == string(name) {
						dup = true
						break
					}
				}
			}
		}
		if dup {
			return nil, false, false, ErrDuplicatePropertiesSpecified.with("property %q appears twice", name)
		}
		switch {
		case isPK || isRK:
			if k != kindString {
				return nil, false, false, ErrInvalidInput.with("%s is not a string", name)
			}
			if isPK {
				pk, hasPK = m, true
			} else {
				rk, hasRK = m, true
			}
			continue
		}
		ms = append(ms, m)
		if names != nil {
			names[string(name)] = len(ms) - 1
		} else if len(ms) > linear {
			names = make(map[string]int, 2*len(ms))
			for i := range ms {
				names[string(ms[i].name)] = i
			}
		}
	}
	if _, ok := d.peek(); ok {
		return nil, false, false, ErrInvalidInput.with("data after the JSON object")
	}
	for i := range as {
		a := &as[i]
		switch base := a.base; {
		case string(base) == "Timestamp":
		case string(base) == "PartitionKey" || string(base) == "RowKey":
			if string(a.typ) != "Edm.String" {
				return nil, false, false, ErrInvalidInput.with("%s must be Edm.String, not %s", base, a.typ)
			}
		default:
			j := -1
			if names != nil {
				if m, ok := names[string(base)]; ok {
					j = m
				}
			} else {
				for m := range ms {
					if string(ms[m].name) == string(base) {
						j = m
						break
					}
				}
			}
			if j < 0 {
				return nil, false, false, ErrInvalidInput.with("%s%s annotates a property the body does not have", base, typeSuffix)
			}
			ms[j].annot = i
		}
	}

	// The values, in body order (the first bad one is the error), then
	// the strings, copied into one allocation.
	kept := 0
	size := pk.strLen() + rk.strLen()
	for i := range ms {
		if ms[i].kind != kindNull {
			kept++
		}
	}
	e = &edm.Entity{}
	if kept > 0 {
		e.Props = make([]edm.Property, 0, kept)
	}
	for i := range ms {
		m := &ms[i]
		if m.kind == kindNull {
			continue // the service does not store nulls: the property is absent
		}
		var v edm.Value
		if m.annot >= 0 {
			v, m.isStr, err = d.typed(m, as[m.annot].typ)
		} else {
			v, m.isStr, err = inferred(m)
		}
		if err != nil {
			return nil, false, false, err
		}
		size += len(m.name)
		if m.isStr {
			size += m.strLen()
		}
		e.Props = append(e.Props, edm.Property{Value: v})
	}
	var sb strings.Builder
	sb.Grow(size)
	pk.writeStr(&sb)
	rk.writeStr(&sb)
	for i := range ms {
		if m := &ms[i]; m.kind != kindNull {
			sb.Write(m.name)
			if m.isStr {
				m.writeStr(&sb)
			}
		}
	}
	s := sb.String()
	cut := func(n int) string {
		r := s[:n]
		s = s[n:]
		return r
	}
	e.PartitionKey, e.RowKey = cut(pk.strLen()), cut(rk.strLen())
	j := 0
	for i := range ms {
		m := &ms[i]
		if m.kind == kindNull {
			continue
		}
		p := &e.Props[j]
		j++
		p.Name = cut(len(m.name))
		if m.isStr {
			p.Value = edm.Str(cut(m.strLen()))
		}
	}
	return e, hasPK, hasRK, nil
}

// kind is a JSON scalar's kind.
type kind uint8

const (
	kindNull kind = iota
	kindString
	kindNumber
	kindTrue
	kindFalse
)

// member is a property as read: its unescaped name, aliasing the body
// or the reader's scratch space, and its value as it stands in the body
// (a string's contents between the quotes, a number's text).
type member struct {
	name  []byte
	val   []byte
	kind  kind
	plain bool // val is a string's value as it stands: no escapes, valid UTF-8
	isStr bool // its value is an edm.String, to be copied with the names
	annot int  // index of its annotation, or -1
}

// str is the value of a string member, unescaped (into d.scratch when
// it has to be).
func (m *member) str(d *reader) []byte {
	if m.plain {
		return m.val
	}
	return d.unquote(m.val)
}

// strLen is the length of a string member's unescaped value.
func (m *member) strLen() int {
	if m.plain {
		return len(m.val)
	}
	n := 0
	for r := 0; r < len(m.val); {
		run, ch, next := unquoteNext(m.val, r)
		if run != nil {
			n += len(run)
		} else {
			n += utf8.RuneLen(ch)
		}
		r = next
	}
	return n
}

// writeStr writes a string member's unescaped value to sb.
func (m *member) writeStr(sb *strings.Builder) {
	if m.plain {
		sb.Write(m.val)
		return
	}
	for r := 0; r < len(m.val); {
		run, ch, next := unquoteNext(m.val, r)
		if run != nil {
			sb.Write(run)
		} else {
			sb.WriteRune(ch)
		}
		r = next
	}
}

// annotation is a "base@odata.type": "typ" member.
type annotation struct{ base, typ []byte }

// reader walks a JSON body. Its checks are those of encoding/json's
// scanner and token stream, so it accepts and refuses what they do.
type reader struct {
	b       []byte
	i       int    // next byte to read
	scratch []byte // unescaped strings; never overwritten, only appended to
}

// peek skips JSON white space and returns the next byte.
func (d *reader) peek() (byte, bool) {
	for ; d.i < len(d.b); d.i++ {
		switch c := d.b[d.i]; c {
		case ' ', '\t', '\n', '\r':
		default:
			return c, true
		}
	}
	return 0, false
}

func (d *reader) eof() *Error {
	return ErrInvalidInput.with("bad JSON: unexpected end of input")
}

// unexpected is the error for the byte at d.i.
func (d *reader) unexpected(context string) *Error {
	return ErrInvalidInput.with("bad JSON: invalid character %s %s at offset %d", quoteChar(d.b[d.i]), context, d.i)
}

func quoteChar(c byte) string {
	if c == '\'' {
		return `'\''`
	}
	if c == '"' {
		return `'"'`
	}
	s := strconv.Quote(string(rune(c)))
	return "'" + s[1:len(s)-1] + "'"
}

// colon reads the ':' after an object key.
func (d *reader) colon() *Error {
	c, ok := d.peek()
	if !ok {
		return d.eof()
	}
	if c != ':' {
		return d.unexpected("after object key")
	}
	d.i++
	return nil
}

// scalar reads the value of the member name, which must not be an
// object or array.
// A string comes back as rawStr returns it.
func (d *reader) scalar(name []byte) (k kind, val []byte, plain bool, err *Error) {
	c, ok := d.peek()
	if !ok {
		return 0, nil, false, d.eof()
	}
	if c == '{' || c == '[' {
		return 0, nil, false, ErrInvalidValueType.with("%q: objects and arrays are not property values", name)
	}
	return d.primitive(c)
}

// primitive reads a string, number, true, false or null starting with
// c, the byte at d.i. A string comes back as rawStr returns it.
func (d *reader) primitive(c byte) (k kind, val []byte, plain bool, err *Error) {
	switch {
	case c == '"':
		val, plain, err = d.rawStr()
		return kindString, val, plain, err
	case c == '-' || '0' <= c && c <= '9':
		val, err = d.number()
		return kindNumber, val, false, err
	case c == 't':
		return kindTrue, nil, false, d.literal("true")
	case c == 'f':
		return kindFalse, nil, false, d.literal("false")
	case c == 'n':
		return kindNull, nil, false, d.literal("null")
	}
	return 0, nil, false, d.unexpected("looking for beginning of value")
}

func (d *reader) literal(lit string) *Error {
	for k := 0; k < len(lit); k++ {
		if d.i >= len(d.b) {
			return d.eof()
		}
		if d.b[d.i] != lit[k] {
			return d.unexpected("in literal " + lit)
		}
		d.i++
	}
	return nil
}

// number reads a number in JSON's grammar and returns its text. It
// stops at the first byte that cannot continue the number, as
// encoding/json does; what follows is the next token's business.
func (d *reader) number() ([]byte, *Error) {
	b, start := d.b, d.i
	digit := func() bool { return d.i < len(b) && '0' <= b[d.i] && b[d.i] <= '9' }
	digits := func(context string) *Error {
		if d.i >= len(b) {
			return d.eof()
		}
		if !digit() {
			return d.unexpected(context)
		}
		for digit() {
			d.i++
		}
		return nil
	}
	if b[d.i] == '-' {
		d.i++
	}
	switch {
	case d.i >= len(b):
		return nil, d.eof()
	case b[d.i] == '0':
		d.i++
	default:
		if err := digits("in numeric literal"); err != nil {
			return nil, err
		}
	}
	if d.i < len(b) && b[d.i] == '.' {
		d.i++
		if err := digits("after decimal point in numeric literal"); err != nil {
			return nil, err
		}
	}
	if d.i < len(b) && (b[d.i] == 'e' || b[d.i] == 'E') {
		d.i++
		if d.i < len(b) && (b[d.i] == '+' || b[d.i] == '-') {
			d.i++
		}
		if err := digits("in exponent of numeric literal"); err != nil {
			return nil, err
		}
	}
	return b[start:d.i], nil
}

// plainByte marks the bytes a JSON string holds as themselves: ASCII
// but controls, '"' and '\\'.
var plainByte = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// str reads a string at d.i (a '"') and returns its contents unescaped:
// a slice of the body when nothing needs changing, else of d.scratch.
// Escapes are JSON's; a \u surrogate pair is one character and a lone
// surrogate U+FFFD; each byte of invalid UTF-8 becomes U+FFFD; a raw
// control character is an error. So encoding/json reads strings.
func (d *reader) str() ([]byte, *Error) {
	raw, plain, err := d.rawStr()
	if err != nil || plain {
		return raw, err
	}
	return d.unquote(raw), nil
}

// unquote is the unescaped value of a string's contents raw, which
// rawStr has checked, in d.scratch.
func (d *reader) unquote(raw []byte) []byte {
	if d.scratch == nil {
		d.scratch = make([]byte, 0, 2*len(raw)+64)
	}
	n := len(d.scratch)
	d.scratch = appendUnquoted(d.scratch, raw)
	return d.scratch[n:len(d.scratch):len(d.scratch)]
}

// rawStr reads and checks a string at d.i (a '"') and returns what is
// between its quotes, and whether that is its value as it stands (no
// escapes, valid UTF-8).
func (d *reader) rawStr() (raw []byte, plain bool, err *Error) {
	b := d.b
	i := d.i + 1
	start := i
	esc, high := false, false
	for {
		for i < len(b) && plainByte[b[i]] {
			i++
		}
		if i >= len(b) {
			d.i = i
			return nil, false, d.eof()
		}
		switch c := b[i]; {
		case c == '"':
			d.i = i + 1
			raw = b[start:i]
			return raw, !esc && (!high || utf8.Valid(raw)), nil
		case c == '\\':
			esc = true
			i++
			if i >= len(b) {
				d.i = i
				return nil, false, d.eof()
			}
			switch b[i] {
			case 'b', 'f', 'n', 'r', 't', '\\', '/', '"':
				i++
			case 'u':
				i++
				for k := 0; k < 4; k, i = k+1, i+1 {
					if i >= len(b) {
						d.i = i
						return nil, false, d.eof()
					}
					if unhexOK(b[i]) < 0 {
						d.i = i
						return nil, false, d.unexpected("in \\u hexadecimal character escape")
					}
				}
			default:
				d.i = i
				return nil, false, d.unexpected("in string escape code")
			}
		case c < 0x20:
			d.i = i
			return nil, false, d.unexpected("in string literal")
		default: // c >= utf8.RuneSelf
			high = true
			i++
		}
	}
}

// unhexOK is the value of a hex digit, or -1.
func unhexOK(c byte) rune {
	switch {
	case '0' <= c && c <= '9':
		return rune(c - '0')
	case 'a' <= c && c <= 'f':
		return rune(c - 'a' + 10)
	case 'A' <= c && c <= 'F':
		return rune(c - 'A' + 10)
	}
	return -1
}

// u4 is the code unit of the \uXXXX escape at s[0:6], or -1.
func u4(s []byte) rune {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return -1
	}
	var r rune
	for _, c := range s[2:6] {
		v := unhexOK(c)
		if v < 0 {
			return -1
		}
		r = r<<4 | v
	}
	return r
}

// appendUnquoted appends the contents of a JSON string that rawStr has
// checked (raw, between the quotes) to dst, unescaped.
func appendUnquoted(dst, raw []byte) []byte {
	for r := 0; r < len(raw); {
		run, ch, next := unquoteNext(raw, r)
		if run != nil {
			dst = append(dst, run...)
		} else {
			dst = utf8.AppendRune(dst, ch)
		}
		r = next
	}
	return dst
}

// unquoteNext decodes the checked string contents raw from r on: either
// a run of bytes that stand for themselves (ASCII, valid UTF-8), or
// else one character ch, from an escape or from an invalid byte
// (U+FFFD). next is where the rest begins. As encoding/json does, a
// \u surrogate pair is one character, a lone surrogate U+FFFD.
func unquoteNext(raw []byte, r int) (run []byte, ch rune, next int) {
	start := r
	for r < len(raw) {
		c := raw[r]
		if c == '\\' {
			break
		}
		if c < utf8.RuneSelf {
			r++
			continue
		}
		rr, size := utf8.DecodeRune(raw[r:])
		if rr == utf8.RuneError && size == 1 {
			break
		}
		r += size
	}
	if r > start {
		return raw[start:r], 0, r
	}
	if raw[r] != '\\' {
		return nil, utf8.RuneError, r + 1 // an invalid byte
	}
	switch raw[r+1] {
	case 'b':
		return nil, '\b', r + 2
	case 'f':
		return nil, '\f', r + 2
	case 'n':
		return nil, '\n', r + 2
	case 'r':
		return nil, '\r', r + 2
	case 't':
		return nil, '\t', r + 2
	case 'u':
		rr := u4(raw[r:])
		r += 6
		if utf16.IsSurrogate(rr) {
			if pair := utf16.DecodeRune(rr, u4(raw[r:])); pair != unicode.ReplacementChar {
				return nil, pair, r + 6
			}
			return nil, unicode.ReplacementChar, r
		}
		return nil, rr, r
	}
	return nil, rune(raw[r+1]), r + 2 // '"', '\\', '/'
}

// skip reads and drops one JSON value of any shape, checking its syntax.
// Nesting is not limited (encoding/json's token stream does not limit
// it either); the stack of open containers costs a byte each.
func (d *reader) skip() *Error {
	var stackBuf [32]byte
	stack := stackBuf[:0] // '{' or '['
	for {
		// A value.
		c, ok := d.peek()
		if !ok {
			return d.eof()
		}
		switch c {
		case '{', '[':
			d.i++
			stack = append(stack, c)
			c, ok = d.peek()
			if !ok {
				return d.eof()
			}
			if c == '}'+stack[len(stack)-1]-'{' { // '}' or ']'
				d.i++
				stack = stack[:len(stack)-1]
				break
			}
			if stack[len(stack)-1] == '{' {
				if err := d.key(c); err != nil {
					return err
				}
			}
			continue
		case '}', ']', ',', ':':
			return d.unexpected("looking for beginning of value")
		default:
			if _, _, _, err := d.primitive(c); err != nil {
				return err
			}
		}
		// After a value: close containers, or a comma and the next
		// element.
		for {
			if len(stack) == 0 {
				return nil
			}
			c, ok := d.peek()
			if !ok {
				return d.eof()
			}
			open := stack[len(stack)-1]
			if c == '}'+open-'{' {
				d.i++
				stack = stack[:len(stack)-1]
				continue
			}
			if c != ',' {
				return d.unexpected("after a value")
			}
			d.i++
			if open == '{' {
				c, ok := d.peek()
				if !ok {
					return d.eof()
				}
				if err := d.key(c); err != nil {
					return err
				}
			}
			break
		}
	}
}

// key reads an object key starting with c, the byte at d.i, and the
// colon after it.
func (d *reader) key(c byte) *Error {
	if c != '"' {
		return d.unexpected("looking for an object key")
	}
	if _, _, err := d.rawStr(); err != nil {
		return err
	}
	return d.colon()
}

// inferred types an un-annotated value from its JSON kind: string →
// String (the text is set by the caller), true/false → Boolean, an
// integer in int32 range → Int32, any other number → Double.
func inferred(m *member) (edm.Value, bool, error) {
	switch m.kind {
	case kindString:
		return edm.Value{}, true, nil
	case kindTrue, kindFalse:
		return edm.Bool(m.kind == kindTrue), false, nil
	}
	s := m.val
	if bytes.IndexAny(s, ".eE") < 0 {
		if i, ok := smallInt(s); ok {
			return edm.I32(int32(i)), false, nil
		}
		if i, err := strconv.ParseInt(string(s), 10, 32); err == nil {
			return edm.I32(int32(i)), false, nil
		}
	}
	f, err := strconv.ParseFloat(string(s), 64)
	if err != nil {
		return edm.Value{}, false, ErrInvalidInput.with("property %q: %s is not a Double", m.name, s)
	}
	return edm.F64(f), false, nil
}

// smallInt reads an optionally signed run of at most nine decimal
// digits, which always fits an int32.
func smallInt(s []byte) (int64, bool) {
	neg := len(s) > 0 && s[0] == '-'
	if neg {
		s = s[1:]
	}
	if len(s) == 0 || len(s) > 9 {
		return 0, false
	}
	var v int64
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int64(c-'0')
	}
	if neg {
		v = -v
	}
	return v, true
}

// strictBase64 is padded standard base64 with no slack in the padding.
var strictBase64 = base64.StdEncoding.Strict()

// typed reads a value by its @odata.type annotation. For a String the
// text is set by the caller.
func (d *reader) typed(m *member, typ []byte) (edm.Value, bool, error) {
	name, s := m.name, m.val
	if m.kind == kindString && !m.plain {
		s = d.unquote(s)
	}
	t, ok := parseType(typ)
	if !ok {
		return edm.Value{}, false, ErrInvalidInput.with("property %q: unsupported type %q", name, typ)
	}
	isStr, isNum := m.kind == kindString, m.kind == kindNumber
	bad := func() (edm.Value, bool, error) {
		return edm.Value{}, false, ErrInvalidInput.with("property %q: %s is not a valid %s", name, m.text(d), t)
	}
	wrongKind := func() (edm.Value, bool, error) {
		return edm.Value{}, false, ErrInvalidValueType.with("property %q: a JSON %s cannot be %s", name, m.goType(), t)
	}
	switch t {
	case edm.String:
		if !isStr {
			return wrongKind()
		}
		return edm.Value{}, true, nil
	case edm.Int32, edm.Int64:
		// Int64 travels as a string; the service also takes a JSON
		// number, and an Int32 as a string ("12345").
		if !isStr && !isNum {
			return wrongKind()
		}
		bits := 64
		if t == edm.Int32 {
			bits = 32
		}
		i, err := strconv.ParseInt(string(s), 10, bits)
		if err != nil {
			return bad()
		}
		if t == edm.Int32 {
			return edm.I32(int32(i)), false, nil
		}
		return edm.I64(i), false, nil
	case edm.Double:
		if !isStr && !isNum {
			return wrongKind()
		}
		switch string(s) {
		case "NaN":
			return edm.F64(math.NaN()), false, nil
		case "Infinity", "INF":
			return edm.F64(math.Inf(1)), false, nil
		case "-Infinity", "-INF":
			return edm.F64(math.Inf(-1)), false, nil
		}
		if !isJSONNumber(s) {
			return bad()
		}
		f, err := strconv.ParseFloat(string(s), 64)
		if err != nil {
			return bad()
		}
		return edm.F64(f), false, nil
	case edm.Boolean:
		switch {
		case m.kind == kindTrue || m.kind == kindFalse:
			return edm.Bool(m.kind == kindTrue), false, nil
		case !isStr:
			return wrongKind()
		case bytes.EqualFold(s, []byte("true")):
			return edm.Bool(true), false, nil
		case bytes.EqualFold(s, []byte("false")):
			return edm.Bool(false), false, nil
		}
		return bad()
	case edm.DateTime:
		if !isStr {
			return wrongKind()
		}
		ts, err := parseTime(s)
		if err != nil {
			return edm.Value{}, false, err.with("property %q: %s", name, err.Detail)
		}
		return edm.Time(ts), false, nil
	case edm.Guid:
		if !isStr {
			return wrongKind()
		}
		if !isGUID(s) {
			return bad()
		}
		var g [16]byte
		j := 0
		for i := 0; i < len(s); i++ {
			if s[i] == '-' {
				continue
			}
			g[j] = byte(unhexOK(s[i])<<4 | unhexOK(s[i+1]))
			i++
			j++
		}
		return edm.GUID(g), false, nil
	case edm.Binary:
		if !isStr {
			return wrongKind()
		}
		var buf [256]byte // most binaries decode without an allocation
		b, err := strictBase64.AppendDecode(buf[:0], s)
		if err != nil {
			return bad()
		}
		return edm.Bin(b), false, nil
	}
	return bad()
}

// parseType is edm.ParseType of bytes.
func parseType(name []byte) (edm.Type, bool) {
	switch string(name) {
	case "Edm.String":
		return edm.String, true
	case "Edm.Int32":
		return edm.Int32, true
	case "Edm.Int64":
		return edm.Int64, true
	case "Edm.Double":
		return edm.Double, true
	case "Edm.Boolean":
		return edm.Boolean, true
	case "Edm.DateTime":
		return edm.DateTime, true
	case "Edm.Guid":
		return edm.Guid, true
	case "Edm.Binary":
		return edm.Binary, true
	}
	return edm.Invalid, false
}

// text is the value as an error message shows it.
func (m *member) text(d *reader) string {
	switch m.kind {
	case kindTrue:
		return "true"
	case kindFalse:
		return "false"
	case kindNull:
		return "<nil>"
	}
	if m.kind == kindString {
		return string(m.str(d))
	}
	return string(m.val)
}

// goType names the value's JSON kind as error messages always have
// (the Go type encoding/json decoded it to).
func (m *member) goType() string {
	switch m.kind {
	case kindString:
		return "string"
	case kindNumber:
		return "json.Number"
	case kindTrue, kindFalse:
		return "bool"
	}
	return "<nil>"
}

// isJSONNumber says whether s is a number in JSON's grammar (so no hex,
// no "inf", no underscores, which strconv.ParseFloat would take).
func isJSONNumber[S ~string | ~[]byte](s S) bool {
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	digits := func() int {
		n := 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if i < len(s) && s[i] == '0' {
		i++
	} else if digits() == 0 {
		return false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(s)
}

// isGUID says whether s is xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx in hex
// digits of either case.
func isGUID[S ~string | ~[]byte](s S) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if i == 8 || i == 13 || i == 18 || i == 23 {
			if c != '-' {
				return false
			}
			continue
		}
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}
