package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/redis/go-redis/v9"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
)

func init() {
	register(suite{
		name:  "cluster",
		about: "real processes on loopback: tabula master + 5 servers vs 3-node etcd and Redis (AOF always): durable writes, reads, failover under kill -9, a paused secondary, a flapping one",
		run:   runCluster,
	})
}

// clConfig is the cluster suite's flags.
type clConfig struct {
	servers, partitions, replicas int
	goroutines, keys, valueSize   int
	rounds                        int
	duration                      time.Duration
	kills                         int
	repairBytes                   int64
	failoverTimeout, opTimeout    time.Duration
	killInterval                  time.Duration
	restart                       string
	pause                         time.Duration
	flaps                         int
	flapPause, flapInterval       time.Duration
	peers, workloads              map[string]bool
	dir, tabulaBin                string
	seed                          uint64
	cpuProfile                    string   // the suite's own process (the clients)
	gomaxprocs                    int      // of every child process; 0: Go's default
	serverDebugPort               int      // server i serves /debug/pprof/ on this port + i, /metrics on this port + 100 + i; 0: none
	serverFlags                   []string // added to every tabula server's command line
	masterFlags                   []string // added to the tabula master's command line
}

// childProcs describes the children's GOMAXPROCS for the header line.
func childProcs(n int) string {
	if n == 0 {
		return "Go's default"
	}
	return strconv.Itoa(n)
}

func clSet(s string) map[string]bool {
	m := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" && f != "none" {
			m[f] = true
		}
	}
	return m
}

