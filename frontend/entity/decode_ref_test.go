package entity

// The JSON entity decoder as it was before the hand-written one in
// decode.go: encoding/json's token API. Kept as the reference that
// FuzzDecodeJSONAgainstStdlib compares DecodeJSONKeysOptional with; do
// not "fix" it without fixing decode.go the same way.

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/tabuladb/tabula/frontend/edm"
)

// refDecodeJSONKeysOptional is the former DecodeJSONKeysOptional.
func refDecodeJSONKeysOptional(body []byte) (e *edm.Entity, hasPK, hasRK bool, err error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return nil, false, false, ErrInvalidInput.with("the body is not a JSON object")
	}
	type raw struct {
		name string
		val  any // string, json.Number, bool or nil
	}
	var (
		props  []raw
		seen   = map[string]bool{} // property and key names
		annots = map[string]string{}
	)
	e = &edm.Entity{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, false, false, ErrInvalidInput.with("bad JSON: %v", err)
		}
		name := tok.(string) // object keys are strings
		if base, ok := strings.CutSuffix(name, typeSuffix); ok && base != "" {
			v, err := refScalar(dec, name)
			if err != nil {
				return nil, false, false, err
			}
			t, ok := v.(string)
			if !ok {
				return nil, false, false, ErrInvalidInput.with("%s is not a string", name)
			}
			if _, dup := annots[base]; dup {
				return nil, false, false, ErrDuplicatePropertiesSpecified.with("%s appears twice", name)
			}
			annots[base] = t
			continue
		}
		if strings.HasPrefix(name, "odata.") || strings.Contains(name, "@odata.") || name == "Timestamp" {
			// Metadata a client echoes back, and the server-set
			// Timestamp: ignored, whatever the value.
			if err := refSkip(dec); err != nil {
				return nil, false, false, err
			}
			continue
		}
		v, err := refScalar(dec, name)
		if err != nil {
			return nil, false, false, err
		}
		if seen[name] {
			return nil, false, false, ErrDuplicatePropertiesSpecified.with("property %q appears twice", name)
		}
		seen[name] = true
		switch name {
		case "PartitionKey", "RowKey":
			s, ok := v.(string)
			if !ok {
				return nil, false, false, ErrInvalidInput.with("%s is not a string", name)
			}
			if name == "PartitionKey" {
				e.PartitionKey, hasPK = s, true
			} else {
				e.RowKey, hasRK = s, true
			}
			continue
		}
		props = append(props, raw{name, v})
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, false, false, ErrInvalidInput.with("bad JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false, false, ErrInvalidInput.with("data after the JSON object")
	}
	for base, t := range annots {
		switch {
		case base == "Timestamp":
		case base == "PartitionKey" || base == "RowKey":
			if t != "Edm.String" {
				return nil, false, false, ErrInvalidInput.with("%s must be Edm.String, not %s", base, t)
			}
		case !seen[base]:
			return nil, false, false, ErrInvalidInput.with("%s%s annotates a property the body does not have", base, typeSuffix)
		}
	}
	for _, p := range props {
		if p.val == nil {
			continue // the service does not store nulls: the property is absent
		}
		var v edm.Value
		if t, ok := annots[p.name]; ok {
			v, err = refTyped(p.name, t, p.val)
		} else {
			v, err = refInferred(p.name, p.val)
		}
		if err != nil {
			return nil, false, false, err
		}
		e.Props = append(e.Props, edm.Property{Name: p.name, Value: v})
	}
	return e, hasPK, hasRK, nil
}

// refScalar reads the value of the member name, which must not be an
// object or array.
func refScalar(dec *json.Decoder, name string) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, ErrInvalidInput.with("bad JSON: %v", err)
	}
	if _, ok := tok.(json.Delim); ok {
		return nil, ErrInvalidValueType.with("%q: objects and arrays are not property values", name)
	}
	return tok, nil
}

