package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/data/aztables"
)

func init() {
	register(suite{
		name:  "azure",
		about: "the Azure Table API through aztables: tabula dev's gateway vs Azurite (in memory): inserts, point gets, 100-row range queries, 100-op batches; and the ordered engine alone vs pebble used directly (workload engine)",
		run:   runAzure,
	})
}

// The well-known development account both targets serve.
const (
	azAccount = "devstoreaccount1"
	azKey     = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
	// azAzuriteVersion is the npm package the suite installs.
	azAzuriteVersion = "3.35.0"
)

// azConfig is the azure suite's flags.
type azConfig struct {
	targets     map[string]bool
	workloads   map[string]bool
	getKeys     int
	rangeParts  int
	rangeRows   int
	dir         string
	tabulaBin   string
	azuriteDir  string
	cl          clConfig // goroutines, rounds, duration, seed, valueSize for clCompare
	startupWait time.Duration
	tabulaDebug string // -tabula-debug-listen
}

var azWorkloads = []string{"insert", "get", "range", "batch", "engine"}

func runAzure(out io.Writer, args []string) (err error) {
	fs := flag.NewFlagSet("azure", flag.ContinueOnError)
	var cfg azConfig
	targetList := fs.String("targets", "tabula,azurite", "targets: tabula (tabula dev's Azure Table gateway), azurite (comma list); none runs only the engine workload, which needs no target")
	workloads := fs.String("workloads", strings.Join(azWorkloads, ","), "workloads (comma list): "+strings.Join(azWorkloads, ", "))
	fs.IntVar(&cfg.cl.goroutines, "goroutines", 16, "client goroutines of every workload")
	fs.IntVar(&cfg.cl.rounds, "rounds", 3, "rounds per workload, contender order reversed every other round")
	fs.DurationVar(&cfg.cl.duration, "duration", 5*time.Second, "length of one contender's run in a round")
	fs.IntVar(&cfg.cl.valueSize, "value-size", 100, "characters of the string property of every entity")
	fs.Uint64Var(&cfg.cl.seed, "seed", rand.Uint64(), "random seed")
	fs.IntVar(&cfg.getKeys, "get-keys", 10000, "entities preloaded for point gets (in 100 partitions)")
	fs.IntVar(&cfg.rangeParts, "range-partitions", 16, "partitions preloaded for range queries")
	fs.IntVar(&cfg.rangeRows, "range-rows", 1000, "rows per range partition (a query reads 100 consecutive ones)")
	fs.StringVar(&cfg.dir, "dir", "", "directory for data and logs (default: a new temp dir, removed after a successful run)")
	fs.StringVar(&cfg.tabulaBin, "tabula-bin", "", "tabula binary to run (default: built from this checkout)")
	fs.StringVar(&cfg.azuriteDir, "azurite-dir", "", "npm prefix Azurite is installed into when missing (default: <user cache dir>/tabula-bench/azurite-"+azAzuriteVersion+")")
	fs.StringVar(&cfg.tabulaDebug, "tabula-debug-listen", "", "serve Go's profiling endpoints of tabula dev (the whole cluster and the gateway) on this address, to profile it during a run (empty: none)")
	fs.DurationVar(&cfg.startupWait, "startup-wait", 90*time.Second, "how long a target may take to serve")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.targets, cfg.workloads = clSet(*targetList), clSet(*workloads)
	if len(cfg.targets) == 0 {
		// -targets none: the engine workload compares two libraries in
		// this process, with nothing to start (and no Azurite to install).
		cfg.workloads = map[string]bool{"engine": true}
	}
	for tg := range cfg.targets {
		if tg != "tabula" && tg != "azurite" {
			return fmt.Errorf("unknown target %q", tg)
		}
	}
	for w := range cfg.workloads {
		if !strings.Contains(","+strings.Join(azWorkloads, ",")+",", ","+w+",") {
			return fmt.Errorf("unknown workload %q", w)
		}
	}
	if cfg.cl.goroutines < 1 || cfg.cl.rounds < 1 || cfg.rangeRows < 100 || cfg.getKeys < 100 || cfg.rangeParts < 1 {
		return errors.New("want -goroutines and -rounds ≥ 1, -range-rows ≥ 100, -get-keys ≥ 100, -range-partitions ≥ 1")
	}

	dir, keep, err := suiteDir("azure", cfg.dir)
	if err != nil {
		return err
	}
	defer func() { keep(err) }()
	procs := &clProcs{logDir: filepath.Join(dir, "logs")}
	if err := os.MkdirAll(procs.logDir, 0o755); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer procs.killAll()
	go func() {
		<-ctx.Done()
		procs.killAll()
	}()

	fmt.Fprintf(out, "# azure: loopback, %d goroutines, %d-character string values; %d rounds x %v per contender and workload, order reversed every other round; GOMAXPROCS %d (clients and servers share the box); dir %s; seed %d (rerun with -seed %d)\n",
		cfg.cl.goroutines, cfg.cl.valueSize, cfg.cl.rounds, cfg.cl.duration, runtime.GOMAXPROCS(0), dir, cfg.cl.seed, cfg.cl.seed)
	fmt.Fprintln(out, "# client: github.com/Azure/azure-sdk-for-go/sdk/data/aztables v1.4.1 (Shared Key Lite, x-ms-version 2019-02-02), no retries, one HTTP transport per target with 64 idle connections per host")

	var targets []*azTarget
	if cfg.targets["tabula"] {
		tg, terr := azStartTabula(ctx, out, procs, dir, &cfg)
		switch {
		case terr == nil:
			targets = append(targets, tg)
		case len(cfg.targets) > 1:
			fmt.Fprintf(out, "note: the tabula Azure Table gateway is not available, so no tabula numbers and no ratios: %s\n", azOneLine(terr))
		default:
			return fmt.Errorf("tabula: %w", terr)
		}
	}
	if cfg.targets["azurite"] {
		tg, aerr := azStartAzurite(ctx, out, procs, &cfg)
		if aerr != nil {
			return fmt.Errorf("azurite: %w", aerr)
		}
		targets = append(targets, tg)
	}
	if len(targets) == 0 && len(cfg.targets) > 0 {
		return errors.New("no target to run")
	}
	fmt.Fprintln(out, "# targets: ≥10x Azurite's throughput on every operation (durable on 3 replicas); point get p99 ≤ 5 ms through the gateway")

	for _, tg := range targets {
		if err := tg.preload(ctx, out, &cfg); err != nil {
			return fmt.Errorf("%s preload: %w", tg.name, err)
		}
	}
	for _, wl := range azWorkloads {
		if !cfg.workloads[wl] {
			continue
		}
		if wl == "engine" {
			if err := azEngineCompare(ctx, out, dir, &cfg.cl); err != nil {
				return fmt.Errorf("engine: %w", err)
			}
			continue
		}
		var cs []clContender
		for _, tg := range targets {
			cs = append(cs, clContender{name: tg.name, op: tg.op(wl, &cfg), serverCPU: tg.proc.cpu})
		}
		res, err := clCompare(ctx, out, wl, cs, &cfg.cl)
		if err != nil {
			return err
		}
		if wl == "batch" {
			for _, tg := range targets {
				fmt.Fprintf(out, "figure %s-batch-rows %.0f rows/s\n", tg.name, 100*res[tg.name][0])
			}
		}
		ours, okO := res["tabula"]
		peer, okP := res["azurite"]
		if okO && okP {
			fmt.Fprintf(out, "ratio tabula/azurite %s %.2f\n", wl, ours[0]/peer[0])
			if ours[2] > 0 {
				fmt.Fprintf(out, "ratio tabula/azurite %s-p99(peer÷ours) %.2f\n", wl, peer[2]/ours[2])
			}
		}
		if okO && okP && ours[3] > 0 {
			// The aztables clients run on the same cores: even a server
			// that cost nothing could not pass cores ÷ their CPU per
			// operation, which bounds the ratio any server can reach here.
			bound := float64(runtime.NumCPU()) * 1e6 / ours[3]
			fmt.Fprintf(out, "figure tabula-%s-client-bound %.0f ops/s (clients alone at %.1f us/op on %d cores: at most %.1fx azurite)\n", wl, bound, ours[3], runtime.NumCPU(), bound/peer[0])
		}
		if o, p := clServerCPU["tabula/"+wl], clServerCPU["azurite/"+wl]; okO && okP && p > 0 {
			// The servers' own cost, which the shared box's client CPU
			// does not cap (target ≤ 0.1).
			fmt.Fprintf(out, "ratio tabula/azurite %s-server-cpu %.3f\n", wl, o/p)
		}
		if okO && wl == "get" {
			fmt.Fprintf(out, "figure tabula-get-p99-ms %.2f ms (target ≤ 5)\n", ours[2]/1000)
		}
	}
	return ctx.Err()
}