func runCluster(out io.Writer, args []string) (err error) {
	fs := flag.NewFlagSet("cluster", flag.ContinueOnError)
	var cfg clConfig
	fs.IntVar(&cfg.servers, "servers", 5, "tabula server processes (each its own fault domain fd-N)")
	fs.IntVar(&cfg.gomaxprocs, "gomaxprocs", -1, "GOMAXPROCS of every process the suite starts (tabula master and servers, etcd members; Redis is single-threaded): -1 is the machine's cores ÷ tabula servers, at least 1, so that processes sharing the machine each run on their share of it, as co-located servers would be set up; 0 leaves Go's default (every core)")
	fs.IntVar(&cfg.partitions, "partitions", 15, "partitions of the benchmark table")
	fs.IntVar(&cfg.replicas, "replicas", 3, "replicas per partition (falls back to 1, with a note, while the product refuses more)")
	fs.IntVar(&cfg.goroutines, "goroutines", 16, "client goroutines of every workload")
	fs.IntVar(&cfg.keys, "keys", 100000, "distinct keys")
	fs.IntVar(&cfg.valueSize, "value-size", 100, "value bytes")
	fs.IntVar(&cfg.rounds, "rounds", 3, "rounds of the throughput workloads, contender order reversed every other round")
	fs.DurationVar(&cfg.duration, "duration", 10*time.Second, "length of one contender's run in a round")
	fs.IntVar(&cfg.kills, "kills", 20, "kill -9s of a server hosting primaries in the failover run")
	fs.DurationVar(&cfg.failoverTimeout, "failover-timeout", 30*time.Second, "a partition not writable this long after the kill counts as a failure")
	fs.DurationVar(&cfg.opTimeout, "op-timeout", 2*time.Second, "deadline of one write in the failover run (the writer moves on to its next write after it)")
	fs.DurationVar(&cfg.killInterval, "kill-interval", 2*time.Second, "steady write load between the cluster settling and the next kill")
	fs.StringVar(&cfg.restart, "restart", "auto", "when the killed server is restarted: immediate (as soon as it is gone), after (once its partitions are writable again or the failover timeout passed), auto (immediate with 1 replica, whose partitions wait for their server; after otherwise)")
	fs.DurationVar(&cfg.pause, "pause", 5*time.Second, "SIGSTOP length of the paused-secondary run (and of its steady run before)")
	fs.IntVar(&cfg.flaps, "flaps", 5, "pauses of one server in the flap run")
	serverFlags := fs.String("server-flags", "", "extra flags for every tabula server, space-separated (e.g. \"--replicate-timeout-max 150ms\" to fix the replicate timeout)")
	fs.DurationVar(&cfg.flapPause, "flap-pause", 400*time.Millisecond, "SIGSTOP length of each pause of the flap run")
	fs.DurationVar(&cfg.flapInterval, "flap-interval", 3*time.Second, "time from one pause's start to the next one's in the flap run")
	peers := fs.String("peers", "etcd,redis", "peers to run: etcd, redis (comma list; none for ours alone)")
	workloads := fs.String("workloads", "writes,reads,pause,flap,failover,repair", "workloads to run (comma list; also lazyflush: puts with engines flushing lazily vs fsyncing every write, on a second cluster)")
	fs.Int64Var(&cfg.repairBytes, "repair-bytes", 1<<30, "repair: bytes of the partition copied to a new replica")
	fs.StringVar(&cfg.dir, "dir", "", "directory for data and logs (default: a new temp dir, removed after a successful run)")
	fs.StringVar(&cfg.tabulaBin, "tabula-bin", "", "tabula binary to run (default: built from this checkout)")
	fs.Uint64Var(&cfg.seed, "seed", rand.Uint64(), "random seed")
	fs.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write a CPU profile of the suite's own process (every client of every contender) to this file")
	fs.IntVar(&cfg.serverDebugPort, "server-debug-port", 0, "serve Go's profiling endpoints of server i on 127.0.0.1:(this port + i), and its metrics on (this port + 100 + i), to profile a server during a run (0: none)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if cfg.cpuProfile != "" {
		f, perr := os.Create(cfg.cpuProfile)
		if perr != nil {
			return perr
		}
		if perr := pprof.StartCPUProfile(f); perr != nil {
			return errors.Join(perr, f.Close())
		}
		defer func() {
			pprof.StopCPUProfile()
			err = errors.Join(err, f.Close())
		}()
	}
	cfg.peers, cfg.workloads = clSet(*peers), clSet(*workloads)
	cfg.serverFlags = strings.Fields(*serverFlags)
	for w := range cfg.workloads {
		if !slices.Contains([]string{"writes", "reads", "pause", "flap", "failover", "repair", "lazyflush"}, w) {
			return fmt.Errorf("unknown workload %q", w)
		}
	}
	for p := range cfg.peers {
		if p != "etcd" && p != "redis" {
			return fmt.Errorf("unknown peer %q", p)
		}
	}
	if cfg.restart != "auto" && cfg.restart != "immediate" && cfg.restart != "after" {
		return fmt.Errorf("-restart %q: want auto, immediate or after", cfg.restart)
	}
	if cfg.servers < 1 || cfg.goroutines < 1 || cfg.keys < cfg.goroutines || cfg.rounds < 1 {
		return errors.New("-servers, -goroutines, -rounds must be ≥ 1 and -keys ≥ -goroutines")
	}
	if cfg.flaps < 1 || cfg.flapPause <= 0 || cfg.flapInterval <= cfg.flapPause {
		return errors.New("-flaps must be ≥ 1, -flap-pause > 0 and -flap-interval longer than -flap-pause")
	}

	dir, keep, err := suiteDir("cluster", cfg.dir)
	if err != nil {
		return err
	}
	defer func() { keep(err) }()
	if cfg.gomaxprocs < 0 {
		cfg.gomaxprocs = max(1, runtime.NumCPU()/cfg.servers)
	}
	procs := &clProcs{logDir: filepath.Join(dir, "logs"), gomaxprocs: cfg.gomaxprocs}
	if err := os.MkdirAll(procs.logDir, 0o755); err != nil {
		return err
	}
	// Every child dies with the suite: on return (error or not) and on
	// Ctrl-C / SIGTERM, which also cancels ctx so workloads stop.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer procs.killAll()
	go func() {
		<-ctx.Done()
		procs.killAll()
	}()

	fmt.Fprintf(out, "# cluster: loopback, %d goroutines, %d-byte values, %d keys; %d rounds x %v per contender, order reversed every other round; GOMAXPROCS %d (children: %s); dir %s; seed %d (rerun with -seed %d)\n",
		cfg.goroutines, cfg.valueSize, cfg.keys, cfg.rounds, cfg.duration, runtime.GOMAXPROCS(0), childProcs(cfg.gomaxprocs), dir, cfg.seed, cfg.seed)
	if err := clEnsurePeers(out, cfg.peers); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}

	tab, err := clStartTabula(ctx, out, procs, dir, &cfg)
	if err != nil {
		return err
	}
	defer tab.close()
	var etcd *clEtcd
	if cfg.peers["etcd"] {
		if etcd, err = clStartEtcd(ctx, procs, dir, 3); err != nil {
			return fmt.Errorf("etcd: %w", err)
		}
		defer etcd.close()
		fmt.Fprintln(out, "# etcd3: 3 etcd members (Debian etcd-server) on loopback, own data dirs, default settings (WAL fsynced before the ack); client go.etcd.io/etcd/client/v3 with every member as an endpoint; Put")
	}
	var rds *clRedis
	if cfg.peers["redis"] {
		if rds, err = clStartRedis(ctx, procs, dir, cfg.goroutines+4); err != nil {
			return fmt.Errorf("redis: %w", err)
		}
		defer rds.close()
		fmt.Fprintln(out, "# redis: one redis-server (Debian redis-server), --appendonly yes --appendfsync always --save '' (every write fsynced to the AOF before the reply); client github.com/redis/go-redis/v9; SET, GET")
	}

	keys := make([][]byte, cfg.keys)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "key-%07d", i)
	}
	if cfg.workloads["writes"] || cfg.workloads["reads"] {
		if err := clPreload(ctx, out, tab, rds, keys, &cfg); err != nil {
			return err
		}
	}
	if cfg.workloads["writes"] {
		if err := clWrites(ctx, out, tab, etcd, rds, keys, &cfg); err != nil {
			return err
		}
	}
	if cfg.workloads["lazyflush"] {
		if err := clLazyFlush(ctx, out, procs, dir, tab, keys, &cfg); err != nil {
			return err
		}
	}
	if cfg.workloads["reads"] {
		if err := clReads(ctx, out, tab, rds, keys, &cfg); err != nil {
			return err
		}
	}
	if cfg.workloads["pause"] {
		if err := clPausedSecondary(ctx, out, tab, keys, &cfg); err != nil {
			return err
		}
	}
	if cfg.workloads["flap"] {
		if err := clFlap(ctx, out, tab, keys, &cfg); err != nil {
			return err
		}
	}
	if cfg.workloads["failover"] {
		if err := clFailover(ctx, out, tab, keys, &cfg); err != nil {
			return err
		}
	}
	if cfg.workloads["repair"] {
		if err := clRepair(ctx, out, tab, keys, &cfg); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// clTabula is the product as real processes: a master and cfg.servers
// table servers (server i in fault domain fd-i), a client, and the
// benchmark table.
type clTabula struct {
	master      *clProc
	masterAddr  string
	servers     []*clProc
	c           *client.Client
	tableName   string
	tbl         *client.Table
	replicas    int
	partitions  int
	singleCopy  bool
	serverCount int
	// metricsAddrs[i] serves server i's Prometheus metrics (the stream's
	// drop and rejoin counters); "" for servers of a prefixed cluster.
	metricsAddrs []string

	// bin, procs and dir start more servers (the repair section's spare).
	bin   string
	procs *clProcs
	dir   string
}

const clTable = "bench"

func clStartTabula(ctx context.Context, out io.Writer, procs *clProcs, dir string, cfg *clConfig) (*clTabula, error) {
	return clStartTabulaAs(ctx, out, procs, dir, cfg, "", cfg.serverFlags...)
}

// clStartTabulaAs starts a tabula cluster whose processes' names start
// with prefix, its servers run with serverArgs added.
func clStartTabulaAs(ctx context.Context, out io.Writer, procs *clProcs, dir string, cfg *clConfig, prefix string, serverArgs ...string) (*clTabula, error) {
	bin := cfg.tabulaBin
	if bin == "" {
		bin = filepath.Join(dir, "tabula")
		t0 := time.Now()
		// Built in the product's own module (the replace directive's
		// target), with the product's go.mod: the binary users run.
		root, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/tabuladb/tabula").Output()
		if err != nil {
			return nil, fmt.Errorf("find the product module: %w", err)
		}
		cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/tabula")
		cmd.Dir = strings.TrimSpace(string(root))
		if b, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("build tabula: %w\n%s", err, b)
		}
		fmt.Fprintf(os.Stderr, "cluster: built %s in %v\n", bin, time.Since(t0).Round(time.Millisecond))
	}
	// The master's and the servers' addresses, and the servers' metrics
	// addresses, picked in one go so that none repeats.
	addrs, err := clFreeAddrs(1 + 2*cfg.servers)
	if err != nil {
		return nil, err
	}
	t := &clTabula{masterAddr: addrs[0], tableName: clTable, serverCount: cfg.servers, bin: bin, procs: procs, dir: dir}
	// The partitions stay as placed unless a suite asks otherwise (the
	// elastic suite's flags come after and win): the other suites compare
	// fixed layouts with their peers, and an automatic split or a
	// balancing move in the middle of a run would change what is measured.
	masterArgs := append([]string{"master", "--listen", t.masterAddr, "--data", filepath.Join(dir, "master"), "--auto-split=false", "--rebalance=false"}, cfg.masterFlags...)
	t.master, err = procs.start(prefix+"tabula-master", bin, masterArgs...)
	if err != nil {
		return nil, err
	}
	if err := t.master.waitLog(ctx, "master serving", 20*time.Second); err != nil {
		return nil, err
	}
	// The main cluster's servers always serve their metrics: the suite
	// reads the stream's drop and rejoin counters (on -server-debug-port's
	// ports when it is given).
	metricsAddrs := make([]string, cfg.servers)
	if prefix == "" {
		for i := range metricsAddrs {
			metricsAddrs[i] = addrs[1+cfg.servers+i]
			if cfg.serverDebugPort != 0 {
				metricsAddrs[i] = fmt.Sprintf("127.0.0.1:%d", cfg.serverDebugPort+100+i)
			}
		}
	}
	t.metricsAddrs = metricsAddrs
	for i := range cfg.servers {
		args := append([]string{"server",
			"--master", t.masterAddr, "--listen", addrs[1+i],
			"--data", filepath.Join(dir, fmt.Sprintf("server-%d", i)), "--fault-domain", fmt.Sprintf("fd-%d", i)}, serverArgs...)
		if cfg.serverDebugPort != 0 && prefix == "" {
			args = append(args, "--debug-listen", fmt.Sprintf("127.0.0.1:%d", cfg.serverDebugPort+i))
		}
		if metricsAddrs[i] != "" {
			args = append(args, "--metrics-listen", metricsAddrs[i])
		}
		p, err := procs.start(fmt.Sprintf("%stabula-server-%d", prefix, i), bin, args...)
		if err != nil {
			return nil, err
		}
		t.servers = append(t.servers, p)
	}
	for _, p := range t.servers {
		if err := p.waitLog(ctx, "registered with master", 30*time.Second); err != nil {
			return nil, err
		}
	}
	t.c, err = client.New(ctx, client.Options{Credential: benchCred, Masters: []string{t.masterAddr}})
	if err != nil {
		return nil, err
	}
	if err := clPoll(ctx, 30*time.Second, 50*time.Millisecond, func() (bool, error) {
		ids, err := t.serverIDs(ctx)
		return len(ids) == cfg.servers, err
	}, fmt.Sprintf("%d live servers", cfg.servers)); err != nil {
		return nil, errors.Join(err, t.close())
	}
	t.replicas, t.partitions = cfg.replicas, cfg.partitions
	opts := func() *api.TableOptions {
		return &api.TableOptions{Partitions: uint32(t.partitions), Replication: uint32(t.replicas), Storage: "ssd", Durability: "sync"}
	}
	_, err = t.c.CreateTable(ctx, t.tableName, api.TableKind_TABLE_KIND_POINT, opts())
	if err != nil && t.replicas > 1 && api.CodeOf(err) == api.ErrorCode_ERROR_CODE_UNIMPLEMENTED {
		fmt.Fprintf(out, "note: the product refused %d replicas (%v); falling back to 1 replica: every tabula number below is SINGLE-COPY (no replication), the paused-secondary run is skipped, and failover time is the killed server's restart time\n", t.replicas, err)
		t.replicas, t.singleCopy = 1, true
		_, err = t.c.CreateTable(ctx, t.tableName, api.TableKind_TABLE_KIND_POINT, opts())
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("create table: %w", err), t.close())
	}
	t.singleCopy = t.replicas == 1
	t.tbl = t.c.Table(t.tableName)
	if _, err := t.waitPlaced(ctx, t.tableName, 30*time.Second); err != nil {
		return nil, errors.Join(err, t.close())
	}
	fmt.Fprintf(out, "# tabula: master + %d servers as processes (fd-0..fd-%d), point table %q: %d partitions, %d replica(s), storage ssd, durability sync (acknowledged once fsynced); Go SDK, one client shared by all goroutines; Put, Get (from the primary)\n",
		cfg.servers, cfg.servers-1, t.tableName, t.partitions, t.replicas)
	return t, nil
}

