package entity

import (
	"encoding/base64"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tabuladb/tabula/frontend/edm"
)

// Metadata is a JSON response's OData metadata level. The zero value is
// MinimalMetadata, the level plain application/json asks for.
type Metadata uint8

const (
	MinimalMetadata Metadata = iota // odata.metadata, odata.etag, annotations for non-inferred types
	NoMetadata                      // bare properties
	FullMetadata                    // plus odata.type, odata.id, odata.editLink, Timestamp@odata.type
)

func (m Metadata) String() string {
	switch m {
	case NoMetadata:
		return "nometadata"
	case FullMetadata:
		return "fullmetadata"
	}
	return "minimalmetadata"
}

// ContentType is the Content-Type the service answers with at this
// level, e.g. "application/json;odata=minimalmetadata;streaming=true;charset=utf-8".
func (m Metadata) ContentType() string {
	return "application/json;odata=" + m.String() + ";streaming=true;charset=utf-8"
}

// ParseAccept picks the metadata level from the $format query parameter
// (which wins when given, as it does with DataServiceVersion 3.0) or
// else the Accept header: application/json;odata=nometadata,
// minimalmetadata or fullmetadata; plain application/json, */*,
// application/*, "json", an empty or an unrecognised value mean minimal
// metadata. Atom or XML alone is AtomFormatNotSupported (the service
// has answered only JSON since 2015-12-11); a JSON flavour it does not
// serve (odata=verbose) is JsonFormatNotSupported. Of several media
// ranges in Accept the first JSON one wins; q-values are not weighed.
func ParseAccept(accept, format string) (Metadata, error) {
	if f := strings.TrimSpace(format); f != "" {
		switch strings.ToLower(f) {
		case "json":
			return MinimalMetadata, nil
		case "atom", "xml":
			return 0, ErrAtomFormatNotSupported.with("$format=%s", f)
		}
		accept = f
	}
	atom := false
	for _, r := range strings.Split(accept, ",") {
		params := strings.Split(r, ";")
		mt := strings.ToLower(strings.TrimSpace(params[0]))
		switch mt {
		case "application/json":
			level := ""
			for _, p := range params[1:] {
				k, v, _ := strings.Cut(p, "=")
				if strings.EqualFold(strings.TrimSpace(k), "odata") {
					level = strings.ToLower(strings.TrimSpace(v))
				}
			}
			switch level {
			case "", "minimalmetadata":
				return MinimalMetadata, nil
			case "nometadata":
				return NoMetadata, nil
			case "fullmetadata":
				return FullMetadata, nil
			}
			return 0, ErrJsonFormatNotSupported.with("odata=%s", level)
		case "*/*", "application/*":
			return MinimalMetadata, nil
		case "application/atom+xml", "application/xml", "text/xml", "application/atomsvc+xml":
			atom = true
		}
	}
	if atom {
		return 0, ErrAtomFormatNotSupported.with("Accept: %s", accept)
	}
	return MinimalMetadata, nil
}

// JSONOptions says how AppendJSON and AppendFeed write entities. The
// zero value writes a single entity with minimal metadata and every
// property (its odata.metadata then lacks a base URL and table).
type JSONOptions struct {
	Metadata Metadata
	// BaseURL is the account's URL without a trailing slash, e.g.
	// "http://127.0.0.1:10002/devstoreaccount1" (path style) or
	// "https://acct.table.core.windows.net".
	BaseURL string
	// Account names the account, for odata.type ("acct.table") at full
	// metadata.
	Account string
	// Table is the table's name as the request spelled it.
	Table string
	// InFeed writes an element of a query's "value" array: no
	// odata.metadata of its own. AppendFeed sets it.
	InFeed bool
	// Select is the $select list, names already split at commas; empty
	// or "*" means every property. Otherwise only the named properties
	// are written (PartitionKey, RowKey and Timestamp too only when
	// named); a named property the entity lacks is written as null, as
	// the service does; odata.etag is written at minimal and full
	// metadata regardless.
	Select []string
}

