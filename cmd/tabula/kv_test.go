package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tabuladb/tabula/client"
)

// lsnOf reads the "lsn N" line a -v command printed on stderr.
func lsnOf(t *testing.T, stderr string) uint64 {
	t.Helper()
	for _, l := range lines(stderr) {
		if s, ok := strings.CutPrefix(l, "lsn "); ok {
			n, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				t.Fatalf("lsn line %q: %v", l, err)
			}
			return n
		}
	}
	t.Fatalf("no lsn line in stderr %q", stderr)
	return 0
}

// put -v and del -v print the write's LSN; get --read any --min-lsn reads
// it back from any replica; a bad --read is refused.
func TestKVReplicaFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process: skipped with -short")
	}
	dir := t.TempDir()
	masterAddr := freeAddr(t)
	master := start(t, "master", append([]string{"master", "--listen", masterAddr, "--data", filepath.Join(dir, "master")}, fastTiming...)...)
	master.waitOutput("master serving", 15*time.Second)
	serverArgs := func(i int) []string {
		return []string{"server", "--master", masterAddr, "--data", filepath.Join(dir, fmt.Sprintf("server-%d", i)), "--fault-domain", fmt.Sprintf("fd-%d", i)}
	}
	servers := make([]*proc, 3)
	for i := range 3 {
		servers[i] = start(t, fmt.Sprintf("server-%d", i), serverArgs(i)...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.New(ctx, client.Options{Credential: testCred, Masters: []string{masterAddr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitFor(t, 20*time.Second, "3 live servers", func() (bool, error) {
		ss, err := c.ListServers(ctx)
		alive := 0
		for _, s := range ss {
			if s.GetAlive() {
				alive++
			}
		}
		return alive == 3, err
	})
	mustCLI(t, masterAddr, "table", "create", "kv", "--partitions", "2", "--replicas", "3")

	_, errOut, err := cli(t, masterAddr, nil, "put", "kv", "k", "v1", "-v")
	if err != nil {
		t.Fatalf("put -v: %v: %s", err, errOut)
	}
	lsn := lsnOf(t, errOut)
	if lsn == 0 {
		t.Fatal("put -v printed LSN 0 on a replicated table")
	}
	for range 5 {
		out, errOut, err := cli(t, masterAddr, nil, "get", "kv", "k", "--read", "any", "--min-lsn", strconv.FormatUint(lsn, 10), "-v")
		if err != nil || out != "v1" {
			t.Fatalf("get --read any --min-lsn %d: %q, %v: %s", lsn, out, err, errOut)
		}
		if got := lsnOf(t, errOut); got < lsn {
			t.Fatalf("get reflects LSN %d, asked for at least %d", got, lsn)
		}
	}
	// A staleness bound: only replicas in step within it answer.
	if out, errOut, err := cli(t, masterAddr, nil, "get", "kv", "k", "--read", "any", "--max-lag", "500ms"); err != nil || out != "v1" {
		t.Fatalf("get --read any --max-lag 500ms: %q, %v: %s", out, err, errOut)
	}
	if _, errOut, err := cli(t, masterAddr, nil, "get", "kv", "k", "--max-lag", "500ms"); err == nil || !strings.Contains(errOut, "--read any") {
		t.Fatalf("get --max-lag without --read any: %v, %q", err, errOut)
	}
	// describe shows every secondary's state and lag once all are in sync.
	waitFor(t, 20*time.Second, "describe: every secondary in sync", func() (bool, error) {
		out, errOut, err := cli(t, masterAddr, nil, "table", "describe", "kv")
		if err != nil {
			return false, fmt.Errorf("%v: %s", err, errOut)
		}
		return strings.Count(out, "(in sync, ") == 4 && !strings.Contains(out, "UNDER-REPLICATED"), fmt.Errorf("describe: %s", out)
	})
	// The same id again returns the first outcome: no new LSN.
	_, errOut, err = cli(t, masterAddr, nil, "put", "kv", "k", "v1", "-v", "--request-id", "cli-test-1")
	if err != nil {
		t.Fatalf("put --request-id: %v: %s", err, errOut)
	}
	first := lsnOf(t, errOut)
	_, errOut, err = cli(t, masterAddr, nil, "put", "kv", "k", "v1", "-v", "--request-id", "cli-test-1")
	if err != nil || lsnOf(t, errOut) != first {
		t.Fatalf("put repeated with its request id: %v, stderr %q; want LSN %d again", err, errOut, first)
	}
	out, errOut, err := cli(t, masterAddr, nil, "del", "kv", "k", "-v")
	if err != nil || strings.TrimSpace(out) != "deleted" || lsnOf(t, errOut) <= first {
		t.Fatalf("del -v: %q, %v, %q", out, err, errOut)
	}
	if _, errOut, err := cli(t, masterAddr, nil, "get", "kv", "k", "--read", "nearest"); err == nil || !strings.Contains(errOut, "--read") {
		t.Fatalf("get --read nearest: %v, %q", err, errOut)
	}
	// Any replica: the delete may not have reached the one that answers.
	if out := mustCLI(t, masterAddr, "scan", "kv", "--read", "any"); out != "" && out != "k\tv1\n" {
		t.Fatalf("scan --read any: %q", out)
	}

	// An ordered table: key ranges cut at the split points, scans in key
	// order with a range, both ways, limited; it survives kill -9 of every
	// server (its engine keeps no log of its own: the commit log replays).
	if _, errOut, err := cli(t, masterAddr, nil, "table", "create", "bad", "--kind", "ordered", "--partitions", "4"); err == nil || !strings.Contains(errOut, "--split-points") {
		t.Fatalf("ordered table with --partitions: %v, %q", err, errOut)
	}
	if _, errOut, err := cli(t, masterAddr, nil, "table", "create", "bad", "--split-points", "m"); err == nil || !strings.Contains(errOut, "ordered") {
		t.Fatalf("point table with --split-points: %v, %q", err, errOut)
	}
	if out := mustCLI(t, masterAddr, "table", "create", "sorted", "--kind", "ordered", "--split-points", "g,p", "--replicas", "3"); !strings.Contains(out, "kind ordered, 3 partitions") {
		t.Fatalf("create ordered: %q", out)
	}
	for _, k := range []string{"t", "a", "p", "h", "g", "z", "b"} {
		mustCLI(t, masterAddr, "put", "sorted", k, "v-"+k)
	}
	check := func(what string) {
		t.Helper()
		for _, tc := range []struct {
			args []string
			want string
		}{
			{nil, "a b g h p t z"},
			{[]string{"--from", "b", "--to", "p"}, "b g h"},
			{[]string{"--reverse", "--limit", "4"}, "z t p h"},
			{[]string{"--from", "c", "--reverse"}, "z t p h g"},
		} {
			out := mustCLI(t, masterAddr, append([]string{"scan", "sorted"}, tc.args...)...)
			var keys []string
			for _, l := range lines(out) {
				k, v, _ := strings.Cut(l, "\t")
				if v != "v-"+k {
					t.Fatalf("%s: scan %v: line %q", what, tc.args, l)
				}
				keys = append(keys, k)
			}
			if got := strings.Join(keys, " "); got != tc.want {
				t.Fatalf("%s: scan %v: %q, want %q", what, tc.args, got, tc.want)
			}
		}
	}
	check("before the kill")
	if out := mustCLI(t, masterAddr, "table", "describe", "sorted"); !strings.Contains(out, "KEY RANGE") || !strings.Contains(out, "[g, p)") || !strings.Contains(out, "[p, (end))") {
		t.Fatalf("describe ordered: %q", out)
	}
	for i, s := range servers {
		s.kill()
		servers[i] = start(t, fmt.Sprintf("server-%d-again", i), serverArgs(i)...)
	}
	waitFor(t, 30*time.Second, "the ordered table readable again", func() (bool, error) {
		_, _, err := cli(t, masterAddr, nil, "get", "sorted", "z")
		return err == nil, nil
	})
	check("after kill -9 of every server")
}
