package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/keyspace"
)

// The elastic suite: a table's partitions split under load, and servers
// that join a loaded cluster get their share, as real processes on
// loopback. Workloads:
//
//   - split: 16 clients read and write while the table's widest partition
//     is split, 20 times one after another: the time from the split
//     command to both children taking writes (the master's SplitPartition
//     with wait), the write p99 during splits ÷ steady, failed requests.
//   - join: 3 servers with 30 partitions × 3 replicas under load, the
//     master rebalancing; 2 servers join: the time until every server's
//     replica count is within ±15% of the mean, the p99 while moving ÷
//     steady, failed requests.
//   - hot: 5 servers, a 3-partition table, 16 clients on a Zipfian
//     (s = 1.1) load over keys of its first partition only, the master
//     splitting by itself (automatic splits, thresholds lowered so it acts
//     within the run) and rebalancing: throughput once the cluster
//     settled ÷ before its first split, and the time to settle.
//   - merge: 3 servers, a table of 20 partitions × 3 replicas, each split
//     once (20 pairs of siblings, cold: a light load of -merge-goroutines
//     spread over the 40); the 20 pairs merge back one after another: the
//     time from the merge command to the child taking writes (the
//     master's MergePartitions with wait), failed requests.
//
// The split, join and merge workloads run with automatic splits off, so
// only the splits they make happen.
func init() {
	register(suite{
		name:  "elastic",
		about: "real processes on loopback: splits under a 16-client load (time to both children writable, write p99 during ÷ steady), 2 servers joining a loaded 3-server cluster (time to balance), a hot partition split automatically (throughput after ÷ before) and 20 pairs merging under a light load (time to the child writable)",
		run:   runElastic,
	})
}

// elConfig is the elastic suite's flags.
type elConfig struct {
	clConfig
	splits    int
	merges    int
	mergeLoad int
	steady    time.Duration
	joinLimit time.Duration
	band      float64
	hotLimit  time.Duration
	hotQuiet  time.Duration
	hotQPS    int
	// hotRebalance: 1 s rounds (as join uses) transferred the hot
	// children's primaries back and forth every round on this machine.
	hotRebalance time.Duration
}

func runElastic(out io.Writer, args []string) (err error) {
	fs := flag.NewFlagSet("elastic", flag.ContinueOnError)
	var cfg elConfig
	fs.IntVar(&cfg.goroutines, "goroutines", 16, "client goroutines of the load")
	fs.IntVar(&cfg.keys, "keys", 20000, "distinct keys")
	fs.IntVar(&cfg.valueSize, "value-size", 100, "value bytes")
	fs.IntVar(&cfg.splits, "splits", 20, "split: splits, one after another")
	fs.IntVar(&cfg.merges, "merges", 20, "merge: pairs merged, one after another")
	fs.IntVar(&cfg.mergeLoad, "merge-goroutines", 4, "merge: client goroutines of the light load")
	fs.DurationVar(&cfg.steady, "steady", 5*time.Second, "load before the splits or the join (the steady p99)")
	fs.DurationVar(&cfg.joinLimit, "join-limit", 5*time.Minute, "join: give up waiting for balance after this long")
	fs.Float64Var(&cfg.band, "band", 0.15, "join: balanced within mean × (1 ± band) replicas per server")
	fs.DurationVar(&cfg.hotLimit, "hot-limit", 90*time.Second, "hot: the longest the hot load runs")
	fs.DurationVar(&cfg.hotQuiet, "hot-quiet", 10*time.Second, "hot: settled = no split, move or primary change for this long (the after window)")
	fs.IntVar(&cfg.hotQPS, "hot-split-qps", 2500, "hot: the master's --split-qps")
	fs.DurationVar(&cfg.hotRebalance, "hot-rebalance-interval", 5*time.Second, "hot: the master's --rebalance-interval (0: no --rebalance, the children's primaries stay where the split left them)")
	workloads := fs.String("workloads", "split,join,hot,merge", "workloads to run (comma list)")
	fs.StringVar(&cfg.dir, "dir", "", "directory for data and logs (default: a new temp dir, removed after a successful run)")
	fs.StringVar(&cfg.tabulaBin, "tabula-bin", "", "tabula binary to run (default: built from this checkout)")
	fs.Uint64Var(&cfg.seed, "seed", rand.Uint64(), "random seed")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.workloads = clSet(*workloads)
	for w := range cfg.workloads {
		if w != "split" && w != "join" && w != "hot" && w != "merge" {
			return fmt.Errorf("unknown workload %q (split, join, hot, merge)", w)
		}
	}
	if cfg.goroutines < 1 || cfg.keys < cfg.goroutines || cfg.splits < 1 || cfg.merges < 1 || cfg.mergeLoad < 1 {
		return errors.New("-goroutines, -splits, -merges and -merge-goroutines must be ≥ 1 and -keys ≥ -goroutines")
	}
	dir, keep, err := suiteDir("elastic", cfg.dir)
	if err != nil {
		return err
	}
	defer func() { keep(err) }()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Fprintf(out, "# elastic: loopback, %d goroutines (half puts, half gets), %d-byte values, %d keys; GOMAXPROCS %d; dir %s; seed %d (rerun with -seed %d)\n",
		cfg.goroutines, cfg.valueSize, cfg.keys, runtime.GOMAXPROCS(0), dir, cfg.seed, cfg.seed)
	for _, w := range []string{"split", "join", "hot", "merge"} {
		if !cfg.workloads[w] {
			continue
		}
		run := elSplit
		switch w {
		case "join":
			run = elJoin
		case "hot":
			run = elHot
		case "merge":
			run = elMerge
		}
		if err := run(ctx, out, filepath.Join(dir, w), &cfg); err != nil {
			return fmt.Errorf("%s: %w", w, err)
		}
	}
	return nil
}