// AppendJSON appends the entity's JSON, as the service writes it for
// Get Entity and Insert Entity, to dst. Properties follow the system
// ones in stored order; at minimal and full metadata an
// "X@odata.type" annotation precedes each Int64, DateTime, Guid and
// Binary value and each Double that is NaN or infinite (written as a
// string); full metadata also annotates Timestamp. Doubles with an
// integral value are written with ".0" (3.0) so that readers infer
// Double, as the service's ODataLib does; Int64 is a JSON string;
// DateTime has seven fractional digits.
func AppendJSON(dst []byte, e *edm.Entity, opts JSONOptions) []byte {
	return appendJSON(dst, e, &opts, newSelection(opts.Select))
}

// appendJSON is AppendJSON with the $select list already read.
func appendJSON(dst []byte, e *edm.Entity, opts *JSONOptions, sel selection) []byte {
	meta := opts.Metadata
	dst = append(dst, '{')
	first := true
	// field writes the member name (name then suffix, which is ASCII)
	// and its colon.
	field := func(name, suffix string) {
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = append(dst, '"')
		dst = appendStringBody(dst, name)
		dst = append(dst, suffix...)
		dst = append(dst, '"', ':')
	}
	if meta != NoMetadata && !opts.InFeed {
		field("odata.metadata", "")
		dst = append(dst, '"')
		dst = appendStringBody(dst, opts.BaseURL)
		dst = append(dst, "/$metadata#"...)
		dst = appendStringBody(dst, opts.Table)
		dst = append(dst, `/@Element"`...)
	}
	if meta == FullMetadata {
		field("odata.type", "")
		dst = append(dst, '"')
		dst = appendStringBody(dst, opts.Account)
		dst = append(dst, '.')
		dst = appendStringBody(dst, opts.Table)
		dst = append(dst, '"')
		field("odata.id", "")
		dst = append(dst, '"')
		dst = appendStringBody(dst, opts.BaseURL)
		dst = append(dst, '/')
		dst = appendLink(dst, opts.Table, e.PartitionKey, e.RowKey)
		dst = append(dst, '"')
	}
	if meta != NoMetadata {
		field("odata.etag", "")
		// The ETag is ASCII; of it only its quotes need escaping.
		dst = append(dst, `"W/\"datetime'`...)
		dst = appendTime(dst, e.Timestamp, "%3A")
		dst = append(dst, `'\""`...)
	}
	if meta == FullMetadata {
		field("odata.editLink", "")
		dst = append(dst, '"')
		dst = appendLink(dst, opts.Table, e.PartitionKey, e.RowKey)
		dst = append(dst, '"')
	}
	if sel.want("PartitionKey") {
		field("PartitionKey", "")
		dst = appendString(dst, e.PartitionKey)
	}
	if sel.want("RowKey") {
		field("RowKey", "")
		dst = appendString(dst, e.RowKey)
	}
	if sel.want("Timestamp") {
		if meta == FullMetadata {
			field("Timestamp", typeSuffix)
			dst = append(dst, `"Edm.DateTime"`...)
		}
		field("Timestamp", "")
		dst = append(dst, '"')
		dst = AppendTime(dst, e.Timestamp)
		dst = append(dst, '"')
	}
	found := 0
	for _, p := range e.Props {
		if !sel.want(p.Name) {
			continue
		}
		found++
		v := p.Value
		if meta != NoMetadata && annotated(v) {
			field(p.Name, typeSuffix)
			dst = appendString(dst, v.Type().String())
		}
		field(p.Name, "")
		dst = appendValue(dst, v)
	}
	if !sel.all() && found < sel.len() {
		// A named property the entity lacks is null; each name once.
		for i, name := range sel.names {
			switch name {
			case "", "PartitionKey", "RowKey", "Timestamp":
				continue
			}
			if sel.seenBefore(i) {
				continue
			}
			if _, ok := e.Get(name); ok {
				continue
			}
			field(name, "")
			dst = append(dst, "null"...)
		}
	}
	return append(dst, '}')
}