func (t *clTabula) close() error {
	if t.c == nil {
		return nil
	}
	return t.c.Close()
}

// serverIDs maps the fault domain (fd-i: server process i) of every live
// server to its id.
func (t *clTabula) serverIDs(ctx context.Context) (map[string]string, error) {
	ss, err := t.c.ListServers(ctx)
	if err != nil {
		return nil, err
	}
	ids := map[string]string{}
	for _, s := range ss {
		if s.GetAlive() {
			ids[s.GetFaultDomain()] = s.GetId()
		}
	}
	return ids, nil
}

// freshMap reads table name's partition map from the master (not the
// client's cache).
func (t *clTabula) freshMap(ctx context.Context, name string) (*api.PartitionMap, error) {
	d, err := t.c.DescribeTable(ctx, name)
	if err != nil {
		return nil, err
	}
	return d.GetMap(), nil
}

// waitPlaced waits until every partition of the table has a primary and
// its full set of replicas.
func (t *clTabula) waitPlaced(ctx context.Context, name string, d time.Duration) (*api.PartitionMap, error) {
	var m *api.PartitionMap
	err := clPoll(ctx, d, 50*time.Millisecond, func() (bool, error) {
		var err error
		if m, err = t.freshMap(ctx, name); err != nil {
			return false, err
		}
		for _, p := range m.GetPartitions() {
			if clPrimary(p) == "" || len(p.GetReplicas()) < t.replicas {
				return false, fmt.Errorf("partition %d: %d replicas, primary %q", p.GetIndex(), len(p.GetReplicas()), clPrimary(p))
			}
		}
		return len(m.GetPartitions()) > 0, nil
	}, "every partition of "+name+" placed")
	return m, err
}