// elStart starts a cluster of servers processes (gomaxprocs shared out)
// in dir, its master run with masterArgs, and a table of partitions × 3.
func elStart(ctx context.Context, out io.Writer, dir string, cfg *elConfig, servers, partitions int, masterArgs ...string) (*clTabula, *clProcs, error) {
	c := cfg.clConfig
	c.servers, c.partitions, c.replicas = servers, partitions, 3
	c.dir, c.masterFlags = dir, masterArgs
	procs := &clProcs{logDir: filepath.Join(dir, "logs"), gomaxprocs: max(1, runtime.NumCPU()/servers)}
	if err := os.MkdirAll(procs.logDir, 0o755); err != nil {
		return nil, nil, err
	}
	tab, err := clStartTabula(ctx, out, procs, dir, &c)
	if err != nil {
		procs.killAll()
		return nil, nil, err
	}
	cfg.tabulaBin = tab.bin // built once for both workloads
	return tab, procs, nil
}

// elLoad is the background load: goroutines putting and getting random
// keys until stopped, their latencies recorded in the phase's histogram.
type elLoad struct {
	mu      sync.Mutex
	phase   string
	hists   map[string]*elHist
	failed  atomic.Int64
	ops     atomic.Int64 // requests answered
	lastErr atomic.Value
	stop    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

type elHist struct{ puts, gets []time.Duration }

func (l *elLoad) setPhase(p string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.phase = p
	if l.hists[p] == nil {
		l.hists[p] = &elHist{}
	}
}

func (l *elLoad) record(put bool, d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.hists[l.phase]
	if put {
		h.puts = append(h.puts, d)
	} else {
		h.gets = append(h.gets, d)
	}
}

func startLoad(ctx context.Context, tab *clTabula, cfg *elConfig) *elLoad {
	return startLoadOn(ctx, tab, cfg, func(rng *rand.Rand) func() []byte {
		return func() []byte { return fmt.Appendf(nil, "key-%07d", rng.IntN(cfg.keys)) }
	})
}

// startLoadOn is startLoad with each goroutine's keys drawn by the
// picker keys makes from its random source.
func startLoadOn(ctx context.Context, tab *clTabula, cfg *elConfig, keys func(*rand.Rand) func() []byte) *elLoad {
	l := &elLoad{hists: map[string]*elHist{}, stop: make(chan struct{})}
	l.setPhase("steady")
	for g := range cfg.goroutines {
		l.wg.Go(func() {
			rng := rand.New(rand.NewPCG(cfg.seed, uint64(g)))
			pick := keys(rng)
			val := make([]byte, cfg.valueSize)
			for {
				select {
				case <-l.stop:
					return
				case <-ctx.Done():
					return
				default:
				}
				key := pick()
				put := g%2 == 0
				t0 := time.Now()
				var err error
				if put {
					clPutValue(rng, val)
					err = tab.tbl.Put(ctx, key, val)
				} else {
					_, err = tab.tbl.Get(ctx, key)
					if errors.Is(err, client.ErrKeyNotFound) {
						err = nil
					}
				}
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					l.failed.Add(1)
					l.lastErr.Store(err.Error())
					continue
				}
				l.record(put, time.Since(t0))
				l.ops.Add(1)
			}
		})
	}
	return l
}