// AppendFeed appends a query's response body to dst:
// {"odata.metadata":"{BaseURL}/$metadata#{Table}","value":[...]},
// without odata.metadata at no metadata.
func AppendFeed(dst []byte, entities []*edm.Entity, opts JSONOptions) []byte {
	dst = append(dst, '{')
	if opts.Metadata != NoMetadata {
		dst = append(dst, `"odata.metadata":"`...)
		dst = appendStringBody(dst, opts.BaseURL)
		dst = append(dst, "/$metadata#"...)
		dst = appendStringBody(dst, opts.Table)
		dst = append(dst, '"', ',')
	}
	dst = append(dst, `"value":[`...)
	opts.InFeed = true
	sel := newSelection(opts.Select)
	for i, e := range entities {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendJSON(dst, e, &opts, sel)
	}
	return append(dst, "]}"...)
}

// selection is a $select list: the names, trimmed, or nil for every
// property. A long list is also indexed.
type selection struct {
	names []string
	index map[string]int // first position of each name, for long lists
}

// newSelection reads a $select list; empty, blank or with "*" in it
// means every property.
func newSelection(list []string) selection {
	if len(list) == 0 {
		return selection{}
	}
	names := make([]string, len(list))
	blank := true
	for i, n := range list {
		n = strings.TrimSpace(n)
		if n == "*" {
			return selection{}
		}
		names[i] = n
		blank = blank && n == ""
	}
	if blank {
		return selection{}
	}
	sel := selection{names: names}
	if len(names) > 16 {
		sel.index = make(map[string]int, len(names))
		for i := len(names) - 1; i >= 0; i-- {
			sel.index[names[i]] = i
		}
	}
	return sel
}

// all says whether every property is selected.
func (s selection) all() bool { return s.names == nil }

// want says whether the property name is selected.
func (s selection) want(name string) bool {
	if s.names == nil {
		return true
	}
	if s.index != nil {
		_, ok := s.index[name]
		return ok && name != ""
	}
	for _, n := range s.names {
		if n == name && n != "" {
			return true
		}
	}
	return false
}

// seenBefore says whether names[i] occurs earlier in the list.
func (s selection) seenBefore(i int) bool {
	if s.index != nil {
		return s.index[s.names[i]] < i
	}
	for _, n := range s.names[:i] {
		if n == s.names[i] {
			return true
		}
	}
	return false
}

// len is the number of distinct names selected.
func (s selection) len() int {
	n := 0
	for i, name := range s.names {
		if name != "" && !s.seenBefore(i) {
			n++
		}
	}
	return n
}

// annotated says whether a value's type cannot be inferred from its JSON
// form, so minimal metadata annotates it.
func annotated(v edm.Value) bool {
	switch v.Type() {
	case edm.Int64, edm.DateTime, edm.Guid, edm.Binary:
		return true
	case edm.Double:
		f := v.AsDouble()
		return math.IsNaN(f) || math.IsInf(f, 0)
	}
	return false
}

func appendValue(dst []byte, v edm.Value) []byte {
	switch v.Type() {
	case edm.String, edm.Guid:
		return appendString(dst, v.AsString())
	case edm.Int32:
		return strconv.AppendInt(dst, v.AsInt(), 10)
	case edm.Int64:
		dst = append(dst, '"')
		dst = strconv.AppendInt(dst, v.AsInt(), 10)
		return append(dst, '"')
	case edm.Double:
		return appendDouble(dst, v.AsDouble())
	case edm.Boolean:
		return strconv.AppendBool(dst, v.AsBool())
	case edm.DateTime:
		dst = append(dst, '"')
		dst = AppendTime(dst, v.AsTime())
		return append(dst, '"')
	case edm.Binary:
		s := v.AsString()
		dst = append(dst, '"')
		// In chunks of whole 3-byte groups, so that no copy of the
		// bytes is allocated.
		var buf [3 * 64]byte
		for len(s) > 0 {
			n := copy(buf[:], s)
			dst = base64.StdEncoding.AppendEncode(dst, buf[:n])
			s = s[n:]
		}
		return append(dst, '"')
	}
	return append(dst, "null"...)
}

