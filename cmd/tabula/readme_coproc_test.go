package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// readmeBlock returns the first ```sh block after heading in README.md.
func readmeBlock(t *testing.T, heading string) string {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(readme)
	i := strings.Index(s, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("README has no %q", heading)
	}
	s = s[i:]
	j := strings.Index(s, "```sh\n")
	k := strings.Index(s[j+6:], "```")
	if j < 0 || k < 0 {
		t.Fatalf("README's %q has no sh block", heading)
	}
	return s[j+6 : j+6+k]
}

// TestREADMECoprocessors runs README's coprocessor block as written
// against `tabula dev` (issue 32: it deployed to a table it never made,
// and its filter example printed nothing). The only changes: it runs in a
// scratch directory, so `go build` is pointed at the repository and
// writes its output there.
func TestREADMECoprocessors(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process: skipped with -short")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	if err := os.Symlink(tabulaBin, filepath.Join(work, "tabula")); err != nil {
		t.Fatal(err)
	}
	script := readmeBlock(t, "## Coprocessors")
	script = regexp.MustCompile(`go build (.*)-o (\S+) `).ReplaceAllString(script, "go -C "+root+" build $1-o "+work+"/$2 ")
	if !strings.Contains(script, "go -C ") {
		t.Fatalf("no go build to point at the repository in:\n%s", script)
	}

	data := filepath.Join(work, "data")
	addr := freeAddr(t)
	dev := start(t, "dev", "dev", "--data", data, "--listen", addr, "--azure-listen", freeAddr(t), "--servers", "1")
	dev.waitOutput("tabula dev ready", 30*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = work
	cmd.Env = append(os.Environ(), "TABULA_MASTER="+addr) // dev and the CLI share $TABULA_CLUSTER_KEY (TestMain)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("README's coprocessor block: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errOut.String())
	}
	got := out.String()
	for _, want := range []string{"counter version 1 is live", "alice\tname=alice", "carol\tname=carol"} {
		if !strings.Contains(got, want) {
			t.Errorf("README's coprocessor block printed no %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "bob\t") {
		t.Errorf("the filter kept bob (age 27, where age>=30):\n%s", got)
	}
	if !strings.Contains(errOut.String(), "servers ready") {
		t.Errorf("deploy showed no progress:\n%s", errOut.String())
	}
}
