package parquetinput

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"

	"github.com/tabuladb/tabula/engines/bulk"
)

// pcol is a column of a test file.
type pcol struct {
	name string
	node parquet.Node
}

// encodeParquet writes rows (one value per column, in cols' order; nil is
// null) as a Parquet file with the library under test.
func encodeParquet(t testing.TB, cols []pcol, rows [][]any, opts ...parquet.WriterOption) []byte {
	t.Helper()
	g := parquet.Group{}
	for _, c := range cols {
		g[c.name] = c.node
	}
	schema := parquet.NewSchema("records", g)
	var buf bytes.Buffer
	w := parquet.NewWriter(&buf, append([]parquet.WriterOption{schema}, opts...)...)
	for i, r := range rows {
		if len(r) != len(cols) {
			t.Fatalf("row %d: %d values for %d columns", i, len(r), len(cols))
		}
		row := make(parquet.Row, 0, len(cols))
		for j, c := range cols {
			leaf, ok := schema.Lookup(c.name)
			if !ok {
				t.Fatalf("no leaf %s", c.name)
			}
			if r[j] == nil {
				row = append(row, parquet.NullValue().Level(0, 0, leaf.ColumnIndex))
				continue
			}
			row = append(row, parquet.ValueOf(r[j]).Level(0, leaf.MaxDefinitionLevel, leaf.ColumnIndex))
		}
		// A row's values go in column order.
		parquetSortRow(row)
		if _, err := w.WriteRows([]parquet.Row{row}); err != nil {
			t.Fatalf("write row %d: %v", i, err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func parquetSortRow(row parquet.Row) {
	for i := 1; i < len(row); i++ {
		for j := i; j > 0 && row[j].Column() < row[j-1].Column(); j-- {
			row[j], row[j-1] = row[j-1], row[j]
		}
	}
}

// readAll reads every record of a file, copying them.
func readAll(b []byte, o bulk.InputOptions) ([]bulk.Record, error) {
	r, err := NewReader("in.parquet", bytes.NewReader(b), int64(len(b)), o)
	if err != nil {
		return nil, err
	}
	var out []bulk.Record
	for {
		rec, pos, _, err := r.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		if want := int64(len(out) + 1); pos.Line != want || !pos.Row || pos.File != "in.parquet" {
			return out, fmt.Errorf("position %+v, want row %d", pos, want)
		}
		out = append(out, bulk.Record{Key: bytes.Clone(rec.Key), Value: bytes.Clone(rec.Value), Delete: rec.Delete})
	}
}

func optString() parquet.Node { return parquet.Optional(parquet.String()) }

// recs makes records from key, value pairs; a value of "<del>" deletes.
func recs(kv ...string) []bulk.Record {
	var out []bulk.Record
	for i := 0; i < len(kv); i += 2 {
		if kv[i+1] == "<del>" {
			out = append(out, bulk.Record{Key: []byte(kv[i]), Delete: true})
		} else {
			out = append(out, bulk.Record{Key: []byte(kv[i]), Value: []byte(kv[i+1])})
		}
	}
	return out
}

func sameRecords(a, b []bulk.Record) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i].Key, b[i].Key) || !bytes.Equal(a[i].Value, b[i].Value) || a[i].Delete != b[i].Delete {
			return false
		}
	}
	return true
}

