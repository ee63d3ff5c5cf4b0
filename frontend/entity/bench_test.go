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
