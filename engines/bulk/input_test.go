package bulk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tabuladb/tabula/engines/vfs"
)

func TestPositionString(t *testing.T) {
	for _, tc := range []struct {
		p    Position
		want string
	}{
		{Position{File: "in.tsv", Line: 3}, "in.tsv:3"},
		{Position{Line: 3}, "record 3"},
		{Position{File: "in.parquet", Line: 3, Row: true}, "in.parquet row 3"},
		{Position{File: "in.parquet", Row: true}, "in.parquet"},
		{Position{Line: 3, Row: true}, "row 3"},
	} {
		if got := tc.p.String(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.p, got, tc.want)
		}
	}
}

// memInput is an InputFile of bytes.
type memInput struct{ *bytes.Reader }

func (m memInput) Size() (int64, error) { return m.Reader.Size(), nil }

// readInput reads every record of text with OpenInput, copying them.
func readInput(text string, o InputOptions) ([]Record, error) {
	r, err := OpenInput("in", memInput{bytes.NewReader([]byte(text))}, o)
	if err != nil {
		return nil, err
	}
	var out []Record
	for {
		rec, _, _, err := r.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, Record{Key: bytes.Clone(rec.Key), Value: bytes.Clone(rec.Value), Delete: rec.Delete})
	}
}

// TestJSONLColumns: KeyColumn and ValueColumn rename the jsonl fields.
func TestJSONLColumns(t *testing.T) {
	named := InputOptions{Format: FormatJSONL, KeyColumn: "id", ValueColumn: "emb"}
	for _, tc := range []struct {
		name string
		text string
		o    InputOptions
		want []Record // nil: an error
		err  string
	}{
		{"renamed", `{"id":"a","emb":"1"}` + "\n" + `{"emb":"2","id":"b"}`, named,
			[]Record{{Key: []byte("a"), Value: []byte("1")}, {Key: []byte("b"), Value: []byte("2")}}, ""},
		{"only the key renamed", `{"id":"a","value":"1"}`, InputOptions{Format: FormatJSONL, KeyColumn: "id"},
			[]Record{{Key: []byte("a"), Value: []byte("1")}}, ""},
		{"default names given", `{"KEY":"a","value":"1"}`, InputOptions{Format: FormatJSONL, KeyColumn: "key", ValueColumn: "value"},
			[]Record{{Key: []byte("a"), Value: []byte("1")}}, ""},
		{"delete", `{"id":"a","delete":true}`, InputOptions{Format: FormatJSONL, KeyColumn: "id", ValueColumn: "emb", Delta: true},
			[]Record{{Key: []byte("a"), Delete: true}}, ""},
		{"last of a repeated field", `{"id":"a","emb":"1","emb":"2"}`, named, []Record{{Key: []byte("a"), Value: []byte("2")}}, ""},
		{"default key refused", `{"key":"a","emb":"1"}`, named, nil, `unknown field "key"`},
		{"other field", `{"id":"a","emb":"1","ts":5}`, named, nil, `unknown field "ts"`},
		{"case matters", `{"ID":"a","emb":"1"}`, named, nil, `unknown field "ID"`},
		{"no key", `{"emb":"1"}`, named, nil, `no "id"`},
		{"null key", `{"id":null,"emb":"1"}`, named, nil, `no "id"`},
		{"no value", `{"id":"a"}`, named, nil, `no "emb"`},
		{"number", `{"id":1,"emb":"1"}`, named, nil, `field "id"`},
		{"not an object", `["a","1"]`, named, nil, "not a JSON object"},
		{"null", `null`, named, nil, "not a JSON object"},
		{"delete in a full build", `{"id":"a","delete":true}`, named, nil, `"delete" in a full`},
		{"delete with a value", `{"id":"a","emb":"1","delete":true}`, InputOptions{Format: FormatJSONL, KeyColumn: "id", ValueColumn: "emb", Delta: true}, nil, `"delete" with a "emb"`},
		{"two objects", `{"id":"a","emb":"1"} {}`, named, nil, "more than one JSON value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readInput(tc.text, tc.o)
			if tc.want == nil {
				var me *MalformedError
				if !errors.As(err, &me) || me.Pos != (Position{File: "in", Line: 1}) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want malformed line 1 (%s)", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("%d records, want %d", len(got), len(tc.want))
			}
			for i := range got {
				if !bytes.Equal(got[i].Key, tc.want[i].Key) || !bytes.Equal(got[i].Value, tc.want[i].Value) || got[i].Delete != tc.want[i].Delete {
					t.Fatalf("record %d: %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

// TestJSONLColumnsBuild: a renamed build gives the bytes of the default
// one.
func TestJSONLColumnsBuild(t *testing.T) {
	dir := t.TempDir()
	var plain, renamed strings.Builder
	for i := range 500 {
		k, v := fmt.Sprintf("key-%d", i), strings.Repeat("v", i%40)
		plain.WriteString(`{"key":"` + k + `","value":"` + v + `"}` + "\n")
		renamed.WriteString(`{"v":"` + v + `","k":"` + k + `"}` + "\n")
	}
	writeFile(t, filepath.Join(dir, "plain.jsonl"), plain.String())
	writeFile(t, filepath.Join(dir, "renamed.jsonl"), renamed.String())
	o := BuildOptions{Partitions: 3, Format: FormatJSONL}
	a, err := BuildTable(context.Background(), []string{filepath.Join(dir, "plain.jsonl")}, filepath.Join(dir, "a"), o)
	if err != nil {
		t.Fatal(err)
	}
	o.KeyColumn, o.ValueColumn = "k", "v"
	b, err := BuildTable(context.Background(), []string{filepath.Join(dir, "renamed.jsonl")}, filepath.Join(dir, "b"), o)
	if err != nil {
		t.Fatal(err)
	}
	for i := range a {
		if !bytes.Equal(readFile(t, a[i].Path), readFile(t, b[i].Path)) {
			t.Fatalf("partition %d differs", i)
		}
	}
}

func TestInputOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		o   BuildOptions
		err string
	}{
		{BuildOptions{KeyColumn: "k"}, "a tsv input has no names"},
		{BuildOptions{Format: FormatCSV, ValueColumn: "v"}, "a csv input has no names"},
		{BuildOptions{Format: FormatJSONL, KeyColumn: "value"}, `key and value both in column "value"`},
		{BuildOptions{Format: FormatJSONL, KeyColumn: "x", ValueColumn: "x"}, `both in column "x"`},
		{BuildOptions{Format: FormatJSONL, ValueColumn: "delete"}, `"delete" is the jsonl deletion field`},
		{BuildOptions{Format: Format(99)}, "unknown Format"},
		// The package's own tests do not import parquetinput.
		{BuildOptions{Format: FormatParquet}, "not linked"},
	} {
		err := tc.o.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%+v: %v, want %q", tc.o, err, tc.err)
		}
	}
	if err := (BuildOptions{Format: FormatJSONL, KeyColumn: "id", ValueColumn: "v"}).Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenInput("x.parquet", memInput{bytes.NewReader(nil)}, InputOptions{Format: FormatParquet}); !errors.Is(err, ErrFormatNotLinked) {
		t.Fatalf("OpenInput of parquet without its package: %v", err)
	}
	_, err := BuildTable(context.Background(), []string{"x"}, t.TempDir(), BuildOptions{Format: FormatParquet, Partition: PartitionOptions{FS: vfs.NewMem()}})
	if !errors.Is(err, ErrFormatNotLinked) {
		t.Fatalf("BuildTable of parquet without its package: %v", err)
	}
	for _, s := range []string{"tsv", "CSV", "jsonl", "parquet"} {
		f, err := ParseFormat(s)
		if err != nil || f.String() != strings.ToLower(s) {
			t.Fatalf("ParseFormat(%q) = %v, %v", s, f, err)
		}
	}
	if _, err := ParseFormat("orc"); err == nil || !strings.Contains(err.Error(), "parquet") {
		t.Fatalf("ParseFormat(orc): %v", err)
	}
}
