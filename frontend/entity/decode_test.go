package entity

import (
	"math"
	"testing"
	"time"

	"github.com/tabuladb/tabula/frontend/edm"
)

func TestDecodeJSONTypes(t *testing.T) {
	g, _ := edm.ParseGUID("c9da6455-213d-42c9-9a79-3e9149a57833")
	when := time.Date(2024, 5, 6, 7, 8, 9, 123456700, time.UTC)
	cases := []struct {
		name string
		prop string // JSON members after the keys
		want edm.Value
	}{
		{"string", `"X":"héllo ☃"`, edm.Str("héllo ☃")},
		{"string escapes", `"X":"a\"b\\c\u0001\ud83d\ude00"`, edm.Str("a\"b\\c\x01😀")},
		{"int32", `"X":42`, edm.I32(42)},
		{"int32 min", `"X":-2147483648`, edm.I32(math.MinInt32)},
		{"int32 max", `"X":2147483647`, edm.I32(math.MaxInt32)},
		{"past int32 is double", `"X":2147483648`, edm.F64(2147483648)},
		{"below int32 is double", `"X":-2147483649`, edm.F64(-2147483649)},
		{"decimal is double", `"X":3.25`, edm.F64(3.25)},
		{"integral decimal is double", `"X":3.0`, edm.F64(3)},
		{"exponent is double", `"X":1e3`, edm.F64(1000)},
		{"bool", `"X":false`, edm.Bool(false)},
		{"annotated string", `"X@odata.type":"Edm.String","X":"s"`, edm.Str("s")},
		{"annotated int32", `"X":7,"X@odata.type":"Edm.Int32"`, edm.I32(7)},
		{"int32 as string", `"X":"12345","X@odata.type":"Edm.Int32"`, edm.I32(12345)},
		{"int64", `"X@odata.type":"Edm.Int64","X":"9223372036854775807"`, edm.I64(math.MaxInt64)},
		{"int64 min", `"X@odata.type":"Edm.Int64","X":"-9223372036854775808"`, edm.I64(math.MinInt64)},
		{"int64 as number", `"X@odata.type":"Edm.Int64","X":9007199254740993`, edm.I64(9007199254740993)},
		{"double", `"X@odata.type":"Edm.Double","X":3`, edm.F64(3)},
		{"double as string", `"X@odata.type":"Edm.Double","X":"3.14"`, edm.F64(3.14)},
		{"NaN", `"X@odata.type":"Edm.Double","X":"NaN"`, edm.F64(math.NaN())},
		{"Infinity", `"X@odata.type":"Edm.Double","X":"Infinity"`, edm.F64(math.Inf(1))},
		{"-Infinity", `"X@odata.type":"Edm.Double","X":"-Infinity"`, edm.F64(math.Inf(-1))},
		{"INF", `"X@odata.type":"Edm.Double","X":"INF"`, edm.F64(math.Inf(1))},
		{"bool annotated", `"X@odata.type":"Edm.Boolean","X":true`, edm.Bool(true)},
		{"bool as string", `"X@odata.type":"Edm.Boolean","X":"False"`, edm.Bool(false)},
		{"datetime 7 digits", `"X@odata.type":"Edm.DateTime","X":"2024-05-06T07:08:09.1234567Z"`, edm.Time(when)},
		{"datetime no fraction", `"X@odata.type":"Edm.DateTime","X":"2021-07-13T00:00:00Z"`, edm.Time(time.Date(2021, 7, 13, 0, 0, 0, 0, time.UTC))},
		{"datetime 6 digits", `"X@odata.type":"Edm.DateTime","X":"2024-05-06T07:08:09.123456Z"`, edm.Time(time.Date(2024, 5, 6, 7, 8, 9, 123456000, time.UTC))},
		{"datetime offset", `"X@odata.type":"Edm.DateTime","X":"2024-05-06T09:08:09.1234567+02:00"`, edm.Time(when)},
		{"datetime no zone", `"X@odata.type":"Edm.DateTime","X":"2024-05-06T07:08:09.1234567"`, edm.Time(when)},
		{"guid", `"X@odata.type":"Edm.Guid","X":"C9DA6455-213D-42C9-9A79-3E9149A57833"`, g},
		{"binary", `"X@odata.type":"Edm.Binary","X":"AQIDBA=="`, edm.Bin([]byte{1, 2, 3, 4})},
		{"empty binary", `"X@odata.type":"Edm.Binary","X":""`, edm.Bin(nil)},
	}
	for _, c := range cases {
		body := `{"PartitionKey":"p","RowKey":"r",` + c.prop + `}`
		e, err := DecodeJSON([]byte(body))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if len(e.Props) != 1 || e.Props[0].Name != "X" || e.Props[0].Value.GoString() != c.want.GoString() {
			t.Errorf("%s: got %+v, want X=%#v", c.name, e.Props, c.want)
		}
	}
}