// refSkip reads and drops one JSON value of any shape.
func refSkip(dec *json.Decoder) error {
	depth := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return ErrInvalidInput.with("bad JSON: %v", err)
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
		if depth == 0 {
			return nil
		}
	}
}

// refInferred types an un-annotated value from its JSON kind: string →
// String, true/false → Boolean, an integer in int32 range → Int32, any
// other number → Double.
func refInferred(name string, val any) (edm.Value, error) {
	switch v := val.(type) {
	case string:
		return edm.Str(v), nil
	case bool:
		return edm.Bool(v), nil
	case json.Number:
		s := string(v)
		if !strings.ContainsAny(s, ".eE") {
			if i, err := strconv.ParseInt(s, 10, 32); err == nil {
				return edm.I32(int32(i)), nil
			}
		}
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return edm.Value{}, ErrInvalidInput.with("property %q: %s is not a Double", name, s)
		}
		return edm.F64(f), nil
	}
	return edm.Value{}, ErrInvalidValueType.with("property %q has an unsupported JSON value", name)
}

// refTyped reads a value by its @odata.type annotation.
func refTyped(name, typ string, val any) (edm.Value, error) {
	t, ok := edm.ParseType(typ)
	if !ok {
		return edm.Value{}, ErrInvalidInput.with("property %q: unsupported type %q", name, typ)
	}
	s, isStr := val.(string)
	num, isNum := val.(json.Number)
	bad := func() (edm.Value, error) {
		return edm.Value{}, ErrInvalidInput.with("property %q: %v is not a valid %s", name, val, t)
	}
	kind := func() (edm.Value, error) {
		return edm.Value{}, ErrInvalidValueType.with("property %q: a JSON %T cannot be %s", name, val, t)
	}
	switch t {
	case edm.String:
		if !isStr {
			return kind()
		}
		return edm.Str(s), nil
	case edm.Int32, edm.Int64:
		// Int64 travels as a string; the service also takes a JSON
		// number, and an Int32 as a string ("12345").
		switch {
		case isNum:
			s = string(num)
		case !isStr:
			return kind()
		}
		bits := 64
		if t == edm.Int32 {
			bits = 32
		}
		i, err := strconv.ParseInt(s, 10, bits)
		if err != nil {
			return bad()
		}
		if t == edm.Int32 {
			return edm.I32(int32(i)), nil
		}
		return edm.I64(i), nil
	case edm.Double:
		switch {
		case isNum:
			s = string(num)
		case !isStr:
			return kind()
		}
		switch s {
		case "NaN":
			return edm.F64(math.NaN()), nil
		case "Infinity", "INF":
			return edm.F64(math.Inf(1)), nil
		case "-Infinity", "-INF":
			return edm.F64(math.Inf(-1)), nil
		}
		if !isJSONNumber(s) {
			return bad()
		}
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return bad()
		}
		return edm.F64(f), nil
	case edm.Boolean:
		if b, ok := val.(bool); ok {
			return edm.Bool(b), nil
		}
		switch {
		case !isStr:
			return kind()
		case strings.EqualFold(s, "true"):
			return edm.Bool(true), nil
		case strings.EqualFold(s, "false"):
			return edm.Bool(false), nil
		}
		return bad()
	case edm.DateTime:
		if !isStr {
			return kind()
		}
		ts, err := ParseTime(s)
		if err != nil {
			var te *Error
			if errors.As(err, &te) {
				return edm.Value{}, te.with("property %q: %s", name, te.Detail)
			}
			return bad()
		}
		return edm.Time(ts), nil
	case edm.Guid:
		if !isStr {
			return kind()
		}
		if !isGUID(s) { // edm.ParseGUID panics on a misplaced fifth dash
			return bad()
		}
		g, err := edm.ParseGUID(s)
		if err != nil {
			return bad()
		}
		return g, nil
	case edm.Binary:
		if !isStr {
			return kind()
		}
		b, err := base64.StdEncoding.Strict().DecodeString(s)
		if err != nil {
			return bad()
		}
		return edm.Bin(b), nil
	}
	return bad()
}
