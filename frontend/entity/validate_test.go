package entity

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tabuladb/tabula/frontend/edm"
)

func props(n int) []edm.Property {
	ps := make([]edm.Property, n)
	for i := range ps {
		ps[i] = edm.Property{Name: fmt.Sprintf("P%d", i), Value: edm.Bool(true)}
	}
	return ps
}

func TestValidateLimits(t *testing.T) {
	e := func(pk, rk string, ps ...edm.Property) *edm.Entity {
		return &edm.Entity{PartitionKey: pk, RowKey: rk, Props: ps}
	}
	prop := func(name string, v edm.Value) edm.Property { return edm.Property{Name: name, Value: v} }
	emoji := strings.Repeat("😀", MaxStringUnits/2) // two UTF-16 units each
	cases := []struct {
		name string
		e    *edm.Entity
		code string
	}{
		{"empty keys", e("", ""), ""},
		{"252 properties", &edm.Entity{Props: props(252)}, ""},
		{"253 properties", &edm.Entity{Props: props(253)}, "TooManyProperties"},
		{"name 255", e("p", "r", prop(strings.Repeat("a", 255), edm.I32(1))), ""},
		{"name 256", e("p", "r", prop(strings.Repeat("a", 256), edm.I32(1))), "PropertyNameTooLong"},
		{"string 32768", e("p", "r", prop("S", edm.Str(strings.Repeat("a", MaxStringUnits)))), ""},
		{"string 32769", e("p", "r", prop("S", edm.Str(strings.Repeat("a", MaxStringUnits+1)))), "PropertyValueTooLarge"},
		{"string 32768 units of pairs", e("p", "r", prop("S", edm.Str(emoji))), ""},
		{"string 32769 units of pairs", e("p", "r", prop("S", edm.Str(emoji+"a"))), "PropertyValueTooLarge"},
		{"string of 32768 two-byte chars", e("p", "r", prop("S", edm.Str(strings.Repeat("é", MaxStringUnits)))), ""},
		{"binary 65536", e("p", "r", prop("B", edm.Bin(make([]byte, MaxBinaryBytes)))), ""},
		{"binary 65537", e("p", "r", prop("B", edm.Bin(make([]byte, MaxBinaryBytes+1)))), "PropertyValueTooLarge"},
		{"pk 512", e(strings.Repeat("k", 512), "r"), ""},
		{"pk 513", e(strings.Repeat("k", 513), "r"), "InvalidInput"},
		{"rk 512 units", e("p", strings.Repeat("😀", 256)), ""},
		{"rk 513 units", e("p", strings.Repeat("😀", 256)+"x"), "InvalidInput"},
		{"key slash", e("p/1", "r"), "InvalidInput"},
		{"key backslash", e("p", `r\`), "InvalidInput"},
		{"key hash", e("p", "r#"), "InvalidInput"},
		{"key question", e("?", "r"), "InvalidInput"},
		{"key tab", e("p\t", "r"), "InvalidInput"},
		{"key nul", e("p\x00", "r"), "InvalidInput"},
		{"key DEL", e("p\x7f", "r"), "InvalidInput"},
		{"key U+009F", e("p\u009f", "r"), "InvalidInput"},
		{"key U+00A0", e("p\u00a0", "r"), ""},
		{"key bad utf8", e("p\xff", "r"), "InvalidInput"},
		{"key U+FFFD", e("p\uFFFD", "r"), ""},
		{"key quote and unicode", e("it's 😀", "r'@*$!%"), ""},
		{"name digit first", e("p", "r", prop("123", edm.I32(1))), "PropertyNameInvalid"},
		{"name dash", e("p", "r", prop("a-b", edm.I32(1))), "PropertyNameInvalid"},
		{"name dot", e("p", "r", prop("a.b", edm.I32(1))), "PropertyNameInvalid"},
		{"name space", e("p", "r", prop("a b", edm.I32(1))), "PropertyNameInvalid"},
		{"name empty", e("p", "r", prop("", edm.I32(1))), "PropertyNameInvalid"},
		{"name system", e("p", "r", prop("Timestamp", edm.I32(1))), "PropertyNameInvalid"},
		{"name underscore digits", e("p", "r", prop("_1", edm.I32(1))), ""},
		{"name unicode", e("p", "r", prop("Größe名前", edm.I32(1))), ""},
		{"name ETag", e("p", "r", prop("ETag", edm.I32(1))), ""},
		{"duplicate", e("p", "r", prop("A", edm.I32(1)), prop("A", edm.I32(2))), "DuplicatePropertiesSpecified"},
		{"case differs", e("p", "r", prop("A", edm.I32(1)), prop("a", edm.I32(2))), ""},
		{"invalid value", e("p", "r", prop("A", edm.Value{})), "InvalidValueType"},
	}
	for _, c := range cases {
		wantCode(t, c.name, Validate(c.e), c.code)
	}
}

func TestValidateEntitySize(t *testing.T) {
	// Fifteen 64 KiB binaries, then one more sized to land exactly on
	// 1 MiB: that passes, one byte more does not.
	e := &edm.Entity{PartitionKey: "pk", RowKey: "rk"}
	for i := 0; i < 15; i++ {
		e.Props = append(e.Props, edm.Property{Name: fmt.Sprintf("B%02d", i), Value: edm.Bin(make([]byte, MaxBinaryBytes))})
	}
	rest := MaxEntitySize - Size(e) - (8 + 2*1 + 4) // the last property "X": 8 + name + length + 4
	if rest < 0 || rest > MaxBinaryBytes {
		t.Fatalf("bad arithmetic: %d", rest)
	}
	e.Props = append(e.Props, edm.Property{Name: "X", Value: edm.Bin(make([]byte, rest))})
	if Size(e) != MaxEntitySize {
		t.Fatalf("size %d", Size(e))
	}
	wantCode(t, "exactly 1 MiB", Validate(e), "")
	e.Props[15].Value = edm.Bin(make([]byte, rest+1))
	wantCode(t, "1 MiB + 1", Validate(e), "EntityTooLarge")

	// The formula, by hand: 4 + 2*2 (pk) + 2*1 (rk) + S: 8+2+(2*3+4) + I: 8+2+4 + L: 8+2+8 + G: 8+2+16 + B: 8+2+1 + Bin: 8+6+(2+4).
	g, _ := edm.ParseGUID("c9da6455-213d-42c9-9a79-3e9149a57833")
	small := &edm.Entity{PartitionKey: "pk", RowKey: "r", Props: []edm.Property{
		{Name: "S", Value: edm.Str("a😀")}, {Name: "I", Value: edm.I32(1)}, {Name: "L", Value: edm.I64(1)},
		{Name: "G", Value: g}, {Name: "B", Value: edm.Bool(true)}, {Name: "Bin", Value: edm.Bin([]byte{1, 2})}}}
	want := int64(4 + 4 + 2 + (8 + 2 + 10) + (8 + 2 + 4) + (8 + 2 + 8) + (8 + 2 + 16) + (8 + 2 + 1) + (8 + 6 + 6))
	if got := Size(small); got != want {
		t.Errorf("Size = %d, want %d", got, want)
	}
}

func TestValidateTableName(t *testing.T) {
	cases := map[string]string{
		"abc": "", "A1b2": "", strings.Repeat("t", 63): "",
		"ab": "InvalidResourceName", strings.Repeat("t", 64): "InvalidResourceName", "1ab": "InvalidResourceName",
		"a-b": "InvalidResourceName", "a_b": "InvalidResourceName", "tables": "InvalidResourceName",
		"Tables": "InvalidResourceName", "TABLES": "InvalidResourceName", "tables1": "", "täble": "InvalidResourceName",
	}
	for name, code := range cases {
		wantCode(t, name, ValidateTableName(name), code)
	}
}

func TestErrorIs(t *testing.T) {
	err := Validate(&edm.Entity{Props: props(300)})
	if !errorsIs(err, ErrTooManyProperties) || errorsIs(err, ErrEntityTooLarge) {
		t.Fatalf("errors.Is by code broken: %v", err)
	}
	var e *Error
	if !errorsAs(err, &e) || e.Status != 400 || e.Message != ErrTooManyProperties.Message || e.Detail == "" {
		t.Fatalf("errors.As: %+v", e)
	}
}
