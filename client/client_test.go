package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/keyspace"
	"github.com/tabuladb/tabula/internal/testcluster"
	"github.com/tabuladb/tabula/tablemaster"
)

const testSeed = 20240611

func startCluster(t *testing.T, servers int) *testcluster.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tc, err := testcluster.Start(ctx, testcluster.Options{Servers: servers, Dir: t.TempDir()})
	if err != nil {
		t.Fatalf("start cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := tc.Close(); err != nil {
			t.Errorf("close cluster: %v", err)
		}
	})
	return tc
}

// newClient connects to tc (at masters, when given) with its credential.
func newClient(t *testing.T, tc *testcluster.Cluster, masters ...string) *client.Client {
	t.Helper()
	if len(masters) == 0 {
		masters = tc.MasterAddrs()
	}
	c, err := client.New(context.Background(), client.Options{Masters: masters, Seed: testSeed, Credential: tc.Credential()})
	if err != nil {
		t.Fatalf("new client: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close client: %v", err)
		}
	})
	return c
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func createTable(t *testing.T, c *client.Client, name string, opts *api.TableOptions) *client.Table {
	t.Helper()
	if _, err := c.CreateTable(testCtx(t), name, api.TableKind_TABLE_KIND_POINT, opts); err != nil {
		t.Fatalf("create table %q: %v", name, err)
	}
	return c.Table(name)
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		<-tick.C
	}
}

func wantCode(t *testing.T, what string, err error, code api.ErrorCode) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error, want %v", what, code)
		return
	}
	if got := api.CodeOf(err); got != code {
		t.Errorf("%s: code %v (%v), want %v", what, got, err, code)
	}
}

func TestRoundTrip(t *testing.T) {
	tc := startCluster(t, 3)
	c := newClient(t, tc)
	ctx := testCtx(t)
	tbl := createTable(t, c, "rt", &api.TableOptions{Partitions: 4})
	if tbl.Name() != "rt" || c.Tenant() != api.DefaultTenant {
		t.Fatalf("name %q tenant %q", tbl.Name(), c.Tenant())
	}

	if _, err := tbl.Get(ctx, []byte("k")); !errors.Is(err, client.ErrKeyNotFound) {
		t.Fatalf("get absent: %v, want ErrKeyNotFound", err)
	}
	if err := tbl.Put(ctx, []byte("k"), []byte("v1")); err != nil {
		t.Fatal(err)
	}
	if v, err := tbl.Get(ctx, []byte("k")); err != nil || string(v) != "v1" {
		t.Fatalf("get: %q, %v", v, err)
	}
	if err := tbl.Put(ctx, []byte("k"), []byte("v2")); err != nil {
		t.Fatal(err)
	}
	if v, err := tbl.Get(ctx, []byte("k")); err != nil || string(v) != "v2" {
		t.Fatalf("get after overwrite: %q, %v", v, err)
	}
	if err := tbl.Put(ctx, []byte("empty"), nil); err != nil {
		t.Fatal(err)
	}
	if v, err := tbl.Get(ctx, []byte("empty")); err != nil || v == nil || len(v) != 0 {
		t.Fatalf("get empty value: %q (nil=%v), %v", v, v == nil, err)
	}

	// CAS: mismatch, match, expect-absent, delete.
	r, err := tbl.CompareAndSwap(ctx, client.CAS{Key: []byte("k"), Expected: []byte("nope"), Value: []byte("v3")})
	if err != nil || r.Swapped || !r.Existed || string(r.Current) != "v2" {
		t.Fatalf("CAS mismatch: %+v, %v", r, err)
	}
	r, err = tbl.CompareAndSwap(ctx, client.CAS{Key: []byte("k"), Expected: []byte("v2"), Value: []byte("v3")})
	if err != nil || !r.Swapped {
		t.Fatalf("CAS match: %+v, %v", r, err)
	}
	if v, _ := tbl.Get(ctx, []byte("k")); string(v) != "v3" {
		t.Fatalf("after CAS: %q", v)
	}
	r, err = tbl.CompareAndSwap(ctx, client.CAS{Key: []byte("k"), ExpectAbsent: true, Value: []byte("x")})
	if err != nil || r.Swapped || !r.Existed {
		t.Fatalf("CAS expect-absent on present key: %+v, %v", r, err)
	}
	r, err = tbl.CompareAndSwap(ctx, client.CAS{Key: []byte("new"), ExpectAbsent: true, Value: []byte("n1")})
	if err != nil || !r.Swapped || r.Existed {
		t.Fatalf("CAS create: %+v, %v", r, err)
	}
	r, err = tbl.CompareAndSwap(ctx, client.CAS{Key: []byte("new"), Expected: []byte("n1"), Delete: true})
	if err != nil || !r.Swapped {
		t.Fatalf("CAS delete: %+v, %v", r, err)
	}
	if _, err := tbl.Get(ctx, []byte("new")); !errors.Is(err, client.ErrKeyNotFound) {
		t.Fatalf("get after CAS delete: %v", err)
	}

	existed, err := tbl.Delete(ctx, []byte("k"))
	if err != nil || !existed {
		t.Fatalf("delete: %v, %v", existed, err)
	}
	existed, err = tbl.Delete(ctx, []byte("k"))
	if err != nil || existed {
		t.Fatalf("delete again: %v, %v", existed, err)
	}
	if _, err := tbl.Get(ctx, []byte("k")); !errors.Is(err, client.ErrKeyNotFound) {
		t.Fatalf("get deleted: %v", err)
	}

	// Catalog calls.
	tables, err := c.ListTables(ctx)
	if err != nil || !slices.ContainsFunc(tables, func(x *api.Table) bool { return x.GetName() == "rt" }) {
		t.Fatalf("list tables: %v, %v", tables, err)
	}
	desc, err := c.DescribeTable(ctx, "rt")
	if err != nil || len(desc.GetMap().GetPartitions()) != 4 {
		t.Fatalf("describe: %v, %v", desc, err)
	}
	servers, err := c.ListServers(ctx)
	if err != nil || len(servers) != 3 {
		t.Fatalf("list servers: %v, %v", servers, err)
	}
	m, err := tbl.Map(ctx)
	if err != nil || len(m.GetPartitions()) != 4 {
		t.Fatalf("map: %v, %v", m, err)
	}
}

