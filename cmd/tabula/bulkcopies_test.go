package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tabuladb/tabula/client"
)

// TestBulkCopiesUnderKills: a master and four table-server processes, a
// bulk table of 3 serving copies per partition. Readers run BatchGets
// while new versions are published one after another and, again and
// again, a server holding copies is killed (kill -9) and started again.
// No read fails (a dead copy is skipped for another), no BatchGet mixes
// versions, and every version published serves.
func TestBulkCopiesUnderKills(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process: skipped with -short")
	}
	dir := t.TempDir()
	masterAddr := freeAddr(t)
	master := start(t, "master", append([]string{"master", "--listen", masterAddr, "--data", filepath.Join(dir, "master")}, fastTiming...)...)
	master.waitOutput("master serving", 15*time.Second)
	const servers = 4
	procs := make([]*proc, servers)
	addrs := make([]string, servers)
	startServer := func(i int) {
		procs[i] = start(t, fmt.Sprintf("server-%d", i), "server", "--master", masterAddr, "--listen", addrs[i],
			"--data", filepath.Join(dir, fmt.Sprintf("server-%d", i)), "--fault-domain", fmt.Sprintf("fd-%d", i))
	}
	for i := range servers {
		addrs[i] = freeAddr(t)
		startServer(i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := client.New(ctx, client.Options{Credential: testCred, Masters: []string{masterAddr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	live := func() (bool, error) {
		ss, err := c.ListServers(ctx)
		n := 0
		for _, s := range ss {
			if s.GetAlive() {
				n++
			}
		}
		return n == servers, err
	}
	waitFor(t, 20*time.Second, "4 live servers", live)
	const parts, keys = 4, 2000
	mustCLI(t, masterAddr, "table", "create", "model", "--kind", "bulk", "--partitions", fmt.Sprint(parts), "--replicas", "3")
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
		mustCLI(t, masterAddr, "bulk", "build", "--table", "model", "--input", in, "--out", out, "--version", fmt.Sprint(v), "--no-progress")
		return out
	}
	if out := mustCLI(t, masterAddr, "bulk", "publish", "--table", "model", "--dir", build(1), "--no-progress"); !strings.Contains(out, "serves version 1") {
		t.Fatalf("publish 1: %s", out)
	}

	tb := c.Table("model")
	rd := startBatchReaders(ctx, tb, keys, 5)
	defer rd.halt()
	waitFor(t, 20*time.Second, "reads", func() (bool, error) { return rd.reads.Load() >= 50, nil })
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	kills := 0
	for v := 2; v <= 4; v++ {
		// A server dies (and comes back) while version v is published.
		k := rng.IntN(servers)
		t.Logf("kill -9 server %d, then publish version %d", k, v)
		procs[k].kill()
		kills++
		dirV := build(v)
		t0 := time.Now()
		out := mustCLI(t, masterAddr, "bulk", "publish", "--table", "model", "--dir", dirV, "--no-progress")
		t.Logf("version %d published in %v: %s", v, time.Since(t0).Round(time.Millisecond), strings.TrimSpace(out))
		if !strings.Contains(out, fmt.Sprintf("serves version %d", v)) {
			t.Fatalf("publish %d: %s", v, out)
		}
		startServer(k)
		waitFor(t, 30*time.Second, "the killed server back", live)
		before := rd.reads.Load()
		waitFor(t, 20*time.Second, "reads of the new version", func() (bool, error) { return rd.reads.Load() >= before+50, nil })
	}
	rd.halt()
	t.Logf("%d kills; %d BatchGets of 16 keys, %d failed, %d mixed or missing", kills, rd.reads.Load(), rd.failed.Load(), rd.mixed.Load())
	if rd.failed.Load() > 0 || rd.mixed.Load() > 0 {
		t.Fatalf("%d reads failed and %d mixed versions or missed keys with copies to spare (first: %s)", rd.failed.Load(), rd.mixed.Load(), rd.firstErr())
	}
	res, err := tb.BatchGet(ctx, [][]byte{[]byte("key-00000"), []byte("key-01999")})
	if err != nil || string(res[0].Value) != "v4" || string(res[1].Value) != "v4" {
		t.Fatalf("after the last publish: %v, %v", res, err)
	}
}

// batchReaders run BatchGets of 16 random keys of a bulk table built with
// values "v<N>" (keys "key-%05d" below keys) until halt, counting reads,
// failures and answers that mix versions or miss a key, and the reads of
// each version.
type batchReaders struct {
	stop                 atomic.Bool
	reads, failed, mixed atomic.Int64
	wg                   sync.WaitGroup
	once                 sync.Once
	mu                   sync.Mutex
	first                string           // guarded by mu
	seen                 map[string]int64 // by value; guarded by mu
}

// startBatchReaders starts three readers of tb, seeded with seed.
func startBatchReaders(ctx context.Context, tb *client.Table, keys int, seed uint64) *batchReaders {
	b := &batchReaders{seen: map[string]int64{}}
	note := func(s string) {
		b.mu.Lock()
		if b.first == "" {
			b.first = s
		}
		b.mu.Unlock()
	}
	for g := range 3 {
		b.wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), seed))
			ks := make([][]byte, 16)
			for !b.stop.Load() {
				for i := range ks {
					ks[i] = fmt.Appendf(nil, "key-%05d", r.IntN(keys))
				}
				rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
				res, err := tb.BatchGet(rctx, ks)
				rcancel()
				if err != nil {
					b.failed.Add(1)
					note(err.Error())
					continue
				}
				b.reads.Add(1)
				tag := ""
				for i, x := range res {
					if !x.Found || tag != "" && string(x.Value) != tag {
						b.mixed.Add(1)
						note(fmt.Sprintf("%s = %q (found %v) beside %q", ks[i], x.Value, x.Found, tag))
						break
					}
					tag = string(x.Value)
				}
				b.mu.Lock()
				b.seen[tag]++
				b.mu.Unlock()
			}
		})
	}
	return b
}

// halt stops the readers and waits for them; it is idempotent.
func (b *batchReaders) halt() {
	b.once.Do(func() {
		b.stop.Store(true)
		b.wg.Wait()
	})
}

// firstErr is the first failure noted ("" if none).
func (b *batchReaders) firstErr() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.first
}

// seenOf is how many reads answered with value tag.
func (b *batchReaders) seenOf(tag string) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.seen[tag]
}
