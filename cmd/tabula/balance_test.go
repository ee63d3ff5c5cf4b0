package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestClusterBalanceDryRun: real servers report load with their
// heartbeats; after two join a cluster of three, `tabula cluster balance
// --dry-run` prints moves onto them with reasons and the servers before
// and after, and changes nothing; `table describe` shows each
// partition's rates; without --dry-run the master runs one round and
// the command prints what it started.
func TestClusterBalanceDryRun(t *testing.T) {
	dir := t.TempDir()
	masterAddr := freeAddr(t)
	master := start(t, "master", append([]string{"master", "--listen", masterAddr, "--data", filepath.Join(dir, "master")}, fastTiming...)...)
	master.waitOutput("master serving", 15*time.Second)
	server := func(i int) *proc {
		return start(t, fmt.Sprintf("server-%d", i), "server", "--master", masterAddr,
			"--data", filepath.Join(dir, fmt.Sprintf("server-%d", i)), "--fault-domain", fmt.Sprintf("fd-%d", i))
	}
	for i := range 3 {
		server(i).waitOutput("registered with master", 20*time.Second)
	}
	mustCLI(t, masterAddr, "table", "create", "b", "--partitions", "6")
	for i := range 20 {
		mustCLI(t, masterAddr, "put", "b", fmt.Sprintf("k%d", i), "v")
	}
	desc := mustCLI(t, masterAddr, "table", "describe", "b")
	if !strings.Contains(desc, "READS/S") || !strings.Contains(desc, "WRITES/S") {
		t.Fatalf("describe has no rate columns:\n%s", desc)
	}
	for i := 3; i < 5; i++ {
		server(i).waitOutput("registered with master", 20*time.Second)
	}
	var out string
	waitFor(t, 20*time.Second, "a plan moving replicas to the new servers", func() (bool, error) {
		out = mustCLI(t, masterAddr, "cluster", "balance", "--dry-run")
		return strings.Contains(out, "move replica of default/b#") && !strings.Contains(out, "warming up"), nil
	})
	if !strings.Contains(out, "why: ") || !strings.Contains(out, "below band: ") || !strings.Contains(out, "before:") || !strings.Contains(out, "after:") {
		t.Fatalf("plan output:\n%s", out)
	}
	if again := mustCLI(t, masterAddr, "cluster", "balance", "--dry-run"); !strings.Contains(again, "move replica of") {
		t.Fatalf("a dry run changed the cluster: the second plan moves nothing:\n%s", again)
	}
	applied := mustCLI(t, masterAddr, "cluster", "balance")
	if !strings.Contains(applied, "     started\n") || !strings.Contains(applied, "started ") {
		t.Fatalf("balance without --dry-run started nothing:\n%s", applied)
	}
}
