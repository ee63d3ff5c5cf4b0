package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tabuladb/tabula/api"
)

// The flap run: the benchmark table under the write load, first steady
// (drops per minute with no fault: secondaries the primaries dropped from
// their log extents' ack sets, which should be none), then one server
// (one hosting secondaries) SIGSTOPped for 0.4 s every 3 s, cfg.flaps
// times. Each pause drops that server's secondaries from the ack sets;
// the rejoin time of a pause is from its SIGCONT until every replica on
// the paused server has applied what its primary had applied at the
// SIGCONT (DescribeTable, polled every 50 ms); the under-replicated time
// is from the last SIGCONT until the master judges every partition's
// replicas in sync again. Drops are counted from the servers' logs.

const (
	flapPause = 400 * time.Millisecond
	flapEvery = 3 * time.Second
)

func clFlap(ctx context.Context, out io.Writer, tab *clTabula, keys [][]byte, cfg *clConfig) error {
	if tab.replicas < 2 {
		fmt.Fprintln(out, "note: flap run skipped: the table has 1 replica")
		return nil
	}
	ids, err := tab.serverIDs(ctx)
	if err != nil {
		return err
	}
	m, err := tab.waitPlaced(ctx, tab.tableName, 30*time.Second)
	if err != nil {
		return err
	}
	// The server with the most secondaries (fewest primaries on a tie).
	prim, sec := map[string]int{}, map[string]int{}
	for _, p := range m.GetPartitions() {
		for _, r := range p.GetReplicas() {
			if r.GetRole() == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
				prim[r.GetServerId()]++
			} else {
				sec[r.GetServerId()]++
			}
		}
	}
	victim, victimID := -1, ""
	for i := range tab.servers {
		id := ids[fmt.Sprintf("fd-%d", i)]
		if victim < 0 || sec[id]-prim[id] > sec[victimID]-prim[victimID] {
			victim, victimID = i, id
		}
	}
	drops := func() int {
		n := 0
		for _, s := range tab.servers {
			n += strings.Count(s.log(), "secondary dropped from the ack set")
		}
		return n
	}
	rejoins := func() int {
		n := 0
		for _, s := range tab.servers {
			n += strings.Count(s.log(), "secondary back in the ack set")
		}
		return n
	}
	put := func(ctx context.Context, rng *rand.Rand, val []byte) error {
		clPutValue(rng, val)
		return tab.tbl.Put(ctx, keys[rng.IntN(len(keys))], val)
	}

	// Steady: drops per minute with no fault.
	d0 := drops()
	steady, err := clRun(ctx, cfg.goroutines, cfg.valueSize, cfg.duration, cfg.seed+21, put)
	if err != nil {
		return fmt.Errorf("flap steady run: %w", err)
	}
	steadyDrops := drops() - d0
	fmt.Fprintf(out, "raw flap steady %.0f puts/s p99 %d us over %v: %d secondaries dropped\n", steady.opsPerS(), steady.hist.ValueAtQuantile(99), cfg.duration.Round(time.Second), steadyDrops)
	fmt.Fprintf(out, "figure cluster-secondary-drops-per-min %.1f /min\n", float64(steadyDrops)/cfg.duration.Minutes())

	// Flapping, under the same load.
	d0, r0 := drops(), rejoins()
	proc := tab.servers[victim]
	var (
		wg      sync.WaitGroup
		load    clStats
		loadErr error
	)
	runFor := flapEvery*time.Duration(cfg.flaps) + 5*time.Second
	wg.Add(1)
	go func() {
		defer wg.Done()
		load, loadErr = clRun(ctx, cfg.goroutines, cfg.valueSize, runFor, cfg.seed+22, put)
	}()
	var rejoin []time.Duration
	var lastResume time.Time
	var flapErr error
	for i := range cfg.flaps {
		if err := sleepCtx(ctx, flapEvery-flapPause); err != nil {
			flapErr = err
			break
		}
		if err := proc.signal(syscall.SIGSTOP); err != nil {
			flapErr = err
			break
		}
		time.Sleep(flapPause) // the fault itself
		if err := proc.signal(syscall.SIGCONT); err != nil {
			flapErr = err
			break
		}
		lastResume = time.Now()
		took, err := flapInStep(ctx, tab, victimID, lastResume)
		if err != nil {
			flapErr = fmt.Errorf("pause %d: %w", i+1, err)
			break
		}
		rejoin = append(rejoin, took)
	}
	var under time.Duration
	if flapErr == nil {
		under, flapErr = flapAllInSync(ctx, tab, lastResume)
	}
	wg.Wait()
	if err := errors.Join(flapErr, loadErr); err != nil {
		return fmt.Errorf("flap run (fd-%d paused): %w", victim, err)
	}
	slices.Sort(rejoin)
	pct := func(q float64) time.Duration { return rejoin[min(len(rejoin)-1, int(q*float64(len(rejoin))))] }
	fmt.Fprintf(out, "raw flap fd-%d (%d secondaries, %d primaries) paused %v every %v x%d: %.0f puts/s p99 %d us (steady p99 %d us); %d secondaries dropped, %d back in the ack set; rejoin times %v\n",
		victim, sec[victimID], prim[victimID], flapPause, flapEvery, cfg.flaps, load.opsPerS(), load.hist.ValueAtQuantile(99), steady.hist.ValueAtQuantile(99), drops()-d0, rejoins()-r0, rejoin)
	fmt.Fprintf(out, "figure cluster-secondary-rejoin-s-p50 %.2f s\n", pct(0.5).Seconds())
	fmt.Fprintf(out, "figure cluster-secondary-rejoin-s-p99 %.2f s\n", pct(0.99).Seconds())
	fmt.Fprintf(out, "figure cluster-under-replicated-s %.2f s\n", under.Seconds())
	fmt.Fprintf(out, "figure flap-write-p99-ratio %.2f\n", float64(load.hist.ValueAtQuantile(99))/float64(steady.hist.ValueAtQuantile(99)))
	return nil
}

