package entity

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/tabuladb/tabula/frontend/edm"
)

// The service's limits (Learn: "Understanding the Table service data
// model"; the boundaries were checked against Azurite, see doc.go).
const (
	MaxProperties  = 252      // custom properties per entity (255 with PartitionKey, RowKey, Timestamp)
	MaxEntitySize  = 1 << 20  // bytes, counted by Size
	MaxNameUnits   = 255      // UTF-16 code units in a property name
	MaxStringUnits = 32 << 10 // UTF-16 code units in an Edm.String (64 KiB)
	MaxBinaryBytes = 64 << 10 // bytes in an Edm.Binary
	MaxKeyUnits    = 512      // UTF-16 code units in PartitionKey or RowKey (1 KiB of UTF-16)
)

// utf16Len is the number of UTF-16 code units s takes, the unit the
// service counts strings in. An invalid UTF-8 byte counts as one unit.
func utf16Len(s string) int {
	n := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			n++
			i++
			continue
		}
		r, w := utf8.DecodeRuneInString(s[i:])
		if r >= 0x10000 {
			n += 2
		} else {
			n++
		}
		i += w
	}
	return n
}

// valueSize is a value's share of Size.
func valueSize(v edm.Value) int64 {
	switch v.Type() {
	case edm.String:
		return int64(utf16Len(v.AsString()))*2 + 4
	case edm.Binary:
		return int64(len(v.AsString())) + 4
	case edm.Int32:
		return 4
	case edm.Int64, edm.Double, edm.DateTime:
		return 8
	case edm.Guid:
		return 16
	case edm.Boolean:
		return 1
	}
	return 0
}

// Size is the entity's size as the service counts it against the 1 MiB
// limit: 4 bytes, plus twice the UTF-16 length of PartitionKey and of
// RowKey, plus for each custom property 8 bytes, twice the UTF-16
// length of its name and its value's size: String 2 per UTF-16 code unit
// + 4, Binary its length + 4, Int32 4, Int64, Double and DateTime 8, Guid
// 16, Boolean 1. Timestamp is not counted.
func Size(e *edm.Entity) int64 {
	n := int64(4) + 2*int64(utf16Len(e.PartitionKey)) + 2*int64(utf16Len(e.RowKey))
	for _, p := range e.Props {
		n += 8 + 2*int64(utf16Len(p.Name)) + valueSize(p.Value)
	}
	return n
}

// Validate checks an entity against the service's rules before it is
// written: keys (InvalidInput), the number of properties
// (TooManyProperties), each property's name (PropertyNameTooLong,
// PropertyNameInvalid, DuplicatePropertiesSpecified) and value
// (PropertyValueTooLarge, InvalidValueType), and the total size
// (EntityTooLarge). The error is an *Error. Call it on the entity that
// will be stored: after a merge, on the merged entity.
func Validate(e *edm.Entity) error {
	if err := ValidateKey("PartitionKey", e.PartitionKey); err != nil {
		return err
	}
	if err := ValidateKey("RowKey", e.RowKey); err != nil {
		return err
	}
	if len(e.Props) > MaxProperties {
		return ErrTooManyProperties.with("%d custom properties, at most %d", len(e.Props), MaxProperties)
	}
	seen := make(map[string]struct{}, len(e.Props))
	for _, p := range e.Props {
		if err := ValidatePropertyName(p.Name); err != nil {
			return err
		}
		if _, dup := seen[p.Name]; dup {
			return ErrDuplicatePropertiesSpecified.with("property %q appears twice", p.Name)
		}
		seen[p.Name] = struct{}{}
		switch v := p.Value; v.Type() {
		case edm.String:
			if n := utf16Len(v.AsString()); n > MaxStringUnits {
				return ErrPropertyValueTooLarge.with("property %q: %d UTF-16 code units, at most %d", p.Name, n, MaxStringUnits)
			}
		case edm.Binary:
			if n := len(v.AsString()); n > MaxBinaryBytes {
				return ErrPropertyValueTooLarge.with("property %q: %d bytes, at most %d", p.Name, n, MaxBinaryBytes)
			}
		case edm.Int32, edm.Int64, edm.Double, edm.Boolean, edm.DateTime, edm.Guid:
		default:
			return ErrInvalidValueType.with("property %q has no valid type", p.Name)
		}
	}
	if n := Size(e); n > MaxEntitySize {
		return ErrEntityTooLarge.with("%d bytes, at most %d", n, MaxEntitySize)
	}
	return nil
}