// appendDouble writes a Double so that it reads back as a Double: the
// shortest form that round-trips, with ".0" added to an integral value;
// NaN and the infinities as the strings the service uses.
func appendDouble(dst []byte, f float64) []byte {
	switch {
	case math.IsNaN(f):
		return append(dst, `"NaN"`...)
	case math.IsInf(f, 1):
		return append(dst, `"Infinity"`...)
	case math.IsInf(f, -1):
		return append(dst, `"-Infinity"`...)
	}
	format := byte('f')
	if a := math.Abs(f); a != 0 && (a < 1e-6 || a >= 1e21) {
		format = 'e'
	}
	start := len(dst)
	dst = strconv.AppendFloat(dst, f, format, -1, 64)
	for _, c := range dst[start:] {
		if c == '.' || c == 'e' {
			return dst
		}
	}
	return append(dst, ".0"...)
}

// Address is an entity's URL, as odata.id spells it and as the service
// sends it in the Location and DataServiceId headers of a batch's insert
// and upsert answers: "{baseURL}/{table}(PartitionKey='..',RowKey='..')",
// each key's quotes doubled, then percent-encoded as a URL path (so the
// result is ASCII and fits a header). baseURL is the account's URL
// without a trailing slash, as JSONOptions.BaseURL.
func Address(baseURL, table, pk, rk string) string {
	dst := make([]byte, 0, len(baseURL)+len(table)+len(pk)+len(rk)+32)
	dst = append(dst, baseURL...)
	dst = append(dst, '/')
	return string(appendLink(dst, table, pk, rk))
}

// appendLink appends an entity's address relative to the account,
// "{table}(PartitionKey='..',RowKey='..')", as it goes in a JSON string.
func appendLink(dst []byte, table, pk, rk string) []byte {
	dst = appendStringBody(dst, table)
	dst = append(dst, "(PartitionKey='"...)
	dst = appendKeyLiteral(dst, pk)
	dst = append(dst, "',RowKey='"...)
	dst = appendKeyLiteral(dst, rk)
	return append(dst, "')"...)
}

// appendKeyLiteral appends a key as it appears inside the quotes of an
// entity's address: quotes doubled, then percent-encoded like a URL
// path. The result is ASCII with nothing a JSON string escapes.
func appendKeyLiteral(dst []byte, k string) []byte {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c == '\'' {
			dst = append(dst, "''"...)
			continue
		}
		if ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9') ||
			strings.IndexByte("-._~!*()$&+,;=:@", c) >= 0 {
			dst = append(dst, c)
			continue
		}
		dst = append(dst, '%', hex[c>>4], hex[c&15])
	}
	return dst
}

// appendString writes s as a JSON string. Non-ASCII text is written as
// is; control characters, U+2028 and U+2029 are escaped; an invalid
// UTF-8 byte becomes U+FFFD.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	dst = appendStringBody(dst, s)
	return append(dst, '"')
}

// appendStringBody is appendString without the quotes. Of strings
// joined by ASCII, the body is the bodies joined (the escaping of a
// byte never depends on an ASCII neighbour).
func appendStringBody(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
			}
			i++
			start = i
			continue
		}
		r, w := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && w == 1) || r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			if r == utf8.RuneError {
				dst = append(dst, `\ufffd`...)
			} else {
				dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&15])
			}
			i += w
			start = i
			continue
		}
		i += w
	}
	return append(dst, s[start:]...)
}
