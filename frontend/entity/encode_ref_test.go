package entity

// The JSON and storage encoders as they were before allocations were
// trimmed from them; TestEncodersAgainstRef and FuzzEncodersAgainstRef
// hold the current ones to byte-identical output.

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tabuladb/tabula/frontend/edm"
)

// refAppendJSON appends the entity's JSON, as the service writes it for
// Get Entity and Insert Entity, to dst. Properties follow the system
// ones in stored order; at minimal and full metadata an
// "X@odata.type" annotation precedes each Int64, DateTime, Guid and
// Binary value and each Double that is NaN or infinite (written as a
// string); full metadata also annotates Timestamp. Doubles with an
// integral value are written with ".0" (3.0) so that readers infer
// Double, as the service's ODataLib does; Int64 is a JSON string;
// DateTime has seven fractional digits.
func refAppendJSON(dst []byte, e *edm.Entity, opts JSONOptions) []byte {
	meta := opts.Metadata
	dst = append(dst, '{')
	first := true
	field := func(name string) {
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = refAppendString(dst, name)
		dst = append(dst, ':')
	}
	if meta != NoMetadata && !opts.InFeed {
		field("odata.metadata")
		dst = refAppendString(dst, opts.BaseURL+"/$metadata#"+opts.Table+"/@Element")
	}
	var link string
	if meta == FullMetadata {
		link = opts.Table + "(PartitionKey='" + refKeyLiteral(e.PartitionKey) + "',RowKey='" + refKeyLiteral(e.RowKey) + "')"
		field("odata.type")
		dst = refAppendString(dst, opts.Account+"."+opts.Table)
		field("odata.id")
		dst = refAppendString(dst, opts.BaseURL+"/"+link)
	}
	if meta != NoMetadata {
		field("odata.etag")
		dst = refAppendString(dst, ETag(e.Timestamp))
	}
	if meta == FullMetadata {
		field("odata.editLink")
		dst = refAppendString(dst, link)
	}
	sel := refSelection(opts.Select)
	want := func(name string) bool {
		if sel == nil {
			return true
		}
		_, ok := sel[name]
		return ok
	}
	if want("PartitionKey") {
		field("PartitionKey")
		dst = refAppendString(dst, e.PartitionKey)
	}
	if want("RowKey") {
		field("RowKey")
		dst = refAppendString(dst, e.RowKey)
	}
	if want("Timestamp") {
		if meta == FullMetadata {
			field("Timestamp" + typeSuffix)
			dst = refAppendString(dst, "Edm.DateTime")
		}
		field("Timestamp")
		dst = append(dst, '"')
		dst = AppendTime(dst, e.Timestamp)
		dst = append(dst, '"')
	}
	found := 0
	for _, p := range e.Props {
		if !want(p.Name) {
			continue
		}
		found++
		v := p.Value
		if meta != NoMetadata && annotated(v) {
			field(p.Name + typeSuffix)
			dst = refAppendString(dst, v.Type().String())
		}
		field(p.Name)
		dst = refAppendValue(dst, v)
	}
	if sel != nil && found < len(sel) {
		for _, name := range opts.Select {
			name = strings.TrimSpace(name)
			if _, ok := sel[name]; !ok {
				continue // written already, or a duplicate
			}
			switch name {
			case "PartitionKey", "RowKey", "Timestamp":
				continue
			}
			if _, ok := e.Get(name); ok {
				continue
			}
			delete(sel, name)
			field(name)
			dst = append(dst, "null"...)
		}
	}
	return append(dst, '}')
}

// refAppendFeed appends a query's response body to dst:
// {"odata.metadata":"{BaseURL}/$metadata#{Table}","value":[...]},
// without odata.metadata at no metadata.
func refAppendFeed(dst []byte, entities []*edm.Entity, opts JSONOptions) []byte {
	dst = append(dst, '{')
	if opts.Metadata != NoMetadata {
		dst = refAppendString(dst, "odata.metadata")
		dst = append(dst, ':')
		dst = refAppendString(dst, opts.BaseURL+"/$metadata#"+opts.Table)
		dst = append(dst, ',')
	}
	dst = append(dst, `"value":[`...)
	opts.InFeed = true
	for i, e := range entities {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = refAppendJSON(dst, e, opts)
	}
	return append(dst, "]}"...)
}

