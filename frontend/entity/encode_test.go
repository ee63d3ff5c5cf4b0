package entity

import (
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/tabuladb/tabula/frontend/edm"
)

func goldenEntity() *edm.Entity {
	g, _ := edm.ParseGUID("c9da6455-213d-42c9-9a79-3e9149a57833")
	return &edm.Entity{
		PartitionKey: "p1",
		RowKey:       "r'1 x",
		Timestamp:    time.Date(2024, 5, 6, 7, 8, 9, 123456700, time.UTC),
		Props: []edm.Property{
			{Name: "S", Value: edm.Str("hi \"you\"\n")},
			{Name: "I", Value: edm.I32(-42)},
			{Name: "L", Value: edm.I64(9007199254740993)},
			{Name: "D", Value: edm.F64(3)},
			{Name: "F", Value: edm.F64(0.5)},
			{Name: "N", Value: edm.F64(math.NaN())},
			{Name: "B", Value: edm.Bool(true)},
			{Name: "T", Value: edm.Time(time.Date(2021, 7, 13, 0, 0, 0, 0, time.UTC))},
			{Name: "G", Value: g},
			{Name: "Bin", Value: edm.Bin([]byte{1, 2, 3, 4})},
		},
	}
}

const base = "http://127.0.0.1:10002/devstoreaccount1"

func TestAppendJSONGolden(t *testing.T) {
	opts := JSONOptions{BaseURL: base, Account: "devstoreaccount1", Table: "t1"}
	cases := []struct {
		name string
		meta Metadata
		sel  []string
		want string
	}{
		{"nometadata", NoMetadata, nil,
			`{"PartitionKey":"p1","RowKey":"r'1 x","Timestamp":"2024-05-06T07:08:09.1234567Z",` +
				`"S":"hi \"you\"\n","I":-42,"L":"9007199254740993","D":3.0,"F":0.5,"N":"NaN","B":true,` +
				`"T":"2021-07-13T00:00:00.0000000Z","G":"c9da6455-213d-42c9-9a79-3e9149a57833","Bin":"AQIDBA=="}`},
		{"minimalmetadata", MinimalMetadata, nil,
			`{"odata.metadata":"http://127.0.0.1:10002/devstoreaccount1/$metadata#t1/@Element",` +
				`"odata.etag":"W/\"datetime'2024-05-06T07%3A08%3A09.1234567Z'\"",` +
				`"PartitionKey":"p1","RowKey":"r'1 x","Timestamp":"2024-05-06T07:08:09.1234567Z",` +
				`"S":"hi \"you\"\n","I":-42,"L@odata.type":"Edm.Int64","L":"9007199254740993","D":3.0,"F":0.5,` +
				`"N@odata.type":"Edm.Double","N":"NaN","B":true,` +
				`"T@odata.type":"Edm.DateTime","T":"2021-07-13T00:00:00.0000000Z",` +
				`"G@odata.type":"Edm.Guid","G":"c9da6455-213d-42c9-9a79-3e9149a57833",` +
				`"Bin@odata.type":"Edm.Binary","Bin":"AQIDBA=="}`},
		{"fullmetadata", FullMetadata, nil,
			`{"odata.metadata":"http://127.0.0.1:10002/devstoreaccount1/$metadata#t1/@Element",` +
				`"odata.type":"devstoreaccount1.t1",` +
				`"odata.id":"http://127.0.0.1:10002/devstoreaccount1/t1(PartitionKey='p1',RowKey='r''1%20x')",` +
				`"odata.etag":"W/\"datetime'2024-05-06T07%3A08%3A09.1234567Z'\"",` +
				`"odata.editLink":"t1(PartitionKey='p1',RowKey='r''1%20x')",` +
				`"PartitionKey":"p1","RowKey":"r'1 x","Timestamp@odata.type":"Edm.DateTime","Timestamp":"2024-05-06T07:08:09.1234567Z",` +
				`"S":"hi \"you\"\n","I":-42,"L@odata.type":"Edm.Int64","L":"9007199254740993","D":3.0,"F":0.5,` +
				`"N@odata.type":"Edm.Double","N":"NaN","B":true,` +
				`"T@odata.type":"Edm.DateTime","T":"2021-07-13T00:00:00.0000000Z",` +
				`"G@odata.type":"Edm.Guid","G":"c9da6455-213d-42c9-9a79-3e9149a57833",` +
				`"Bin@odata.type":"Edm.Binary","Bin":"AQIDBA=="}`},
		{"select minimal", MinimalMetadata, []string{"L", " Missing", "RowKey", "L", "Missing"},
			`{"odata.metadata":"http://127.0.0.1:10002/devstoreaccount1/$metadata#t1/@Element",` +
				`"odata.etag":"W/\"datetime'2024-05-06T07%3A08%3A09.1234567Z'\"",` +
				`"RowKey":"r'1 x","L@odata.type":"Edm.Int64","L":"9007199254740993","Missing":null}`},
		{"select nometadata", NoMetadata, []string{"I", "Timestamp"},
			`{"Timestamp":"2024-05-06T07:08:09.1234567Z","I":-42}`},
		{"select star", NoMetadata, []string{"*"},
			`{"PartitionKey":"p1","RowKey":"r'1 x","Timestamp":"2024-05-06T07:08:09.1234567Z",` +
				`"S":"hi \"you\"\n","I":-42,"L":"9007199254740993","D":3.0,"F":0.5,"N":"NaN","B":true,` +
				`"T":"2021-07-13T00:00:00.0000000Z","G":"c9da6455-213d-42c9-9a79-3e9149a57833","Bin":"AQIDBA=="}`},
	}
	for _, c := range cases {
		o := opts
		o.Metadata, o.Select = c.meta, c.sel
		got := string(AppendJSON(nil, goldenEntity(), o))
		if got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, got, c.want)
		}
		if !json.Valid([]byte(got)) {
			t.Errorf("%s: invalid JSON", c.name)
		}
	}
}

