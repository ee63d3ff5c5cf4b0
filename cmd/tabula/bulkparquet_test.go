package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"

	"github.com/tabuladb/tabula/engines/bulk"
)

// TestBulkBuildParquetCLI builds a version from a Parquet file with the
// binary, its key and value in named columns (one an integer), and checks
// that the files are byte for byte those built from the same records in
// TSV; a null key stops the build naming the file and the row; an unknown
// column lists the file's columns.
func TestBulkBuildParquetCLI(t *testing.T) {
	dir := t.TempDir()
	type row struct {
		ID    *int64  `parquet:"id,optional"`
		Emb   *string `parquet:"emb,optional"`
		Other float64 `parquet:"other"`
	}
	const n = 2000
	var rows []row
	var tsv strings.Builder
	for i := range n {
		id, emb := int64(i*1000-7), fmt.Sprintf("vector-%d", i*3)
		rows = append(rows, row{ID: &id, Emb: &emb, Other: float64(i)})
		fmt.Fprintf(&tsv, "%d\t%s\n", id, emb)
	}
	writeParquet := func(name string, rows []row) string {
		var buf bytes.Buffer
		if err := parquet.Write(&buf, rows, parquet.MaxRowsPerRowGroup(300)); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pq := writeParquet("in.parquet", rows)
	in := filepath.Join(dir, "in.tsv")
	if err := os.WriteFile(in, []byte(tsv.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out := mustCLI(t, "127.0.0.1:1", "bulk", "build", "--partitions", "3", "--format", "parquet", "--key-column", "id", "--value-column", "emb",
		"--input", pq, "--out", filepath.Join(dir, "pq"), "--no-progress")
	if !strings.Contains(out, fmt.Sprintf("%d records", n)) {
		t.Fatalf("output %q", out)
	}
	mustCLI(t, "127.0.0.1:1", "bulk", "build", "--partitions", "3", "--input", in, "--out", filepath.Join(dir, "tsv"), "--no-progress")
	for i := range 3 {
		name := bulk.PartitionFileName(i, 3)
		a, err1 := os.ReadFile(filepath.Join(dir, "pq", name))
		b, err2 := os.ReadFile(filepath.Join(dir, "tsv", name))
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		if !bytes.Equal(a, b) {
			t.Fatalf("partition %d from parquet differs from the one from tsv", i)
		}
	}

	rows[1233].ID = nil
	bad := writeParquet("bad.parquet", rows)
	_, errOut, err := cli(t, "127.0.0.1:1", nil, "bulk", "build", "--partitions", "3", "--format", "parquet", "--key-column", "id", "--value-column", "emb",
		"--input", bad, "--out", filepath.Join(dir, "bad"), "--no-progress")
	if err == nil || !strings.Contains(errOut, "bad.parquet row 1234: key column \"id\" is null") {
		t.Fatalf("null key: err %v, stderr %q", err, errOut)
	}
	if names, _ := filepath.Glob(filepath.Join(dir, "bad", "*.bulk")); len(names) != 0 {
		t.Fatalf("files built despite the error: %v", names)
	}
	_, errOut, err = cli(t, "127.0.0.1:1", nil, "bulk", "build", "--partitions", "3", "--format", "parquet", "--key-column", "user",
		"--input", pq, "--out", filepath.Join(dir, "bad"), "--no-progress")
	if err == nil || !strings.Contains(errOut, `no key column "user"; the file's columns: "id", "emb", "other"`) {
		t.Fatalf("unknown column: err %v, stderr %q", err, errOut)
	}
	_, errOut, err = cli(t, "127.0.0.1:1", nil, "bulk", "build", "--partitions", "3", "--key-column", "id",
		"--input", in, "--out", filepath.Join(dir, "bad"), "--no-progress")
	if err == nil || !strings.Contains(errOut, "a tsv input has no names") {
		t.Fatalf("--key-column with tsv: err %v, stderr %q", err, errOut)
	}
}
