package client_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tabuladb/tabula/internal/testcluster"
)

// TestREADMEProgram builds the README's Go SDK program as a user would:
// in a module of its own that requires this one through the README's
// `go mod edit` line (its ../tabula pointed at this checkout), then runs
// it against a cluster with a profile for tenant acme saved where the
// program looks (issue 32, item 1). go.sum is copied from this module and
// the build may add requirements (-mod=mod) but not download: what `go
// mod tidy` does with the network.
func TestREADMEProgram(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program: skipped with -short")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	sdk := string(readme)
	i := strings.Index(sdk, "\n## The Go SDK\n")
	if i < 0 {
		t.Fatal("README.md has no section \"The Go SDK\"")
	}
	sdk = sdk[i+1:]
	if j := strings.Index(sdk[1:], "\n## "); j >= 0 {
		sdk = sdk[:j+1]
	}
	prog := regexp.MustCompile("(?s)```go\n(package main\n.*?)```").FindStringSubmatch(sdk)
	if prog == nil {
		t.Fatal("the SDK section has no ```go block with a whole program (package main)")
	}
	edit := regexp.MustCompile(`(?m)^go mod edit (.*-replace github\.com/tabuladb/tabula=)\.\./tabula$`).FindStringSubmatch(sdk)
	if edit == nil {
		t.Fatal("the SDK section does not show `go mod edit ... -replace github.com/tabuladb/tabula=../tabula`")
	}

	dir := t.TempDir()
	app := filepath.Join(dir, "app")
	if err := os.MkdirAll(app, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(app, "main.go"), []byte(prog[1]), 0o644); err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(app, "go.sum"), sum, 0o644); err != nil {
		t.Fatal(err)
	}
	goBin := "go"
	env := append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off")
	run := func(args ...string) {
		t.Helper()
		cmd := exec.Command(goBin, args...)
		cmd.Dir, cmd.Env = app, env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("mod", "init", "example.com/app")
	run(append([]string{"mod", "edit"}, strings.Fields(edit[1]+root)...)...)
	run("build", "-o", filepath.Join(dir, "app.bin"), ".")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tc, err := testcluster.Start(ctx, testcluster.Options{Servers: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	config, err := saveTenantProfile(ctx, tc, dir, "acme")
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second run finds the table there
		cmd := exec.CommandContext(ctx, filepath.Join(dir, "app.bin"))
		cmd.Env = append(os.Environ(), "TABULA_CONFIG="+config)
		out, err := cmd.CombinedOutput()
		if err != nil || string(out) != "alice: pro\n" {
			t.Fatalf("the README's program: %v\n%s", err, out)
		}
	}
}