// clPrimary is the id of p's primary, "" when it has none.
func clPrimary(p *api.Partition) string {
	for _, r := range p.GetReplicas() {
		if r.GetRole() == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
			return r.GetServerId()
		}
	}
	return ""
}

// clPreload writes every key once to ours and to redis, so reads always
// find their key (etcd only takes writes).
func clPreload(ctx context.Context, out io.Writer, tab *clTabula, rds *clRedis, keys [][]byte, cfg *clConfig) error {
	rng := rand.New(rand.NewPCG(cfg.seed, 1))
	val := make([]byte, cfg.valueSize)
	for i := range val {
		val[i] = byte(rng.Uint32())
	}
	t0 := time.Now()
	const batch = 500
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	work := make(chan int)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for start := range work {
				muts := make([]client.Mutation, 0, batch)
				for _, k := range keys[start:min(start+batch, len(keys))] {
					muts = append(muts, client.Mutation{Key: k, Value: val})
				}
				if err := tab.tbl.BatchWrite(ctx, muts); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	for start := 0; start < len(keys); start += batch {
		work <- start
	}
	close(work)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("preload tabula: %w", err)
	}
	fmt.Fprintf(out, "# preloaded %d keys into tabula in %v (BatchWrite of %d)\n", len(keys), time.Since(t0).Round(time.Millisecond), batch)
	if rds != nil {
		t0 = time.Now()
		for start := 0; start < len(keys); start += batch {
			pipe := rds.cli.Pipeline()
			for _, k := range keys[start:min(start+batch, len(keys))] {
				pipe.Set(ctx, string(k), val, 0)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				return fmt.Errorf("preload redis: %w", err)
			}
		}
		fmt.Fprintf(out, "# preloaded %d keys into redis in %v (pipelines of %d SETs)\n", len(keys), time.Since(t0).Round(time.Millisecond), batch)
	}
	return nil
}