// flapInStep waits until every replica on server id has applied what its
// partition's primary had applied at the first look after resumed, and
// returns the time since resumed.
func flapInStep(ctx context.Context, tab *clTabula, id string, resumed time.Time) (time.Duration, error) {
	var target map[uint64]uint64
	err := clPoll(ctx, 30*time.Second, 50*time.Millisecond, func() (bool, error) {
		d, err := tab.c.DescribeTable(ctx, tab.tableName)
		if err != nil {
			return false, err
		}
		applied := map[string]uint64{}
		for _, r := range d.GetReplicas() {
			applied[fmt.Sprintf("%d/%s", r.GetPartitionId(), r.GetServerId())] = r.GetAppliedLsn()
		}
		if target == nil {
			target = map[uint64]uint64{}
			for _, p := range d.GetMap().GetPartitions() {
				for _, r := range p.GetReplicas() {
					if r.GetRole() == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
						target[p.GetId()] = applied[fmt.Sprintf("%d/%s", p.GetId(), r.GetServerId())]
					}
				}
			}
		}
		for _, p := range d.GetMap().GetPartitions() {
			for _, r := range p.GetReplicas() {
				if r.GetServerId() == id && applied[fmt.Sprintf("%d/%s", p.GetId(), id)] < target[p.GetId()] {
					return false, fmt.Errorf("partition %d on %s: applied %d of %d", p.GetId(), id, applied[fmt.Sprintf("%d/%s", p.GetId(), id)], target[p.GetId()])
				}
			}
		}
		return true, nil
	}, "the paused server's replicas in step")
	return time.Since(resumed), err
}

// flapAllInSync waits until the master judges every replica of the table
// in sync, and returns the time since resumed.
func flapAllInSync(ctx context.Context, tab *clTabula, resumed time.Time) (time.Duration, error) {
	err := clPoll(ctx, 60*time.Second, 50*time.Millisecond, func() (bool, error) {
		d, err := tab.c.DescribeTable(ctx, tab.tableName)
		if err != nil {
			return false, err
		}
		for _, r := range d.GetReplicas() {
			if st := r.GetSync().GetState(); st != api.ReplicaState_REPLICA_STATE_IN_SYNC {
				return false, fmt.Errorf("partition %d on %s: %v (%s)", r.GetPartitionId(), r.GetServerId(), st, r.GetSync().GetReason())
			}
		}
		return true, nil
	}, "every replica in sync")
	return time.Since(resumed), err
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
