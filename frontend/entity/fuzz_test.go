package entity

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/tabuladb/tabula/frontend/edm"
)

var jsonSeeds = []string{
	`{"PartitionKey":"p","RowKey":"r","A":1,"B":"x","C":true,"D":2.5}`,
	`{"PartitionKey":"p","RowKey":"r","L@odata.type":"Edm.Int64","L":"-9223372036854775808","N":"NaN","N@odata.type":"Edm.Double"}`,
	`{"PartitionKey":"p","RowKey":"r","T@odata.type":"Edm.DateTime","T":"2024-05-06T07:08:09.1234567Z","G":"c9da6455-213d-42c9-9a79-3e9149a57833","G@odata.type":"Edm.Guid"}`,
	`{"odata.etag":"x","PartitionKey":"p","RowKey":"r","Bin@odata.type":"Edm.Binary","Bin":"AQIDBA==","Nul":null,"Timestamp":"0001-01-01T00:00:00Z"}`,
	`{"PartitionKey":"p","RowKey":"r","A":2147483648,"B":"12","B@odata.type":"Edm.Int32","C":"False","C@odata.type":"Edm.Boolean"}`,
	`{"PartitionKey":"p","RowKey":"r","A":1,"A":2}`,
	`{"PartitionKey":"p","RowKey":"r","A":{"x":[1,{}]}}`,
	`{"PartitionKey":1}`,
	`[`, ``,
}

// FuzzDecodeJSON: DecodeJSON never panics, fails only with an *Error,
// and what it accepts survives encode → decode unchanged, in JSON and
// in the storage encoding.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range jsonSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		e, err := DecodeJSON(body)
		if err != nil {
			var ee *Error
			if !errors.As(err, &ee) {
				t.Fatalf("error %v is not an *Error", err)
			}
			return
		}
		_ = Validate(e)
		for _, m := range []Metadata{MinimalMetadata, FullMetadata} {
			out := AppendJSON(nil, e, JSONOptions{Metadata: m, BaseURL: base, Account: "a", Table: "t"})
			e2, err := DecodeJSON(out)
			if err != nil {
				t.Fatalf("%v: re-decode %s: %v", m, out, err)
			}
			if d := sameEntity(e, e2, false); d != "" {
				t.Fatalf("%v: %s\n%s", m, d, out)
			}
		}
		_ = AppendJSON(nil, e, JSONOptions{Metadata: NoMetadata, Select: []string{"A", "PartitionKey", "Z"}})
		e3, err := DecodeBinary(e.PartitionKey, e.RowKey, AppendBinary(nil, e))
		if err != nil {
			t.Fatal(err)
		}
		if d := sameEntity(e, e3, true); d != "" {
			t.Fatal(d)
		}
	})
}

// FuzzDecodeBinary: DecodeBinary never panics, fails only with
// ErrCorrupt, and what it accepts re-encodes to an equal entity.
func FuzzDecodeBinary(f *testing.F) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 20; i++ {
		b := AppendBinary(nil, randEntity(r))
		f.Add(b)
		f.Add(b[:len(b)-4])
	}
	f.Add([]byte{})
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		// As given, and with a correct checksum appended, so that the
		// fuzzer explores the parser behind the CRC check too.
		for _, in := range [][]byte{b, appendCRC(bytes.Clone(b))} {
			e, err := DecodeBinary("p", "r", in)
			if err != nil {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("error %v does not wrap ErrCorrupt", err)
				}
				continue
			}
			e2, err := DecodeBinary("p", "r", AppendBinary(nil, e))
			if err != nil {
				t.Fatal(err)
			}
			if d := sameEntity(e, e2, true); d != "" {
				t.Fatal(d)
			}
			_ = AppendJSON(nil, e, JSONOptions{Metadata: FullMetadata})
		}
	})
}

// FuzzDecodeJSONAgainstStdlib: the hand-written decoder and the one it
// replaced (refDecodeJSONKeysOptional, on encoding/json's token API)
// agree on every input: the same entity and key flags, or errors with
// the same code. Where the reference's error says what kind of failure
// it is (a JSON syntax error, an annotation check), the new one's says
// the same kind; other details must be equal.
func FuzzDecodeJSONAgainstStdlib(f *testing.F) {
	for _, s := range jsonSeeds {
		f.Add([]byte(s))
	}
	for _, s := range diffSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, gotPK, gotRK, gotErr := DecodeJSONKeysOptional(body)
		want, wantPK, wantRK, wantErr := refDecodeJSONKeysOptional(body)
		if d := diffDecode(got, gotPK, gotRK, gotErr, want, wantPK, wantRK, wantErr); d != "" {
			t.Fatalf("%q:\n%s", body, d)
		}
	})
}

