package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/linearize"
)

// Replicas that heal (issue 15), with real processes: a master and five
// table servers, a point table on ssd with 3 replicas per partition.

const (
	repairServers    = 5
	repairPartitions = 8
	repairReplicas   = 3
)

// repairCluster is a master and repairServers table servers, each with its
// own data directory, fault domain and fixed listen address (a restart
// comes back at the same address).
type repairCluster struct {
	t       *testing.T
	master  string
	servers []*repairServer
	admin   *client.Client
}

type repairServer struct {
	idx      int
	addr     string
	args     []string
	proc     *proc
	restarts int
}

func startRepairCluster(t *testing.T, ctx context.Context, masterFlags ...string) *repairCluster {
	t.Helper()
	dir := t.TempDir()
	c := &repairCluster{t: t, master: freeAddr(t)}
	args := append([]string{"master", "--listen", c.master, "--data", filepath.Join(dir, "master")}, fastTiming...)
	m := start(t, "master", append(args, masterFlags...)...)
	m.waitOutput("master serving", 15*time.Second)
	// TABULA_REPAIR_DEBUG=1 prints the master's log (placements, moves,
	// seals) whether the test passes or not.
	if os.Getenv("TABULA_REPAIR_DEBUG") != "" {
		t.Cleanup(func() { t.Logf("master output:\n%s", m.output()) })
	}
	for i := 0; i < repairServers; i++ {
		s := &repairServer{idx: i, addr: freeAddr(t)}
		s.args = []string{"server", "--master", c.master, "--listen", s.addr,
			"--data", filepath.Join(dir, fmt.Sprintf("server-%d", i)), "--fault-domain", fmt.Sprintf("fd-%d", i)}
		s.proc = start(t, fmt.Sprintf("server-%d", i), s.args...)
		c.servers = append(c.servers, s)
	}
	admin, err := client.New(ctx, client.Options{Credential: testCred, Masters: []string{c.master}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	c.admin = admin
	c.waitLive(ctx, repairServers, 20*time.Second)
	return c
}

// waitLive waits until n servers are alive at the master.
func (c *repairCluster) waitLive(ctx context.Context, n int, d time.Duration) {
	c.t.Helper()
	waitFor(c.t, d, fmt.Sprintf("%d live servers", n), func() (bool, error) {
		ss, err := c.admin.ListServers(ctx)
		live := 0
		for _, s := range ss {
			if s.GetAlive() && !s.GetDraining() {
				live++
			}
		}
		return live == n, err
	})
}

// restart starts server s again on its data directory.
func (c *repairCluster) restart(s *repairServer) {
	s.restarts++
	s.proc = start(c.t, fmt.Sprintf("server-%d-restart-%d", s.idx, s.restarts), s.args...)
}

// serverID is the id the master knows the server at addr by.
func (c *repairCluster) serverID(ctx context.Context, addr string) (string, error) {
	ss, err := c.admin.ListServers(ctx)
	if err != nil {
		return "", err
	}
	for _, s := range ss {
		if s.GetAddr() == addr {
			return s.GetId(), nil
		}
	}
	return "", fmt.Errorf("no server at %s among %d", addr, len(ss))
}

// health reports whether every partition of table has exactly
// repairReplicas replicas, one primary, each on a live server that is not
// excluded and reports it in sync; otherwise why not, partition by
// partition (the progress printed when a wait times out).
func (c *repairCluster) health(ctx context.Context, table string, exclude string) (bool, string, error) {
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	ss, err := c.admin.ListServers(dctx)
	if err != nil {
		return false, "", err
	}
	alive := map[string]bool{}
	for _, s := range ss {
		alive[s.GetId()] = s.GetAlive() && !s.GetDraining()
	}
	d, err := c.admin.DescribeTable(dctx, table)
	if err != nil {
		return false, "", err
	}
	state := map[string]*api.ReplicaStatus{}
	for _, r := range d.GetReplicas() {
		state[fmt.Sprintf("%d/%s", r.GetPartitionId(), r.GetServerId())] = r
	}
	ok := true
	var b strings.Builder
	parts := d.GetMap().GetPartitions()
	sort.Slice(parts, func(i, j int) bool { return parts[i].GetIndex() < parts[j].GetIndex() })
	for _, p := range parts {
		primaries := 0
		var desc []string
		good := len(p.GetReplicas()) == repairReplicas
		for _, r := range p.GetReplicas() {
			id := r.GetServerId()
			st := state[fmt.Sprintf("%d/%s", p.GetId(), id)]
			s := id
			if r.GetRole() == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
				primaries++
				s += "*"
			}
			switch {
			case id == exclude:
				s += "(excluded)"
				good = false
			case !alive[id]:
				s += "(down)"
				good = false
			case st == nil:
				s += "(no report)"
				good = false
			case st.GetState() != api.ReplicaState_REPLICA_STATE_IN_SYNC:
				s += "(" + strings.TrimPrefix(st.GetState().String(), "REPLICA_STATE_") + ")"
				good = false
			}
			desc = append(desc, s)
		}
		if primaries != 1 {
			good = false
		}
		if !good {
			ok = false
		}
		fmt.Fprintf(&b, "  partition %d (epoch %d): %s\n", p.GetIndex(), p.GetEpoch(), strings.Join(desc, " "))
	}
	return ok, b.String(), nil
}

// waitHealthy waits until health holds, printing the last state seen if
// it does not within d.
func (c *repairCluster) waitHealthy(ctx context.Context, table, exclude string, d time.Duration) time.Duration {
	c.t.Helper()
	t0 := time.Now()
	deadline := t0.Add(d)
	var last string
	var lastErr error
	for time.Now().Before(deadline) {
		ok, desc, err := c.health(ctx, table, exclude)
		if ok {
			return time.Since(t0)
		}
		if err == nil {
			last = desc
		}
		lastErr = err
		time.Sleep(50 * time.Millisecond)
	}
	c.t.Fatalf("table %s not back to %d in-sync replicas per partition (none on %q) within %v (last error %v); last seen (* primary):\n%s",
		table, repairReplicas, exclude, d, lastErr, last)
	return 0
}

func (c *repairCluster) createTable(ctx context.Context, name string) {
	c.t.Helper()
	_, err := c.admin.CreateTable(ctx, name, api.TableKind_TABLE_KIND_POINT,
		&api.TableOptions{Partitions: repairPartitions, Storage: "ssd", Replication: repairReplicas})
	if err != nil {
		c.t.Fatal(err)
	}
	c.waitHealthy(ctx, name, "", 20*time.Second)
}

// TestKillServerReplicasReplaced kill -9s a table server while writers are
// busy and never restarts it: its primaries fail over, and after
// --replace-after its replicas are placed again on the other servers,
// which copy a snapshot and catch up. The table gets back to 3 in-sync
// replicas per partition, none on the dead server; every acknowledged
// write is there; and no write failed (the SDK retries those in flight at
// the kill).
func TestKillServerReplicasReplaced(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process: skipped with -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := startRepairCluster(t, ctx, "--replace-after", "2s")
	c.createTable(ctx, "heal")

	var (
		mu     sync.Mutex
		acked  = map[string]string{} // guarded by mu
		failed []string              // guarded by mu
		// writes that took over a second (they waited for the failover),
		// and the slowest: guarded by mu
		slow    int
		slowest time.Duration
		wg      sync.WaitGroup
	)
	stop := make(chan struct{})
	for w := 0; w < 8; w++ {
		cl, err := client.New(ctx, client.Options{Credential: testCred, Masters: []string{c.master}, RetryTimeout: 20 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		tbl := cl.Table("heal")
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k, v := fmt.Sprintf("w%d-%06d", w, i), fmt.Sprintf("value-%d-%d", w, i)
				t0 := time.Now()
				err := tbl.Put(ctx, []byte(k), []byte(v))
				took := time.Since(t0)
				mu.Lock()
				if took > time.Second {
					slow++
				}
				slowest = max(slowest, took)
				if err == nil {
					acked[k] = v
				} else {
					failed = append(failed, fmt.Sprintf("put %s at %s after %v: %v", k, t0.Format("15:04:05.000"), time.Since(t0).Round(time.Millisecond), err))
				}
				mu.Unlock()
			}
		}()
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acked)
	}
	waitFor(t, 30*time.Second, "some acknowledged writes", func() (bool, error) { return count() > 500, nil })

	// Kill the server hosting the most primaries: writes to them are in
	// flight at the kill.
	d, err := c.admin.DescribeTable(ctx, "heal")
	if err != nil {
		t.Fatal(err)
	}
	primaries := map[string]int{}
	for _, p := range d.GetMap().GetPartitions() {
		primaries[primaryID(p)]++
	}
	victim, victimID := c.servers[0], ""
	for _, s := range c.servers {
		id, err := c.serverID(ctx, s.addr)
		if err != nil {
			t.Fatal(err)
		}
		if victimID == "" || primaries[id] > primaries[victimID] {
			victim, victimID = s, id
		}
	}
	tKill := time.Now()
	victim.proc.kill()
	before := count()
	t.Logf("killed %s (%s, primary of %d partitions) at %s with %d writes acknowledged", victimID, victim.addr, primaries[victimID], tKill.Format("15:04:05.000"), before)

	healed := c.waitHealthy(ctx, "heal", victimID, 40*time.Second)
	t.Logf("back to %d in-sync replicas per partition, none on %s, %v after the kill", repairReplicas, victimID, healed.Round(time.Millisecond))
	// Writes go on after the repair, to every partition.
	after := count()
	waitFor(t, 20*time.Second, "writes after the repair", func() (bool, error) { return count() > after+200, nil })
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	if len(failed) > 0 {
		t.Errorf("%d writes failed (want none: the SDK retries those in flight at the kill):\n  %s", len(failed), strings.Join(failed[:min(len(failed), 20)], "\n  "))
	}
	t.Logf("%d writes acknowledged (%d before the kill), %d failed; %d took over a second (retried across the failover), the slowest %v; reading every one back",
		len(acked), before, len(failed), slow, slowest.Round(time.Millisecond))
	reader, err := client.New(ctx, client.Options{Credential: testCred, Masters: []string{c.master}})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	tbl := reader.Table("heal")
	keys := make([][]byte, 0, len(acked))
	for k := range acked {
		keys = append(keys, []byte(k))
	}
	lost := 0
	for start := 0; start < len(keys); start += 500 {
		batch := keys[start:min(start+500, len(keys))]
		res, err := tbl.BatchGet(ctx, batch)
		if err != nil {
			t.Fatalf("BatchGet after the repair: %v", err)
		}
		for i, r := range res {
			if !r.Found || string(r.Value) != acked[string(batch[i])] {
				if lost++; lost <= 20 {
					t.Errorf("acknowledged write %s lost or changed: found=%v value=%q", batch[i], r.Found, r.Value)
				}
			}
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d acknowledged writes lost or changed", lost, len(acked))
	}
	// Still healthy after the reads.
	if ok, desc, err := c.health(ctx, "heal", victimID); !ok || err != nil {
		t.Fatalf("table no longer healthy at the end (err %v):\n%s", err, desc)
	}
}

// TestRollingRestart restarts every table server in turn under a
// porcupine-checked client load: SIGTERM (the server drains: its primaries
// hand off and its replicas start moving off), start it again on the same
// data directory, and wait until it is alive and the table is back to 3
// in-sync replicas per partition before the next. No client request may
// fail (any error counts), and the history must be linearizable.
func TestRollingRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process: skipped with -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := startRepairCluster(t, ctx)
	c.createTable(ctx, "rolling")

	const (
		clients = 6
		nkeys   = 100
	)
	seed := uint64(time.Now().UnixNano())
	t.Logf("client seed %d", seed)
	rec := linearize.NewRecorder(linearize.Options{})
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		failed  []string // guarded by mu
		ops     atomic.Int64
		stopped = make(chan struct{})
	)
	for ci := 0; ci < clients; ci++ {
		cl, err := client.New(ctx, client.Options{Credential: testCred, Masters: []string{c.master}, RetryTimeout: 20 * time.Second, Seed: seed + uint64(ci)})
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		tbl := cl.Table("rolling")
		r := rand.New(rand.NewPCG(seed, uint64(ci)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := 0; ; seq++ {
				select {
				case <-stopped:
					return
				default:
				}
				k := fmt.Sprintf("key-%03d", r.IntN(nkeys))
				v := fmt.Sprintf("c%d-%d", ci, seq)
				in := linearize.Input{Key: k}
				var (
					out linearize.Output
					err error
				)
				t0 := time.Now()
				switch p := r.IntN(100); {
				case p < 35:
					in.Kind = linearize.Get
					call := rec.Begin(ci, in)
					var got []byte
					got, err = tbl.Get(ctx, []byte(k))
					if errors.Is(err, client.ErrKeyNotFound) {
						err = nil
					} else if err == nil {
						out = linearize.Output{Found: true, Value: string(got)}
					}
					call.Finish(out, err)
				case p < 75:
					in.Kind, in.Value = linearize.Put, v
					call := rec.Begin(ci, in)
					err = tbl.Put(ctx, []byte(k), []byte(v))
					call.Finish(out, err)
				case p < 85:
					in.Kind = linearize.Delete
					call := rec.Begin(ci, in)
					out.Existed, err = tbl.Delete(ctx, []byte(k))
					call.Finish(out, err)
				default:
					// CAS from absent, or a swap of a value a Get just saw.
					in.Kind, in.Value = linearize.CAS, v
					cas := client.CAS{Key: []byte(k), Value: []byte(v), ExpectAbsent: true}
					in.ExpectAbsent = true
					if cur, gerr := tbl.Get(ctx, []byte(k)); gerr == nil {
						in.ExpectAbsent, cas.ExpectAbsent = false, false
						in.Expected, cas.Expected = string(cur), cur
					}
					call := rec.Begin(ci, in)
					var res client.CASResult
					res, err = tbl.CompareAndSwap(ctx, cas)
					out = linearize.Output{Swapped: res.Swapped, Existed: res.Existed, Current: string(res.Current)}
					call.Finish(out, err)
				}
				ops.Add(1)
				if err != nil {
					mu.Lock()
					failed = append(failed, fmt.Sprintf("%v %s at %s after %v: %v", in.Kind, k, t0.Format("15:04:05.000"), time.Since(t0).Round(time.Millisecond), err))
					mu.Unlock()
				}
			}
		}()
	}
	waitFor(t, 20*time.Second, "the clients to get going", func() (bool, error) { return ops.Load() > 200, nil })

	for _, s := range c.servers {
		id, err := c.serverID(ctx, s.addr)
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		end := rec.Note("restart", fmt.Sprintf("SIGTERM %s, start it again", id))
		if err := s.proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
			t.Errorf("%s exited with %v after SIGTERM", id, err)
		}
		tStopped := time.Since(t0)
		// The drain goes on without the process: every replica it held
		// moves off with its data (copied from the others).
		c.waitHealthy(ctx, "rolling", id, 30*time.Second)
		tDrained := time.Since(t0)
		c.restart(s)
		s.proc.waitOutput("registered with master", 20*time.Second)
		c.waitLive(ctx, repairServers, 20*time.Second)
		c.waitHealthy(ctx, "rolling", "", 30*time.Second)
		end()
		t.Logf("restarted %s: exited %v after SIGTERM, drained %v later, back and healthy %v later; %d operations so far",
			id, tStopped.Round(time.Millisecond), (tDrained - tStopped).Round(time.Millisecond), (time.Since(t0) - tDrained).Round(time.Millisecond), ops.Load())
	}
	close(stopped)
	wg.Wait()

	st := rec.Stats()
	t.Logf("operations: %d ok, %d of unknown outcome, %d dropped", st.Ok, st.Unknown, st.Dropped)
	mu.Lock()
	if len(failed) > 0 {
		t.Errorf("%d client requests failed during the rolling restart (want none):\n  %s", len(failed), strings.Join(failed[:min(len(failed), 20)], "\n  "))
	}
	mu.Unlock()
	res := rec.Check(time.Minute)
	t.Logf("porcupine: %s over %d operations on %d keys", res.Verdict, res.Ops, res.Keys)
	switch res.Verdict {
	case porcupine.Ok:
	case porcupine.Unknown:
		t.Logf("the linearizability check timed out: inconclusive, not a failure")
	default:
		if out, err := os.MkdirTemp("", "tabula-rolling-*"); err == nil {
			path := filepath.Join(out, "history.html")
			if err := res.Visualize(path); err == nil {
				t.Logf("visualisation of the failing keys: %s", path)
			}
		}
		t.Errorf("history not linearizable; keys %v\n%s", res.BadKeys, res.Report(40))
	}
}
