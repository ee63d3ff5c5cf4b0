package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/keyspace"
)

// TestBulkPublishProcesses runs `tabula master` and 3 `tabula server`
// processes, and drives a bulk table through the CLI alone: create, build
// for the table, publish, get, a second version, status, rollback, a delta,
// and a put refused.
func TestBulkPublishProcesses(t *testing.T) {
	dir := t.TempDir()
	masterAddr := freeAddr(t)
	master := start(t, "master", append([]string{"master", "--listen", masterAddr, "--data", filepath.Join(dir, "master")}, fastTiming...)...)
	master.waitOutput("master serving", 15*time.Second)
	for i := range 3 {
		start(t, fmt.Sprintf("server-%d", i), "server", "--master", masterAddr,
			"--data", filepath.Join(dir, fmt.Sprintf("server-%d", i)), "--fault-domain", fmt.Sprintf("fd-%d", i))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := client.New(ctx, client.Options{Credential: testCred, Masters: []string{masterAddr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitFor(t, 20*time.Second, "3 live servers", func() (bool, error) {
		ss, err := c.ListServers(ctx)
		n := 0
		for _, s := range ss {
			if s.GetAlive() {
				n++
			}
		}
		return n == 3, err
	})
	mustCLI(t, masterAddr, "table", "create", "model", "--kind", "bulk", "--partitions", "6")
	// The partitions spread over all 3 servers.
	d, err := c.DescribeTable(ctx, "model")
	if err != nil {
		t.Fatal(err)
	}
	hosts := map[string]bool{}
	for _, p := range d.GetMap().GetPartitions() {
		hosts[primaryID(p)] = true
	}
	if len(hosts) != 3 {
		t.Fatalf("6 partitions on %d servers", len(hosts))
	}

	input := func(name, tag string, n int, deleted ...int) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "key-%05d\t%s-%d\n", i, tag, i)
		}
		for _, i := range deleted {
			fmt.Fprintf(&b, "key-%05d\n", i)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	build := func(out string, args ...string) string {
		return mustCLI(t, masterAddr, append([]string{"bulk", "build", "--table", "model", "--out", filepath.Join(dir, out), "--no-progress"}, args...)...)
	}
	get := func(key string) string {
		return strings.TrimSpace(mustCLI(t, masterAddr, "get", "model", key))
	}

	if out := build("v1", "--input", input("v1.tsv", "one", 3000)); !strings.Contains(out, "built version 1") {
		t.Fatalf("build v1: %s", out)
	}
	if out := mustCLI(t, masterAddr, "bulk", "publish", "--table", "model", "--dir", filepath.Join(dir, "v1"), "--no-progress"); !strings.Contains(out, "serves version 1") {
		t.Fatalf("publish v1: %s", out)
	}
	if v := get("key-00042"); v != "one-42" {
		t.Fatalf("get after v1: %q", v)
	}
	// The next build takes version 2 from the table.
	if out := build("v2", "--input", input("v2.tsv", "two", 3000)); !strings.Contains(out, "built version 2") {
		t.Fatalf("build v2: %s", out)
	}
	mustCLI(t, masterAddr, "bulk", "publish", "--table", "model", "--dir", filepath.Join(dir, "v2"), "--no-progress")
	if v := get("key-00042"); v != "two-42" {
		t.Fatalf("get after v2: %q", v)
	}
	status := mustCLI(t, masterAddr, "bulk", "status", "model", "--partitions")
	if !strings.Contains(status, "serving version 2") || !strings.Contains(status, "6/6") {
		t.Fatalf("status:\n%s", status)
	}
	// Each partition's row names every server holding a copy (it named
	// the last one only).
	d, err = c.DescribeTable(ctx, "model")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range d.GetMap().GetPartitions() {
		var ids []string
		for _, r := range p.GetReplicas() {
			ids = append(ids, r.GetServerId())
		}
		if row := fmt.Sprintf(`\n%d +%s `, p.GetIndex(), strings.Join(ids, ",")); len(ids) < 2 || !regexp.MustCompile(row).MatchString(status) {
			t.Errorf("bulk status --partitions has no row %q for partition %d's %d copies:\n%s", row, p.GetIndex(), len(ids), status)
		}
	}
	mustCLI(t, masterAddr, "bulk", "rollback", "model", "--version", "1")
	if v := get("key-00042"); v != "one-42" {
		t.Fatalf("get after rollback: %q", v)
	}
	// A delta over 1: key 42 changed, key 43 deleted.
	var b strings.Builder
	fmt.Fprintf(&b, "key-00042\tdelta-42\nkey-00043\n")
	if err := os.WriteFile(filepath.Join(dir, "d.tsv"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := build("d3", "--input", filepath.Join(dir, "d.tsv"), "--delta-of", "1"); !strings.Contains(out, "built version 3") {
		t.Fatalf("build delta: %s", out)
	}
	mustCLI(t, masterAddr, "bulk", "publish", "--table", "model", "--dir", filepath.Join(dir, "d3"), "--no-progress")
	if v := get("key-00042"); v != "delta-42" {
		t.Fatalf("get over the delta: %q", v)
	}
	if v := get("key-00044"); v != "one-44" {
		t.Fatalf("unchanged key over the delta: %q", v)
	}
	if _, errOut, err := cli(t, masterAddr, nil, "get", "model", "key-00043"); err == nil || !strings.Contains(errOut, "not found") {
		t.Fatalf("deleted key over the delta: err %v, stderr %q", err, errOut)
	}
	if _, errOut, err := cli(t, masterAddr, nil, "put", "model", "k", "v"); err == nil || !strings.Contains(errOut, "WRONG_KIND") {
		t.Fatalf("put to a bulk table: err %v, stderr %q", err, errOut)
	}
	// Publishing version 2 again (retained, not serving) loads it, no switch.
	if out := mustCLI(t, masterAddr, "bulk", "publish", "--table", "model", "--dir", filepath.Join(dir, "v2"), "--no-progress"); !strings.Contains(out, "serves version 3") {
		t.Fatalf("republish of a retained version: %s", out)
	}
	// A version number already used, with other content, is refused clearly.
	build("v2b", "--input", input("v2b.tsv", "other", 100), "--version", "2")
	if _, errOut, err := cli(t, masterAddr, nil, "bulk", "publish", "--table", "model", "--dir", filepath.Join(dir, "v2b"), "--no-progress"); err == nil || !strings.Contains(errOut, "other files") {
		t.Fatalf("publish of a used version number: err %v, stderr %q", err, errOut)
	}
}

// TestBulkMoveProcesses publishes a bulk version to 3 server processes
// (each file stored in a stream), kills the server of partition 0 with
// SIGKILL, and checks that its partitions move and are served by their new
// servers, which fetched the files from the streams: every key reads back.
func TestBulkMoveProcesses(t *testing.T) {
	dir := t.TempDir()
	masterAddr := freeAddr(t)
	master := start(t, "master", append([]string{"master", "--listen", masterAddr, "--data", filepath.Join(dir, "master")}, fastTiming...)...)
	master.waitOutput("master serving", 15*time.Second)
	procs := map[string]*proc{} // by address
	for i := range 3 {
		addr := freeAddr(t)
		procs[addr] = start(t, fmt.Sprintf("server-%d", i), "server", "--master", masterAddr, "--listen", addr,
			"--data", filepath.Join(dir, fmt.Sprintf("server-%d", i)), "--fault-domain", fmt.Sprintf("fd-%d", i))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := client.New(ctx, client.Options{Credential: testCred, Masters: []string{masterAddr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitFor(t, 20*time.Second, "3 live servers", func() (bool, error) {
		ss, err := c.ListServers(ctx)
		n := 0
		for _, s := range ss {
			if s.GetAlive() {
				n++
			}
		}
		return n == 3, err
	})
	mustCLI(t, masterAddr, "table", "create", "model", "--kind", "bulk", "--partitions", "6")
	const n = 5000
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "key-%05d\tval-%d\n", i, i)
	}
	in := filepath.Join(dir, "in.tsv")
	if err := os.WriteFile(in, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	mustCLI(t, masterAddr, "bulk", "build", "--table", "model", "--input", in, "--out", filepath.Join(dir, "v1"), "--no-progress")
	if out := mustCLI(t, masterAddr, "bulk", "publish", "--table", "model", "--dir", filepath.Join(dir, "v1"), "--no-progress"); !strings.Contains(out, "serves version 1") {
		t.Fatalf("publish: %s", out)
	}
	if out := mustCLI(t, masterAddr, "stream", "ls"); strings.Count(out, "bulk/") != 6 {
		t.Fatalf("streams after the publish:\n%s", out)
	}
	if out := mustCLI(t, masterAddr, "bulk", "status", "model", "--partitions"); strings.Count(out, "bulk/") != 6 {
		t.Fatalf("status does not show the streams:\n%s", out)
	}
	tb := c.Table("model")
	m, err := tb.Map(ctx)
	if err != nil {
		t.Fatal(err)
	}
	victim := m.GetPartitions()[0].GetReplicas()[0]
	p := procs[victim.GetAddr()]
	if p == nil {
		t.Fatalf("no process serves %s", victim.GetAddr())
	}
	p.kill() // SIGKILL
	t.Logf("killed %s (%s) with SIGKILL", victim.GetServerId(), victim.GetAddr())
	waitFor(t, 30*time.Second, "partitions to move and load version 1 on their new servers", func() (bool, error) {
		st, err := tb.BulkStatus(ctx)
		if err != nil {
			return false, nil
		}
		m, err := tb.Map(ctx)
		if err != nil {
			return false, nil
		}
		for _, p := range m.GetPartitions() {
			if len(p.GetReplicas()) == 0 || p.GetReplicas()[0].GetServerId() == victim.GetServerId() {
				return false, nil
			}
		}
		return st.GetCurrent() == 1 && len(st.GetVersions()) == 1 && st.GetVersions()[0].GetLoadedPartitions() == 6, nil
	})
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("key-%05d", i))
	}
	res, err := tb.BatchGet(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if !r.Found || string(r.Value) != fmt.Sprintf("val-%d", i) {
			t.Fatalf("key %d after the move: %q %v", i, r.Value, r.Found)
		}
	}
	// A key of the moved partition 0, through the CLI.
	for i := range n {
		if keyspace.Index(keyspace.Hash(keys[i]), 6) == 0 {
			if v := strings.TrimSpace(mustCLI(t, masterAddr, "get", "model", string(keys[i]))); v != fmt.Sprintf("val-%d", i) {
				t.Fatalf("get %s: %q", keys[i], v)
			}
			break
		}
	}
	found := false
	for _, q := range procs {
		if q != p && strings.Contains(q.output(), "fetched from its stream") {
			found = true
		}
	}
	if !found {
		t.Fatal("no live server logged a fetch from a stream")
	}
}
