package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
)

// The master suite's failover section: three `tabula master` processes on
// raft and three table servers, a replicated table under a steady write
// load, and -kills kill -9s of the leader (each restarted once a new
// leader serves). Per kill: the time to the first successful CreateTable
// (the client polls every 10 ms, from the kill), and to the first lease
// grant on the new leader (the new leader's log line "leases granted
// again", whose timestamp is compared with the kill's); and the writes
// that failed and the slowest write in the two seconds after the kill.
// Before the kills, proposals per second: CreateTable and DropTable from 8
// goroutines for -proposal-time.

// mfConfig is the failover section's flags.
type mfConfig struct {
	kills        int
	proposalTime time.Duration
}

var grantedRe = regexp.MustCompile(`time=(\S+) level=INFO msg="tablemaster: leases granted again`)

func runMasterFailover(ctx context.Context, out io.Writer, bin string, fc mfConfig, seed uint64) (err error) {
	dir, err := os.MkdirTemp("", "tabula-bench-master-failover-")
	if err != nil {
		return err
	}
	defer func() {
		if err == nil {
			_ = os.RemoveAll(dir)
		} else {
			fmt.Fprintf(os.Stderr, "master failover: data and process logs kept in %s\n", dir)
		}
	}()
	procs := &clProcs{logDir: filepath.Join(dir, "logs")}
	if err := os.MkdirAll(procs.logDir, 0o755); err != nil {
		return err
	}
	defer procs.killAll()
	addrs, err := clFreeAddrs(3)
	if err != nil {
		return err
	}
	var peers []string
	for i, a := range addrs {
		peers = append(peers, fmt.Sprintf("%d=%s", i+1, a))
	}
	masters := make([]*clProc, 3)
	for i := range masters {
		masters[i], err = procs.start(fmt.Sprintf("master-%d", i+1), bin, "master", "--id", fmt.Sprint(i+1),
			"--peers", strings.Join(peers, ","), "--data", filepath.Join(dir, fmt.Sprintf("m%d", i+1)))
		if err != nil {
			return err
		}
	}
	saddrs, err := clFreeAddrs(3)
	if err != nil {
		return err
	}
	for i, a := range saddrs {
		if _, err := procs.start(fmt.Sprintf("server-%d", i), bin, "--master", strings.Join(addrs, ","), "server", "--listen", a,
			"--data", filepath.Join(dir, fmt.Sprintf("s%d", i)), "--fault-domain", fmt.Sprintf("fd-%d", i)); err != nil {
			return err
		}
	}
	c, err := client.New(ctx, client.Options{Credential: benchCred, Masters: addrs, RetryTimeout: 10 * time.Second})
	if err != nil {
		return err
	}
	defer c.Close()
	if err := clPoll(ctx, 30*time.Second, 50*time.Millisecond, func() (bool, error) {
		s, err := c.ListServers(ctx)
		return err == nil && len(s) == 3, err
	}, "three servers registered"); err != nil {
		return err
	}
	if _, err := c.CreateTable(ctx, "load", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 6, Replication: 3}); err != nil {
		return err
	}
	tbl := c.Table("load")
	if err := clPoll(ctx, 30*time.Second, 20*time.Millisecond, func() (bool, error) {
		err := tbl.Put(ctx, []byte("probe"), []byte("x"))
		return err == nil, err
	}, "the load table writable"); err != nil {
		return err
	}
	fmt.Fprintf(out, "# master failover: 3 raft masters + 3 servers as processes; table \"load\" (6 partitions, 3 replicas) under 8 writers; %d kill -9s of the leader\n", fc.kills)

	// Proposals per second on a stable leader.
	var props atomic.Int64
	pctx, pcancel := context.WithTimeout(ctx, fc.proposalTime)
	var pwg sync.WaitGroup
	for g := range 8 {
		pwg.Go(func() {
			for i := 0; pctx.Err() == nil; i++ {
				name := fmt.Sprintf("p%d-%d", g, i)
				if _, err := c.CreateTable(pctx, name, api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 1, Replication: 1, Storage: "memory"}); err == nil {
					props.Add(1)
				}
				if err := c.DropTable(pctx, name); err == nil {
					props.Add(1)
				}
			}
		})
	}
	pwg.Wait()
	pcancel()
	fmt.Fprintf(out, "figure master-proposals %.0f ops/s\n", float64(props.Load())/fc.proposalTime.Seconds())

	// Steady writes, with their errors and latencies by time.
	type wr struct {
		at   time.Time
		took time.Duration
		err  bool
	}
	var wmu sync.Mutex
	var writes []wr
	lctx, lcancel := context.WithCancel(ctx)
	var lwg sync.WaitGroup
	for w := range 8 {
		lwg.Go(func() {
			for i := 0; lctx.Err() == nil; i++ {
				t0 := time.Now()
				wctx, wcancel := context.WithTimeout(lctx, 10*time.Second)
				err := tbl.Put(wctx, fmt.Appendf(nil, "w%d-%d", w, i%1000), []byte("v"))
				wcancel()
				if lctx.Err() != nil {
					return
				}
				wmu.Lock()
				writes = append(writes, wr{t0, time.Since(t0), err != nil})
				wmu.Unlock()
			}
		})
	}
	defer func() { lcancel(); lwg.Wait() }()

	leader := func() int {
		for i, a := range addrs {
			if !masters[i].running() {
				continue
			}
			cc, err := client.New(ctx, client.Options{Credential: benchCred, Masters: []string{a}, RetryTimeout: time.Second})
			if err != nil {
				continue
			}
			_, err = cc.ListServers(ctx) // only the leader answers
			cc.Close()
			if err == nil {
				return i
			}
		}
		return -1
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	var toCreate, toGrant []time.Duration
	var failedWrites, slowest []float64
	for k := 0; k < fc.kills; k++ {
		if err := clSleep(ctx, time.Duration(1500+rng.IntN(1000))*time.Millisecond); err != nil {
			return err
		}
		i := -1
		if err := clPoll(ctx, 10*time.Second, 20*time.Millisecond, func() (bool, error) { i = leader(); return i >= 0, nil }, "a leader"); err != nil {
			return err
		}
		kill := time.Now()
		masters[i].kill()
		var created time.Duration
		for n := 0; created == 0; n++ {
			if time.Since(kill) > 30*time.Second {
				return errors.New("no CreateTable succeeded within 30 s of a leader's kill")
			}
			cctx, ccancel := context.WithTimeout(ctx, time.Second)
			_, err := c.CreateTable(cctx, fmt.Sprintf("f%d-%d", k, n), api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 1, Replication: 1, Storage: "memory"})
			ccancel()
			if err == nil {
				created = time.Since(kill)
				break
			}
			_ = clSleep(ctx, 10*time.Millisecond)
		}
		toCreate = append(toCreate, created)
		if err := clSleep(ctx, 2*time.Second); err != nil {
			return err
		}
		// The first grant may come after the first CreateTable: look once
		// the 2 s are over.
		var granted time.Duration
		for j, m := range masters {
			if j == i {
				continue
			}
			for _, sm := range grantedRe.FindAllStringSubmatch(m.log(), -1) {
				at, perr := time.Parse(time.RFC3339Nano, sm[1])
				if perr == nil && at.After(kill) && (granted == 0 || at.Sub(kill) < granted) {
					granted = at.Sub(kill)
				}
			}
		}
		if granted > 0 {
			toGrant = append(toGrant, granted)
		}
		var fails, slow float64
		wmu.Lock()
		for _, w := range writes {
			if w.at.After(kill) && w.at.Before(kill.Add(2*time.Second)) {
				if w.err {
					fails++
				}
				slow = max(slow, float64(w.took.Milliseconds()))
			}
		}
		wmu.Unlock()
		failedWrites = append(failedWrites, fails)
		slowest = append(slowest, slow)
		grantedS := "not logged" // the new leader logged no first grant after the kill
		if granted > 0 {
			grantedS = "after " + granted.Round(time.Millisecond).String()
		}
		fmt.Fprintf(out, "master failover %d: master %d killed; CreateTable after %v, leases granted %s; in the next 2 s %0.f writes failed, slowest %0.f ms\n",
			k+1, i+1, created.Round(time.Millisecond), grantedS, fails, slow)
		if err := masters[i].restart(); err != nil {
			return err
		}
	}
	total := 0.0
	for _, f := range failedWrites {
		total += f
	}
	fmt.Fprintf(out, "figure master-failover-create-p50 %.0f ms\n", msPct(toCreate, 0.5))
	fmt.Fprintf(out, "figure master-failover-create-p99 %.0f ms\n", msPct(toCreate, 0.99))
	fmt.Fprintf(out, "figure master-failover-lease-p50 %.0f ms\n", msPct(toGrant, 0.5))
	fmt.Fprintf(out, "figure master-failover-lease-p99 %.0f ms\n", msPct(toGrant, 0.99))
	fmt.Fprintf(out, "figure master-failover-failed-writes %.0f writes\n", total)
	fmt.Fprintf(out, "figure master-failover-slowest-write %.0f ms\n", maxOf(slowest))
	return nil
}

func maxOf(xs []float64) float64 {
	m := 0.0
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

// clSleep sleeps d unless ctx ends first.
func clSleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
