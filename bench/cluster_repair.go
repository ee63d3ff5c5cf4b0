package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
)

// The cluster suite's repair section, on the same processes: a steady
// write load on the benchmark table runs throughout, its latency and
// errors recorded per phase.
//
//   - copy: a one-partition table filled to -repair-bytes (64 KiB values)
//     has one secondary moved to another server (tabula partition move):
//     the target copies a snapshot and catches up. Time to the move done,
//     the copy rate, and the load's p99 during it against steady.
//   - drain: tabula server drain of the server holding the most replicas:
//     time until it holds none, and the load's errors.
//   - rolling: every server in turn gets SIGTERM (it drains: primaries
//     hand off, replicas start moving) and is restarted once it exited:
//     the load's errors and p99.

// rpLoad is the steady write load, phase by phase.
type rpLoad struct {
	mu    sync.Mutex
	phase string
	hist  map[string]*hdrhistogram.Histogram
	errs  map[string]int
	first map[string]string
	stop  chan struct{}
	wg    sync.WaitGroup
}

func startRepairLoad(ctx context.Context, tab *clTabula, keys [][]byte, cfg *clConfig) *rpLoad {
	l := &rpLoad{phase: "warmup", hist: map[string]*hdrhistogram.Histogram{}, errs: map[string]int{}, first: map[string]string{}, stop: make(chan struct{})}
	for g := range 8 {
		l.wg.Go(func() {
			rng := rand.New(rand.NewPCG(cfg.seed, uint64(g)+100))
			val := make([]byte, cfg.valueSize)
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				clPutValue(rng, val)
				t0 := time.Now()
				wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				err := tab.tbl.Put(wctx, keys[rng.IntN(len(keys))], val)
				cancel()
				us := max(1, time.Since(t0).Microseconds())
				l.mu.Lock()
				if l.hist[l.phase] == nil {
					l.hist[l.phase] = clNewHist()
				}
				_ = l.hist[l.phase].RecordValue(us)
				if err != nil {
					l.errs[l.phase]++
					if l.first[l.phase] == "" {
						l.first[l.phase] = err.Error()
					}
				}
				l.mu.Unlock()
			}
		})
	}
	return l
}

func (l *rpLoad) set(phase string) {
	l.mu.Lock()
	l.phase = phase
	l.mu.Unlock()
}

// p99 in microseconds, and the errors, of phase.
func (l *rpLoad) result(phase string) (float64, int, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.hist[phase]
	if h == nil {
		return 0, l.errs[phase], l.first[phase]
	}
	return float64(h.ValueAtQuantile(99)), l.errs[phase], l.first[phase]
}

func (l *rpLoad) close() {
	close(l.stop)
	l.wg.Wait()
}

