package edm

import (
	"bytes"
	"cmp"
	"fmt"
	"math"
	"strings"
	"time"
)

// Type is an Edm property type. The numeric values are stored (storage
// encodings carry them): never change or reuse one.
type Type uint8

const (
	Invalid  Type = 0
	String   Type = 1
	Int32    Type = 2
	Int64    Type = 3
	Double   Type = 4
	Boolean  Type = 5
	DateTime Type = 6
	Guid     Type = 7
	Binary   Type = 8
)

var typeNames = [...]string{
	Invalid:  "Edm.Invalid",
	String:   "Edm.String",
	Int32:    "Edm.Int32",
	Int64:    "Edm.Int64",
	Double:   "Edm.Double",
	Boolean:  "Edm.Boolean",
	DateTime: "Edm.DateTime",
	Guid:     "Edm.Guid",
	Binary:   "Edm.Binary",
}

// String is the type's OData name ("Edm.Int64").
func (t Type) String() string {
	if int(t) < len(typeNames) {
		return typeNames[t]
	}
	return fmt.Sprintf("Edm.Type(%d)", uint8(t))
}

// Valid says whether t is one of the eight types.
func (t Type) Valid() bool { return t >= String && t <= Binary }

// ParseType reads an OData type name ("Edm.Guid"); it is case-sensitive,
// as the service is.
func ParseType(name string) (Type, bool) {
	for t := String; t <= Binary; t++ {
		if typeNames[t] == name {
			return t, true
		}
	}
	return Invalid, false
}

// Ticks is a DateTime's resolution: 100 ns, seven fractional digits.
const Ticks = 100 * time.Nanosecond

// Value is one typed property value. The zero Value is invalid.
type Value struct {
	t Type
	s string  // String; Guid (canonical lower-case form); Binary (the bytes)
	i int64   // Int32, Int64; DateTime (ticks of 100 ns since 0001-01-01T00:00:00Z, as .NET counts)
	f float64 // Double
	b bool    // Boolean
}

// Str is an Edm.String.
func Str(s string) Value { return Value{t: String, s: s} }

// I32 is an Edm.Int32.
func I32(v int32) Value { return Value{t: Int32, i: int64(v)} }

// I64 is an Edm.Int64.
func I64(v int64) Value { return Value{t: Int64, i: v} }

// F64 is an Edm.Double.
func F64(v float64) Value { return Value{t: Double, f: v} }

// Bool is an Edm.Boolean.
func Bool(v bool) Value { return Value{t: Boolean, b: v} }

// unixAt0001 is 0001-01-01T00:00:00Z in Unix seconds.
const unixAt0001 = -62135596800

// Time is an Edm.DateTime, in UTC, truncated to 100 ns. Its range is
// years 1 to 9999 (the service's is narrower: from 1601); a time outside
// it wraps, so callers check the range (MinTime, MaxTime) first.
func Time(v time.Time) Value {
	return Value{t: DateTime, i: (v.Unix()-unixAt0001)*1e7 + int64(v.Nanosecond())/100}
}

// MinTime and MaxTime bound the times Time represents.
var (
	MinTime = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	MaxTime = time.Date(9999, 12, 31, 23, 59, 59, 999999900, time.UTC)
)

// GUID is an Edm.Guid from its 16 bytes.
func GUID(b [16]byte) Value {
	const digits = "0123456789abcdef"
	var out [36]byte
	j := 0
	for i, c := range b {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			out[j] = '-'
			j++
		}
		out[j], out[j+1] = digits[c>>4], digits[c&0x0f]
		j += 2
	}
	return Value{t: Guid, s: string(out[:])}
}

// ParseGUID reads a GUID in its 36-character form (any case).
func ParseGUID(s string) (Value, error) {
	var b [16]byte
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return Value{}, fmt.Errorf("edm: %q is not a GUID (want xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)", s)
	}
	hex := strings.ReplaceAll(s, "-", "")
	if len(hex) != 32 {
		return Value{}, fmt.Errorf("edm: %q is not a GUID (want xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)", s)
	}
	for i := range b {
		hi, ok1 := unhex(hex[2*i])
		lo, ok2 := unhex(hex[2*i+1])
		if !ok1 || !ok2 {
			return Value{}, fmt.Errorf("edm: %q is not a GUID (bad hex digit)", s)
		}
		b[i] = hi<<4 | lo
	}
	return GUID(b), nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// Bin is an Edm.Binary; it copies b.