func TestReader(t *testing.T) {
	uuid := [16]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	kv := []pcol{{"key", optString()}, {"value", optString()}}
	b64 := base64.StdEncoding.EncodeToString
	for _, tc := range []struct {
		name string
		cols []pcol
		rows [][]any
		o    bulk.InputOptions
		want []bulk.Record
		// errRow is the row of the expected error (-1: the file as a
		// whole; 0: no error); errText a piece of its message.
		errRow  int64
		errText string
	}{
		{name: "strings", cols: kv, rows: [][]any{{"a", "1"}, {"b", ""}, {"ü", "x\ty\nz"}},
			want: recs("a", "1", "b", "", "ü", "x\ty\nz")},
		{name: "required byte arrays and other columns unread",
			cols: []pcol{{"key", parquet.Leaf(parquet.ByteArrayType)}, {"value", parquet.String()}, {"ts", parquet.Leaf(parquet.DoubleType)}, {"tags", parquet.Repeated(parquet.String())}},
			rows: [][]any{{[]byte{0, 0xff}, "v", 1.5, "t"}}, want: []bulk.Record{{Key: []byte{0, 0xff}, Value: []byte("v")}}},
		{name: "named columns", cols: []pcol{{"user_id", parquet.String()}, {"embedding", parquet.String()}, {"key", parquet.String()}},
			rows: [][]any{{"u1", "e1", "not me"}}, o: bulk.InputOptions{KeyColumn: "user_id", ValueColumn: "embedding"},
			want: recs("u1", "e1")},
		{name: "integers as decimal", cols: []pcol{{"key", parquet.Leaf(parquet.Int64Type)}, {"value", parquet.Leaf(parquet.Int32Type)}},
			rows: [][]any{{int64(-42), int32(-7)}, {int64(1) << 62, int32(2147483647)}}, want: recs("-42", "-7", "4611686018427387904", "2147483647")},
		{name: "unsigned integers", cols: []pcol{{"key", parquet.Uint(32)}, {"value", parquet.Uint(64)}},
			rows: [][]any{{uint32(4000000000), uint64(18446744073709551615)}}, want: recs("4000000000", "18446744073709551615")},
		{name: "uuid key", cols: []pcol{{"key", parquet.UUID()}, {"value", parquet.String()}},
			rows: [][]any{{uuid, "u"}}, want: []bulk.Record{{Key: uuid[:], Value: []byte("u")}}},
		{name: "dictionary encoded", cols: []pcol{{"key", parquet.String()}, {"value", parquet.Encoded(parquet.String(), &parquet.RLEDictionary)}},
			rows: [][]any{{"a", "same"}, {"b", "same"}, {"c", "other"}}, want: recs("a", "same", "b", "same", "c", "other")},
		{name: "base64", cols: kv, rows: [][]any{{b64([]byte{0, 1}), b64([]byte("\n"))}}, o: bulk.InputOptions{Base64: true},
			want: []bulk.Record{{Key: []byte{0, 1}, Value: []byte("\n")}}},
		{name: "base64 not decoded in integers", cols: []pcol{{"key", parquet.Leaf(parquet.Int64Type)}, {"value", parquet.String()}},
			rows: [][]any{{int64(7), b64([]byte("v"))}}, o: bulk.InputOptions{Base64: true}, want: recs("7", "v")},
		{name: "null value deletes in a delta", cols: kv, rows: [][]any{{"a", "1"}, {"b", nil}}, o: bulk.InputOptions{Delta: true},
			want: recs("a", "1", "b", "<del>")},
		{name: "empty file", cols: kv, rows: nil},

		{name: "null value in a full build", cols: kv, rows: [][]any{{"a", "1"}, {"b", "2"}, {"c", nil}},
			errRow: 3, errText: `value column "value" is null`},
		{name: "null key", cols: kv, rows: [][]any{{"a", "1"}, {nil, "2"}}, o: bulk.InputOptions{Delta: true},
			errRow: 2, errText: `key column "key" is null`},
		{name: "bad base64", cols: kv, rows: [][]any{{"YQ==", "MQ=="}, {"!!", "MQ=="}}, o: bulk.InputOptions{Base64: true},
			errRow: 2, errText: "not valid base64"},
		{name: "no such column", cols: []pcol{{"k", parquet.String()}, {"v", parquet.String()}}, rows: [][]any{{"a", "1"}},
			errRow: -1, errText: `no key column "key"; the file's columns: "k", "v"`},
		{name: "no such value column", cols: []pcol{{"k", parquet.String()}, {"v", parquet.String()}}, rows: [][]any{{"a", "1"}},
			o: bulk.InputOptions{KeyColumn: "k", ValueColumn: "val"}, errRow: -1, errText: `no value column "val"; the file's columns: "k", "v"`},
		{name: "double", cols: []pcol{{"key", parquet.String()}, {"value", parquet.Leaf(parquet.DoubleType)}}, rows: [][]any{{"a", 1.0}},
			errRow: -1, errText: `value column "value": of type DOUBLE`},
		{name: "timestamp", cols: []pcol{{"key", parquet.Timestamp(parquet.Millisecond)}, {"value", parquet.String()}}, rows: nil,
			errRow: -1, errText: `key column "key": of type INT64 (TIMESTAMP`},
		{name: "repeated", cols: []pcol{{"key", parquet.String()}, {"value", parquet.Repeated(parquet.String())}}, rows: nil,
			errRow: -1, errText: `value column "value": repeated`},
		{name: "group", cols: []pcol{{"key", parquet.Group{"a": parquet.String()}}, {"value", parquet.String()}}, rows: nil,
			errRow: -1, errText: `key column "key": a group`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := encodeParquet(t, tc.cols, tc.rows)
			got, err := readAll(b, tc.o)
			if tc.errRow == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if !sameRecords(got, tc.want) {
					t.Fatalf("records %+v, want %+v", got, tc.want)
				}
				return
			}
			var me *bulk.MalformedError
			if !errors.As(err, &me) || me.Pos.File != "in.parquet" || !me.Pos.Row || !strings.Contains(err.Error(), tc.errText) {
				t.Fatalf("err %v, want a malformed row %d (%s)", err, tc.errRow, tc.errText)
			}
			if want := max(tc.errRow, 0); me.Pos.Line != want {
				t.Fatalf("err %v at row %d, want row %d", err, me.Pos.Line, want)
			}
			if tc.errRow > 0 && !strings.Contains(err.Error(), fmt.Sprintf("in.parquet row %d: ", tc.errRow)) {
				t.Fatalf("err %q does not name the row", err)
			}
		})
	}
}