func (l *elLoad) halt() {
	l.once.Do(func() { close(l.stop) })
	l.wg.Wait()
}

func (l *elLoad) p99(phase string, put bool) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.hists[phase]
	if h == nil {
		return 0
	}
	s := h.gets
	if put {
		s = h.puts
	}
	return elQuantile(s, 0.99)
}

func elQuantile(s []time.Duration, q float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	c := slices.Clone(s)
	slices.Sort(c)
	return c[min(len(c)-1, int(q*float64(len(c))))]
}

func (l *elLoad) report(out io.Writer, name, phase string) {
	for _, put := range []bool{true, false} {
		op := "get"
		if put {
			op = "put"
		}
		steady, during := l.p99("steady", put), l.p99(phase, put)
		fmt.Fprintf(out, "figure elastic-%s-%s-p99-steady %.2f ms\n", name, op, ms(steady))
		fmt.Fprintf(out, "figure elastic-%s-%s-p99-during %.2f ms\n", name, op, ms(during))
		if steady > 0 {
			fmt.Fprintf(out, "ratio during/steady elastic-%s-%s-p99 %.2f\n", name, op, float64(during)/float64(steady))
		}
	}
	fmt.Fprintf(out, "figure elastic-%s-failed-requests %d requests\n", name, l.failed.Load())
	if e, ok := l.lastErr.Load().(string); ok {
		fmt.Fprintf(out, "# last failure: %s\n", e)
	}
}