// diffSeeds are inputs at the edges of the JSON grammar and of the
// entity rules, for the differential fuzz target.
var diffSeeds = []string{
	`{"PartitionKey":"p\u00e9\ud83d\ude00\ud800x\udc00\ud800\ud800\udc00","RowKey":"\"\\\/\b\f\n\r\t","A":"\xff\xc3(\xed\xa0\x80ok"}`,
	`{"PartitionKey":"p","RowKey":"r","odata.x":{"a":[1,2,{"b":null}],"c":{}},"x@odata.y":[[],[[]],{"d":[true,false]}]}`,
	` { "PartitionKey" : "p" , "RowKey" : "r" , "A" : -0 , "B" : 0.0 , "C" : -1E+2 , "D" : 1e-400 , "E" : 123456789012345678901234567890 } `,
	`{"PartitionKey":"p","RowKey":"r","A":2147483647,"B":-2147483648,"C":2147483648,"D":-2147483649,"E":999999999,"F":1000000000}`,
	`{"PartitionKey":"p","RowKey":"r","A":01}`,
	`{"PartitionKey":"p","RowKey":"r","A":1,"A":01}`,
	`{"PartitionKey":"p","RowKey":"r","A":truex}`,
	`{"PartitionKey":"p","RowKey":"r","A":1.}`,
	`{"PartitionKey":"p","RowKey":"r","A":-}`,
	`{"PartitionKey":"p","RowKey":"r","A":"x",}`,
	`{"PartitionKey":"p","RowKey":"r"}x`,
	`{"PartitionKey":"p","RowKey":"r"}]`,
	`{"PartitionKey":"p","RowKey":"r"]`,
	`{"PartitionKey":"p","RowKey":"r","A@odata.type":"Edm.Int64","A":"+12","B@odata.type":"Edm.Boolean","B":"fal\u017fe"}`,
	`{"PartitionKey":"p","RowKey":"r","A@odata.type":"Edm.Binary","A":"AQID\nBA==","B":null,"B@odata.type":"Edm.Nope"}`,
	`{"PartitionKey":"p","RowKey":"r","A@odata.type":"Edm.Double","A":"-INF","B@odata.type":"Edm.Double","B":"1e5","C@odata.type":"Edm.Double","C":"0x1p3"}`,
	`{"PartitionKey":"p","RowKey":"r","A@odata.type":"Edm.Int32","A":"12.0","B@odata.type":"Edm.Int64","B":1e3}`,
	`{"PartitionKey":"p","RowKey":"r","A@odata.type":"Edm.DateTime","A":"9999-12-31T23:59:59.9999999-00:01","Timestamp@odata.type":"Edm.Bogus"}`,
	`{"PartitionKey":"p","RowKey":"r","A@odata.type":"Edm.String","A":5}`,
	`{"PartitionKey":"p","RowKey":"r","PartitionKey@odata.type":"Edm.Int32"}`,
	`{"PartitionKey":null,"RowKey":"r"}`,
	`{"@odata.type":"x","A@odata\u002etype":"Edm.Int64","A":"5"}`,
	`{"odata.metadata":"m","odata.etag":1,"Timestamp":[1,2],"PartitionKey":"p"}`,
	`{"a":[1 2]}`, `{"odata.a":[1,]}`, `{"odata.a":[,1]}`, `{"odata.a":{"b" 1}}`, `{"odata.a":{"b":1,}}`, `{"odata.a":{1:2}}`,
	`{"odata.a":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}`,
	`{"a":"\u12"}`, `{"a":"\x"}`, "{\"a\":\"\x01\"}", `{"a":"abc`, `{"a`, `{"a":`, `{"a":1`, `{"a":1,`, `{`, `{}`, "\t\r\n{}\n",
	`{"PartitionKey":"p","RowKey":"r","A":1,"B":2,"C":3,"D":4,"E":5,"F":6,"G":7,"H":8,"I":9,"J":10,"K":11,"L":12,"M":13,"N":14,"O":15,"P":16,"Q":17,"R":18,"S":19,"T":20,"U":21,"V":22,"W":23,"X":24,"Y":25,"Z":26,"a":27,"Z":28}`,
}