func clRepair(ctx context.Context, out io.Writer, tab *clTabula, keys [][]byte, cfg *clConfig) error {
	if tab.replicas < 2 {
		fmt.Fprintln(out, "note: repair section skipped: the table has 1 replica")
		return nil
	}
	cc, err := grpc.NewClient(tab.masterAddr, append(benchCred.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		return err
	}
	defer cc.Close()
	mc := api.NewMasterClient(cc)
	load := startRepairLoad(ctx, tab, keys, cfg)
	defer load.close()
	if err := clSleep(ctx, 2*time.Second); err != nil {
		return err
	}
	load.set("steady")
	if err := clSleep(ctx, 8*time.Second); err != nil {
		return err
	}
	steady, steadyErrs, _ := load.result("steady")
	fmt.Fprintf(out, "repair steady: write p99 %.0f us, %d errors\n", steady, steadyErrs)

	// copy
	load.set("fill")
	name := clTable + "-repair"
	if _, err := tab.c.CreateTable(ctx, name, api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 1, Replication: 3, Storage: "ssd"}); err != nil {
		return fmt.Errorf("repair: create %s: %w", name, err)
	}
	big := tab.c.Table(name)
	const valueBytes = 64 << 10
	val := make([]byte, valueBytes)
	rng := rand.New(rand.NewPCG(cfg.seed, 9))
	t0 := time.Now()
	var filled int64
	for i := 0; filled < cfg.repairBytes; i++ {
		var ks, vs [][]byte
		for j := range 16 {
			for k := range val {
				val[k] = byte(rng.Uint32())
			}
			ks = append(ks, fmt.Appendf(nil, "big-%08d-%02d", i, j))
			vs = append(vs, append([]byte(nil), val...))
		}
		muts := make([]client.Mutation, len(ks))
		for j := range ks {
			muts[j] = client.Mutation{Key: ks[j], Value: vs[j]}
		}
		if err := big.BatchWrite(ctx, muts); err != nil {
			return fmt.Errorf("repair: fill: %w", err)
		}
		filled += 16 * valueBytes
		if i%64 == 63 {
			fmt.Fprintf(out, "# repair: filled %d of %d MiB\n", filled>>20, cfg.repairBytes>>20)
		}
	}
	fmt.Fprintf(out, "# repair: filled %s with %d MiB in %v\n", name, filled>>20, time.Since(t0).Round(time.Millisecond))
	d, err := mc.DescribeTable(ctx, &api.DescribeTableRequest{Tenant: api.DefaultTenant, Name: name})
	if err != nil {
		return err
	}
	var from string
	for _, r := range d.GetMap().GetPartitions()[0].GetReplicas() {
		if r.GetRole() == api.ReplicaRole_REPLICA_ROLE_SECONDARY {
			from = r.GetServerId()
		}
	}
	load.set("copy")
	t0 = time.Now()
	mv, err := mc.MovePartition(ctx, &api.MovePartitionRequest{Tenant: api.DefaultTenant, Table: name, Index: 0, From: from})
	if err != nil {
		return fmt.Errorf("repair: move: %w", err)
	}
	if err := clPoll(ctx, 30*time.Minute, 100*time.Millisecond, func() (bool, error) {
		d, err := mc.DescribeTable(ctx, &api.DescribeTableRequest{Tenant: api.DefaultTenant, Name: name})
		if err != nil {
			return false, err
		}
		p := d.GetMap().GetPartitions()[0]
		has := func(id string) bool {
			return slices.ContainsFunc(p.GetReplicas(), func(r *api.Replica) bool { return r.GetServerId() == id })
		}
		return !has(from) && has(mv.GetTo()), nil
	}, "the copy's move done"); err != nil {
		return err
	}
	took := time.Since(t0)
	copyP99, copyErrs, copyFirst := load.result("copy")
	fmt.Fprintf(out, "repair copy: %d MiB from %s to %s in sync after %v (%.0f MB/s); write p99 %.0f us during it (%d errors %s)\n",
		filled>>20, from, mv.GetTo(), took.Round(time.Millisecond), float64(filled)/took.Seconds()/1e6, copyP99, copyErrs, copyFirst)
	fmt.Fprintf(out, "figure repair-copy-seconds %.1f s\n", took.Seconds())
	fmt.Fprintf(out, "figure repair-copy-rate %.0f MB/s\n", float64(filled)/took.Seconds()/1e6)
	if steady > 0 {
		fmt.Fprintf(out, "figure repair-copy-write-p99-ratio %.2f\n", copyP99/steady)
	}

	// The same copy unthrottled: a spare server started with
	// --repair-bandwidth -1 takes a secondary. Time to in sync includes the
	// master's steps and the catch-up; the copy itself is what the spare
	// logs.
	if err := clUnthrottledCopy(ctx, out, tab, mc, name, filled, load); err != nil {
		return err
	}

	// drain
	ids, err := tab.serverIDs(ctx)
	if err != nil {
		return err
	}
	count := func() (map[string]int, error) {
		n := map[string]int{}
		for _, tn := range []string{tab.tableName, name} {
			d, err := mc.DescribeTable(ctx, &api.DescribeTableRequest{Tenant: api.DefaultTenant, Name: tn})
			if err != nil {
				return nil, err
			}
			for _, p := range d.GetMap().GetPartitions() {
				for _, r := range p.GetReplicas() {
					n[r.GetServerId()]++
				}
			}
		}
		return n, nil
	}
	n, err := count()
	if err != nil {
		return err
	}
	victim, most := "", 0
	for _, id := range ids {
		if n[id] > most {
			victim, most = id, n[id]
		}
	}
	load.set("drain")
	t0 = time.Now()
	if _, err := mc.DrainServer(ctx, &api.DrainServerRequest{ServerId: victim}); err != nil {
		return fmt.Errorf("repair: drain: %w", err)
	}
	if err := clPoll(ctx, 30*time.Minute, 100*time.Millisecond, func() (bool, error) {
		n, err := count()
		return err == nil && n[victim] == 0, err
	}, "the drain"); err != nil {
		return err
	}
	took = time.Since(t0)
	drainP99, drainErrs, drainFirst := load.result("drain")
	fmt.Fprintf(out, "repair drain: server %s with %d replicas emptied in %v; write p99 %.0f us, %d errors %s\n", victim, most, took.Round(time.Millisecond), drainP99, drainErrs, drainFirst)
	fmt.Fprintf(out, "figure repair-drain-seconds %.1f s\n", took.Seconds())
	fmt.Fprintf(out, "figure repair-drain-errors %d errors\n", drainErrs)

	// rolling restart: SIGTERM, wait for the exit, restart, wait for its
	// registration, next.
	load.set("rolling")
	t0 = time.Now()
	var restarted atomic.Int32
	for i, p := range tab.servers {
		if err := p.signal(syscall.SIGTERM); err != nil {
			continue
		}
		if err := clPoll(ctx, time.Minute, 50*time.Millisecond, func() (bool, error) { return !p.running(), nil }, fmt.Sprintf("server %d to exit", i)); err != nil {
			return err
		}
		if err := p.restart(); err != nil {
			return err
		}
		if err := p.waitLog(ctx, "registered with master", time.Minute); err != nil {
			return err
		}
		restarted.Add(1)
		if err := clSleep(ctx, 2*time.Second); err != nil {
			return err
		}
	}
	took = time.Since(t0)
	rollP99, rollErrs, rollFirst := load.result("rolling")
	fmt.Fprintf(out, "repair rolling restart: %d servers in %v; write p99 %.0f us, %d errors %s\n", restarted.Load(), took.Round(time.Millisecond), rollP99, rollErrs, rollFirst)
	fmt.Fprintf(out, "figure repair-rolling-errors %d errors\n", rollErrs)
	if steady > 0 {
		fmt.Fprintf(out, "figure repair-rolling-write-p99-ratio %.2f\n", rollP99/steady)
	}
	return nil
}