// azOneLine squeezes an error onto one line for a note.
func azOneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// azTarget is one Azure Table endpoint under load and its tables.
// Safe for concurrent use once preloaded.
type azTarget struct {
	name string
	svc  *aztables.ServiceClient
	ins  *aztables.Client // insert workload
	get  *aztables.Client // preloaded: g00..g99 / k%06d
	rng  *aztables.Client // preloaded: rp00.. / r%05d
	bat  *aztables.Client // batch workload

	seq atomic.Int64 // unique keys of inserts and batches
	// proc is the target's server process (tabula dev: master, servers and
	// gateway in one; Azurite's node process): its CPU is the server's.
	proc *clProc
}

func azNewTarget(name, endpoint string) (*azTarget, error) {
	cred, err := aztables.NewSharedKeyCredential(azAccount, azKey)
	if err != nil {
		return nil, err
	}
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        128,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     60 * time.Second,
	}
	opts := &aztables.ClientOptions{ClientOptions: policy.ClientOptions{
		Retry:     policy.RetryOptions{MaxRetries: -1},
		Transport: &http.Client{Transport: tr},
	}}
	svc, err := aztables.NewServiceClientWithSharedKey(endpoint, cred, opts)
	if err != nil {
		return nil, err
	}
	return &azTarget{name: name, svc: svc}, nil
}

