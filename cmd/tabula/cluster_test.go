package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/keyspace"
)

// fastTiming makes failure detection quick enough for tests, and leaves
// the balancer to the tests that turn it on (--rebalance): the others
// place partitions by hand and kill, pause or move chosen replicas.
var fastTiming = []string{"--heartbeat-interval", "50ms", "--lease", "500ms", "--dead-after", "1500ms", "--rebalance=false"}

func primaryID(p *api.Partition) string {
	for _, r := range p.GetReplicas() {
		if r.GetRole() == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
			return r.GetServerId()
		}
	}
	return ""
}

// TestMultiProcessCluster runs `tabula master` and three `tabula server`
// processes: spread, 10,000 keys, kill -9 of a server, master restart, and a
// drained server on SIGTERM.
func TestMultiProcessCluster(t *testing.T) {
	dir := t.TempDir()
	masterAddr := freeAddr(t)
	masterArgs := append([]string{"master", "--listen", masterAddr, "--data", filepath.Join(dir, "master")}, fastTiming...)
	master := start(t, "master", masterArgs...)
	master.waitOutput("master serving", 15*time.Second)
	servers := make([]*proc, 3)
	for i := range servers {
		servers[i] = start(t, fmt.Sprintf("server-%d", i), "server", "--master", masterAddr,
			"--data", filepath.Join(dir, fmt.Sprintf("server-%d", i)), "--fault-domain", fmt.Sprintf("fd-%d", i))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := client.New(ctx, client.Options{Credential: testCred, Masters: []string{masterAddr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	// fd-i is server process i; learn each one's id.
	idOf := map[string]string{} // fault domain -> server id
	waitFor(t, 20*time.Second, "3 live servers", func() (bool, error) {
		ss, err := c.ListServers(ctx)
		if err != nil {
			return false, err
		}
		alive := 0
		for _, s := range ss {
			if s.GetAlive() {
				alive++
				idOf[s.GetFaultDomain()] = s.GetId()
			}
		}
		return alive == 3, nil
	})

	m, err := c.CreateTable(ctx, "mp", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 12, Storage: "memory"}) // memory: a dead server's partitions move at once
	if err != nil {
		t.Fatal(err)
	}
	perServer := map[string]int{}
	for _, p := range m.GetPartitions() {
		perServer[primaryID(p)]++
	}
	for fd, id := range idOf {
		if perServer[id] != 4 {
			t.Fatalf("server %s (%s) primary for %d partitions, want 4: %v", id, fd, perServer[id], perServer)
		}
	}

	// 10,000 keys through the SDK.
	tbl := c.Table("mp")
	const n = 10000
	key := func(i int) []byte { return fmt.Appendf(nil, "key-%05d", i) }
	val := func(i int) []byte { return fmt.Appendf(nil, "value-%d", i) }
	for start := 0; start < n; start += 1000 {
		muts := make([]client.Mutation, 0, 1000)
		for i := start; i < start+1000; i++ {
			muts = append(muts, client.Mutation{Key: key(i), Value: val(i)})
		}
		if err := tbl.BatchWrite(ctx, muts); err != nil {
			t.Fatalf("BatchWrite from %d: %v", start, err)
		}
	}
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = key(i)
	}
	res, err := tbl.BatchGet(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if !r.Found || !bytes.Equal(r.Value, val(i)) {
			t.Fatalf("key %d: found=%v value=%q", i, r.Found, r.Value)
		}
	}
	for i := 0; i < n; i += 97 {
		v, err := tbl.Get(ctx, key(i))
		if err != nil || !bytes.Equal(v, val(i)) {
			t.Fatalf("Get key %d: %q, %v", i, v, err)
		}
	}

	// kill -9 server 0: its partitions are reassigned, with new epochs, and serve.
	victim := idOf["fd-0"]
	before := map[uint64]*api.Partition{}
	for _, p := range m.GetPartitions() {
		before[p.GetId()] = p
	}
	servers[0].kill()
	var after *api.PartitionMap
	waitFor(t, 30*time.Second, "reassignment of the killed server's partitions", func() (bool, error) {
		d, err := c.DescribeTable(ctx, "mp")
		if err != nil {
			return false, err
		}
		for _, p := range d.GetMap().GetPartitions() {
			if id := primaryID(p); id == "" || id == victim {
				return false, nil
			}
		}
		after = d.GetMap()
		return true, nil
	})
	moved := map[int]bool{} // partition index -> moved
	for _, p := range after.GetPartitions() {
		old := before[p.GetId()]
		if primaryID(old) == victim {
			moved[int(p.GetIndex())] = true
			if p.GetEpoch() <= old.GetEpoch() {
				t.Fatalf("partition %d moved but epoch %d -> %d", p.GetId(), old.GetEpoch(), p.GetEpoch())
			}
		} else if p.GetEpoch() != old.GetEpoch() || primaryID(p) != primaryID(old) {
			t.Fatalf("partition %d did not lose its server but changed: %v -> %v", p.GetId(), old, p)
		}
	}
	if len(moved) != 4 {
		t.Fatalf("%d partitions moved, want 4", len(moved))
	}
	// Every key is served again: in-memory partitions that moved come back
	// empty (no replication yet); the others keep their data.
	res, err = tbl.BatchGet(ctx, keys)
	if err != nil {
		t.Fatalf("BatchGet after kill: %v", err)
	}
	for i, r := range res {
		if moved[keyspace.Index(keyspace.Hash(keys[i]), 12)] {
			continue
		}
		if !r.Found || !bytes.Equal(r.Value, val(i)) {
			t.Fatalf("key %d on a surviving partition: found=%v value=%q", i, r.Found, r.Value)
		}
	}
	for i := 0; i < 200; i++ {
		if err := tbl.Put(ctx, key(i), []byte("again")); err != nil {
			t.Fatalf("Put after reassignment: %v", err)
		}
	}

	// Restart the master (kill -9): catalog and map survive.
	master.kill()
	master = start(t, "master-2", masterArgs...)
	master.waitOutput("master serving", 15*time.Second)
	waitFor(t, 20*time.Second, "the restarted master to answer", func() (bool, error) {
		d, err := c.DescribeTable(ctx, "mp")
		if err != nil {
			return false, err
		}
		for _, p := range d.GetMap().GetPartitions() {
			a := after.GetPartitions()[p.GetIndex()]
			if p.GetId() != a.GetId() || p.GetEpoch() != a.GetEpoch() || primaryID(p) != primaryID(a) ||
				p.GetStart() != a.GetStart() || p.GetEnd() != a.GetEnd() {
				return false, fmt.Errorf("partition %d differs after restart: %v vs %v", p.GetIndex(), p, a)
			}
		}
		ts, err := c.ListTables(ctx)
		if err != nil || len(ts) != 1 || ts[0].GetName() != "mp" || ts[0].GetId() != after.GetTable().GetId() {
			return false, fmt.Errorf("tables after restart: %v, %v", ts, err)
		}
		return true, nil
	})
	for i := 0; i < 200; i++ {
		v, err := tbl.Get(ctx, key(i))
		if err != nil || string(v) != "again" {
			t.Fatalf("Get after master restart: %q, %v", v, err)
		}
	}

	// SIGTERM drains a server: it exits cleanly and its partitions move at
	// once, well before the dead-after timeout would.
	drained := idOf["fd-1"]
	t0 := time.Now()
	if err := servers[1].stop(syscall.SIGTERM, 15*time.Second); err != nil {
		t.Fatalf("drained server exit: %v", err)
	}
	t.Logf("drained server exited after %v", time.Since(t0))
	waitFor(t, 20*time.Second, "the drained server's partitions to move", func() (bool, error) {
		d, err := c.DescribeTable(ctx, "mp")
		if err != nil {
			return false, err
		}
		for _, p := range d.GetMap().GetPartitions() {
			if id := primaryID(p); id == "" || id == drained {
				return false, nil
			}
		}
		return true, nil
	})
	t.Logf("drain moved partitions in %v", time.Since(t0))
	if _, err := tbl.BatchGet(ctx, keys); err != nil {
		t.Fatalf("BatchGet after drain: %v", err)
	}
	if !servers[2].running() {
		t.Fatal("the last server died")
	}
}

// TestServerUnreachableMaster starts a server before its master: it retries
// with a clear log line and registers once the master is up.
func TestServerUnreachableMaster(t *testing.T) {
	dir := t.TempDir()
	masterAddr := freeAddr(t)
	srv := start(t, "server", "server", "--master", masterAddr, "--data", filepath.Join(dir, "server"))
	srv.waitOutput("cannot reach the master; retrying", 15*time.Second)
	if !srv.running() {
		t.Fatal("server exited while the master was unreachable")
	}
	start(t, "master", append([]string{"master", "--listen", masterAddr, "--data", filepath.Join(dir, "master")}, fastTiming...)...)
	srv.waitOutput("registered with master", 20*time.Second)
}

// TestDevQuickStart follows the README: `tabula dev`, then the client
// commands against it, then a restart that keeps the catalog.
func TestDevQuickStart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tabula-data")
	addr := freeAddr(t)
	dev := start(t, "dev", "dev", "--data", dir, "--listen", addr)
	dev.waitOutput("tabula dev ready", 30*time.Second)
	if !strings.Contains(dev.output(), "master  "+addr) {
		t.Fatalf("dev did not print its master endpoint:\n%s", dev.output())
	}

	mustCLI(t, addr, "table", "create", "kv", "--kind", "point", "--partitions", "4")
	mustCLI(t, addr, "put", "kv", "hello", "world")
	if out := mustCLI(t, addr, "get", "kv", "hello"); out != "world" {
		t.Fatalf("get: %q", out)
	}
	if _, _, err := cli(t, addr, strings.NewReader("from stdin"), "put", "kv", "piped"); err != nil {
		t.Fatalf("put from stdin: %v", err)
	}
	if out := mustCLI(t, addr, "get", "kv", "piped"); out != "from stdin" {
		t.Fatalf("get piped: %q", out)
	}
	if out := mustCLI(t, addr, "scan", "kv"); !strings.Contains(out, "hello\tworld") || !strings.Contains(out, "piped\tfrom stdin") {
		t.Fatalf("scan: %q", out)
	}
	if out := mustCLI(t, addr, "table", "list"); !strings.Contains(out, "kv") || !strings.Contains(out, "point") {
		t.Fatalf("table list: %q", out)
	}
	if out := mustCLI(t, addr, "table", "describe", "kv"); !strings.Contains(out, "partitions   4") {
		t.Fatalf("table describe: %q", out)
	}
	if out := mustCLI(t, addr, "del", "kv", "hello"); !strings.Contains(out, "deleted") {
		t.Fatalf("del: %q", out)
	}
	if _, errOut, err := cli(t, addr, nil, "get", "kv", "hello"); err == nil || !strings.Contains(errOut, "not found") {
		t.Fatalf("get of a deleted key: err %v, stderr %q", err, errOut)
	}
	out := mustCLI(t, addr, "workload", "kv", "--table", "kv", "--duration", "2s", "--concurrency", "4", "--read-percent", "90", "--value-size", "64", "--keys", "2000")
	for _, want := range []string{"ops/s", "p50", "p99", "p99.9", "errors   0"} {
		if !strings.Contains(out, want) {
			t.Fatalf("workload output lacks %q:\n%s", want, out)
		}
	}

	// Bad input: a clear error, nothing changed.
	bad := []struct {
		args []string
		want string
	}{
		{[]string{"put", "kv", strings.Repeat("k", api.MaxKeyBytes+1), "v"}, "key_too_large"},
		{[]string{"put", "kv", "", "v"}, "key_empty"},
		{[]string{"get", "nosuch", "k"}, "table_not_found"},
		{[]string{"table", "create", "o", "--kind", "ordered", "--partitions", "4"}, "--split-points"},
		{[]string{"table", "create", "o", "--kind", "ordered", "--split-points", "m,c"}, "split_points_unordered"},
		{[]string{"table", "create", "b2", "--kind", "bulk", "--storage", "memory"}, "storage_invalid"},
		{[]string{"table", "create", "9bad"}, "name_invalid"},
		{[]string{"table", "create", "kv"}, "ALREADY_EXISTS"},
		{[]string{"table", "create", "x", "--kind", "nope"}, "want point, bulk or ordered"},
		{[]string{"table", "create", "x", "--partitions", "5000"}, "--partitions 5000: want 1 to 4096"},
	}
	for _, b := range bad {
		_, errOut, err := cli(t, addr, nil, b.args...)
		if err == nil || !strings.Contains(errOut, b.want) {
			t.Fatalf("tabula %s: err %v, stderr %q; want an error containing %q", strings.Join(b.args, " ")[:min(60, len(strings.Join(b.args, " ")))], err, errOut, b.want)
		}
	}
	big, err := os.CreateTemp(t.TempDir(), "big")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := big.Write(make([]byte, api.DefaultMaxValueBytes+1)); err != nil {
		t.Fatal(err)
	}
	_, _ = big.Seek(0, 0)
	if _, errOut, err := cli(t, addr, big, "put", "kv", "big"); err == nil || !strings.Contains(errOut, "value_too_large") {
		t.Fatalf("oversized value: err %v, stderr %q", err, errOut)
	}
	if out := mustCLI(t, addr, "table", "list"); strings.Count(out, "\n") != 2 {
		t.Fatalf("bad input changed the catalog:\n%s", out)
	}

	// Interrupt, restart on the same data: the catalog is kept.
	if err := dev.stop(os.Interrupt, 20*time.Second); err != nil {
		t.Fatalf("dev exit after interrupt: %v", err)
	}
	dev = start(t, "dev-2", "dev", "--data", dir, "--listen", addr)
	dev.waitOutput("tabula dev ready", 30*time.Second)
	if out := mustCLI(t, addr, "table", "list"); !strings.Contains(out, "kv") {
		t.Fatalf("catalog lost across dev restart:\n%s", out)
	}
	// kv is on ssd storage (the default): its data survived the restart.
	if out := mustCLI(t, addr, "get", "kv", "piped"); out != "from stdin" {
		t.Fatalf("data lost across dev restart: get piped = %q", out)
	}
	mustCLI(t, addr, "put", "kv", "after", "restart")
}
