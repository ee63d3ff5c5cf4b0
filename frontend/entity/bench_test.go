package entity

import "testing"

func BenchmarkDecodeJSON(b *testing.B) {
	body := AppendJSON(nil, goldenEntity(), JSONOptions{BaseURL: base, Account: "a", Table: "t"})
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := DecodeJSON(body); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendJSON(b *testing.B) {
	e := goldenEntity()
	opts := JSONOptions{BaseURL: base, Account: "a", Table: "t"}
	buf := AppendJSON(nil, e, opts)
	b.ReportAllocs()
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		buf = AppendJSON(buf[:0], e, opts)
	}
}

func BenchmarkBinary(b *testing.B) {
	e := goldenEntity()
	buf := AppendBinary(nil, e)
	b.ReportAllocs()
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		buf = AppendBinary(buf[:0], e)
		if _, err := DecodeBinary(e.PartitionKey, e.RowKey, buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeJSONPlain decodes what an SDK typically sends: ten
// String, Int32, Int64, Double and Boolean properties (no Guid, whose
// edm.GUID formatting allocates several times per value).
func BenchmarkDecodeJSONPlain(b *testing.B) {
	body := []byte(plainBody)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := DecodeJSON(body); err != nil {
			b.Fatal(err)
		}
	}
}

const plainBody = `{"PartitionKey":"customers-0042","RowKey":"0000001234","Name":"Ada Lovelace",` +
	`"Email":"ada@example.com","City":"London","Age":36,"Score":98.25,"Active":true,` +
	`"Visits@odata.type":"Edm.Int64","Visits":"1234567890123","Note":"likes \"engines\"",` +
	`"Balance":-12.5,"Level":7}`

// BenchmarkDecodeJSONStdlibRef is the former decoder (encoding/json's
// token API, decode_ref_test.go) on the same bodies, side by side.
func BenchmarkDecodeJSONStdlibRef(b *testing.B) {
	for _, c := range []struct {
		name string
		body []byte
	}{
		{"golden", AppendJSON(nil, goldenEntity(), JSONOptions{BaseURL: base, Account: "a", Table: "t"})},
		{"plain", []byte(plainBody)},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.body)))
			for b.Loop() {
				if _, _, _, err := refDecodeJSONKeysOptional(c.body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
