package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBulkBuildRunnerNeedsBeam: --runner builds on tabula-beam, a binary
// of its own; without it the command says how to install it, and builds
// nothing.
func TestBulkBuildRunnerNeedsBeam(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.tsv")
	if err := os.WriteFile(in, []byte("a\t1\nb\t2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(tabulaBin, "bulk", "build", "--input", in, "--out", filepath.Join(dir, "out"), "--partitions", "2", "--runner", "local", "--no-progress")
	cmd.Env = append(os.Environ(), "PATH="+dir) // no tabula-beam anywhere
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "needs tabula-beam") || !strings.Contains(string(out), "go install ./cmd/tabula-beam") {
		t.Fatalf("bulk build --runner without tabula-beam: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "out")); !os.IsNotExist(err) {
		t.Fatalf("the failed build left %s: %v", filepath.Join(dir, "out"), err)
	}
	cmd = exec.Command(tabulaBin, "bulk", "build", "--input", in, "--out", filepath.Join(dir, "out"), "--partitions", "2", "--beam-arg=--endpoint=x", "--no-progress")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "give --runner too") {
		t.Fatalf("--beam-arg without --runner: %v\n%s", err, out)
	}
}