// elSplit splits the widest partition of a 3-partition table on 5
// servers, cfg.splits times, under load.
func elSplit(ctx context.Context, out io.Writer, dir string, cfg *elConfig) error {
	tab, procs, err := elStart(ctx, out, dir, cfg, 5, 3, "--auto-split=false", "--rebalance=false")
	if err != nil {
		return err
	}
	defer procs.killAll()
	defer tab.close()
	cc, err := grpc.NewClient(tab.masterAddr, append(benchCred.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		return err
	}
	defer cc.Close()
	mc := api.NewMasterClient(cc)
	load := startLoad(ctx, tab, cfg)
	defer load.halt()
	if err := clSleep(ctx, cfg.steady); err != nil {
		return err
	}
	load.setPhase("splits")
	var took []time.Duration
	for i := range cfg.splits {
		m, err := tab.freshMap(ctx, tab.tableName)
		if err != nil {
			return err
		}
		// The widest partition: splits spread over the hash space.
		widest := m.GetPartitions()[0]
		for _, p := range m.GetPartitions() {
			if p.GetEnd()-p.GetStart() > widest.GetEnd()-widest.GetStart() {
				widest = p
			}
		}
		t0 := time.Now()
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		resp, err := mc.SplitPartition(sctx, &api.SplitPartitionRequest{Tenant: api.DefaultTenant, Table: tab.tableName, Index: widest.GetIndex(), Wait: true})
		cancel()
		if err != nil {
			return fmt.Errorf("split %d (partition index %d): %w", i+1, widest.GetIndex(), err)
		}
		d := time.Since(t0)
		took = append(took, d)
		fmt.Fprintf(os.Stderr, "elastic: split %d/%d: partition %d into %d and %d in %v\n", i+1, cfg.splits, resp.GetParentId(), resp.GetLeft().GetId(), resp.GetRight().GetId(), d.Round(time.Millisecond))
	}
	load.setPhase("after")
	if err := clSleep(ctx, time.Second); err != nil {
		return err
	}
	load.halt()
	fmt.Fprintf(out, "# split: master + 5 servers, point table of 3 partitions × 3 replicas (ssd, sync); %d splits of the widest partition, one after another, under the load; a split's time is the master's SplitPartition with wait (returns once both children take writes)\n", cfg.splits)
	fmt.Fprintf(out, "figure elastic-split-ms-p50 %.1f ms\n", ms(elQuantile(took, 0.5)))
	fmt.Fprintf(out, "figure elastic-split-ms-p99 %.1f ms\n", ms(elQuantile(took, 0.99)))
	fmt.Fprintf(out, "figure elastic-split-ms-max %.1f ms\n", ms(slices.Max(took)))
	load.report(out, "split", "splits")
	return nil
}

// elJoin adds 2 servers to a loaded 3-server cluster of 30 partitions,
// the master rebalancing, and times the balance.
func elJoin(ctx context.Context, out io.Writer, dir string, cfg *elConfig) error {
	tab, procs, err := elStart(ctx, out, dir, cfg, 3, 30, "--rebalance", "--rebalance-interval", "1s", "--auto-split=false")
	if err != nil {
		return err
	}
	defer procs.killAll()
	defer tab.close()
	load := startLoad(ctx, tab, cfg)
	defer load.halt()
	if err := clSleep(ctx, cfg.steady); err != nil {
		return err
	}
	addrs, err := clFreeAddrs(2)
	if err != nil {
		return err
	}
	load.setPhase("join")
	t0 := time.Now()
	for i, a := range addrs {
		p, err := procs.start(fmt.Sprintf("tabula-server-join-%d", i), tab.bin, "server", "--master", tab.masterAddr, "--listen", a,
			"--data", filepath.Join(dir, fmt.Sprintf("server-join-%d", i)), "--fault-domain", fmt.Sprintf("fd-join-%d", i))
		if err != nil {
			return err
		}
		tab.servers = append(tab.servers, p)
	}
	var counts map[string]int
	balanced := func() (bool, error) {
		m, err := tab.freshMap(ctx, tab.tableName)
		if err != nil {
			return false, err
		}
		ids, err := tab.serverIDs(ctx)
		if err != nil {
			return false, err
		}
		counts = map[string]int{}
		for _, id := range ids {
			counts[id] = 0
		}
		total := 0
		for _, p := range m.GetPartitions() {
			for _, r := range p.GetReplicas() {
				counts[r.GetServerId()]++
				total++
			}
		}
		if len(ids) < 5 || total != 30*3 { // a move in flight holds a fourth replica
			return false, nil
		}
		mean := float64(total) / float64(len(counts))
		for _, n := range counts {
			if float64(n) < mean*(1-cfg.band) || float64(n) > mean*(1+cfg.band) {
				return false, nil
			}
		}
		return true, nil
	}
	perr := clPoll(ctx, cfg.joinLimit, 200*time.Millisecond, balanced, "every server within the band of the mean replica count")
	took := time.Since(t0)
	load.setPhase("after")
	if err := clSleep(ctx, time.Second); err != nil {
		return err
	}
	load.halt()
	fmt.Fprintf(out, "# join: master (--rebalance, 1 s rounds) + 3 servers, point table of 30 partitions × 3 replicas (ssd, sync) under the load; 2 servers join; balanced = every server's replica count within ±%.0f%% of the mean (load dimensions are not checked here)\n", cfg.band*100)
	if perr != nil {
		fmt.Fprintf(out, "# not balanced within %v: %v; replicas per server %v\n", cfg.joinLimit, perr, counts)
	} else {
		fmt.Fprintf(out, "# replicas per server at balance: %v\n", elCounts(counts))
		fmt.Fprintf(out, "figure elastic-join-balance-s %.1f s\n", took.Seconds())
	}
	load.report(out, "join", "join")
	return nil
}

func elCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%d ", k, m[k])
	}
	return strings.TrimSpace(b.String())
}