// waitServing polls List Tables until it answers, alive() turns false, or
// d passes.
func (tg *azTarget) waitServing(ctx context.Context, d time.Duration, alive func() bool, tail func() string) error {
	return clPoll(ctx, d, 100*time.Millisecond, func() (bool, error) {
		if !alive() {
			return false, fmt.Errorf("%w: %s exited; log tail:\n%s", errStopPolling, tg.name, tail())
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := tg.svc.NewListTablesPager(&aztables.ListTablesOptions{Top: ptrTo[int32](1)}).NextPage(pctx)
		return err == nil, err
	}, tg.name+" to answer List Tables")
}

func ptrTo[T any](v T) *T { return &v }

// azStartTabula builds (or takes) the tabula binary and runs `tabula dev`
// with its Azure Table gateway on a free port.
func azStartTabula(ctx context.Context, out io.Writer, procs *clProcs, dir string, cfg *azConfig) (*azTarget, error) {
	t0 := time.Now()
	bin, err := msTabulaBin(ctx, dir, cfg.tabulaBin)
	if err != nil {
		return nil, err
	}
	if cfg.tabulaBin == "" {
		fmt.Fprintf(os.Stderr, "azure: built %s in %v\n", bin, time.Since(t0).Round(time.Millisecond))
	}
	addrs, err := clFreeAddrs(2)
	if err != nil {
		return nil, err
	}
	args := []string{"dev",
		"--data", filepath.Join(dir, "tabula-data"),
		"--listen", addrs[0],
		"--azure-listen", addrs[1],
		"--dashboard-listen", ""}
	if cfg.tabulaDebug != "" {
		args = append(args, "--debug-listen", cfg.tabulaDebug)
	}
	p, err := procs.start("tabula-dev", bin, args...)
	if err != nil {
		return nil, err
	}
	// (Not p.waitLog: it keeps polling until its deadline after the
	// process exited.)
	err = clPoll(ctx, cfg.startupWait, 50*time.Millisecond, func() (bool, error) {
		if strings.Contains(p.log(), "tabula dev ready") {
			return true, nil
		}
		if !p.running() {
			if strings.Contains(p.log(), "unknown flag: --azure-listen") {
				return false, fmt.Errorf("%w: this tabula dev has no --azure-listen flag (the gateway is not built yet)", errStopPolling)
			}
			return false, fmt.Errorf("%w: tabula dev exited; log tail:\n%s", errStopPolling, p.tail(20))
		}
		return false, nil
	}, "tabula dev to print \"tabula dev ready\"")
	if err != nil {
		p.kill()
		return nil, errors.New(strings.TrimPrefix(err.Error(), errStopPolling.Error()+": "))
	}
	tg, err := azNewTarget("tabula", "http://"+addrs[1]+"/"+azAccount)
	if err != nil {
		p.kill()
		return nil, err
	}
	tg.proc = p
	if err := tg.waitServing(ctx, 20*time.Second, p.running, func() string { return p.tail(20) }); err != nil {
		p.kill()
		return nil, fmt.Errorf("tabula dev is ready but does not serve the Azure Table gateway on %s (--azure-listen): %w", addrs[1], err)
	}
	fmt.Fprintf(out, "# tabula: tabula dev (1 master, 3 table servers in one process) from %s, Azure Table gateway on %s (--azure-listen); tables as the gateway creates them\n", bin, addrs[1])
	return tg, nil
}

// azStartAzurite installs Azurite with npm into its own folder when
// missing and runs its table service in memory on a free port.
func azStartAzurite(ctx context.Context, out io.Writer, procs *clProcs, cfg *azConfig) (*azTarget, error) {
	prefix := cfg.azuriteDir
	if prefix == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			return nil, fmt.Errorf("no folder for Azurite (give -azurite-dir): %w", err)
		}
		prefix = filepath.Join(cache, "tabula-bench", "azurite-"+azAzuriteVersion)
	}
	bin := filepath.Join(prefix, "node_modules", ".bin", "azurite-table")
	if _, err := os.Stat(bin); err != nil {
		if _, err := exec.LookPath("npm"); err != nil {
			return nil, errors.New("npm not on PATH: install Node.js (apt-get install npm) or give -azurite-dir with Azurite installed")
		}
		fmt.Fprintf(out, "# running: npm install --prefix %s azurite@%s\n", prefix, azAzuriteVersion)
		cmd := exec.CommandContext(ctx, "npm", "install", "--prefix", prefix, "--no-audit", "--no-fund", "azurite@"+azAzuriteVersion)
		if b, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("npm install azurite: %w\n%s", err, b)
		}
	}
	addrs, err := clFreeAddrs(1)
	if err != nil {
		return nil, err
	}
	host, port, _ := net.SplitHostPort(addrs[0])
	p, err := procs.start("azurite-table", bin, "--inMemoryPersistence", "--tableHost", host, "--tablePort", port, "--silent", "--disableTelemetry")
	if err != nil {
		return nil, err
	}
	tg, err := azNewTarget("azurite", "http://"+addrs[0]+"/"+azAccount)
	if err != nil {
		return nil, err
	}
	tg.proc = p
	if err := tg.waitServing(ctx, cfg.startupWait, p.running, func() string { return p.tail(20) }); err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "# azurite: azurite-table %s (npm, %s) --inMemoryPersistence on %s: one Node.js process, nothing durable\n", azAzuriteVersion, prefix, addrs[0])
	return tg, nil
}

