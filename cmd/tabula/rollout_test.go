package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tabuladb/tabula/client"
)

// TestBulkRolloutUnderKills: three masters on raft and five table-server
// processes; a bulk table of 3 copies per partition. Under a BatchGet
// load, version 2 is published and its rollout paused after it starts;
// then the master leader is killed (kill -9), as are a server holding a
// copy of the old row and one holding a copy of the row loading the new
// version; the rollout is resumed through the new leader and finishes.
// No read fails, no BatchGet mixes versions, and every copy ends serving
// version 2.
func TestBulkRolloutUnderKills(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process: skipped with -short")
	}
	dir := t.TempDir()
	var addrs, peers []string
	for i := range 3 {
		a := freeAddr(t)
		addrs = append(addrs, a)
		peers = append(peers, fmt.Sprintf("%d=%s", i+1, a))
	}
	masterList := strings.Join(addrs, ",")
	masters := make([]*proc, 3)
	for i := range 3 {
		masters[i] = start(t, fmt.Sprintf("master-%d", i+1), append([]string{"master", "--id", fmt.Sprint(i + 1), "--peers", strings.Join(peers, ","),
			"--data", filepath.Join(dir, fmt.Sprintf("m%d", i+1))}, fastTiming...)...)
	}
	const servers = 5
	procs := make([]*proc, servers)
	saddrs := make([]string, servers)
	for i := range servers {
		saddrs[i] = freeAddr(t)
		procs[i] = start(t, fmt.Sprintf("server-%d", i), "server", "--master", masterList, "--listen", saddrs[i],
			"--data", filepath.Join(dir, fmt.Sprintf("server-%d", i)), "--fault-domain", fmt.Sprintf("fd-%d", i))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := client.New(ctx, client.Options{Credential: testCred, Masters: addrs})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitFor(t, 30*time.Second, "5 live servers", func() (bool, error) {
		ss, err := c.ListServers(ctx)
		n := 0
		for _, s := range ss {
			if s.GetAlive() {
				n++
			}
		}
		return n == servers, err
	})
	const parts, keys = 4, 2000
	mustCLI(t, masterList, "table", "create", "model", "--kind", "bulk", "--partitions", fmt.Sprint(parts), "--replicas", "3")
	build := func(v int) string {
		var b strings.Builder
		for i := range keys {
			fmt.Fprintf(&b, "key-%05d\tv%d\n", i, v)
		}
		in := filepath.Join(dir, fmt.Sprintf("in%d.tsv", v))
		if err := os.WriteFile(in, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, fmt.Sprintf("v%d", v))
		mustCLI(t, masterList, "bulk", "build", "--table", "model", "--input", in, "--out", out, "--version", fmt.Sprint(v), "--no-progress")
		return out
	}
	if out := mustCLI(t, masterList, "bulk", "publish", "--table", "model", "--dir", build(1), "--no-progress"); !strings.Contains(out, "serves version 1") {
		t.Fatalf("publish 1: %s", out)
	}
	dir2 := build(2)

	tb := c.Table("model")
	rd := startBatchReaders(ctx, tb, keys, 7)
	defer rd.halt()
	waitFor(t, 20*time.Second, "reads", func() (bool, error) { return rd.reads.Load() >= 50, nil })

	// Publish 2 (the CLI waits for the whole rollout) and pause it as
	// soon as it starts (at the publish, before its files are stored: its
	// first row is assigned then, and goes on loading while paused).
	pub := make(chan string, 1)
	go func() {
		out, _, err := cli(t, masterList, nil, "bulk", "publish", "--table", "model", "--dir", dir2, "--no-progress", "--timeout", "2m")
		if err != nil {
			out += "\n" + err.Error()
		}
		pub <- out
	}()
	for {
		st, err := tb.BulkStatus(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.GetRollout().GetVersion() == 2 {
			break
		}
		if st.GetCurrent() == 2 {
			t.Fatal("version 2 rolled out before the test could pause it")
		}
		time.Sleep(time.Millisecond)
	}
	if out := mustCLI(t, masterList, "bulk", "rollout", "pause", "model"); !strings.Contains(out, "paused") {
		t.Fatalf("pause: %s", out)
	}
	st, err := tb.BulkStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m, err := tb.Map(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("paused: %v; table options %v", st.GetRollout(), m.GetTable().GetOptions())
	for _, p := range m.GetPartitions() {
		t.Logf("partition %d: %v", p.GetIndex(), p.GetReplicas())
	}
	// A server with a copy of the old version and one with a copy of the
	// new (loading or serving it), not the same.
	var oldSrv, newSrv string
	for _, p := range m.GetPartitions() {
		for _, r := range p.GetReplicas() {
			holdsNew := false
			for _, h := range r.GetBulkHolds() {
				holdsNew = holdsNew || h == 2
			}
			switch {
			case holdsNew && newSrv == "":
				newSrv = r.GetAddr()
			case !holdsNew && r.GetBulkServes() == 1 && oldSrv == "" && r.GetAddr() != newSrv:
				oldSrv = r.GetAddr()
			}
		}
	}
	if oldSrv == "" || newSrv == "" || oldSrv == newSrv {
		t.Fatalf("no distinct servers of the old and new rows in %v", m.GetPartitions())
	}
	// Kill the master leader, then the two servers.
	leader := -1
	for _, a := range addrs {
		out, _, err := cli(t, a, nil, "master", "members", "--timeout", "2s")
		if err != nil {
			continue
		}
		for _, l := range lines(out) {
			if f := strings.Fields(l); len(f) >= 3 && f[2] == "leader" {
				for k, b := range addrs {
					if b == f[1] {
						leader = k
					}
				}
			}
		}
		if leader >= 0 {
			break
		}
	}
	if leader < 0 {
		t.Fatal("no master leader found")
	}
	t.Logf("kill -9 master %d (leader), then the servers at %s (old row) and %s (new row)", leader+1, oldSrv, newSrv)
	masters[leader].kill()
	for i := range servers {
		if a := saddrs[i]; a == oldSrv || a == newSrv {
			procs[i].kill()
		}
	}
	// The new leader has the paused rollout; resume it there.
	others := []string{}
	for i, a := range addrs {
		if i != leader {
			others = append(others, a)
		}
	}
	waitFor(t, 30*time.Second, "the rollout resumed through the new leader", func() (bool, error) {
		out, _, err := cli(t, strings.Join(others, ","), nil, "bulk", "rollout", "resume", "model", "--timeout", "5s")
		return err == nil && strings.Contains(out, "resume"), nil
	})
	var out string
	select {
	case out = <-pub:
	case <-time.After(2 * time.Minute):
		t.Fatal("the publish did not finish within 2 minutes of the resume")
	}
	if !strings.Contains(out, "serves version 2") {
		t.Fatalf("publish 2 across the failover and kills: %s", out)
	}
	before := rd.reads.Load()
	waitFor(t, 20*time.Second, "reads of version 2", func() (bool, error) { return rd.reads.Load() >= before+50, nil })
	rd.halt()
	t.Logf("%d BatchGets of 16 keys (%d of v1, %d of v2), %d failed, %d mixed or missing", rd.reads.Load(), rd.seenOf("v1"), rd.seenOf("v2"), rd.failed.Load(), rd.mixed.Load())
	if rd.failed.Load() > 0 || rd.mixed.Load() > 0 {
		t.Fatalf("%d reads failed and %d mixed versions or missed keys (first: %s)", rd.failed.Load(), rd.mixed.Load(), rd.firstErr())
	}
	// Every copy serves 2 (on live servers: the dead ones' copies are
	// replaced from the streams).
	waitFor(t, 30*time.Second, "every copy serving version 2", func() (bool, error) {
		m, err := tb.Map(ctx)
		if err != nil || m.GetBulk().GetCurrent() != 2 {
			return false, err
		}
		for _, p := range m.GetPartitions() {
			if len(p.GetReplicas()) != 3 {
				return false, nil
			}
			for _, r := range p.GetReplicas() {
				if r.GetBulkServes() != 2 || r.GetAddr() == oldSrv || r.GetAddr() == newSrv {
					return false, nil
				}
			}
		}
		return true, nil
	})
}