// diffDecode says how two DecodeJSONKeysOptional results differ, or "".
func diffDecode(got *edm.Entity, gotPK, gotRK bool, gotErr error, want *edm.Entity, wantPK, wantRK bool, wantErr error) string {
	if (gotErr == nil) != (wantErr == nil) {
		return fmt.Sprintf("error %v, want %v (entity %+v)", gotErr, wantErr, want)
	}
	if wantErr != nil {
		var g, w *Error
		if !errors.As(gotErr, &g) || !errors.As(wantErr, &w) {
			return fmt.Sprintf("errors %v and %v are not both *Error", gotErr, wantErr)
		}
		if g.Code != w.Code || g.Status != w.Status || g.Message != w.Message {
			return fmt.Sprintf("error %v, want %v", gotErr, wantErr)
		}
		class := func(detail string) string {
			for _, c := range []string{"bad JSON:", "the body is not", "data after"} {
				if strings.HasPrefix(detail, c) {
					return c
				}
			}
			if strings.Contains(detail, "annotates a property") || strings.Contains(detail, "must be Edm.String") {
				return "annotation" // the reference picks one of several at random
			}
			return detail
		}
		if class(g.Detail) != class(w.Detail) {
			return fmt.Sprintf("error %q, want %q", g.Detail, w.Detail)
		}
		return ""
	}
	if gotPK != wantPK || gotRK != wantRK {
		return fmt.Sprintf("key flags %t %t, want %t %t", gotPK, gotRK, wantPK, wantRK)
	}
	if d := sameEntity(got, want, true); d != "" {
		return d
	}
	return ""
}

// FuzzEncodersAgainstRef: AppendJSON, AppendFeed, AppendBinary and
// DecodeBinary write and read exactly what they did before their
// allocations were trimmed (the ref* copies in encode_ref_test.go), for
// any entity DecodeJSON accepts, any table name and $select list, and
// any stored bytes.
func FuzzEncodersAgainstRef(f *testing.F) {
	for i, s := range append(jsonSeeds, diffSeeds...) {
		f.Add([]byte(s), "t1", []string{"", "A,L,Missing, RowKey ,L,Missing", "*", "B,,Timestamp"}[i%4], uint8(i))
	}
	r := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 10; i++ {
		f.Add(AppendBinary(nil, randEntity(r)), "\xff'/é", "P1_3,Q", uint8(i))
	}
	f.Fuzz(func(t *testing.T, body []byte, table, sel string, meta uint8) {
		for _, in := range [][]byte{body, appendCRC(bytes.Clone(body))} {
			got, gotErr := DecodeBinary("p", "r", in)
			want, wantErr := refDecodeBinary("p", "r", in)
			if d := diffBinary(got, gotErr, want, wantErr); d != "" {
				t.Fatal(d)
			}
		}
		e, err := DecodeJSON(body)
		if err != nil {
			return
		}
		e.Timestamp = time.Date(2024, 5, 6, 7, 8, 9, 123456700, time.UTC)
		if d := diffEncoders(e, table, sel, meta); d != "" {
			t.Fatal(d)
		}
	})
}