// azEntity is the entity every workload writes: keys, a string of
// valueSize characters and an Int32.
func azEntity(pk, rk string, val []byte, n int32) ([]byte, error) {
	return json.Marshal(aztables.EDMEntity{
		Entity:     aztables.Entity{PartitionKey: pk, RowKey: rk},
		Properties: map[string]any{"V": azString(val), "N": n},
	})
}

// azString maps val to letters, so the string is valid UTF-8 of len(val)
// characters.
func azString(val []byte) string {
	b := make([]byte, len(val))
	for i, v := range val {
		b[i] = 'a' + v%26
	}
	return string(b)
}

// preload creates the tables and loads the get and range data in
// 100-entity batches.
func (tg *azTarget) preload(ctx context.Context, out io.Writer, cfg *azConfig) error {
	t0 := time.Now()
	for _, t := range []struct {
		name string
		c    **aztables.Client
	}{{"benchins", &tg.ins}, {"benchget", &tg.get}, {"benchrange", &tg.rng}, {"benchbatch", &tg.bat}} {
		if _, err := tg.svc.CreateTable(ctx, t.name, nil); err != nil {
			return fmt.Errorf("create table %s: %w", t.name, err)
		}
		*t.c = tg.svc.NewClient(t.name)
	}
	val := make([]byte, cfg.cl.valueSize)
	rng := rand.New(rand.NewPCG(cfg.cl.seed, 0))
	load := func(c *aztables.Client, pk string, rks []string) error {
		var acts []aztables.TransactionAction
		for i, rk := range rks {
			for j := range val {
				val[j] = byte(rng.Uint32())
			}
			e, err := azEntity(pk, rk, val, int32(i))
			if err != nil {
				return err
			}
			acts = append(acts, aztables.TransactionAction{ActionType: aztables.TransactionTypeAdd, Entity: e})
			if len(acts) == 100 || i == len(rks)-1 {
				if _, err := c.SubmitTransaction(ctx, acts, nil); err != nil {
					return fmt.Errorf("load %s: %w", pk, err)
				}
				acts = acts[:0]
			}
		}
		return nil
	}
	perPart := (cfg.getKeys + 99) / 100
	for p := range 100 {
		var rks []string
		for i := range perPart {
			rks = append(rks, fmt.Sprintf("k%06d", i))
		}
		if err := load(tg.get, fmt.Sprintf("g%02d", p), rks); err != nil {
			return err
		}
	}
	for p := range cfg.rangeParts {
		var rks []string
		for i := range cfg.rangeRows {
			rks = append(rks, fmt.Sprintf("r%05d", i))
		}
		if err := load(tg.rng, fmt.Sprintf("rp%02d", p), rks); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "raw %s preload %d get entities + %d range rows in %v\n", tg.name, 100*perPart, cfg.rangeParts*cfg.rangeRows, time.Since(t0).Round(time.Millisecond))
	return nil
}