func TestDecodeJSONEntity(t *testing.T) {
	// What aztables Go v1.4.1 sends (with its zero Timestamp), plus
	// metadata a client echoed back and a null.
	body := `{"odata.etag":"W/\"x\"","odata.metadata":"m","Timestamp":"0001-01-01T00:00:00Z",
		"Timestamp@odata.type":"Edm.DateTime","Zed":1,"PartitionKey":"pk","PartitionKey@odata.type":"Edm.String",
		"Nul":null,"Nul@odata.type":"Edm.Guid","RowKey":"rk","Alpha":"a","Obj@odata.mediaEditLink":{"x":[1,2]}}`
	e, err := DecodeJSON([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	want := &edm.Entity{PartitionKey: "pk", RowKey: "rk", Props: []edm.Property{
		{Name: "Zed", Value: edm.I32(1)}, {Name: "Alpha", Value: edm.Str("a")}}}
	if d := sameEntity(e, want, true); d != "" {
		t.Fatal(d)
	}
	// Keys from the URL.
	e, hasPK, hasRK, err := DecodeJSONKeysOptional([]byte(`{"A":1,"RowKey":"r"}`))
	if err != nil || hasPK || !hasRK || e.RowKey != "r" || len(e.Props) != 1 {
		t.Fatalf("keys optional: %+v %t %t %v", e, hasPK, hasRK, err)
	}
}

func TestDecodeJSONErrors(t *testing.T) {
	cases := []struct {
		name, body, code string
	}{
		{"not json", `not json`, "InvalidInput"},
		{"array", `[1]`, "InvalidInput"},
		{"empty", ``, "InvalidInput"},
		{"truncated", `{"PartitionKey":"p","RowKey":"r","A":1`, "InvalidInput"},
		{"trailing", `{"PartitionKey":"p","RowKey":"r"} {}`, "InvalidInput"},
		{"no partition key", `{"RowKey":"r"}`, "PropertiesNeedValue"},
		{"no row key", `{"PartitionKey":"p"}`, "PropertiesNeedValue"},
		{"numeric row key", `{"PartitionKey":"p","RowKey":1}`, "InvalidInput"},
		{"bool row key", `{"PartitionKey":"p","RowKey":true}`, "InvalidInput"},
		{"typed row key", `{"PartitionKey":"p","RowKey":"3.14","RowKey@odata.type":"Edm.Double"}`, "InvalidInput"},
		{"duplicate property", `{"PartitionKey":"p","RowKey":"r","A":1,"A":2}`, "DuplicatePropertiesSpecified"},
		{"duplicate key", `{"PartitionKey":"p","RowKey":"r","RowKey":"s"}`, "DuplicatePropertiesSpecified"},
		{"duplicate annotation", `{"PartitionKey":"p","RowKey":"r","A":"1","A@odata.type":"Edm.Int64","A@odata.type":"Edm.Int64"}`, "DuplicatePropertiesSpecified"},
		{"annotation without property", `{"PartitionKey":"p","RowKey":"r","A@odata.type":"Edm.Int64"}`, "InvalidInput"},
		{"annotation not a string", `{"PartitionKey":"p","RowKey":"r","A":1,"A@odata.type":3}`, "InvalidInput"},
		{"unknown type", `{"PartitionKey":"p","RowKey":"r","A":1,"A@odata.type":"Edm.Single"}`, "InvalidInput"},
		{"int64 overflow", `{"PartitionKey":"p","RowKey":"r","A":"9223372036854775808","A@odata.type":"Edm.Int64"}`, "InvalidInput"},
		{"int64 decimal", `{"PartitionKey":"p","RowKey":"r","A":"1.5","A@odata.type":"Edm.Int64"}`, "InvalidInput"},
		{"int32 overflow", `{"PartitionKey":"p","RowKey":"r","A":2147483648,"A@odata.type":"Edm.Int32"}`, "InvalidInput"},
		{"int32 from bool", `{"PartitionKey":"p","RowKey":"r","A":true,"A@odata.type":"Edm.Int32"}`, "InvalidValueType"},
		{"double word", `{"PartitionKey":"p","RowKey":"r","A":"nan","A@odata.type":"Edm.Double"}`, "InvalidInput"},
		{"double hex", `{"PartitionKey":"p","RowKey":"r","A":"0x10","A@odata.type":"Edm.Double"}`, "InvalidInput"},
		{"double overflow", `{"PartitionKey":"p","RowKey":"r","A":1e400}`, "InvalidInput"},
		{"bool word", `{"PartitionKey":"p","RowKey":"r","A":"yes","A@odata.type":"Edm.Boolean"}`, "InvalidInput"},
		{"guid bad", `{"PartitionKey":"p","RowKey":"r","A":"c9da6455-213d-42c9-9a79","A@odata.type":"Edm.Guid"}`, "InvalidInput"},
		{"guid fifth dash", `{"PartitionKey":"p","RowKey":"r","A":"c9da6455-213d-42c9-9a79-2024-9a57833","A@odata.type":"Edm.Guid"}`, "InvalidInput"},
		{"guid number", `{"PartitionKey":"p","RowKey":"r","A":5,"A@odata.type":"Edm.Guid"}`, "InvalidValueType"},
		{"binary bad", `{"PartitionKey":"p","RowKey":"r","A":"AQID*A==","A@odata.type":"Edm.Binary"}`, "InvalidInput"},
		{"binary unpadded", `{"PartitionKey":"p","RowKey":"r","A":"AQIDBA","A@odata.type":"Edm.Binary"}`, "InvalidInput"},
		{"datetime bad", `{"PartitionKey":"p","RowKey":"r","A":"2024-13-01T00:00:00Z","A@odata.type":"Edm.DateTime"}`, "InvalidInput"},
		{"datetime 8 digits", `{"PartitionKey":"p","RowKey":"r","A":"2024-01-01T00:00:00.12345678Z","A@odata.type":"Edm.DateTime"}`, "InvalidInput"},
		{"datetime feb 30", `{"PartitionKey":"p","RowKey":"r","A":"2024-02-30T00:00:00Z","A@odata.type":"Edm.DateTime"}`, "InvalidInput"},
		{"datetime out of range", `{"PartitionKey":"p","RowKey":"r","A":"1600-12-31T23:59:59.9999999Z","A@odata.type":"Edm.DateTime"}`, "OutOfRangeInput"},
		{"datetime before year 1", `{"PartitionKey":"p","RowKey":"r","A":"0000-12-31T23:59:59Z","A@odata.type":"Edm.DateTime"}`, "OutOfRangeInput"},
		{"object value", `{"PartitionKey":"p","RowKey":"r","A":{"b":1}}`, "InvalidValueType"},
		{"array annotation", `{"T@odata.type":[`, "InvalidValueType"},
		{"array value", `{"PartitionKey":"p","RowKey":"r","A":[1]}`, "InvalidValueType"},
	}
	for _, c := range cases {
		_, err := DecodeJSON([]byte(c.body))
		wantCode(t, c.name, err, c.code)
	}
}