// TestEncodersAgainstRef is FuzzEncodersAgainstRef's comparison over
// random entities, with invalid UTF-8, U+2028 and extreme timestamps in
// them, and long $select lists.
func TestEncodersAgainstRef(t *testing.T) {
	r := seeded(t)
	odd := []string{"\xff", "\xc3", "\u2028", "\u2029", "'", "%", "\"", "\\", "\x00", "é", ""}
	mangle := func(s string) string {
		if r.IntN(3) == 0 {
			i := r.IntN(len(s) + 1)
			s = s[:i] + odd[r.IntN(len(odd))] + s[i:]
		}
		return s
	}
	for n := 0; n < 2000; n++ {
		e := randEntity(r)
		e.PartitionKey, e.RowKey = mangle(e.PartitionKey), mangle(e.RowKey)
		for i := range e.Props {
			e.Props[i].Name = mangle(e.Props[i].Name)
			if e.Props[i].Value.Type() == edm.String {
				e.Props[i].Value = edm.Str(mangle(e.Props[i].Value.AsString()))
			}
		}
		switch r.IntN(10) {
		case 0:
			e.Timestamp = time.Date(12000+r.IntN(100000), 1, 2, 3, 4, 5, 6, time.UTC)
		case 1:
			e.Timestamp = time.Date(-r.IntN(100000), 1, 2, 3, 4, 5, 6, time.UTC)
		case 2:
			e.Props = append(e.Props, e.Props...) // duplicate names
		}
		var sel []string
		if r.IntN(3) > 0 {
			pool := []string{"", " ", "*", "PartitionKey", " RowKey", "Timestamp", "Missing", "Gone ", "\xff"}
			for _, p := range e.Props {
				pool = append(pool, p.Name, " "+p.Name)
			}
			k := r.IntN(40)
			for i := 0; i < k; i++ {
				if s := pool[r.IntN(len(pool))]; s != "*" || r.IntN(4) == 0 {
					sel = append(sel, s)
				}
			}
		}
		table := mangle(randString(r, 6))
		if d := diffEncoders(e, table, strings.Join(sel, ","), uint8(r.IntN(3))); d != "" {
			t.Fatalf("entity %#v, select %q: %s", e, sel, d)
		}
		b := AppendBinary(nil, e)
		if r.IntN(2) == 0 {
			b[r.IntN(len(b))] ^= byte(1 + r.IntN(255))
			if r.IntN(2) == 0 {
				b = appendCRC(b[:len(b)-4])
			}
		}
		got, gotErr := DecodeBinary(e.PartitionKey, e.RowKey, b)
		want, wantErr := refDecodeBinary(e.PartitionKey, e.RowKey, b)
		if d := diffBinary(got, gotErr, want, wantErr); d != "" {
			t.Fatal(d)
		}
	}
}

// diffEncoders compares the encoders with their references on e, or
// says "".
func diffEncoders(e *edm.Entity, table, sel string, meta uint8) string {
	opts := JSONOptions{Metadata: Metadata(meta % 3), BaseURL: "http://h/" + table, Account: table, Table: table}
	if sel != "" {
		opts.Select = strings.Split(sel, ",")
	}
	if got, want := AppendJSON([]byte("x"), e, opts), refAppendJSON([]byte("x"), e, opts); !bytes.Equal(got, want) {
		return fmt.Sprintf("AppendJSON %v:\n got %s\nwant %s", opts, got, want)
	}
	es := []*edm.Entity{e, e}
	if got, want := AppendFeed(nil, es, opts), refAppendFeed(nil, es, opts); !bytes.Equal(got, want) {
		return fmt.Sprintf("AppendFeed %v:\n got %s\nwant %s", opts, got, want)
	}
	if got, want := AppendBinary([]byte("x"), e), refAppendBinary([]byte("x"), e); !bytes.Equal(got, want) {
		return fmt.Sprintf("AppendBinary:\n got %x\nwant %x", got, want)
	}
	return ""
}

// diffBinary compares two DecodeBinary results, or says "".
func diffBinary(got *edm.Entity, gotErr error, want *edm.Entity, wantErr error) string {
	if (gotErr == nil) != (wantErr == nil) || gotErr != nil && gotErr.Error() != wantErr.Error() {
		return fmt.Sprintf("DecodeBinary error %v, want %v", gotErr, wantErr)
	}
	if gotErr == nil {
		if d := sameEntity(got, want, true); d != "" {
			return "DecodeBinary: " + d
		}
	}
	return ""
}

// FuzzParseETag: ParseETag never panics, fails only with InvalidInput
// (not a weak ETag) or UpdateConditionNotSatisfied (a weak ETag not of
// our form), and every ETag that ETag makes reads back to its time.
func FuzzParseETag(f *testing.F) {
	for _, s := range []string{`W/"datetime'2026-11-21T19%3A22%3A43.1171918Z'"`, `w/"datetime'2026-11-21T19:22:43Z'"`,
		`W/"wrong"`, `W/"a\"b"`, `"wrong"`, `W/"`, `*`, ``} {
		f.Add(s, int64(0))
	}
	f.Add("", int64(1_800_000_000_000_000_000))
	f.Fuzz(func(t *testing.T, s string, nanos int64) {
		_, err := ParseETag(s)
		var e *Error
		if err != nil && (!errors.As(err, &e) || (e.Code != "InvalidInput" && e.Code != "UpdateConditionNotSatisfied")) {
			t.Fatalf("ParseETag(%q): %v", s, err)
		}
		ts := time.Unix(0, nanos).UTC().Truncate(100 * time.Nanosecond) // years 1677 to 2262
		got, err := ParseETag(ETag(ts))
		if err != nil || !got.Equal(ts) {
			t.Fatalf("ParseETag(ETag(%v)) = %v, %v", ts, got, err)
		}
	})
}