// TestReaderPagesAndRowGroups reads a file of many row groups and pages,
// the columns' pages ending at different rows.
func TestReaderPagesAndRowGroups(t *testing.T) {
	const n = 5000
	var rows [][]any
	var want []bulk.Record
	for i := range n {
		k, v := fmt.Sprintf("key-%d", i), strings.Repeat("v", i%97)
		if i%13 == 0 {
			rows = append(rows, []any{k, nil})
			want = append(want, bulk.Record{Key: []byte(k), Delete: true})
			continue
		}
		rows = append(rows, []any{k, v})
		want = append(want, bulk.Record{Key: []byte(k), Value: []byte(v)})
	}
	b := encodeParquet(t, []pcol{{"key", optString()}, {"value", optString()}}, rows,
		parquet.MaxRowsPerRowGroup(700), parquet.PageBufferSize(512), parquet.DataPageVersion(1))
	f, err := parquet.OpenFile(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.RowGroups()) < 7 {
		t.Fatalf("%d row groups, want several", len(f.RowGroups()))
	}
	got, err := readAll(b, bulk.InputOptions{Delta: true})
	if err != nil {
		t.Fatal(err)
	}
	if !sameRecords(got, want) {
		t.Fatalf("%d records differ from the %d written", len(got), len(want))
	}
}

func TestReaderNotParquet(t *testing.T) {
	good := encodeParquet(t, []pcol{{"key", parquet.String()}, {"value", parquet.String()}}, [][]any{{"a", "1"}})
	footerTooLong := bytes.Clone(good)
	footerTooLong[len(good)-8] = 0xff
	footerTooLong[len(good)-5] = 0x7f
	for name, b := range map[string][]byte{
		"empty":       nil,
		"text":        []byte("key\tvalue\nmore\tlines\n"),
		"cut":         good[:len(good)-3],
		"no header":   append([]byte("XXXX"), good[4:]...),
		"long footer": footerTooLong,
	} {
		_, err := readAll(b, bulk.InputOptions{})
		var me *bulk.MalformedError
		if !errors.As(err, &me) || me.Pos.Line != 0 || !me.Pos.Row || me.Pos.String() != "in.parquet" {
			t.Fatalf("%s: err %v, want a malformed file", name, err)
		}
	}
}