// elHot runs the hot-partition workload: a Zipfian load on one partition
// of three, automatic splits and rebalancing on, throughput after the
// cluster settles ÷ before its first split.
func elHot(ctx context.Context, out io.Writer, dir string, cfg *elConfig) error {
	// The default sustain (10 s) leaves a before window of ~10 s; the
	// cooldown is lowered from 30 s so a second round fits the run.
	const sustain, cooldown = 10 * time.Second, 10 * time.Second
	flags := []string{"--auto-split", "--split-qps", fmt.Sprint(cfg.hotQPS), "--split-sustain", sustain.String(), "--split-cooldown", cooldown.String()}
	if cfg.hotRebalance > 0 {
		flags = append(flags, "--rebalance", "--rebalance-interval", cfg.hotRebalance.String())
	}
	tab, procs, err := elStart(ctx, out, dir, cfg, 5, 3, flags...)
	if err != nil {
		return err
	}
	defer procs.killAll()
	defer tab.close()
	// cfg.keys keys of the first partition, in random order of rank: the
	// Zipfian's hot keys spread over the partition's hash range.
	_, end0 := keyspace.Range(0, 3)
	keys := make([][]byte, 0, cfg.keys)
	for i := 0; len(keys) < cfg.keys; i++ {
		if k := fmt.Appendf(nil, "hot-%08d", i); keyspace.Hash(k) <= end0 {
			keys = append(keys, k)
		}
	}
	rand.New(rand.NewPCG(cfg.seed, 99)).Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	load := startLoadOn(ctx, tab, cfg, func(rng *rand.Rand) func() []byte {
		z := rand.NewZipf(rng, 1.1, 1, uint64(len(keys)-1))
		return func() []byte { return keys[z.Uint64()] }
	})
	defer load.halt()
	// Every 500 ms: the requests answered since, and the map's shape
	// (partitions, primaries, replicas): a change is a split, a move or
	// a primary transfer.
	type sample struct {
		at    time.Duration
		ops   int64
		parts int
		shape string
	}
	var samples []sample
	t0 := time.Now()
	var lastShape string
	var lastParts []string // partition id -> its replicas, at the last change
	var lastChange, firstSplit time.Duration = 0, -1
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	prev := load.ops.Load()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		now := time.Since(t0)
		n := load.ops.Load()
		s := sample{at: now, ops: n - prev}
		prev = n
		if m, err := tab.freshMap(ctx, tab.tableName); err == nil {
			var b strings.Builder
			for _, p := range m.GetPartitions() {
				fmt.Fprintf(&b, "%d:", p.GetId())
				for _, r := range p.GetReplicas() {
					fmt.Fprintf(&b, "%s/%d,", r.GetServerId(), r.GetRole())
				}
				if p.GetSplit() != nil {
					b.WriteString("splitting")
				}
				b.WriteByte(' ')
			}
			s.parts, s.shape = len(m.GetPartitions()), b.String()
			if lastShape != "" && s.shape != lastShape {
				lastChange = now
				parts := strings.Fields(s.shape)
				var changed []string
				for _, p := range parts {
					if !slices.Contains(lastParts, p) {
						changed = append(changed, p)
					}
				}
				fmt.Fprintf(os.Stderr, "elastic: hot: %v: %d partitions; now %v\n", now.Round(100*time.Millisecond), s.parts, changed)
				if firstSplit < 0 && s.parts > 3 || firstSplit < 0 && strings.Contains(s.shape, "splitting") {
					firstSplit = now
					fmt.Fprintf(os.Stderr, "elastic: hot: first split at %v\n", now.Round(100*time.Millisecond))
				}
			}
			lastShape, lastParts = s.shape, strings.Fields(s.shape)
		}
		samples = append(samples, s)
		if firstSplit >= 0 && now-lastChange >= cfg.hotQuiet || now >= cfg.hotLimit {
			break
		}
	}
	load.halt()
	rate := func(from, to time.Duration) float64 {
		var ops int64
		var span time.Duration
		for i, s := range samples {
			if s.at > from && s.at <= to && i > 0 {
				ops += s.ops
				span += s.at - samples[i-1].at
			}
		}
		if span == 0 {
			return 0
		}
		return float64(ops) / span.Seconds()
	}
	end := samples[len(samples)-1].at
	// Before: from 2 s (the clients' connections warm up) to the first
	// split; after: the quiet window at the end.
	beforeTo := firstSplit
	if beforeTo < 0 {
		beforeTo = end
	}
	before, after := rate(2*time.Second, beforeTo), rate(end-cfg.hotQuiet, end)
	var timeline []string
	for from := time.Duration(0); from < end; from += 5 * time.Second {
		timeline = append(timeline, fmt.Sprintf("%.0f", rate(from, from+5*time.Second)))
	}
	fmt.Fprintf(out, "# hot: master (automatic splits: --split-qps %d, --split-sustain %v, --split-cooldown %v lowered from 30 s so a second round fits the run; --rebalance rounds every %v, 0: off) + 5 servers, point table of 3 partitions × 3 replicas (ssd, sync); %d goroutines (half puts, half gets) on a Zipfian (s = 1.1) over %d keys of partition 0\n",
		cfg.hotQPS, sustain, cooldown, cfg.hotRebalance, cfg.goroutines, len(keys))
	fmt.Fprintf(out, "# partitions at the end: %d; before = answered/s from 2 s to the first split (%v), after = the last %v with no split, move or primary change; settle = from the load's start to the last such change\n",
		samples[len(samples)-1].parts, firstSplit.Round(100*time.Millisecond), cfg.hotQuiet)
	fmt.Fprintf(out, "# answered/s every 5 s: %s\n", strings.Join(timeline, " "))
	fmt.Fprintf(out, "figure elastic-hot-before %.0f req/s\n", before)
	fmt.Fprintf(out, "figure elastic-hot-after %.0f req/s\n", after)
	if firstSplit < 0 {
		fmt.Fprintf(out, "# no split within %v: nothing settled\n", cfg.hotLimit)
	} else if now := end; now-lastChange < cfg.hotQuiet {
		fmt.Fprintf(out, "# not settled within %v (last change at %v): after = the last %v\n", cfg.hotLimit, lastChange.Round(100*time.Millisecond), cfg.hotQuiet)
	} else {
		fmt.Fprintf(out, "figure elastic-hot-settle-s %.1f s\n", lastChange.Seconds())
	}
	if before > 0 {
		fmt.Fprintf(out, "ratio elastic-hot after/before %.2f\n", after/before)
	}
	fmt.Fprintf(out, "figure elastic-hot-failed-requests %d requests\n", load.failed.Load())
	if e, ok := load.lastErr.Load().(string); ok {
		fmt.Fprintf(out, "# last failure: %s\n", e)
	}
	return nil
}