// clUnthrottledCopy moves a secondary of table name (filled bytes) to a
// new server started with --repair-bandwidth -1 and reports the copy's
// rate. The spare joins tab.servers (the rolling restart restarts it too).
func clUnthrottledCopy(ctx context.Context, out io.Writer, tab *clTabula, mc api.MasterClient, name string, filled int64, load *rpLoad) error {
	addrs, err := clFreeAddrs(1)
	if err != nil {
		return err
	}
	spare, err := tab.procs.start("tabula-server-spare", tab.bin, "server",
		"--master", tab.masterAddr, "--listen", addrs[0], "--data", filepath.Join(tab.dir, "server-spare"),
		"--fault-domain", "fd-spare", "--repair-bandwidth", "-1")
	if err != nil {
		return err
	}
	if err := spare.waitLog(ctx, "registered with master", 30*time.Second); err != nil {
		return err
	}
	tab.servers = append(tab.servers, spare)
	var to string
	if err := clPoll(ctx, 30*time.Second, 50*time.Millisecond, func() (bool, error) {
		ids, err := tab.serverIDs(ctx)
		to = ids["fd-spare"]
		return to != "", err
	}, "the spare server alive"); err != nil {
		return err
	}
	d, err := mc.DescribeTable(ctx, &api.DescribeTableRequest{Tenant: api.DefaultTenant, Name: name})
	if err != nil {
		return err
	}
	var from string
	for _, r := range d.GetMap().GetPartitions()[0].GetReplicas() {
		if r.GetRole() == api.ReplicaRole_REPLICA_ROLE_SECONDARY {
			from = r.GetServerId()
		}
	}
	load.set("copy-unthrottled")
	t0 := time.Now()
	if _, err := mc.MovePartition(ctx, &api.MovePartitionRequest{Tenant: api.DefaultTenant, Table: name, Index: 0, From: from, To: to}); err != nil {
		return fmt.Errorf("repair: unthrottled move: %w", err)
	}
	if err := clPoll(ctx, 30*time.Minute, 100*time.Millisecond, func() (bool, error) {
		d, err := mc.DescribeTable(ctx, &api.DescribeTableRequest{Tenant: api.DefaultTenant, Name: name})
		if err != nil {
			return false, err
		}
		p := d.GetMap().GetPartitions()[0]
		has := func(id string) bool {
			return slices.ContainsFunc(p.GetReplicas(), func(r *api.Replica) bool { return r.GetServerId() == id })
		}
		return !has(from) && has(to), nil
	}, "the unthrottled move done"); err != nil {
		return err
	}
	took := time.Since(t0)
	p99, errs, first := load.result("copy-unthrottled")
	fmt.Fprintf(out, "repair copy unthrottled: %d MiB from %s to %s in sync after %v (%.0f MB/s); write p99 %.0f us during it (%d errors %s)\n",
		filled>>20, from, to, took.Round(time.Millisecond), float64(filled)/took.Seconds()/1e6, p99, errs, first)
	fmt.Fprintf(out, "figure repair-unthrottled-in-sync-seconds %.1f s\n", took.Seconds())
	if m := clCopyTook.FindStringSubmatch(spare.log()); m != nil {
		if d, err := time.ParseDuration(m[1]); err == nil && d > 0 {
			fmt.Fprintf(out, "figure repair-unthrottled-copy-rate %.0f MB/s\n", float64(filled)/d.Seconds()/1e6)
		}
	}
	return nil
}

// clCopyTook finds a server's log line of a finished snapshot copy.
var clCopyTook = regexp.MustCompile(`copied a snapshot.* took=(\S+)`)