func TestAppendFeed(t *testing.T) {
	e := &edm.Entity{PartitionKey: "p", RowKey: "r", Timestamp: time.Date(2021, 8, 31, 15, 42, 5, 838226300, time.UTC),
		Props: []edm.Property{{Name: "A", Value: edm.I32(1)}}}
	opts := JSONOptions{BaseURL: "https://acct.table.core.windows.net", Account: "acct", Table: "tbl"}
	got := string(AppendFeed(nil, []*edm.Entity{e, e}, opts))
	el := `{"odata.etag":"W/\"datetime'2021-08-31T15%3A42%3A05.8382263Z'\"","PartitionKey":"p","RowKey":"r","Timestamp":"2021-08-31T15:42:05.8382263Z","A":1}`
	want := `{"odata.metadata":"https://acct.table.core.windows.net/$metadata#tbl","value":[` + el + `,` + el + `]}`
	if got != want {
		t.Errorf("minimal feed:\n got %s\nwant %s", got, want)
	}
	opts.Metadata = NoMetadata
	if got := string(AppendFeed(nil, nil, opts)); got != `{"value":[]}` {
		t.Errorf("empty feed %s", got)
	}
	opts.Metadata = FullMetadata
	got = string(AppendFeed(nil, []*edm.Entity{e}, opts))
	want = `{"odata.metadata":"https://acct.table.core.windows.net/$metadata#tbl","value":[{"odata.type":"acct.tbl",` +
		`"odata.id":"https://acct.table.core.windows.net/tbl(PartitionKey='p',RowKey='r')",` +
		`"odata.etag":"W/\"datetime'2021-08-31T15%3A42%3A05.8382263Z'\"","odata.editLink":"tbl(PartitionKey='p',RowKey='r')",` +
		`"PartitionKey":"p","RowKey":"r","Timestamp@odata.type":"Edm.DateTime","Timestamp":"2021-08-31T15:42:05.8382263Z","A":1}]}`
	if got != want {
		t.Errorf("full feed:\n got %s\nwant %s", got, want)
	}
}

func TestAppendDouble(t *testing.T) {
	cases := []struct {
		f    float64
		want string
	}{
		{0, "0.0"}, {math.Copysign(0, -1), "-0.0"}, {3, "3.0"}, {-17, "-17.0"}, {0.1, "0.1"},
		{1e20, "100000000000000000000.0"}, {1e21, "1e+21"}, {1e-7, "1e-07"}, {123.456, "123.456"},
		{math.MaxFloat64, "1.7976931348623157e+308"}, {math.SmallestNonzeroFloat64, "5e-324"},
		{math.Inf(1), `"Infinity"`}, {math.Inf(-1), `"-Infinity"`}, {math.NaN(), `"NaN"`},
	}
	for _, c := range cases {
		if got := string(appendDouble(nil, c.f)); got != c.want {
			t.Errorf("appendDouble(%g) = %s, want %s", c.f, got, c.want)
		}
	}
}

