package beambuild

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apache/beam/sdks/v2/go/pkg/beam"
	"github.com/apache/beam/sdks/v2/go/pkg/beam/log"
	_ "github.com/apache/beam/sdks/v2/go/pkg/beam/runners/prism"

	"github.com/tabuladb/tabula/engines/bulk"
)

// quiet drops Beam's informational logs (the direct runner prints its plan).
type quiet struct{}

func (quiet) Log(_ context.Context, sev log.Severity, _ int, msg string) {
	if sev >= log.SevWarn {
		fmt.Fprintln(os.Stderr, "beam:", msg)
	}
}

// runners are the runners the tests build on: the direct runner (the
// default) and prism, Beam's portable runner, here in-process with a
// loopback worker: elements go through the runner's coders, in several
// bundles, as on Flink, Spark or Dataflow.
var runners = []string{"direct", "prism"}

func TestMain(m *testing.M) {
	flag.Parse()
	beam.Init()
	log.SetLogger(quiet{})
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil))) // prism's logs
	os.Exit(m.Run())
}

// write writes lines to a new file in dir and returns its path.
func write(t *testing.T, dir, name string, lines []string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// buildBoth builds inputs with bulk.BuildTable and with Build on runner
// and returns their output directories and errors.
func buildBoth(t *testing.T, runner string, inputs []string, opts bulk.BuildOptions) (native, piped string, nerr, berr error) {
	t.Helper()
	dir := t.TempDir()
	native, piped = filepath.Join(dir, "native"), filepath.Join(dir, "beam")
	_, nerr = bulk.BuildTable(context.Background(), inputs, native, opts)
	berr = Build(context.Background(), inputs, piped, Options{Build: opts, ChunkBytes: 4 << 10, Runner: runner})
	return native, piped, nerr, berr
}

// sameFiles checks both directories hold the table's partition files, equal
// byte for byte, and nothing else.
func sameFiles(t *testing.T, native, piped string, np int) {
	t.Helper()
	for _, d := range []string{native, piped} {
		ents, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		if len(ents) != np {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Fatalf("%s holds %v, want the %d partition files", d, names, np)
		}
	}
	for i := range np {
		name := bulk.PartitionFileName(i, np)
		a, err := os.ReadFile(filepath.Join(native, name))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(piped, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Fatalf("%s: native %d bytes, beam %d bytes: differ", name, len(a), len(b))
		}
	}
	if _, err := bulk.DescribeDir(context.Background(), piped, np); err != nil {
		t.Fatalf("beam output does not describe as a version: %v", err)
	}
}

func TestSameFilesAsNative(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(17, 3))
	val := func(i int) string { return fmt.Sprintf("value-%d-%s", i, strings.Repeat("x", rng.IntN(40))) }

	// TSV, two inputs, values of varied length (offsets in the file).
	var a, b []string
	for i := range 3000 {
		a = append(a, fmt.Sprintf("key%05d\t%s", i, val(i)))
	}
	for i := 3000; i < 4000; i++ {
		b = append(b, fmt.Sprintf("key%05d\t%s", i, val(i)))
	}
	tsv := []string{write(t, dir, "a.tsv", a), write(t, dir, "b.tsv", b)}

	// JSONL, one length of values (no offsets), and a blank line.
	var j []string
	for i := range 2500 {
		j = append(j, fmt.Sprintf(`{"key": "j%06d", "value": "%08d"}`, i, i))
		if i == 100 {
			j = append(j, "")
		}
	}
	jsonl := []string{write(t, dir, "j.jsonl", j)}

	// A delta: changed records and deletions.
	var d []string
	for i := 0; i < 4000; i += 3 {
		if i%2 == 0 {
			d = append(d, fmt.Sprintf("key%05d", i))
		} else {
			d = append(d, fmt.Sprintf("key%05d\tnew-%d", i, i))
		}
	}
	delta := []string{write(t, dir, "delta.tsv", d)}

	// Duplicates within an input and across inputs, the last winning.
	var d1, d2 []string
	for i := range 2000 {
		d1 = append(d1, fmt.Sprintf("dup%04d\tfirst-%d", i%1500, i))
	}
	for i := range 1000 {
		d2 = append(d2, fmt.Sprintf("dup%04d\tsecond-%d", (i*7)%1700, i))
	}
	dups := []string{write(t, dir, "d1.tsv", d1), write(t, dir, "d2.tsv", d2)}

	// CSV with base64 keys and values.
	var c []string
	for i := range 1500 {
		k := base64.StdEncoding.EncodeToString([]byte{byte(i), byte(i >> 8), 0, '\t'})
		v := base64.StdEncoding.EncodeToString([]byte(val(i)))
		c = append(c, k+","+v)
	}
	csv := []string{write(t, dir, "c.csv", c)}

	// Few records over many partitions: some partitions get none.
	sparse := []string{write(t, dir, "sparse.tsv", []string{"a\t1", "b\t2", "c\t3", "d\t4", "e\t5"})}

	for _, tc := range []struct {
		name   string
		inputs []string
		opts   bulk.BuildOptions
	}{
		{"tsv", tsv, bulk.BuildOptions{Partitions: 5, Version: 3}},
		{"jsonl", jsonl, bulk.BuildOptions{Partitions: 4, Version: 2, Format: bulk.FormatJSONL}},
		{"delta", delta, bulk.BuildOptions{Partitions: 5, Version: 4, DeltaOf: 3}},
		{"last-wins", dups, bulk.BuildOptions{Partitions: 3, Version: 7, Partition: bulk.PartitionOptions{LastWins: true}}},
		{"csv-base64", csv, bulk.BuildOptions{Partitions: 6, Version: 1, Format: bulk.FormatCSV, Base64: true}},
		{"sparse", sparse, bulk.BuildOptions{Partitions: 16, Version: 1}},
		{"one-partition-fingerprint16", tsv, bulk.BuildOptions{Partitions: 1, Version: 9, Partition: bulk.PartitionOptions{FingerprintBits: 16}}},
	} {
		for _, runner := range runners {
			t.Run(tc.name+"/"+runner, func(t *testing.T) {
				native, piped, nerr, berr := buildBoth(t, runner, tc.inputs, tc.opts)
				if nerr != nil || berr != nil {
					t.Fatalf("native: %v; beam: %v", nerr, berr)
				}
				np := tc.opts.Partitions
				sameFiles(t, native, piped, np)
			})
		}
	}
}