// clStats is one timed closed-loop run: ops, wall time, and every
// operation's latency in microseconds.
type clStats struct {
	ops     int64
	elapsed time.Duration
	hist    *hdrhistogram.Histogram
	cpu     time.Duration // the suite's own CPU time (user + system) during the run: the clients'
	// serverCPU is the contender's server processes' CPU time during the
	// run (0: not measured).
	serverCPU time.Duration
}

// serverCPUPerOp is the servers' CPU time per operation, in microseconds.
func (s clStats) serverCPUPerOp() float64 {
	if s.ops == 0 {
		return 0
	}
	return float64(s.serverCPU.Microseconds()) / float64(s.ops)
}

// cpuPerOp is the clients' CPU time per operation, in microseconds.
func (s clStats) cpuPerOp() float64 {
	if s.ops == 0 {
		return 0
	}
	return float64(s.cpu.Microseconds()) / float64(s.ops)
}

// selfCPU is this process's CPU time so far (user + system).
// clServerCPU holds clCompare's median server CPU per operation (µs), by
// "contender/workload", for the suites' ratio lines. Written by the
// suite's goroutine only.
var clServerCPU = map[string]float64{}

// procCPU is the CPU time (user + system) process pid has used, from
// /proc/<pid>/stat (fields 14 and 15, in clock ticks of 1/100 s on Linux).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// count fields after its closing one.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the name", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	const tick = 10 * time.Millisecond // USER_HZ is 100 on Linux
	return time.Duration(utime+stime) * tick, nil
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func clNewHist() *hdrhistogram.Histogram { return hdrhistogram.New(1, 120_000_000, 3) }

