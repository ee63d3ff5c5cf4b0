package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/coproc/coproctest"
)

// coprocCache is the compilation cache the coprocessor tests share, so a
// Go guest is compiled to machine code once per machine, not per test.
func coprocCache(t *testing.T) string {
	if dir := os.Getenv("TABULA_COPROC_TEST_CACHE"); dir != "" {
		return dir
	}
	uc, err := os.UserCacheDir()
	if err != nil {
		return filepath.Join(t.TempDir(), "coproc-cache")
	}
	return filepath.Join(uc, "tabula", "coproc-test-wazero")
}

// TestCoprocProcesses drives coprocessors through the CLI against a master
// and 2 server processes: deploy, list, a point call with an idempotency
// token retried, a range call, a new version and a rollback, then a server
// and the master killed with kill -9 and restarted: the modules survive
// and serve.
func TestCoprocProcesses(t *testing.T) {
	dir := t.TempDir()
	cache := coprocCache(t)
	masterAddr := freeAddr(t)
	masterArgs := append([]string{"master", "--listen", masterAddr, "--data", filepath.Join(dir, "master")}, fastTiming...)
	master := start(t, "master", masterArgs...)
	master.waitOutput("master serving", 15*time.Second)
	serverArgs := func(i int) []string {
		return []string{"server", "--master", masterAddr, "--data", filepath.Join(dir, fmt.Sprintf("server-%d", i)),
			"--fault-domain", fmt.Sprintf("fd-%d", i), "--coproc-cache", cache}
	}
	servers := []*proc{start(t, "server-0", serverArgs(0)...), start(t, "server-1", serverArgs(1)...)}

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c, err := client.New(ctx, client.Options{Credential: testCred, Masters: []string{masterAddr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	liveServers := func(n int) {
		t.Helper()
		waitFor(t, 30*time.Second, fmt.Sprintf("%d live servers", n), func() (bool, error) {
			ss, err := c.ListServers(ctx)
			live := 0
			for _, s := range ss {
				if s.GetAlive() {
					live++
				}
			}
			return live == n, err
		})
	}
	liveServers(2)

	build := func(pkg string) string {
		t.Helper()
		if _, err := coproctest.Build(ctx, pkg, dir); err != nil {
			t.Fatal(err)
		}
		return filepath.Join(dir, filepath.Base(pkg)+".wasm")
	}
	counterWasm, filterWasm, abitestWasm := build("examples/counter_add"), build("examples/filter_scan"), build("testdata/abitest")
	file := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	add5 := file("add5", binary.LittleEndian.AppendUint64(nil, 5))

	mustCLI(t, masterAddr, "table", "create", "acct", "--partitions", "4")
	if out := mustCLI(t, masterAddr, "coproc", "deploy", "--table", "acct", "--name", "counter", "--wasm", counterWasm); !strings.Contains(out, "version 1 is live") {
		t.Fatalf("deploy: %s", out)
	}
	// Bad input changes nothing and says why.
	if _, errOut, err := cli(t, masterAddr, nil, "coproc", "deploy", "--table", "acct", "--name", "bad", "--wasm", add5); err == nil || !strings.Contains(errOut, "module_invalid") {
		t.Fatalf("deploy of garbage: %v %s", err, errOut)
	}
	if _, errOut, err := cli(t, masterAddr, nil, "coproc", "invoke", "acct", "counter", "nope", "--key", "c1"); err == nil || !strings.Contains(errOut, "unknown_method") {
		t.Fatalf("invoke of an unknown method: %v %s", err, errOut)
	}

	// A point call retried with its token applies once.
	for range 3 {
		out := mustCLI(t, masterAddr, "coproc", "invoke", "acct", "counter", "add", "--key", "c1", "--input", add5, "--token", "tok-1", "--hex")
		if strings.TrimSpace(out) != "0500000000000000" {
			t.Fatalf("counter after a retried add: %s, want 5 (0500000000000000)", out)
		}
	}
	invokeAdd := func(key string) string {
		t.Helper()
		return strings.TrimSpace(mustCLI(t, masterAddr, "coproc", "invoke", "acct", "counter", "add", "--key", key, "--input", add5, "--hex"))
	}
	if out := invokeAdd("c1"); out != "0a00000000000000" {
		t.Fatalf("counter after a new add: %s, want 10", out)
	}

	// A range call: filter_scan over [u02, u05) on every partition.
	for i := range 8 {
		mustCLI(t, masterAddr, "put", "acct", fmt.Sprintf("u%02d", i), fmt.Sprintf("name=n%d,age=%d", i, 20+i))
	}
	mustCLI(t, masterAddr, "coproc", "deploy", "--table", "acct", "--name", "filter", "--wasm", filterWasm)
	query := file("query", []byte("where age>=23\nselect name\n"))
	got := lines(mustCLI(t, masterAddr, "coproc", "invoke", "acct", "filter", "filter", "--range", "u02..u05", "--input", query))
	slices.Sort(got)
	if want := []string{"u03\tname=n3", "u04\tname=n4"}; !slices.Equal(got, want) {
		t.Fatalf("range call: %q, want %q", got, want)
	}
	if _, errOut, err := cli(t, masterAddr, nil, "coproc", "invoke", "acct", "filter", "filter", "--range", "u02"); err == nil || !strings.Contains(errOut, "START..END") {
		t.Fatalf("a malformed range: %v %s", err, errOut)
	}

	// Version 2 of counter has no add; rolling back to version 1 is one
	// alias flip, effective within a second.
	if out := mustCLI(t, masterAddr, "coproc", "deploy", "--table", "acct", "--name", "counter", "--wasm", abitestWasm); !strings.Contains(out, "version 2 is live") {
		t.Fatalf("deploy of version 2: %s", out)
	}
	if _, errOut, err := cli(t, masterAddr, nil, "coproc", "invoke", "acct", "counter", "add", "--key", "c1", "--input", add5); err == nil || !strings.Contains(errOut, "unknown_method") {
		t.Fatalf("add on version 2: %v %s", err, errOut)
	}
	t0 := time.Now()
	mustCLI(t, masterAddr, "coproc", "rollback", "acct", "counter", "--version", "1")
	if out := invokeAdd("c1"); out != "0f00000000000000" {
		t.Fatalf("counter after the rollback: %s, want 15", out)
	}
	t.Logf("rollback to version 1 and the first call on it: %v", time.Since(t0).Round(time.Millisecond))
	list := mustCLI(t, masterAddr, "coproc", "list", "acct")
	for _, want := range []string{"counter  1        live", "counter  2", "filter   1        live"} {
		if !strings.Contains(list, want) {
			t.Fatalf("coproc list lacks %q:\n%s", want, list)
		}
	}

	// kill -9 a server and restart it: it compiles its modules again (from
	// the cache) and serves them.
	servers[0].kill()
	servers[0] = start(t, "server-0b", serverArgs(0)...)
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		waitFor(t, 30*time.Second, "counter add on "+k+" after the server restart", func() (bool, error) {
			out, errOut, err := cli(t, masterAddr, nil, "coproc", "invoke", "acct", "counter", "add", "--key", k, "--input", add5, "--hex", "--token", "restart-"+k)
			if err != nil {
				return false, fmt.Errorf("%v: %s", err, errOut)
			}
			return strings.TrimSpace(out) == "0500000000000000", fmt.Errorf("output %s", out)
		})
	}

	// kill -9 the master and restart it: versions and aliases survive.
	master.kill()
	master = start(t, "master-b", masterArgs...)
	master.waitOutput("master serving", 15*time.Second)
	liveServers(2)
	if after := mustCLI(t, masterAddr, "coproc", "list", "acct"); after != list {
		t.Fatalf("coproc list changed across a master restart:\n%s\nvs\n%s", list, after)
	}
	if out := invokeAdd("c1"); out != "1400000000000000" {
		t.Fatalf("counter after the master restart: %s, want 20", out)
	}
}