// op is one operation of workload wl against tg.
func (tg *azTarget) op(wl string, cfg *azConfig) clOp {
	perPart := (cfg.getKeys + 99) / 100
	switch wl {
	case "insert":
		return func(ctx context.Context, rng *rand.Rand, val []byte) error {
			clPutValue(rng, val)
			n := tg.seq.Add(1)
			e, err := azEntity(fmt.Sprintf("i%02d", rng.IntN(64)), fmt.Sprintf("r%012d", n), val, int32(n))
			if err != nil {
				return err
			}
			_, err = tg.ins.AddEntity(ctx, e, nil)
			return err
		}
	case "get":
		return func(ctx context.Context, rng *rand.Rand, _ []byte) error {
			pk, rk := fmt.Sprintf("g%02d", rng.IntN(100)), fmt.Sprintf("k%06d", rng.IntN(perPart))
			_, err := tg.get.GetEntity(ctx, pk, rk, nil)
			return err
		}
	case "range":
		return func(ctx context.Context, rng *rand.Rand, _ []byte) error {
			start := rng.IntN(cfg.rangeRows - 99)
			f := fmt.Sprintf("PartitionKey eq 'rp%02d' and RowKey ge 'r%05d' and RowKey lt 'r%05d'", rng.IntN(cfg.rangeParts), start, start+100)
			pager := tg.rng.NewListEntitiesPager(&aztables.ListEntitiesOptions{Filter: &f, Top: ptrTo[int32](100)})
			n := 0
			for pager.More() {
				resp, err := pager.NextPage(ctx)
				if err != nil {
					return err
				}
				n += len(resp.Entities)
			}
			if n != 100 {
				return fmt.Errorf("range query %s: %d rows, want 100", f, n)
			}
			return nil
		}
	case "batch":
		return func(ctx context.Context, rng *rand.Rand, val []byte) error {
			pk := fmt.Sprintf("b%012d", tg.seq.Add(1))
			acts := make([]aztables.TransactionAction, 100)
			for i := range acts {
				clPutValue(rng, val)
				e, err := azEntity(pk, fmt.Sprintf("r%03d", i), val, int32(i))
				if err != nil {
					return err
				}
				acts[i] = aztables.TransactionAction{ActionType: aztables.TransactionTypeAdd, Entity: e}
			}
			_, err := tg.bat.SubmitTransaction(ctx, acts, nil)
			return err
		}
	}
	panic("azure: unknown workload " + wl)
}
