package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/linearize"
)

// reshapeCluster is the cluster of the split and merge tests: a master
// and n servers as processes (one fault domain each), a point table of
// partitions × 3 replicas on ssd, and four clients putting and getting
// reshapeKeys keys, every operation recorded for porcupine.
type reshapeCluster struct {
	t          *testing.T
	ctx        context.Context
	masterAddr string
	servers    []*proc
	admin      *client.Client
	table      string
	tbl        *client.Table
	rec        *linearize.Recorder
	ops        atomic.Int64
	failed     atomic.Int64
	failMu     sync.Mutex
	failures   []string // guarded by failMu
	stopLoad   func()
}

// reshapeKeys is how many keys the clients work on.
const reshapeKeys = 300

// startReshape starts the cluster and the load, and returns once 300
// operations went through. The load stops at the test's end at the
// latest (stop stops it sooner).
func startReshape(t *testing.T, ctx context.Context, servers, partitions int, table string) *reshapeCluster {
	t.Helper()
	dir := t.TempDir()
	r := &reshapeCluster{t: t, ctx: ctx, masterAddr: freeAddr(t), table: table, rec: linearize.NewRecorder(linearize.Options{})}
	master := start(t, "master", append([]string{"master", "--listen", r.masterAddr, "--data", filepath.Join(dir, "master")}, fastTiming...)...)
	master.waitOutput("master serving", 15*time.Second)
	for i := range servers {
		r.servers = append(r.servers, start(t, fmt.Sprintf("server-%d", i), "server", "--master", r.masterAddr, "--listen", freeAddr(t),
			"--data", filepath.Join(dir, fmt.Sprintf("server-%d", i)), "--fault-domain", fmt.Sprintf("fd-%d", i)))
	}
	admin, err := client.New(ctx, client.Options{Credential: testCred, Masters: []string{r.masterAddr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	r.admin = admin
	waitFor(t, 20*time.Second, fmt.Sprintf("%d live servers", servers), func() (bool, error) {
		ss, err := admin.ListServers(ctx)
		n := 0
		for _, s := range ss {
			if s.GetAlive() {
				n++
			}
		}
		return n == servers, err
	})
	if _, err := admin.CreateTable(ctx, table, api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: uint32(partitions), Storage: "ssd", Replication: 3}); err != nil {
		t.Fatal(err)
	}
	r.tbl = admin.Table(table)
	waitFor(t, 20*time.Second, "the table takes writes", func() (bool, error) {
		return r.tbl.Put(ctx, []byte("probe"), []byte("x")) == nil, nil
	})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() { r.work(w, stop) })
	}
	r.stopLoad = sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(r.stopLoad)
	r.loadRuns("the start", 300)
	return r
}

// work is one client: random puts and gets until stop.
func (r *reshapeCluster) work(w int, stop chan struct{}) {
	rng := rand.New(rand.NewPCG(uint64(w), 2))
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		k := fmt.Sprintf("k%d", rng.IntN(reshapeKeys))
		octx, ocancel := context.WithTimeout(r.ctx, 20*time.Second)
		var err error
		if rng.IntN(2) == 0 {
			v := fmt.Sprintf("w%d-%d", w, i)
			c := r.rec.Begin(w, linearize.Input{Kind: linearize.Put, Key: k, Value: v})
			err = r.tbl.Put(octx, []byte(k), []byte(v))
			c.Finish(linearize.Output{}, err)
		} else {
			c := r.rec.Begin(w, linearize.Input{Kind: linearize.Get, Key: k})
			var v []byte
			v, err = r.tbl.Get(octx, []byte(k))
			found := err == nil
			if errors.Is(err, client.ErrKeyNotFound) {
				err = nil
			}
			c.Finish(linearize.Output{Found: found, Value: string(v)}, err)
		}
		ocancel()
		r.ops.Add(1)
		if err != nil {
			r.failed.Add(1)
			r.failMu.Lock()
			r.failures = append(r.failures, err.Error())
			r.failMu.Unlock()
		}
	}
}

// loadRuns waits for n more operations: the load runs a while on the
// map after a change.
func (r *reshapeCluster) loadRuns(after string, n int64) {
	r.t.Helper()
	base := r.ops.Load()
	waitFor(r.t, 30*time.Second, "operations after "+after, func() (bool, error) { return r.ops.Load() >= base+n, nil })
}

// check stops the load and reads every key back, recorded: no request
// may have failed, and with the final reads the history must be
// linearizable (every acknowledged write is there). what names the
// changes in the failure ("the splits").
func (r *reshapeCluster) check(what string) {
	r.t.Helper()
	r.stopLoad()
	for k := range reshapeKeys {
		key := fmt.Sprintf("k%d", k)
		c := r.rec.Begin(99, linearize.Input{Kind: linearize.Get, Key: key})
		v, err := r.tbl.Get(r.ctx, []byte(key))
		found := err == nil
		if errors.Is(err, client.ErrKeyNotFound) {
			err = nil
		}
		if err != nil {
			r.t.Errorf("final read of %s: %v", key, err)
		}
		c.Finish(linearize.Output{Found: found, Value: string(v)}, err)
	}
	if n := r.failed.Load(); n > 0 {
		r.t.Errorf("%d of %d requests failed across %s; first: %v", n, r.ops.Load(), what, r.failures[:min(5, len(r.failures))])
	}
	res := r.rec.Check(30 * time.Second)
	if res.Verdict != porcupine.Ok {
		r.t.Fatalf("history of %d operations not linearizable (%v):\n%s", res.Ops, res.Verdict, res.Report(20))
	}
}

// engineTimes collects the servers' logged "took=" of the lines naming
// an engine split or merge (msg), for the test's log.
func (r *reshapeCluster) engineTimes(msg string) []string {
	var out []string
	for _, s := range r.servers {
		for _, line := range strings.Split(s.output(), "\n") {
			if i := strings.Index(line, "took="); i >= 0 && strings.Contains(line, msg) {
				out = append(out, strings.Fields(line[i+5:])[0])
			}
		}
	}
	return out
}
