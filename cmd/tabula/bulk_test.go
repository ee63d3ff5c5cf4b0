package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tabuladb/tabula/engines/bulk"
	"github.com/tabuladb/tabula/engines/vfs"
)

// TestBulkBuildCLI builds a version offline with the binary, twice (the
// bytes must match), reads every key back from the files, and checks the
// clear errors: a malformed line names file and line; publish names its
// required flags.
func TestBulkBuildCLI(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.tsv")
	var b strings.Builder
	const n = 5000
	for i := range n {
		fmt.Fprintf(&b, "key-%05d\tvalue-%d\n", i, i*7)
	}
	if err := os.WriteFile(in, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	build := func(out string) {
		mustCLI(t, "127.0.0.1:1", "bulk", "build", "--partitions", "4", "--input", in, "--out", out, "--no-progress")
	}
	out1, out2 := filepath.Join(dir, "v1"), filepath.Join(dir, "v1-again")
	build(out1)
	build(out2)
	files := 0
	found := 0
	for i := range 4 {
		name := bulk.PartitionFileName(i, 4)
		a, err1 := os.ReadFile(filepath.Join(out1, name))
		c, err2 := os.ReadFile(filepath.Join(out2, name))
		if err1 != nil || err2 != nil {
			t.Fatalf("partition %d: %v %v", i, err1, err2)
		}
		if !bytes.Equal(a, c) {
			t.Fatalf("partition %d differs between two builds of the same input", i)
		}
		files++
		f, err := bulk.Open(vfs.Default, filepath.Join(out1, name), bulk.OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for k := range n {
			v, ok, err := f.Get(fmt.Appendf(nil, "key-%05d", k))
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				found++
				if string(v) != fmt.Sprintf("value-%d", k*7) {
					t.Fatalf("key %d = %q", k, v)
				}
			}
		}
		f.Close()
	}
	if found != n {
		t.Fatalf("%d of %d keys found across %d files", found, n, files)
	}

	bad := filepath.Join(dir, "bad.tsv")
	os.WriteFile(bad, []byte("a\t1\nno-tab-here\n"), 0o644)
	_, errOut, err := cli(t, "127.0.0.1:1", nil, "bulk", "build", "--partitions", "2", "--input", bad, "--out", filepath.Join(dir, "bad"), "--no-progress", "--delta-of", "0")
	if err == nil || !strings.Contains(errOut, "bad.tsv") || !strings.Contains(errOut, "2") {
		t.Fatalf("malformed input: err %v, stderr %q", err, errOut)
	}
	_, errOut, err = cli(t, "127.0.0.1:1", nil, "bulk", "publish")
	if err == nil || !strings.Contains(errOut, "--table and --dir are required") {
		t.Fatalf("publish: err %v, stderr %q", err, errOut)
	}
}