func TestTTL(t *testing.T) {
	tc := startCluster(t, 1)
	c := newClient(t, tc)
	ctx := testCtx(t)
	tbl := createTable(t, c, "ttl", &api.TableOptions{Replication: 1, Partitions: 2})

	if err := tbl.Put(ctx, []byte("long"), []byte("v"), client.WithTTL(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := tbl.Put(ctx, []byte("short"), []byte("v"), client.WithTTL(100*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	// Rounded up: a sub-millisecond TTL is 1 ms, not "the table's default".
	if err := tbl.Put(ctx, []byte("tiny"), []byte("v"), client.WithTTL(time.Microsecond)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "short TTLs to expire", func() bool {
		_, e1 := tbl.Get(ctx, []byte("short"))
		_, e2 := tbl.Get(ctx, []byte("tiny"))
		return errors.Is(e1, client.ErrKeyNotFound) && errors.Is(e2, client.ErrKeyNotFound)
	})
	if v, err := tbl.Get(ctx, []byte("long")); err != nil || string(v) != "v" {
		t.Fatalf("long TTL: %q, %v", v, err)
	}
	wantCode(t, "negative TTL", tbl.Put(ctx, []byte("k"), []byte("v"), client.WithTTL(-time.Second)), api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT)
	_, err := tbl.CompareAndSwap(ctx, client.CAS{Key: []byte("k"), ExpectAbsent: true, Value: []byte("v"), TTL: -1})
	wantCode(t, "negative CAS TTL", err, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT)
	wantCode(t, "negative batch TTL", tbl.BatchWrite(ctx, []client.Mutation{{Key: []byte("k"), TTL: -1}}), api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT)
}

func TestBatchAndScan(t *testing.T) {
	tc := startCluster(t, 3)
	c := newClient(t, tc)
	ctx := testCtx(t)
	const parts, n = 12, 10000
	tbl := createTable(t, c, "batch", &api.TableOptions{Partitions: parts})

	key := func(i int) []byte { return []byte(fmt.Sprintf("key-%05d", i)) }
	val := func(i int) []byte { return []byte(fmt.Sprintf("value-%d", i*7)) }
	muts := make([]client.Mutation, n)
	for i := range muts {
		muts[i] = client.Mutation{Key: key(i), Value: val(i)}
	}
	if err := tbl.BatchWrite(ctx, muts); err != nil {
		t.Fatalf("batch write: %v", err)
	}

	// Every key, plus absent ones interleaved and a duplicate.
	var keys [][]byte
	for i := range n + 200 {
		keys = append(keys, key(i))
	}
	keys = append(keys, key(17))
	res, err := tbl.BatchGet(ctx, keys)
	if err != nil {
		t.Fatalf("batch get: %v", err)
	}
	if len(res) != len(keys) {
		t.Fatalf("%d results for %d keys", len(res), len(keys))
	}
	for i, r := range res[:n+200] {
		if i < n && (!r.Found || !bytes.Equal(r.Value, val(i))) {
			t.Fatalf("key %d: %+v", i, r)
		}
		if i >= n && r.Found {
			t.Fatalf("absent key %d found", i)
		}
	}
	if last := res[len(res)-1]; !last.Found || !bytes.Equal(last.Value, val(17)) {
		t.Fatalf("duplicate key: %+v", last)
	}
	if res, err := tbl.BatchGet(ctx, nil); err != nil || len(res) != 0 {
		t.Fatalf("empty batch get: %v, %v", res, err)
	}

	// Scan sees every key once, with its value.
	seen := make(map[string]bool, n)
	err = tbl.Scan(ctx, func(k, v []byte) error {
		if seen[string(k)] {
			return fmt.Errorf("key %q twice", k)
		}
		seen[string(k)] = true
		var i int
		if _, err := fmt.Sscanf(string(k), "key-%d", &i); err != nil || !bytes.Equal(v, val(i)) {
			return fmt.Errorf("key %q: value %q", k, v)
		}
		return nil
	})
	if err != nil || len(seen) != n {
		t.Fatalf("scan: %d keys, %v", len(seen), err)
	}

	// Each partition holds exactly the keys that hash into its range.
	m, err := tbl.Map(ctx)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for i, p := range m.GetPartitions() {
		err := tbl.ScanPartition(ctx, i, func(k, _ []byte) error {
			if h := keyspace.Hash(k); h < p.GetStart() || h > p.GetEnd() {
				return fmt.Errorf("key %q (hash %#x) outside partition %d [%#x, %#x]", k, h, i, p.GetStart(), p.GetEnd())
			}
			total++
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if total != n {
		t.Fatalf("partition scans saw %d keys, want %d", total, n)
	}

	// fn's error stops the scan and comes back as is.
	stop := errors.New("stop")
	calls := 0
	if err := tbl.Scan(ctx, func(_, _ []byte) error { calls++; return stop }); err != stop || calls != 1 {
		t.Fatalf("stopped scan: %v after %d calls", err, calls)
	}

	// Deletes and puts mixed; later mutations of a key win.
	muts = muts[:0]
	for i := 0; i < n; i += 2 {
		muts = append(muts, client.Mutation{Key: key(i), Delete: true})
	}
	muts = append(muts, client.Mutation{Key: key(1), Value: []byte("first")}, client.Mutation{Key: key(1), Value: []byte("second")})
	if err := tbl.BatchWrite(ctx, muts); err != nil {
		t.Fatalf("batch delete: %v", err)
	}
	res, err = tbl.BatchGet(ctx, keys[:n])
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		switch {
		case i == 1:
			if string(r.Value) != "second" {
				t.Fatalf("key 1: %q, want the later mutation", r.Value)
			}
		case i%2 == 0 && r.Found:
			t.Fatalf("deleted key %d found", i)
		case i%2 == 1 && !r.Found:
			t.Fatalf("key %d lost", i)
		}
	}
}

func TestInvalidInput(t *testing.T) {
	tc := startCluster(t, 1)
	c := newClient(t, tc)
	ctx := testCtx(t)
	tbl := createTable(t, c, "inv", &api.TableOptions{Replication: 1, Partitions: 1, MaxValueBytes: 1024})
	big := bytes.Repeat([]byte("k"), api.MaxKeyBytes+1)
	okKey := bytes.Repeat([]byte("k"), api.MaxKeyBytes)
	tooMany := make([]client.Mutation, api.MaxBatchKeys+1)
	for i := range tooMany {
		tooMany[i] = client.Mutation{Key: []byte(fmt.Sprint(i))}
	}

	if err := tbl.Put(ctx, okKey, bytes.Repeat([]byte("v"), 1024)); err != nil {
		t.Fatalf("largest key and value: %v", err)
	}
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"empty key get", func() error { _, err := tbl.Get(ctx, nil); return err }},
		{"empty key put", func() error { return tbl.Put(ctx, []byte{}, []byte("v")) }},
		{"empty key delete", func() error { _, err := tbl.Delete(ctx, nil); return err }},
		{"oversized key get", func() error { _, err := tbl.Get(ctx, big); return err }},
		{"oversized key put", func() error { return tbl.Put(ctx, big, nil) }},
		{"oversized key CAS", func() error { _, err := tbl.CompareAndSwap(ctx, client.CAS{Key: big}); return err }},
		{"oversized value", func() error { return tbl.Put(ctx, []byte("k"), make([]byte, 1025)) }},
		{"oversized CAS value", func() error {
			_, err := tbl.CompareAndSwap(ctx, client.CAS{Key: []byte("k"), ExpectAbsent: true, Value: make([]byte, 1025)})
			return err
		}},
		{"oversized key batch get", func() error { _, err := tbl.BatchGet(ctx, [][]byte{[]byte("a"), big}); return err }},
		{"empty key batch write", func() error { return tbl.BatchWrite(ctx, []client.Mutation{{Key: nil}}) }},
		{"oversized value batch write", func() error {
			return tbl.BatchWrite(ctx, []client.Mutation{{Key: []byte("a"), Value: make([]byte, 1025)}})
		}},
		{"too many mutations in a partition", func() error { return tbl.BatchWrite(ctx, tooMany) }},
		{"partition out of range", func() error { return tbl.ScanPartition(ctx, 1, func(_, _ []byte) error { return nil }) }},
		{"negative partition", func() error { return tbl.ScanPartition(ctx, -1, func(_, _ []byte) error { return nil }) }},
		{"bad table name", func() error { _, err := c.Table("no spaces").Get(ctx, []byte("k")); return err }},
		{"bad create name", func() error {
			_, err := c.CreateTable(ctx, "9lives", api.TableKind_TABLE_KIND_POINT, nil)
			return err
		}},
		{"unspecified kind", func() error {
			_, err := c.CreateTable(ctx, "nokind", api.TableKind_TABLE_KIND_UNSPECIFIED, nil)
			return err
		}},
	} {
		start := time.Now()
		wantCode(t, tc.name, tc.call(), api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT)
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("%s: took %v; invalid input must fail fast", tc.name, d)
		}
	}
	// Nothing of the refused batch was written.
	if _, err := tbl.Get(ctx, []byte("0")); !errors.Is(err, client.ErrKeyNotFound) {
		t.Errorf("refused batch wrote: %v", err)
	}
	// The detail names the field and the limit.
	d := api.DetailOf(tbl.Put(ctx, big, nil))
	if d.GetField() != "key" || d.GetLimit() != api.MaxKeyBytes {
		t.Errorf("detail %v", d)
	}
}

func TestNotFound(t *testing.T) {
	tc := startCluster(t, 1)
	c := newClient(t, tc)
	ctx := testCtx(t)
	tbl := c.Table("missing")
	start := time.Now()
	_, err := tbl.Get(ctx, []byte("k"))
	wantCode(t, "get", err, api.ErrorCode_ERROR_CODE_NOT_FOUND)
	wantCode(t, "put", tbl.Put(ctx, []byte("k"), []byte("v")), api.ErrorCode_ERROR_CODE_NOT_FOUND)
	_, err = tbl.BatchGet(ctx, [][]byte{[]byte("a"), []byte("b")})
	wantCode(t, "batch get", err, api.ErrorCode_ERROR_CODE_NOT_FOUND)
	wantCode(t, "scan", tbl.Scan(ctx, func(_, _ []byte) error { return nil }), api.ErrorCode_ERROR_CODE_NOT_FOUND)
	_, err = c.DescribeTable(ctx, "missing")
	wantCode(t, "describe", err, api.ErrorCode_ERROR_CODE_NOT_FOUND)
	wantCode(t, "drop", c.DropTable(ctx, "missing"), api.ErrorCode_ERROR_CODE_NOT_FOUND)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("NOT_FOUND took %v; it must not be retried", d)
	}
}

func TestDropAndRecreate(t *testing.T) {
	tc := startCluster(t, 2)
	c := newClient(t, tc)
	ctx := testCtx(t)
	tbl := createTable(t, c, "again", &api.TableOptions{Replication: 1, Partitions: 3})
	if err := tbl.Put(ctx, []byte("k"), []byte("old")); err != nil {
		t.Fatal(err)
	}
	_, err := c.CreateTable(ctx, "again", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Replication: 1})
	wantCode(t, "create twice", err, api.ErrorCode_ERROR_CODE_ALREADY_EXISTS)
	if err := c.DropTable(ctx, "again"); err != nil {
		t.Fatal(err)
	}
	_, err = tbl.Get(ctx, []byte("k"))
	wantCode(t, "get from dropped table", err, api.ErrorCode_ERROR_CODE_NOT_FOUND)

	// Re-created behind the client's back (another client): the stale cache
	// is noticed.
	other := newClient(t, tc)
	if _, err := other.CreateTable(ctx, "again", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Replication: 1, Partitions: 5}); err != nil {
		t.Fatal(err)
	}
	if _, err := tbl.Get(ctx, []byte("k")); !errors.Is(err, client.ErrKeyNotFound) {
		t.Fatalf("get from re-created table: %v", err)
	}
	if err := tbl.Put(ctx, []byte("k"), []byte("new")); err != nil {
		t.Fatal(err)
	}
	if v, err := other.Table("again").Get(ctx, []byte("k")); err != nil || string(v) != "new" {
		t.Fatalf("other client reads %q, %v", v, err)
	}
	waitFor(t, 10*time.Second, "the map of the new table", func() bool {
		m, err := tbl.Map(ctx)
		return err == nil && len(m.GetPartitions()) == 5
	})
}