// TestErrorsAsNative: a failed build gives the native builder's error text
// and leaves no partition file.
func TestErrorsAsNative(t *testing.T) {
	dir := t.TempDir()
	var good []string
	for i := range 2000 {
		good = append(good, fmt.Sprintf("k%d\tv%d", i, i))
	}
	bad := append(append([]string(nil), good[:1234]...), "no tab on this line")
	bad = append(bad, good[1234:]...)
	var dup []string
	for i := range 50 {
		dup = append(dup, fmt.Sprintf("k%d\tagain", i*13))
	}
	empty := filepath.Join(dir, "empty.tsv")
	if err := os.WriteFile(empty, []byte("\n\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	goodIn := write(t, dir, "good.tsv", good)
	for _, tc := range []struct {
		name   string
		inputs []string
		opts   bulk.BuildOptions
		check  func(error) bool
	}{
		{"bad-line", []string{goodIn, write(t, dir, "bad.tsv", bad)}, bulk.BuildOptions{Partitions: 4},
			func(err error) bool {
				var me *bulk.MalformedError
				return errors.As(err, &me) && me.Pos.Line == 1235 && strings.HasSuffix(me.Pos.File, "bad.tsv")
			}},
		{"bad-json", []string{write(t, dir, "bad.jsonl", []string{`{"key":"a","value":"b"}`, `{"key":"c"}`})},
			bulk.BuildOptions{Partitions: 2, Format: bulk.FormatJSONL},
			func(err error) bool { var me *bulk.MalformedError; return errors.As(err, &me) && me.Pos.Line == 2 }},
		{"duplicates", []string{goodIn, write(t, dir, "dup.tsv", dup)}, bulk.BuildOptions{Partitions: 4},
			func(err error) bool { var de *bulk.DuplicateError; return errors.As(err, &de) && de.Count == 50 }},
		{"empty", []string{empty}, bulk.BuildOptions{Partitions: 3},
			func(err error) bool { return errors.Is(err, bulk.ErrEmptyInput) }},
		{"missing", []string{filepath.Join(dir, "nope.tsv")}, bulk.BuildOptions{Partitions: 3},
			func(err error) bool { return errors.Is(err, os.ErrNotExist) }},
	} {
		for _, runner := range runners {
			t.Run(tc.name+"/"+runner, func(t *testing.T) {
				_, piped, nerr, berr := buildBoth(t, runner, tc.inputs, tc.opts)
				if nerr == nil || berr == nil {
					t.Fatalf("native: %v; beam: %v; want both to fail", nerr, berr)
				}
				if nerr.Error() != berr.Error() {
					t.Fatalf("beam error\n  %v\nnative error\n  %v", berr, nerr)
				}
				if !tc.check(berr) {
					t.Fatalf("beam error %#v is not the native kind", berr)
				}
				ents, _ := os.ReadDir(piped)
				for _, e := range ents {
					t.Errorf("failed build left %s", e.Name())
				}
			})
		}
	}
}

// TestFailedBuildRemovesOldFiles: a failed build into a directory holding a
// complete version leaves no complete-looking directory behind.
func TestFailedBuildRemovesOldFiles(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	in := write(t, dir, "in.tsv", []string{"a\t1", "b\t2", "c\t3"})
	if err := Build(context.Background(), []string{in}, out, Options{Build: bulk.BuildOptions{Partitions: 2, Version: 1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := bulk.DescribeDir(context.Background(), out, 2); err != nil {
		t.Fatal(err)
	}
	bad := write(t, dir, "bad.tsv", []string{"a\t1", "a\t2"})
	err := Build(context.Background(), []string{bad}, out, Options{Build: bulk.BuildOptions{Partitions: 2, Version: 2}})
	var de *bulk.DuplicateError
	if !errors.As(err, &de) {
		t.Fatalf("got %v, want a duplicate error", err)
	}
	if _, err := bulk.DescribeDir(context.Background(), out, 2); err == nil {
		t.Fatal("a failed build left a directory that describes as a complete version")
	}
}

func TestChunkOrder(t *testing.T) {
	inputs := []string{"a", "b"}
	var c1, c2, c3 []byte
	c1 = appendRecord(c1, bulk.Record{Key: []byte("x"), Value: []byte("1")}, 1, 5)
	c2 = appendRecord(c2, bulk.Record{Key: []byte("y"), Value: []byte("2")}, 0, 9)
	c2 = appendRecord(c2, bulk.Record{Key: []byte("z"), Delete: true}, 0, 10)
	c3 = appendRecord(c3, bulk.Record{Key: []byte("w"), Value: []byte("3")}, 1, 2)
	// c1 and c3 overlap in order only through their records' lines once
	// merged: c3 (b:2) comes before c1 (b:5).
	d, err := inputOrder([][]byte{c1, c2, c3}, inputs)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for i, r := range d.recs {
		got = append(got, fmt.Sprintf("%s=%s/%v@%s", r.Key, r.Value, r.Delete, d.pos[i]))
	}
	want := "y=2/false@a:9 z=/true@a:10 w=3/false@b:2 x=1/false@b:5"
	if s := strings.Join(got, " "); s != want {
		t.Fatalf("got %s, want %s", s, want)
	}
	// Interleaved runs within one chunk are sorted record by record.
	var c4 []byte
	c4 = appendRecord(c4, bulk.Record{Key: []byte("p")}, 0, 7)
	c4 = appendRecord(c4, bulk.Record{Key: []byte("q")}, 0, 3)
	if d, err = inputOrder([][]byte{c4}, inputs); err != nil || d.pos[0].Line != 3 || d.pos[1].Line != 7 {
		t.Fatalf("got %v %v", d.pos, err)
	}
	if _, err := inputOrder([][]byte{c4[:len(c4)-1]}, inputs); !errors.Is(err, errBadChunk) {
		t.Fatalf("cut chunk: %v, want errBadChunk", err)
	}
}