// TestReaderRecoversPanic: a damaged file on which the library panics
// (slice bounds out of range decoding its footer; found by
// FuzzParquetInput) is a malformed file, not a crash of the build.
func TestReaderRecoversPanic(t *testing.T) {
	b := []byte("PAR1\x150\x19<H\a0000000\x1510\x150#0\x18\x030008\x00,8\x0000\x150#0\x18\x05000008\x00,8\x0000\x160\x19\x1c\x19,&0,8100000000000000000000000000000000000000000000000000$\xe007000000000\x1c8#000000000000000000000000000000000001,119A0000119!0000\x16\xf60C018\x02000\x16\x840\x16070000000009)\x18 00000000000000000000000000000000\x19a0000000\xfb\x00\x00\x00PAR1")
	_, err := readAll(b, bulk.InputOptions{})
	var me *bulk.MalformedError
	if !errors.As(err, &me) || me.Pos != (bulk.Position{File: "in.parquet", Row: true}) {
		t.Fatalf("err %v, want a malformed file", err)
	}
	t.Log(err)
}

// writeFile writes b to dir/name and returns its path.
func writeFile(t testing.TB, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBuildSameAsTSV builds one table from Parquet and from TSV: the
// partition files are byte for byte the same (full and delta builds, the
// Parquet input split over several row groups, the build spilling).
func TestBuildSameAsTSV(t *testing.T) {
	seed := rand.Uint64()
	if s := os.Getenv("TABULA_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (rerun with TABULA_SEED=%d)", seed, seed)
	r := rand.New(rand.NewPCG(seed, 17))
	dir := t.TempDir()
	const n, np = 3000, 4
	randBytes := func(l int) []byte {
		b := make([]byte, l)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return b
	}
	for _, delta := range []bool{false, true} {
		var tsv strings.Builder
		var rows [][]any
		for i := range n {
			k := base64.StdEncoding.EncodeToString(append(randBytes(8), byte(i), byte(i>>8)))
			if delta && i%5 == 0 {
				fmt.Fprintf(&tsv, "%s\n", k)
				rows = append(rows, []any{k, nil})
				continue
			}
			v := base64.StdEncoding.EncodeToString(randBytes(r.IntN(40)))
			fmt.Fprintf(&tsv, "%s\t%s\n", k, v)
			rows = append(rows, []any{k, v})
		}
		tag := fmt.Sprint("delta-", delta)
		tsvIn := writeFile(t, dir, tag+".tsv", []byte(tsv.String()))
		pqIn := writeFile(t, dir, tag+".parquet", encodeParquet(t, []pcol{{"k", optString()}, {"v", optString()}}, rows, parquet.MaxRowsPerRowGroup(1000)))
		o := bulk.BuildOptions{Partitions: np, Base64: true, Version: 3, MemoryBudget: 16 << 10}
		if delta {
			o.DeltaOf = 2
		}
		a, err := bulk.BuildTable(context.Background(), []string{tsvIn}, filepath.Join(dir, tag+"-tsv"), o)
		if err != nil {
			t.Fatal(err)
		}
		o.Format, o.KeyColumn, o.ValueColumn = bulk.FormatParquet, "k", "v"
		b, err := bulk.BuildTable(context.Background(), []string{pqIn}, filepath.Join(dir, tag+"-parquet"), o)
		if err != nil {
			t.Fatal(err)
		}
		var records uint64
		for i := range np {
			ab, err1 := os.ReadFile(a[i].Path)
			bb, err2 := os.ReadFile(b[i].Path)
			if err1 != nil || err2 != nil {
				t.Fatal(err1, err2)
			}
			if !bytes.Equal(ab, bb) || a[i].CRC != b[i].CRC {
				t.Fatalf("%s: partition %d differs: crc %08x from tsv, %08x from parquet", tag, i, a[i].CRC, b[i].CRC)
			}
			records += b[i].Records
		}
		if records != n {
			t.Fatalf("%s: %d records, want %d", tag, records, n)
		}
		da, err1 := bulk.DescribeDir(context.Background(), filepath.Join(dir, tag+"-tsv"), np)
		db, err2 := bulk.DescribeDir(context.Background(), filepath.Join(dir, tag+"-parquet"), np)
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		for i := range np {
			fa, fb := da.Files[i], db.Files[i]
			if fa.CRC != fb.CRC || fa.FileBytes != fb.FileBytes || fa.Records != fb.Records || da.Version != db.Version || da.Base != db.Base {
				t.Fatalf("%s: DescribeDir differs at partition %d:\n%+v\n%+v", tag, i, da, db)
			}
		}
	}
}

// TestBuildErrors: a bad row stops the build with its row named and
// nothing written; duplicates name their rows, through spill files too.
func TestBuildErrors(t *testing.T) {
	dir := t.TempDir()
	build := func(rows [][]any, o bulk.BuildOptions) (string, error) {
		in := writeFile(t, dir, "in.parquet", encodeParquet(t, []pcol{{"key", optString()}, {"value", optString()}}, rows))
		o.Format = bulk.FormatParquet
		o.Partitions = max(o.Partitions, 2)
		out := filepath.Join(dir, "out")
		os.RemoveAll(out)
		_, err := bulk.BuildTable(context.Background(), []string{in}, out, o)
		return in, err
	}
	noFiles := func() {
		t.Helper()
		names, _ := filepath.Glob(filepath.Join(dir, "out", "*.bulk"))
		if len(names) != 0 {
			t.Fatalf("files built despite the error: %v", names)
		}
	}
	long := strings.Repeat("k", 4097)
	for _, tc := range []struct {
		rows   [][]any
		o      bulk.BuildOptions
		row    int64
		reason string
	}{
		{[][]any{{"a", "1"}, {"b", "2"}, {long, "3"}}, bulk.BuildOptions{}, 3, "key of 4097 bytes"},
		{[][]any{{"a", "1"}, {"", "2"}}, bulk.BuildOptions{}, 2, "key of 0 bytes"},
		{[][]any{{"a", strings.Repeat("v", 11)}}, bulk.BuildOptions{Partition: bulk.PartitionOptions{MaxValueBytes: 10}}, 1, "value of 11 bytes"},
		{[][]any{{"a", "1"}, {"b", nil}}, bulk.BuildOptions{}, 2, "null"},
	} {
		in, err := build(tc.rows, tc.o)
		var me *bulk.MalformedError
		if !errors.As(err, &me) || me.Pos != (bulk.Position{File: in, Line: tc.row, Row: true}) || !strings.Contains(err.Error(), tc.reason) {
			t.Fatalf("err %v, want malformed at row %d (%s)", err, tc.row, tc.reason)
		}
		if !strings.Contains(err.Error(), fmt.Sprintf("in.parquet row %d: ", tc.row)) {
			t.Fatalf("err %q does not name the row", err)
		}
		noFiles()
	}
	rows := [][]any{{"a", "1"}, {"b", "2"}, {"a", "3"}, {"c", "4"}, {"b", "5"}}
	for _, budget := range []int64{0, 64} { // 64: every record spills
		in, err := build(rows, bulk.BuildOptions{MemoryBudget: budget})
		var de *bulk.DuplicateError
		if !errors.As(err, &de) || de.Count != 2 || !strings.Contains(err.Error(), in+" row 1 and "+in+" row 3") ||
			!strings.Contains(err.Error(), in+" row 2 and "+in+" row 5") {
			t.Fatalf("budget %d: err %v, want 2 duplicates naming rows", budget, err)
		}
		noFiles()
	}
	if _, err := build(rows, bulk.BuildOptions{Partition: bulk.PartitionOptions{LastWins: true}}); err != nil {
		t.Fatal(err)
	}
	if _, err := build(nil, bulk.BuildOptions{}); !errors.Is(err, bulk.ErrEmptyInput) {
		t.Fatalf("no rows: %v, want ErrEmptyInput", err)
	}
}

// FuzzParquetInput: any bytes either read as records or fail with an
// error; never a panic (the library's are recovered into a
// *bulk.MalformedError), never a record without a key.
func FuzzParquetInput(f *testing.F) {
	f.Add(encodeParquet(f, []pcol{{"key", optString()}, {"value", optString()}}, [][]any{{"a", "1"}, {"b", nil}, {nil, "c"}}))
	f.Add(encodeParquet(f, []pcol{{"key", parquet.Leaf(parquet.Int64Type)}, {"value", parquet.Encoded(parquet.String(), &parquet.RLEDictionary)}},
		[][]any{{int64(1), "x"}, {int64(2), "x"}, {int64(3), "y"}}, parquet.DataPageVersion(1)))
	f.Add(encodeParquet(f, []pcol{{"key", parquet.String()}, {"value", parquet.String()}}, [][]any{{"k1", "v1"}, {"k2", "v2"}, {"k3", "v3"}},
		parquet.MaxRowsPerRowGroup(1), parquet.Compression(&parquet.Snappy)))
	f.Add([]byte("PAR1PAR1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, delta := range []bool{false, true} {
			r, err := NewReader("fuzz.parquet", bytes.NewReader(b), int64(len(b)), bulk.InputOptions{Delta: delta})
			if err != nil {
				continue
			}
			for i := 0; ; i++ {
				rec, _, _, err := r.Next()
				if err != nil {
					break
				}
				if rec.Delete && (!delta || len(rec.Value) > 0) {
					t.Fatalf("record %d: a deletion %+v (delta %v)", i, rec, delta)
				}
			}
		}
	})
}

