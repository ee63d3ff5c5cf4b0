package entity

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
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