func TestKillServer(t *testing.T) {
	tc := startCluster(t, 3)
	c := newClient(t, tc)
	ctx := testCtx(t)
	const n = 600
	tbl := createTable(t, c, "kill", &api.TableOptions{Partitions: 12, Storage: "memory"}) // memory partitions move off a dead server at once
	key := func(i int) []byte { return []byte(fmt.Sprintf("k%d", i)) }
	for i := range n {
		if err := tbl.Put(ctx, key(i), key(i)); err != nil {
			t.Fatal(err)
		}
	}
	m, err := tbl.Map(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dead := tc.ServerAddrs()[0]
	onDead := 0
	for _, p := range m.GetPartitions() {
		for _, r := range p.GetReplicas() {
			if r.GetAddr() == dead {
				onDead++
			}
		}
	}
	if onDead == 0 {
		t.Fatalf("no partition on server 0 (%s); the test would prove nothing", dead)
	}
	if err := tc.KillServer(0); err != nil {
		t.Fatal(err)
	}

	// Every read succeeds: the value, or not found for keys whose in-memory
	// partition died with the server. No error surfaces from the failover.
	lost := 0
	for i := range n {
		v, err := tbl.Get(ctx, key(i))
		switch {
		case errors.Is(err, client.ErrKeyNotFound):
			lost++
		case err != nil:
			t.Fatalf("get %d after kill: %v", i, err)
		case !bytes.Equal(v, key(i)):
			t.Fatalf("get %d: %q", i, v)
		}
	}
	t.Logf("%d partitions were on the killed server; %d of %d keys lost", onDead, lost, n)
	// Writes go to the new primaries and read back.
	for i := range n {
		if err := tbl.Put(ctx, key(i), []byte("after")); err != nil {
			t.Fatalf("put %d after kill: %v", i, err)
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
		if !r.Found || string(r.Value) != "after" {
			t.Fatalf("key %d after rewrite: %+v", i, r)
		}
	}
	m, err = tbl.Map(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range m.GetPartitions() {
		for _, r := range p.GetReplicas() {
			if r.GetAddr() == dead {
				t.Errorf("partition %d still mapped to the dead server", p.GetId())
			}
		}
	}
}

func TestConcurrent(t *testing.T) {
	tc := startCluster(t, 3)
	c := newClient(t, tc)
	ctx := testCtx(t)
	tbl := createTable(t, c, "conc", &api.TableOptions{Partitions: 6})
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Go(func() {
			t := c.Table("conc") // handles are cheap and share the cache
			for i := range 100 {
				k := []byte(fmt.Sprintf("w%d-%d", w, i))
				if err := t.Put(ctx, k, k); err != nil {
					errs <- err
					return
				}
				if v, err := t.Get(ctx, k); err != nil || !bytes.Equal(v, k) {
					errs <- fmt.Errorf("get %q: %q, %v", k, v, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	count := 0
	if err := tbl.Scan(ctx, func(_, _ []byte) error { count++; return nil }); err != nil || count != 1600 {
		t.Fatalf("scan: %d, %v", count, err)
	}
}

// deadAddr is a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

func TestMasterFailover(t *testing.T) {
	tc := startCluster(t, 1)
	// The first master is dead: calls move on to the second.
	c := newClient(t, tc, deadAddr(t), tc.MasterAddr())
	ctx := testCtx(t)
	tbl := createTable(t, c, "mf", &api.TableOptions{Replication: 1, Partitions: 2})
	if err := tbl.Put(ctx, []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListServers(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestUnreachable(t *testing.T) {
	c, err := client.New(context.Background(), client.Options{Masters: []string{deadAddr(t)}, RetryTimeout: 300 * time.Millisecond, Seed: testSeed})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	_, err = c.ListTables(context.Background())
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("gave up after %v, want about 300ms", d)
	}
	wantCode(t, "list tables", err, api.ErrorCode_ERROR_CODE_UNAVAILABLE)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v does not say the deadline passed", err)
	}
	// The caller's earlier deadline wins.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start = time.Now()
	_, err = c.Table("t").Get(ctx, []byte("k"))
	if d := time.Since(start); d > 2*time.Second || err == nil {
		t.Errorf("get: %v after %v", err, d)
	}
}

func TestNewAndClose(t *testing.T) {
	if _, err := client.New(context.Background(), client.Options{}); !errors.Is(err, client.ErrNoMasters) {
		t.Fatalf("no masters: %v", err)
	}
	if _, err := client.New(context.Background(), client.Options{Masters: []string{"x:1"}, Tenant: "bad tenant"}); err == nil {
		t.Fatal("bad tenant accepted")
	}
	tc := startCluster(t, 1)
	c, err := client.New(context.Background(), client.Options{Masters: []string{tc.MasterAddr()}, Credential: tc.Credential()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	tbl := createTable(t, c, "closing", &api.TableOptions{Replication: 1})
	if err := tbl.Put(ctx, []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, err := tbl.Get(ctx, []byte("k")); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("get after close: %v", err)
	}
	if _, err := c.ListTables(ctx); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("list after close: %v", err)
	}
}

// TestNoLeaks checks that Close stops everything the client started: the
// map watches, the batch fan-out and the connections.
func TestNoLeaks(t *testing.T) {
	// The master dials every server's extent node at its first stream sync
	// (5 s by default): sync at once, so those connections are in the
	// baseline rather than opened while the client under test runs.
	ctx := testCtx(t)
	tc, err := testcluster.Start(ctx, testcluster.Options{Servers: 2, Dir: t.TempDir(),
		MasterOptions: func(o *tablemaster.Options) { o.StreamSyncInterval = 20 * time.Millisecond }})
	if err != nil {
		t.Fatalf("start cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := tc.Close(); err != nil {
			t.Errorf("close cluster: %v", err)
		}
	})
	// Warm the cluster up so its own lazily started goroutines are in the
	// baseline.
	warm := newClient(t, tc)
	createTable(t, warm, "warm", &api.TableOptions{Replication: 1, Partitions: 4})
	if err := warm.Table("warm").Put(ctx, []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	// The table the client under test uses exists before the baseline too:
	// its partitions' engines (and their goroutines) belong to the servers.
	createTable(t, warm, "leak", &api.TableOptions{Replication: 1, Partitions: 4})
	// A write to every partition: each server has opened its engines.
	var warmMuts []client.Mutation
	for i := range 200 {
		warmMuts = append(warmMuts, client.Mutation{Key: []byte(fmt.Sprint("w", i)), Value: []byte("v")})
	}
	if err := warm.Table("leak").BatchWrite(ctx, warmMuts); err != nil {
		t.Fatal(err)
	}
	if err := warm.Close(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // a few stream syncs: the master's node connections are up
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	c, err := client.New(ctx, client.Options{Masters: []string{tc.MasterAddr()}, Seed: testSeed, Credential: tc.Credential()})
	if err != nil {
		t.Fatal(err)
	}
	tbl := c.Table("leak")
	var muts []client.Mutation
	for i := range 100 {
		muts = append(muts, client.Mutation{Key: []byte(fmt.Sprint(i)), Value: []byte("v")})
	}
	if err := tbl.BatchWrite(ctx, muts); err != nil {
		t.Fatal(err)
	}
	if _, err := tbl.BatchGet(ctx, [][]byte{[]byte("1"), []byte("2")}); err != nil {
		t.Fatal(err)
	}
	if err := c.Table("warm").Scan(ctx, func(_, _ []byte) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}