// ValidateKey checks a PartitionKey or RowKey value (which names it, for
// the message): at most MaxKeyUnits UTF-16 code units, valid UTF-8, and
// none of / \ # ? or the control characters U+0000-U+001F and
// U+007F-U+009F. Failures are InvalidInput, as the service reports them.
func ValidateKey(which, k string) error {
	if n := utf16Len(k); n > MaxKeyUnits {
		return ErrInvalidInput.with("%s is %d UTF-16 code units, at most %d", which, n, MaxKeyUnits)
	}
	for i, r := range k {
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(k[i:], "\uFFFD"):
			return ErrInvalidInput.with("%s is not valid UTF-8", which)
		case r == '/' || r == '\\' || r == '#' || r == '?' || r <= 0x1F || (r >= 0x7F && r <= 0x9F):
			return ErrInvalidInput.with("%s contains the character %U, which keys may not hold", which, r)
		}
	}
	return nil
}

// ValidatePropertyName checks a custom property's name: at most
// MaxNameUnits UTF-16 code units (PropertyNameTooLong) and a C#
// identifier, not one of the system names PartitionKey, RowKey,
// Timestamp (PropertyNameInvalid). A C# identifier starts with a letter
// (Unicode Lu, Ll, Lt, Lm, Lo, Nl) or '_' and continues with letters,
// decimal digits (Nd), connectors (Pc), combining marks (Mn, Mc) and
// formatting characters (Cf); so no '-', '.', '@' or space.
func ValidatePropertyName(name string) error {
	if n := utf16Len(name); n > MaxNameUnits {
		return ErrPropertyNameTooLong.with("property name of %d UTF-16 code units, at most %d", n, MaxNameUnits)
	}
	if name == "" {
		return ErrPropertyNameInvalid.with("empty property name")
	}
	switch name {
	case "PartitionKey", "RowKey", "Timestamp":
		return ErrPropertyNameInvalid.with("%q is a system property", name)
	}
	for i, r := range name {
		if r == utf8.RuneError && !strings.HasPrefix(name[i:], "\uFFFD") {
			return ErrPropertyNameInvalid.with("property name %q is not valid UTF-8", name)
		}
		ok := r == '_' || unicode.IsLetter(r) || unicode.Is(unicode.Nl, r)
		if i > 0 {
			ok = ok || unicode.In(r, unicode.Nd, unicode.Pc, unicode.Mn, unicode.Mc, unicode.Cf)
		}
		if !ok {
			return ErrPropertyNameInvalid.with("property name %q: %U is not allowed in a C# identifier there", name, r)
		}
	}
	return nil
}

// ValidateTableName checks a table name: 3 to 63 ASCII letters and
// digits, starting with a letter, and not the reserved name "tables"
// (any case). Failures are InvalidResourceName (see doc.go).
func ValidateTableName(name string) error {
	if len(name) < 3 || len(name) > 63 {
		return ErrInvalidResourceName.with("table name %q: %d characters, want 3 to 63", name, len(name))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		letter := (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')
		if !letter && (i == 0 || c < '0' || c > '9') {
			return ErrInvalidResourceName.with("table name %q: want ^[A-Za-z][A-Za-z0-9]{2,62}$", name)
		}
	}
	if strings.EqualFold(name, "tables") {
		return ErrInvalidResourceName.with("table name %q is reserved", name)
	}
	return nil
}