// refSelection is the $select list as a set; nil means every property.
func refSelection(list []string) map[string]struct{} {
	if len(list) == 0 {
		return nil
	}
	sel := make(map[string]struct{}, len(list))
	for _, n := range list {
		n = strings.TrimSpace(n)
		if n == "*" {
			return nil
		}
		if n != "" {
			sel[n] = struct{}{}
		}
	}
	if len(sel) == 0 {
		return nil
	}
	return sel
}

// refKeyLiteral is a key as it appears inside the quotes of an entity's
// address: quotes doubled, then percent-encoded like a URL path.
func refKeyLiteral(k string) string {
	k = strings.ReplaceAll(k, "'", "''")
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(k); i++ {
		c := k[i]
		if ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9') ||
			strings.IndexByte("-._~'!*()$&+,;=:@", c) >= 0 {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// refAppendString writes s as a JSON string. Non-ASCII text is written as
// is; control characters, U+2028 and U+2029 are escaped; an invalid
// UTF-8 byte becomes U+FFFD.
func refAppendString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
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
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

func refAppendValue(dst []byte, v edm.Value) []byte {
	switch v.Type() {
	case edm.String, edm.Guid:
		return refAppendString(dst, v.AsString())
	case edm.Int32:
		return strconv.AppendInt(dst, v.AsInt(), 10)
	case edm.Int64:
		dst = append(dst, '"')
		dst = strconv.AppendInt(dst, v.AsInt(), 10)
		return append(dst, '"')
	case edm.Double:
		return refAppendDouble(dst, v.AsDouble())
	case edm.Boolean:
		return strconv.AppendBool(dst, v.AsBool())
	case edm.DateTime:
		dst = append(dst, '"')
		dst = AppendTime(dst, v.AsTime())
		return append(dst, '"')
	case edm.Binary:
		s := v.AsString()
		dst = append(dst, '"')
		dst = base64.StdEncoding.AppendEncode(dst, []byte(s))
		return append(dst, '"')
	}
	return append(dst, "null"...)
}

// refAppendDouble writes a Double so that it reads back as a Double: the
// shortest form that round-trips, with ".0" added to an integral value;
// NaN and the infinities as the strings the service uses.
func refAppendDouble(dst []byte, f float64) []byte {
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

// refAppendBinary appends the stored form of e (its Timestamp and custom
// properties; the keys live in the engine key, see Key) to dst. It
// stores whatever e holds, valid or not: call Validate first.
func refAppendBinary(dst []byte, e *edm.Entity) []byte {
	start := len(dst)
	dst = append(dst, binaryV1)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(toTicks(e.Timestamp)))
	dst = binary.AppendUvarint(dst, uint64(len(e.Props)))
	for _, p := range e.Props {
		dst = binary.AppendUvarint(dst, uint64(len(p.Name)))
		dst = append(dst, p.Name...)
		v := p.Value
		dst = append(dst, byte(v.Type()))
		switch v.Type() {
		case edm.String, edm.Binary:
			s := v.AsString()
			dst = binary.AppendUvarint(dst, uint64(len(s)))
			dst = append(dst, s...)
		case edm.Int32:
			dst = binary.LittleEndian.AppendUint32(dst, uint32(int32(v.AsInt())))
		case edm.Int64:
			dst = binary.LittleEndian.AppendUint64(dst, uint64(v.AsInt()))
		case edm.Double:
			dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(v.AsDouble()))
		case edm.Boolean:
			b := byte(0)
			if v.AsBool() {
				b = 1
			}
			dst = append(dst, b)
		case edm.DateTime:
			dst = binary.LittleEndian.AppendUint64(dst, uint64(toTicks(v.AsTime())))
		case edm.Guid:
			dst = append(dst, refGuidBytes(v.AsString())...)
		}
	}
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
}

// refDecodeBinary reads an entity AppendBinary wrote, with the keys the
// engine key carried. It checks the CRC32C first; any damage is an
// error wrapping ErrCorrupt, an unknown version one that says so. The
// entity does not alias b.
func refDecodeBinary(pk, rk string, b []byte) (*edm.Entity, error) {
	corrupt := func(why string, args ...any) (*edm.Entity, error) {
		return nil, fmt.Errorf("entity: decode stored entity: %s: %w", fmt.Sprintf(why, args...), ErrCorrupt)
	}
	if len(b) < 1+8+1+4 {
		return corrupt("%d bytes, too short", len(b))
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return corrupt("crc32c %08x, stored %08x", got, sum)
	}
	if body[0] != binaryV1 {
		return corrupt("format version %d, this build reads %d", body[0], binaryV1)
	}
	ts, ok := fromTicks(int64(binary.LittleEndian.Uint64(body[1:9])))
	if !ok {
		return corrupt("timestamp out of range")
	}
	p := body[9:]
	uvarint := func() (uint64, bool) {
		v, n := binary.Uvarint(p)
		if n <= 0 {
			return 0, false
		}
		p = p[n:]
		return v, true
	}
	take := func(n uint64) ([]byte, bool) {
		if n > uint64(len(p)) {
			return nil, false
		}
		s := p[:n]
		p = p[n:]
		return s, true
	}
	count, ok := uvarint()
	if !ok || count > uint64(len(p))/3 { // a property takes at least 3 bytes
		return corrupt("bad property count")
	}
	e := &edm.Entity{PartitionKey: pk, RowKey: rk, Timestamp: ts, Props: make([]edm.Property, 0, count)}
	for i := uint64(0); i < count; i++ {
		n, ok := uvarint()
		if !ok {
			return corrupt("property %d: bad name length", i)
		}
		name, ok := take(n)
		if !ok {
			return corrupt("property %d: name past the end", i)
		}
		tb, ok := take(1)
		if !ok {
			return corrupt("property %d: no type", i)
		}
		var v edm.Value
		switch t := edm.Type(tb[0]); t {
		case edm.String, edm.Binary:
			n, ok := uvarint()
			if !ok {
				return corrupt("property %d: bad value length", i)
			}
			s, ok := take(n)
			if !ok {
				return corrupt("property %d: value past the end", i)
			}
			if t == edm.String {
				v = edm.Str(string(s))
			} else {
				v = edm.Bin(s)
			}
		case edm.Int32:
			s, ok := take(4)
			if !ok {
				return corrupt("property %d: short Int32", i)
			}
			v = edm.I32(int32(binary.LittleEndian.Uint32(s)))
		case edm.Int64, edm.Double, edm.DateTime:
			s, ok := take(8)
			if !ok {
				return corrupt("property %d: short %s", i, t)
			}
			u := binary.LittleEndian.Uint64(s)
			switch t {
			case edm.Int64:
				v = edm.I64(int64(u))
			case edm.Double:
				v = edm.F64(math.Float64frombits(u))
			default:
				tm, ok := fromTicks(int64(u))
				if !ok || tm.Before(minTime) || tm.After(maxTime) {
					return corrupt("property %d: DateTime out of range", i)
				}
				v = edm.Time(tm)
			}
		case edm.Boolean:
			s, ok := take(1)
			if !ok || s[0] > 1 {
				return corrupt("property %d: bad Boolean", i)
			}
			v = edm.Bool(s[0] == 1)
		case edm.Guid:
			s, ok := take(16)
			if !ok {
				return corrupt("property %d: short Guid", i)
			}
			v = edm.GUID([16]byte(s))
		default:
			return corrupt("property %d: unknown type %d", i, tb[0])
		}
		e.Props = append(e.Props, edm.Property{Name: string(name), Value: v})
	}
	if len(p) != 0 {
		return corrupt("%d bytes after the last property", len(p))
	}
	return e, nil
}

// refGuidBytes is the 16 bytes of a GUID in edm's canonical form.
func refGuidBytes(s string) []byte {
	var b [16]byte
	j := 0
	for i := 0; i+1 < len(s) && j < 16; {
		if s[i] == '-' {
			i++
			continue
		}
		b[j] = unhex(s[i])<<4 | unhex(s[i+1])
		i += 2
		j++
	}
	return b[:]
}