func (s clStats) opsPerS() float64 { return float64(s.ops) / s.elapsed.Seconds() }

// clOp is one operation of goroutine g; val is g's value buffer, which
// the op may change.
type clOp func(ctx context.Context, rng *rand.Rand, val []byte) error

// clRun runs op in goroutines closed loops for dur and times every call.
// The first error stops the run and is returned.
func clRun(ctx context.Context, goroutines, valueSize int, dur time.Duration, seed uint64, op clOp) (clStats, error) {
	ctx, cancel := context.WithTimeout(ctx, dur+30*time.Second) // a hung peer ends the run
	defer cancel()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		st    = clStats{hist: clNewHist()}
		first error
	)
	start, cpu0 := time.Now(), selfCPU()
	deadline := start.Add(dur)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(g)))
			val := make([]byte, valueSize)
			for i := range val {
				val[i] = byte(rng.Uint32())
			}
			h := clNewHist()
			var n int64
			var err error
			for time.Now().Before(deadline) {
				t0 := time.Now()
				if err = op(ctx, rng, val); err != nil {
					cancel()
					break
				}
				_ = h.RecordValue(max(1, time.Since(t0).Microseconds()))
				n++
			}
			mu.Lock()
			defer mu.Unlock()
			st.ops += n
			st.hist.Merge(h)
			if err != nil && first == nil {
				first = err
			}
		}()
	}
	wg.Wait()
	st.elapsed, st.cpu = time.Since(start), selfCPU()-cpu0
	return st, first
}

// clContender is one system in a throughput workload.
type clContender struct {
	name string
	op   clOp
	// serverCPU, when set, reads the CPU time (user + system) the
	// contender's server processes have used so far: clCompare then
	// reports the server's CPU per operation beside the clients'.
	serverCPU func() (time.Duration, error)
}

// clCompare runs every contender cfg.rounds times for cfg.duration,
// alternating (order reversed every other round), and prints the medians:
// raw lines, figure <name>-<wl>-ops|p50|p99, and returns the medians by
// contender name.
func clCompare(ctx context.Context, out io.Writer, wl string, cs []clContender, cfg *clConfig) (map[string][4]float64, error) {
	per := map[string][]clStats{}
	var err error
	for r := range cfg.rounds {
		order := slices.Clone(cs)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, c := range order {
			var cpu0 time.Duration
			if c.serverCPU != nil {
				if cpu0, err = c.serverCPU(); err != nil {
					return nil, fmt.Errorf("%s %s round %d: server CPU: %w", c.name, wl, r, err)
				}
			}
			st, err := clRun(ctx, cfg.goroutines, cfg.valueSize, cfg.duration, cfg.seed+uint64(100*r), c.op)
			if err != nil {
				return nil, fmt.Errorf("%s %s round %d: %w", c.name, wl, r, err)
			}
			if c.serverCPU != nil {
				cpu1, err := c.serverCPU()
				if err != nil {
					return nil, fmt.Errorf("%s %s round %d: server CPU: %w", c.name, wl, r, err)
				}
				st.serverCPU = cpu1 - cpu0
			}
			fmt.Fprintf(os.Stderr, "cluster: %s round %d %s: %.0f ops/s p50 %d us p99 %d us\n", wl, r, c.name, st.opsPerS(), st.hist.ValueAtQuantile(50), st.hist.ValueAtQuantile(99))
			per[c.name] = append(per[c.name], st)
		}
	}
	res := map[string][4]float64{}
	for _, c := range cs {
		var ops, p50, p99, cpu []float64
		var rounds []string
		for _, st := range per[c.name] {
			ops = append(ops, st.opsPerS())
			cpu = append(cpu, st.cpuPerOp())
			p50 = append(p50, float64(st.hist.ValueAtQuantile(50)))
			p99 = append(p99, float64(st.hist.ValueAtQuantile(99)))
			rounds = append(rounds, fmt.Sprintf("%.0f/%d/%d", st.opsPerS(), st.hist.ValueAtQuantile(50), st.hist.ValueAtQuantile(99)))
		}
		m := [4]float64{medianF(ops), medianF(p50), medianF(p99), medianF(cpu)}
		res[c.name] = m
		fmt.Fprintf(out, "raw %s %s median %.0f ops/s p50 %.0f us p99 %.0f us (rounds ops/s/p50/p99: %s)\n", c.name, wl, m[0], m[1], m[2], strings.Join(rounds, " "))
		fmt.Fprintf(out, "figure %s-%s-ops %.0f ops/s\n", c.name, wl, m[0])
		fmt.Fprintf(out, "figure %s-%s-p50 %.0f us\n", c.name, wl, m[1])
		fmt.Fprintf(out, "figure %s-%s-p99 %.0f us\n", c.name, wl, m[2])
		// What the clients themselves cost: on a shared box, ops/s can
		// never pass cores ÷ this, however cheap the server.
		fmt.Fprintf(out, "figure %s-%s-client-cpu %.1f us/op\n", c.name, wl, m[3])
		if c.serverCPU != nil {
			var srv []float64
			for _, st := range per[c.name] {
				srv = append(srv, st.serverCPUPerOp())
			}
			fmt.Fprintf(out, "figure %s-%s-server-cpu %.1f us/op\n", c.name, wl, medianF(srv))
			clServerCPU[c.name+"/"+wl] = medianF(srv)
		}
	}
	return res, nil
}

