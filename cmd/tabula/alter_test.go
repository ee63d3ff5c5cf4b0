package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestTableAlter: a table's split settings given at create show in
// describe, `table alter` changes the flags it is given and keeps the
// others, and settings that cannot hold are refused with the reason
// (min above max, above the table limit, a bulk table, nothing to
// change), changing nothing. The master takes the cluster's split flags.
func TestTableAlter(t *testing.T) {
	dir := t.TempDir()
	masterAddr := freeAddr(t)
	master := start(t, "master", append([]string{"master", "--listen", masterAddr, "--data", filepath.Join(dir, "master"),
		"--split-qps", "5000", "--split-size", "1073741824", "--split-sustain", "20s", "--max-concurrent-splits", "2"}, fastTiming...)...)
	master.waitOutput("master serving", 15*time.Second)
	start(t, "server", "server", "--master", masterAddr, "--data", filepath.Join(dir, "server")).waitOutput("registered with master", 20*time.Second)
	mustCLI(t, masterAddr, "table", "create", "t", "--partitions", "2", "--replicas", "1", "--max-partitions", "8", "--split-qps", "300")
	if out := mustCLI(t, masterAddr, "table", "describe", "t"); !strings.Contains(out, "splits       min partitions none, max partitions 8, split at the cluster's or 300 reads+writes/s") {
		t.Fatalf("describe after create:\n%s", out)
	}
	out := mustCLI(t, masterAddr, "table", "alter", "t", "--min-partitions", "2", "--split-size", "1048576")
	if !strings.Contains(out, "min partitions 2, max partitions 8, split at 1048576 bytes or 300 reads+writes/s") {
		t.Fatalf("alter: %s", out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"table", "alter", "t", "--min-partitions", "9"}, "min_above_max"},
		{[]string{"table", "alter", "t", "--max-partitions", "5000"}, "too_many_partitions"},
		{[]string{"table", "alter", "t"}, "nothing to change"},
		{[]string{"table", "alter", "nope", "--split-qps", "1"}, "does not exist"},
		{[]string{"table", "create", "b", "--kind", "bulk", "--max-partitions", "4"}, "bulk_table"},
	} {
		out, errOut, err := cli(t, masterAddr, nil, c.args...)
		if err == nil || !strings.Contains(errOut, c.want) {
			t.Fatalf("tabula %s: %v, want a refusal naming %q\nstdout: %s\nstderr: %s", strings.Join(c.args, " "), err, c.want, out, errOut)
		}
	}
	if out := mustCLI(t, masterAddr, "table", "describe", "t"); !strings.Contains(out, "min partitions 2, max partitions 8, split at 1048576 bytes or 300 reads+writes/s") {
		t.Fatalf("a refusal changed the table:\n%s", out)
	}
}
