package bulk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// buildByHooks builds inputs as an external pipeline does with the exported
// steps: InputReader, PartitionOf, then BuildPartitionAt of each partition's
// records in input order, and JoinPartitionErrors.
func buildByHooks(t *testing.T, inputs []string, outDir string, opts BuildOptions) error {
	t.Helper()
	np := opts.Partitions
	recs := make([][]Record, np)
	pos := make([][]Position, np)
	for _, name := range inputs {
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		r := NewInputReader(name, f, opts)
		for {
			rec, p, err := r.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				f.Close()
				return err
			}
			i := PartitionOf(rec.Key, np)
			rec.Key, rec.Value = bytes.Clone(rec.Key), bytes.Clone(rec.Value)
			recs[i], pos[i] = append(recs[i], rec), append(pos[i], p)
		}
		f.Close()
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		t.Fatal(err)
	}
	errs := make([]error, np)
	for i := range np {
		spec := PartitionSpec{Partition: i, Partitions: np, Version: opts.Version, Delta: opts.DeltaOf != 0, BaseVersion: opts.DeltaOf}
		_, errs[i] = BuildPartitionAt(context.Background(), filepath.Join(outDir, PartitionFileName(i, np)), recs[i], pos[i], spec, opts.Partition)
	}
	return JoinPartitionErrors(errs, inputs)
}

// TestBeamHooksMatchBuildTable: the exported steps make BuildTable's files
// and errors (the Beam pipeline in module beambuild relies on it).
func TestBeamHooksMatchBuildTable(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, lines []string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	var a, b []string
	for i := range 3000 {
		a = append(a, fmt.Sprintf("k%d\t%s", i%2500, strings.Repeat("v", i%37)))
	}
	for i := range 500 {
		b = append(b, fmt.Sprintf("k%d", i*5))
	}
	full := []string{write("a.tsv", a)}
	delta := []string{write("a2.tsv", a), write("b.tsv", b)}
	dups := []string{write("d.tsv", []string{"x\t1", "y\t2", "x\t3", "\tempty key"})}
	for _, tc := range []struct {
		name   string
		inputs []string
		opts   BuildOptions
	}{
		{"last-wins", full, BuildOptions{Partitions: 4, Version: 2, Partition: PartitionOptions{LastWins: true}}},
		{"duplicates", full, BuildOptions{Partitions: 4, Version: 2}},
		{"delta", delta, BuildOptions{Partitions: 3, Version: 5, DeltaOf: 4, Partition: PartitionOptions{LastWins: true}}},
		{"empty-key", dups, BuildOptions{Partitions: 2, Version: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			native, hooks := filepath.Join(t.TempDir(), "n"), filepath.Join(t.TempDir(), "h")
			_, nerr := BuildTable(context.Background(), tc.inputs, native, tc.opts)
			herr := buildByHooks(t, tc.inputs, hooks, tc.opts)
			if (nerr == nil) != (herr == nil) || (nerr != nil && nerr.Error() != herr.Error()) {
				t.Fatalf("BuildTable: %v\nhooks: %v", nerr, herr)
			}
			if nerr != nil {
				return
			}
			for i := range tc.opts.Partitions {
				name := PartitionFileName(i, tc.opts.Partitions)
				x, err := os.ReadFile(filepath.Join(native, name))
				if err != nil {
					t.Fatal(err)
				}
				y, err := os.ReadFile(filepath.Join(hooks, name))
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(x, y) {
					t.Fatalf("%s differs", name)
				}
			}
		})
	}
}