func TestAppendString(t *testing.T) {
	got := string(appendString(nil, "a\x00\x1f\"\\\u2028é😀\xff<>&"))
	want := `"a\u0000\u001f\"\\\u2028é😀\ufffd<>&"`
	if got != want {
		t.Errorf("got %s want %s", got, want)
	}
	var s string
	if err := json.Unmarshal([]byte(got), &s); err != nil || s != "a\x00\x1f\"\\\u2028é😀\uFFFD<>&" {
		t.Errorf("round trip %q %v", s, err)
	}
}

func TestParseAccept(t *testing.T) {
	cases := []struct {
		accept, format string
		want           Metadata
		code           string
	}{
		{"", "", MinimalMetadata, ""},
		{"application/json", "", MinimalMetadata, ""},
		{"application/json;odata=nometadata", "", NoMetadata, ""},
		{"application/json; odata=minimalmetadata", "", MinimalMetadata, ""},
		{"Application/JSON;odata=FullMetadata;charset=utf-8", "", FullMetadata, ""},
		{"application/json;odata=minimalmetadata", "application/json;odata=nometadata", NoMetadata, ""},
		{"", "json", MinimalMetadata, ""},
		{"application/atom+xml,application/xml", "", 0, "AtomFormatNotSupported"},
		{"application/atom+xml, application/json;odata=fullmetadata", "", FullMetadata, ""},
		{"application/json", "atom", 0, "AtomFormatNotSupported"},
		{"application/json;odata=verbose", "", 0, "JsonFormatNotSupported"},
		{"*/*", "", MinimalMetadata, ""},
		{"text/html", "", MinimalMetadata, ""},
	}
	for _, c := range cases {
		got, err := ParseAccept(c.accept, c.format)
		wantCode(t, c.accept+" / "+c.format, err, c.code)
		if err == nil && got != c.want {
			t.Errorf("ParseAccept(%q, %q) = %v, want %v", c.accept, c.format, got, c.want)
		}
	}
	if ct := NoMetadata.ContentType(); ct != "application/json;odata=nometadata;streaming=true;charset=utf-8" {
		t.Errorf("content type %s", ct)
	}
}

// TestJSONRoundTrip: entity → JSON → entity is exact at minimal and
// full metadata (the Timestamp is the server's, not read back), and
// JSON → entity → JSON is stable.
func TestJSONRoundTrip(t *testing.T) {
	r := seeded(t)
	for i := 0; i < 2000; i++ {
		e := randEntity(r)
		for _, m := range []Metadata{MinimalMetadata, FullMetadata} {
			out := AppendJSON(nil, e, JSONOptions{Metadata: m, BaseURL: base, Account: "a", Table: "t"})
			got, err := DecodeJSON(out)
			if err != nil {
				t.Fatalf("%v: decode %s: %v", m, out, err)
			}
			if d := sameEntity(e, got, false); d != "" {
				t.Fatalf("%v: %s\n%s", m, d, out)
			}
			got.Timestamp = e.Timestamp
			if again := AppendJSON(nil, got, JSONOptions{Metadata: m, BaseURL: base, Account: "a", Table: "t"}); string(again) != string(out) {
				t.Fatalf("%v: unstable:\n%s\n%s", m, out, again)
			}
		}
	}
}

// Address is odata.id's URL: quotes in keys doubled, the rest
// percent-encoded, so it fits a header (a batch's Location).
func TestAddress(t *testing.T) {
	for _, c := range []struct{ pk, rk, want string }{
		{"p", "r", "http://127.0.0.1:10002/devstoreaccount1/t1(PartitionKey='p',RowKey='r')"},
		{"it's", "a''b", "http://127.0.0.1:10002/devstoreaccount1/t1(PartitionKey='it''s',RowKey='a''''b')"},
		{"%partition", "r 1\tü", "http://127.0.0.1:10002/devstoreaccount1/t1(PartitionKey='%25partition',RowKey='r%201%09%C3%BC')"},
		{"", "", "http://127.0.0.1:10002/devstoreaccount1/t1(PartitionKey='',RowKey='')"},
	} {
		if got := Address("http://127.0.0.1:10002/devstoreaccount1", "t1", c.pk, c.rk); got != c.want {
			t.Errorf("Address(%q, %q) = %s, want %s", c.pk, c.rk, got, c.want)
		}
	}
}