// elMerge splits each of a 20-partition table's partitions once, then
// merges the pairs of siblings back, cfg.merges of them one after
// another, under a light load.
func elMerge(ctx context.Context, out io.Writer, dir string, cfg *elConfig) error {
	const parts = 20
	if cfg.merges > parts {
		return fmt.Errorf("-merges %d: the table has %d pairs", cfg.merges, parts)
	}
	tab, procs, err := elStart(ctx, out, dir, cfg, 3, parts, "--auto-split=false", "--rebalance=false")
	if err != nil {
		return err
	}
	defer procs.killAll()
	defer tab.close()
	cc, err := grpc.NewClient(tab.masterAddr, append(benchCred.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		return err
	}
	defer cc.Close()
	mc := api.NewMasterClient(cc)
	light := *cfg
	light.goroutines = cfg.mergeLoad
	load := startLoad(ctx, tab, &light)
	defer load.halt()
	// Partition i is at index 2i once the ones before it split.
	for i := range parts {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		_, err := mc.SplitPartition(sctx, &api.SplitPartitionRequest{Tenant: api.DefaultTenant, Table: tab.tableName, Index: uint32(2 * i), Wait: true})
		cancel()
		if err != nil {
			return fmt.Errorf("split %d: %w", i+1, err)
		}
	}
	fmt.Fprintf(os.Stderr, "elastic: merge: %d partitions split once each\n", parts)
	if err := clSleep(ctx, cfg.steady); err != nil {
		return err
	}
	load.setPhase("merges")
	var took []time.Duration
	for i := range cfg.merges {
		// The pairs before this one merged: its left is at index i.
		t0 := time.Now()
		mctx, cancel := context.WithTimeout(ctx, time.Minute)
		resp, err := mc.MergePartitions(mctx, &api.MergePartitionsRequest{Tenant: api.DefaultTenant, Table: tab.tableName, Index: uint32(i), Wait: true})
		cancel()
		if err != nil {
			return fmt.Errorf("merge %d (partition index %d): %w", i+1, i, err)
		}
		if !resp.GetDone() {
			return fmt.Errorf("merge %d (partition index %d): not done within a minute (%s)", i+1, i, resp.GetPhase())
		}
		d := time.Since(t0)
		took = append(took, d)
		fmt.Fprintf(os.Stderr, "elastic: merge %d/%d: partitions %d and %d into %d in %v\n", i+1, cfg.merges, resp.GetLeftId(), resp.GetRightId(), resp.GetChildId(), d.Round(time.Millisecond))
	}
	load.setPhase("after")
	if err := clSleep(ctx, time.Second); err != nil {
		return err
	}
	load.halt()
	fmt.Fprintf(out, "# merge: master + 3 servers, point table of %d partitions × 3 replicas (ssd, sync), each split once; %d pairs of siblings (on the same servers: no alignment) merged back one after another under a light load (%d goroutines); a merge's time is the master's MergePartitions with wait (returns once the child takes writes)\n", parts, cfg.merges, cfg.mergeLoad)
	fmt.Fprintf(out, "figure elastic-merge-ms-p50 %.1f ms\n", ms(elQuantile(took, 0.5)))
	fmt.Fprintf(out, "figure elastic-merge-ms-p99 %.1f ms\n", ms(elQuantile(took, 0.99)))
	fmt.Fprintf(out, "figure elastic-merge-ms-max %.1f ms\n", ms(slices.Max(took)))
	load.report(out, "merge", "merges")
	return nil
}
