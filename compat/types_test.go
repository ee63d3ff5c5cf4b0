package compat

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/data/aztables"
)

var (
	when    = time.Date(2024, 5, 6, 7, 8, 9, 123456700, time.UTC) // 7 fractional digits
	guid    = aztables.EDMGUID("c9da6455-213d-42c9-9a79-3e9149a57833")
	allByte = func() []byte {
		b := make([]byte, 256)
		for i := range b {
			b[i] = byte(i)
		}
		return b
	}()
)

// typedProps holds one property of every Edm type, and edge values.
func typedProps() map[string]any {
	return map[string]any{
		"Str":        "hello 'world' \"quoted\" ü 日本語 🎉 \\ \n\t end",
		"Empty":      "",
		"Int32":      int32(42),
		"Int32Max":   int32(math.MaxInt32),
		"Int32Min":   int32(math.MinInt32),
		"Int64":      aztables.EDMInt64(1<<53 + 1), // not representable as a double
		"Int64Min":   aztables.EDMInt64(math.MinInt64),
		"Int64Max":   aztables.EDMInt64(math.MaxInt64),
		"Double":     3.25,
		"DoubleNeg":  -1.5e-300,
		"DoubleBig":  1.7976931348623157e308,
		"BoolT":      true,
		"BoolF":      false,
		"When":       aztables.EDMDateTime(when),
		"WhenOld":    aztables.EDMDateTime(time.Date(1601, 1, 1, 0, 0, 0, 0, time.UTC)),
		"WhenLate":   aztables.EDMDateTime(time.Date(9999, 12, 31, 23, 59, 59, 999999900, time.UTC)),
		"Guid":       guid,
		"Bin":        aztables.EDMBinary([]byte{0, 1, 0xfe, 0xff}),
		"BinAll":     aztables.EDMBinary(allByte),
		"CamelCase_": "names are case-sensitive",
		"camelcase_": "a different property",
	}
}

// checkTyped compares what came back with typedProps, value and type.
func checkTyped(t *testing.T, where string, got map[string]any) {
	t.Helper()
	for k, want := range typedProps() {
		g, ok := got[k]
		if !ok {
			t.Errorf("%s: %s missing", where, k)
			continue
		}
		switch w := want.(type) {
		case aztables.EDMDateTime:
			gd, ok := g.(aztables.EDMDateTime)
			if !ok || !time.Time(gd).Equal(time.Time(w)) {
				t.Errorf("%s: %s = %#v (%T), want %v", where, k, g, g, time.Time(w))
			}
		case aztables.EDMBinary:
			gb, ok := g.(aztables.EDMBinary)
			if !ok || !bytes.Equal(gb, w) {
				t.Errorf("%s: %s = %#v (%T), want %v", where, k, g, g, w)
			}
		case aztables.EDMGUID:
			gg, ok := g.(aztables.EDMGUID)
			if !ok || !strings.EqualFold(string(gg), string(w)) {
				t.Errorf("%s: %s = %#v (%T), want %v", where, k, g, g, w)
			}
		default:
			if g != want {
				t.Errorf("%s: %s = %#v (%T), want %#v (%T)", where, k, g, g, want, want)
			}
		}
	}
}

// TestEdmRoundTrip: every Edm type written through the SDK reads back
// with its value and type, by Get Entity and by Query Entities.
func TestEdmRoundTrip(t *testing.T) {
	t.Parallel()
	c := newTable(t)
	add(t, c, ent("p", "r", typedProps()))
	e, _ := get(t, c, "p", "r")
	checkTyped(t, "get", e.Properties)
	ps := query(t, c, nil)
	if k := keys(ps); len(k) != 1 {
		t.Fatalf("query: %v", k)
	}
	checkTyped(t, "query", ps[0].entities[0].Properties)

	// Minimal metadata annotates Int64, DateTime, Guid and Binary, and
	// keeps 7 fractional digits of a DateTime.
	raw := getRaw(t, c, "p", "r", nil)
	for k, typ := range map[string]string{"Int64": "Edm.Int64", "When": "Edm.DateTime", "Guid": "Edm.Guid", "Bin": "Edm.Binary"} {
		if string(raw[k+"@odata.type"]) != `"`+typ+`"` {
			t.Errorf("%s@odata.type = %s, want %q", k, raw[k+"@odata.type"], typ)
		}
	}
	if string(raw["Int64"]) != `"9007199254740993"` {
		t.Errorf("Int64 on the wire: %s", raw["Int64"])
	}
	if string(raw["When"]) != `"2024-05-06T07:08:09.1234567Z"` {
		t.Errorf("DateTime on the wire: %s", raw["When"])
	}
}

// TestEdmDoubleSpecials: a Double that is integral, NaN and the
// infinities. encoding/json cannot write NaN or ±Inf and writes 2.0 as 2
// (an Int32), so the SDK user sends these with an Edm.Double annotation,
// the values as the service's strings; they read back as Doubles.
func TestEdmDoubleSpecials(t *testing.T) {
	t.Parallel()
	c := newTable(t)
	body := `{"PartitionKey":"p","RowKey":"r",` +
		`"Whole":2,"Whole@odata.type":"Edm.Double",` +
		`"NaN":"NaN","NaN@odata.type":"Edm.Double",` +
		`"Inf":"Infinity","Inf@odata.type":"Edm.Double",` +
		`"NegInf":"-Infinity","NegInf@odata.type":"Edm.Double",` +
		`"NegZero":-0.0,"NegZero@odata.type":"Edm.Double"}`
	if _, err := c.AddEntity(testCtx(t), []byte(body), nil); err != nil {
		t.Fatalf("add: %v", err)
	}
	raw := getRaw(t, c, "p", "r", nil)
	// The specials come back as strings annotated Edm.Double. An integral
	// Double comes back as a bare JSON number, unannotated, from the
	// service as from Azurite (azure-sdk-for-js #19899, Azurite #1366):
	// not checked here, but its stored type is, by the filter below.
	want := map[string]float64{"Whole": 2, "NaN": math.NaN(), "Inf": math.Inf(1), "NegInf": math.Inf(-1)}
	for k, w := range want {
		if a := string(raw[k+"@odata.type"]); a != `"Edm.Double"` && (k != "Whole" || a != "") {
			t.Errorf("%s: annotation %s, want \"Edm.Double\" (value %s)", k, raw[k+"@odata.type"], raw[k])
			continue
		}
		got, err := parseDouble(raw[k])
		if err != nil {
			t.Errorf("%s: %s: %v", k, raw[k], err)
			continue
		}
		if !(got == w || math.IsNaN(got) && math.IsNaN(w)) {
			t.Errorf("%s = %v, want %v", k, got, w)
		}
	}
	// Stored as a Double: the Double literal 2.0 matches. (Whether an
	// Int32 literal matches a Double is not checked: the docs only say a
	// constant of another type does not give "valid results"; Azurite
	// compares the numbers.)
	if k := keys(query(t, c, filterOpts("Whole eq 2.0"))); len(k) != 1 {
		t.Errorf("Whole eq 2.0: %v", k)
	}
}

// parseDouble reads a Double as the service writes it: a JSON number, or
// a string ("NaN", "Infinity", "-Infinity", or a number).
func parseDouble(raw json.RawMessage) (float64, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "NaN":
			return math.NaN(), nil
		case "Infinity", "INF":
			return math.Inf(1), nil
		case "-Infinity", "-INF":
			return math.Inf(-1), nil
		}
		raw = json.RawMessage(s)
	}
	var f float64
	err := json.Unmarshal(raw, &f)
	return f, err
}