// clPutValue stamps val with a sequence number so values differ.
func clPutValue(rng *rand.Rand, val []byte) {
	for i := 0; i < 8 && i < len(val); i++ {
		val[i] = byte(rng.Uint32())
	}
}

// clWrites: durable single-key writes, ours Put vs etcd Put vs redis SET
// (appendfsync always), uniform over the keys.
func clWrites(ctx context.Context, out io.Writer, tab *clTabula, etcd *clEtcd, rds *clRedis, keys [][]byte, cfg *clConfig) error {
	cs := []clContender{{name: "tabula", op: func(ctx context.Context, rng *rand.Rand, val []byte) error {
		clPutValue(rng, val)
		return tab.tbl.Put(ctx, keys[rng.IntN(len(keys))], val)
	}}}
	if tab.partitions > 1 {
		// The same puts to a table of one partition: one replication
		// group on three servers, the shape of a 3-node etcd, where the
		// writers' puts share each log append and replication call.
		const name = "bench1p"
		if _, err := tab.c.CreateTable(ctx, name, api.TableKind_TABLE_KIND_POINT,
			&api.TableOptions{Partitions: 1, Replication: uint32(tab.replicas), Storage: "ssd", Durability: "sync"}); err != nil {
			return fmt.Errorf("create table %s: %w", name, err)
		}
		if _, err := tab.waitPlaced(ctx, name, 30*time.Second); err != nil {
			return err
		}
		fmt.Fprintf(out, "# tabula-1p: the same puts to point table %q of 1 partition, %d replica(s): one replication group, as a 3-node etcd is\n", name, tab.replicas)
		tbl1 := tab.c.Table(name)
		cs = append(cs, clContender{name: "tabula-1p", op: func(ctx context.Context, rng *rand.Rand, val []byte) error {
			clPutValue(rng, val)
			return tbl1.Put(ctx, keys[rng.IntN(len(keys))], val)
		}})
	}
	if etcd != nil {
		cs = append(cs, clContender{name: "etcd3", op: func(ctx context.Context, rng *rand.Rand, val []byte) error {
			clPutValue(rng, val)
			_, err := etcd.cli.Put(ctx, string(keys[rng.IntN(len(keys))]), string(val))
			return err
		}})
	}
	if rds != nil {
		cs = append(cs, clContender{name: "redis-aof-always", op: func(ctx context.Context, rng *rand.Rand, val []byte) error {
			clPutValue(rng, val)
			return rds.cli.Set(ctx, string(keys[rng.IntN(len(keys))]), val, 0).Err()
		}})
	}
	// Secondaries dropped from an ack set with no fault injected: every
	// one is a replica falling behind that the load alone caused.
	ctrs := newClStreamCounters(tab)
	before, berr := ctrs.read(ctx)
	res, err := clCompare(ctx, out, "put", cs, cfg)
	if err != nil {
		return err
	}
	after, aerr := ctrs.read(ctx)
	if err := errors.Join(berr, aerr); err != nil {
		fmt.Fprintf(out, "note: secondary drops during the puts not known: %v\n", err)
	} else {
		// Per minute of load on ours (its contenders' rounds), not of the
		// whole workload: the peers' rounds load other processes.
		ours := time.Duration(cfg.rounds*tabContenders(cs)) * cfg.duration
		drops := after.drops - before.drops
		fmt.Fprintf(out, "raw tabula put secondaries dropped %.0f, rejoined %.0f over %v of puts to ours (no fault injected)\n", drops, after.rejoins-before.rejoins, ours)
		fmt.Fprintf(out, "figure cluster-secondary-drops-per-min %.2f /min\n", drops/ours.Minutes())
	}
	if tab.singleCopy {
		fmt.Fprintln(out, "note: tabula put numbers are single-copy (1 replica), not replicated writes")
	}
	for _, peer := range []string{"etcd3", "redis-aof-always"} {
		if p, ok := res[peer]; ok {
			fmt.Fprintf(out, "ratio tabula/%s put-ops %.2f\n", peer, res["tabula"][0]/p[0])
			if one, ok := res["tabula-1p"]; ok {
				fmt.Fprintf(out, "ratio tabula-1p/%s put-ops %.2f\n", peer, one[0]/p[0])
			}
		}
	}
	return nil
}