// BenchmarkReader reads 1M rows of a 16-byte key and a 100-byte value
// (snappy, plain encoding), reporting records/s;
// BenchmarkReader/tsv reads the same records as TSV through bulk.OpenInput.
func BenchmarkReader(b *testing.B) {
	const n = 1 << 20
	rows := make([][]any, n)
	var tsv bytes.Buffer
	for i := range rows {
		k, v := fmt.Sprintf("key-%012d", i), strings.Repeat(string(rune('a'+i%26)), 100)
		rows[i] = []any{k, v}
		fmt.Fprintf(&tsv, "%s\t%s\n", k, v)
	}
	pq := encodeParquet(b, []pcol{{"key", parquet.String()}, {"value", parquet.String()}}, rows, parquet.Compression(&parquet.Snappy))
	run := func(b *testing.B, open func() bulk.RecordReader) {
		b.ReportAllocs()
		for b.Loop() {
			r := open()
			for {
				if _, _, _, err := r.Next(); err != nil {
					if !errors.Is(err, io.EOF) {
						b.Fatal(err)
					}
					break
				}
			}
		}
		b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
	}
	b.Run("parquet", func(b *testing.B) {
		b.SetBytes(int64(len(pq)))
		run(b, func() bulk.RecordReader {
			r, err := NewReader("in.parquet", bytes.NewReader(pq), int64(len(pq)), bulk.InputOptions{})
			if err != nil {
				b.Fatal(err)
			}
			return r
		})
	})
	b.Run("tsv", func(b *testing.B) {
		b.SetBytes(int64(tsv.Len()))
		run(b, func() bulk.RecordReader {
			r, err := bulk.OpenInput("in.tsv", sizedReader{bytes.NewReader(tsv.Bytes())}, bulk.InputOptions{})
			if err != nil {
				b.Fatal(err)
			}
			return r
		})
	})
}

// sizedReader is a bulk.InputFile of bytes.
type sizedReader struct{ *bytes.Reader }

func (s sizedReader) Size() (int64, error) { return s.Reader.Size(), nil }
