package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestTabulaBuildRunnerLocal: `tabula bulk build --runner local` runs the
// build on tabula-beam (found beside tabula) and writes the same files as
// the native builder from the same input.
func TestTabulaBuildRunnerLocal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	build := func(modDir, pkg, out string) {
		cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
		cmd.Dir = modDir
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", pkg, err, b)
		}
	}
	// tabula from the product's module, tabula-beam from this one, side by
	// side as an install puts them.
	build("../../..", "./cmd/tabula", filepath.Join(dir, "tabula"))
	build(".", ".", filepath.Join(dir, "tabula-beam"))
	var in strings.Builder
	for i := range 3000 {
		fmt.Fprintf(&in, "key-%05d\tvalue-%d\n", i, i*7)
	}
	input := filepath.Join(dir, "in.tsv")
	if err := os.WriteFile(input, []byte(in.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(out string, extra ...string) {
		args := append([]string{"bulk", "build", "--input", input, "--out", out, "--partitions", "4", "--version", "3", "--no-progress"}, extra...)
		cmd := exec.CommandContext(ctx, filepath.Join(dir, "tabula"), args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("tabula %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
	}
	native, beam := filepath.Join(dir, "native"), filepath.Join(dir, "beam")
	run(native)
	run(beam, "--runner", "local")
	files, err := filepath.Glob(filepath.Join(native, "*.bulk"))
	if err != nil || len(files) != 4 {
		t.Fatalf("native build: %v, %v", files, err)
	}
	for _, f := range files {
		a, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(beam, filepath.Base(f)))
		if err != nil {
			t.Fatalf("the Beam build lacks %s: %v", filepath.Base(f), err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs between the native and the Beam build", filepath.Base(f))
		}
	}
}
