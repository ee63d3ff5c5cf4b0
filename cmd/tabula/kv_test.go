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
	for i := range 3 {
		start(t, fmt.Sprintf("server-%d", i), "server", "--master", masterAddr,
			"--data", filepath.Join(dir, fmt.Sprintf("server-%d", i)), "--fault-domain", fmt.Sprintf("fd-%d", i))
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
}