// tabContenders counts the contenders that are ours.
func tabContenders(cs []clContender) int {
	n := 0
	for _, c := range cs {
		if strings.HasPrefix(c.name, "tabula") {
			n++
		}
	}
	return n
}

// clReads: single-key reads, ours Get (from the primary) vs redis GET.
func clReads(ctx context.Context, out io.Writer, tab *clTabula, rds *clRedis, keys [][]byte, cfg *clConfig) error {
	check := func(v []byte) error {
		if len(v) != cfg.valueSize {
			return fmt.Errorf("read a %d-byte value, want %d", len(v), cfg.valueSize)
		}
		return nil
	}
	cs := []clContender{{name: "tabula", op: func(ctx context.Context, rng *rand.Rand, _ []byte) error {
		v, err := tab.tbl.Get(ctx, keys[rng.IntN(len(keys))])
		if err != nil {
			return err
		}
		return check(v)
	}}}
	if rds != nil {
		cs = append(cs, clContender{name: "redis", op: func(ctx context.Context, rng *rand.Rand, _ []byte) error {
			v, err := rds.cli.Get(ctx, string(keys[rng.IntN(len(keys))])).Bytes()
			if errors.Is(err, redis.Nil) {
				return errors.New("redis: key not found")
			}
			if err != nil {
				return err
			}
			return check(v)
		}})
	}
	res, err := clCompare(ctx, out, "get", cs, cfg)
	if err != nil {
		return err
	}
	if p, ok := res["redis"]; ok {
		fmt.Fprintf(out, "ratio tabula/redis get-ops %.2f\n", res["tabula"][0]/p[0])
	}
	return nil
}

// clLazyFlush: what flushing engines lazily gains. The same puts on the
// main cluster (replicated partitions' engines flush in the background:
// the commit log is the durable record) and on a second cluster whose
// servers run --engine-sync-writes (every engine write fsynced too), in
// alternating rounds.
func clLazyFlush(ctx context.Context, out io.Writer, procs *clProcs, dir string, tab *clTabula, keys [][]byte, cfg *clConfig) error {
	if tab.singleCopy {
		fmt.Fprintln(out, "note: lazyflush skipped: the table has 1 replica (its engine fsyncs every write)")
		return nil
	}
	c2 := *cfg
	c2.tabulaBin = tab.bin
	sync, err := clStartTabulaAs(ctx, out, procs, filepath.Join(dir, "engine-sync"), &c2, "engine-sync-", "--engine-sync-writes")
	if err != nil {
		return fmt.Errorf("lazyflush: the engine-sync cluster: %w", err)
	}
	defer sync.close()
	put := func(t *clTabula) clOp {
		return func(ctx context.Context, rng *rand.Rand, val []byte) error {
			clPutValue(rng, val)
			return t.tbl.Put(ctx, keys[rng.IntN(len(keys))], val)
		}
	}
	res, err := clCompare(ctx, out, "put-lazyflush", []clContender{{name: "tabula", op: put(tab)}, {name: "tabula-engine-sync", op: put(sync)}}, cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "ratio tabula/tabula-engine-sync put-ops %.2f\n", res["tabula"][0]/res["tabula-engine-sync"][0])
	fmt.Fprintf(out, "ratio tabula/tabula-engine-sync put-p99 %.2f\n", res["tabula"][2]/res["tabula-engine-sync"][2])
	return nil
}