func Bin(b []byte) Value { return Value{t: Binary, s: string(b)} }

// Type is the value's type (Invalid for the zero Value).
func (v Value) Type() Type { return v.t }

// AsString is a String's text or a Guid's canonical lower-case form.
func (v Value) AsString() string { return v.s }

// AsInt is an Int32's or Int64's value.
func (v Value) AsInt() int64 { return v.i }

// AsDouble is a Double's value.
func (v Value) AsDouble() float64 { return v.f }

// AsBool is a Boolean's value.
func (v Value) AsBool() bool { return v.b }

// AsTime is a DateTime's value, in UTC.
func (v Value) AsTime() time.Time {
	return time.Unix(v.i/1e7+unixAt0001, (v.i%1e7)*100).UTC()
}

// AsBytes is a Binary's bytes (a copy).
func (v Value) AsBytes() []byte { return []byte(v.s) }

// Compare orders two values of one type: -1, 0 or +1, and ok=false when
// the types differ (the service's queries then do not match) or a Double
// is NaN. Strings compare by their UTF-8 bytes (ordinal, as the service
// sorts keys); Booleans false < true.
func Compare(a, b Value) (c int, ok bool) {
	if a.t != b.t || !a.t.Valid() {
		return 0, false
	}
	switch a.t {
	case String, Guid:
		return strings.Compare(a.s, b.s), true
	case Binary:
		return bytes.Compare([]byte(a.s), []byte(b.s)), true
	case Int32, Int64, DateTime:
		return cmp.Compare(a.i, b.i), true
	case Double:
		if math.IsNaN(a.f) || math.IsNaN(b.f) {
			return 0, false
		}
		return cmp.Compare(a.f, b.f), true
	case Boolean:
		switch {
		case a.b == b.b:
			return 0, true
		case !a.b:
			return -1, true
		}
		return 1, true
	}
	return 0, false
}

// Equal says whether a and b have one type and one value.
func Equal(a, b Value) bool {
	c, ok := Compare(a, b)
	return ok && c == 0
}

// GoString shows the type and value, for test failures.
func (v Value) GoString() string {
	switch v.t {
	case String, Guid:
		return fmt.Sprintf("%v(%q)", v.t, v.s)
	case Binary:
		return fmt.Sprintf("%v(%x)", v.t, v.s)
	case Int32, Int64:
		return fmt.Sprintf("%v(%d)", v.t, v.i)
	case Double:
		return fmt.Sprintf("%v(%g)", v.t, v.f)
	case Boolean:
		return fmt.Sprintf("%v(%t)", v.t, v.b)
	case DateTime:
		return fmt.Sprintf("%v(%s)", v.t, v.AsTime().Format(time.RFC3339Nano))
	}
	return "Edm.Invalid"
}

// Property is one named value of an entity.
type Property struct {
	Name  string
	Value Value
}

// Entity is a table row as the gateway sees it: its keys, the
// server-set Timestamp, and its custom properties in the order they
// were written. PartitionKey, RowKey and Timestamp are never among
// Props.
type Entity struct {
	PartitionKey string
	RowKey       string
	Timestamp    time.Time // UTC, 100 ns resolution; set by the server on every write
	Props        []Property
}

// Get looks up a property by name, including the system properties
// PartitionKey, RowKey (Edm.String) and Timestamp (Edm.DateTime), as a
// $filter sees them. Names are case-sensitive.
func (e *Entity) Get(name string) (Value, bool) {
	switch name {
	case "PartitionKey":
		return Str(e.PartitionKey), true
	case "RowKey":
		return Str(e.RowKey), true
	case "Timestamp":
		return Time(e.Timestamp), true
	}
	for _, p := range e.Props {
		if p.Name == name {
			return p.Value, true
		}
	}
	return Value{}, false
}
