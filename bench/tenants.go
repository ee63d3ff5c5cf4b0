package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/testcluster"
)

func init() {
	register(suite{
		name:  "tenants",
		about: "noisy neighbour (tenant A offered 10x its write quota beside tenant B's steady load: B's p99 with A / alone, A's admitted rate / quota) and the cost of signing (signed / unsigned Get throughput)",
		run:   runTenants,
	})
}

type tenantsConfig struct {
	servers, partitions     int
	quota, bRate            int
	offer                   float64
	duration                time.Duration
	rounds, goroutines      int
	workloads               map[string]bool
	dir, tabulaBin          string
	seed                    uint64
	opTimeout, signDuration time.Duration
	diag                    bool
}

func runTenants(out io.Writer, args []string) (err error) {
	fs := flag.NewFlagSet("tenants", flag.ContinueOnError)
	var cfg tenantsConfig
	fs.IntVar(&cfg.servers, "servers", 3, "tabula server processes of the noisy-neighbour cluster")
	fs.IntVar(&cfg.partitions, "partitions", 6, "partitions of each tenant's table")
	fs.IntVar(&cfg.quota, "quota", 100, "tenant A's write quota (keys per second, over the cluster)")
	fs.Float64Var(&cfg.offer, "offer", 10, "tenant A's offered writes as a multiple of its quota (open loop)")
	fs.IntVar(&cfg.bRate, "b-rate", 400, "tenant B's steady load: requests per second (open loop, half Get, half Put)")
	fs.DurationVar(&cfg.duration, "duration", 10*time.Second, "length of one run (B alone, B with A)")
	fs.IntVar(&cfg.rounds, "rounds", 3, "rounds; each runs B alone and B with A, in alternating order")
	fs.DurationVar(&cfg.opTimeout, "op-timeout", 2*time.Second, "deadline of one request (the SDK retries within it)")
	fs.IntVar(&cfg.goroutines, "goroutines", 16, "closed-loop Get goroutines of the signing workload")
	fs.DurationVar(&cfg.signDuration, "sign-duration", 5*time.Second, "length of one signing run")
	workloads := fs.String("workloads", "noisy,signing", "workloads: noisy, signing (comma list)")
	fs.BoolVar(&cfg.diag, "diag", false, "print per run where tenant A's calls went: outcomes, retries by reason, the shares refusals named, the admitted rate the master heard (debug logging costs client CPU)")
	fs.StringVar(&cfg.dir, "dir", "", "directory for data and logs (default: a new temp dir, removed after a successful run)")
	fs.StringVar(&cfg.tabulaBin, "tabula-bin", "", "tabula binary to run (default: built from this checkout)")
	fs.Uint64Var(&cfg.seed, "seed", rand.Uint64(), "random seed")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.workloads = clSet(*workloads)
	for w := range cfg.workloads {
		if w != "noisy" && w != "signing" {
			return fmt.Errorf("unknown workload %q", w)
		}
	}
	if cfg.quota < 1 || cfg.bRate < 1 || cfg.offer <= 0 || cfg.rounds < 1 {
		return errors.New("-quota, -b-rate, -rounds must be ≥ 1 and -offer > 0")
	}
	dir, keep, err := suiteDir("tenants", cfg.dir)
	if err != nil {
		return err
	}
	defer func() { keep(err) }()
	fmt.Fprintf(out, "# tenants suite, seed %d\n", cfg.seed)
	ctx := context.Background()
	if cfg.workloads["signing"] {
		if err := tnSigning(ctx, out, filepath.Join(dir, "signing"), &cfg); err != nil {
			return fmt.Errorf("signing: %w", err)
		}
	}
	if cfg.workloads["noisy"] {
		if err := tnNoisy(ctx, out, filepath.Join(dir, "noisy"), &cfg); err != nil {
			return fmt.Errorf("noisy neighbour: %w", err)
		}
	}
	return nil
}

// tnSigning measures Get throughput on two in-process clusters of one
// server, alike but for authentication, alternating runs.
func tnSigning(ctx context.Context, out io.Writer, dir string, cfg *tenantsConfig) error {
	type side struct {
		name string
		tc   *testcluster.Cluster
		tbl  *client.Table
		c    *client.Client
		ops  []float64
	}
	sides := []*side{{name: "signed"}, {name: "unsigned"}}
	defer func() {
		for _, s := range sides {
			if s.c != nil {
				s.c.Close()
			}
			if s.tc != nil {
				s.tc.Close()
			}
		}
	}()
	const keys = 10000
	val := make([]byte, 100)
	for _, s := range sides {
		tc, err := testcluster.Start(ctx, testcluster.Options{Servers: 1, Dir: filepath.Join(dir, s.name), NoAuth: s.name == "unsigned"})
		if err != nil {
			return err
		}
		s.tc = tc
		if s.c, err = client.New(ctx, tc.ClientOptions()); err != nil {
			return err
		}
		if _, err := s.c.CreateTable(ctx, "t", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 4, Replication: 1, Storage: "memory"}); err != nil {
			return err
		}
		s.tbl = s.c.Table("t")
		for i := range keys {
			if err := s.tbl.Put(ctx, fmt.Appendf(nil, "k%d", i), val); err != nil {
				return err
			}
		}
	}
	fmt.Fprintf(out, "# signing: two in-process clusters of one server (real gRPC on loopback), memory table of 4 partitions, %d keys of 100 B; %d goroutines of Get for %v per run, %d rounds alternating\n",
		keys, cfg.goroutines, cfg.signDuration, cfg.rounds)
	for r := range cfg.rounds {
		order := sides
		if r%2 == 1 {
			order = []*side{sides[1], sides[0]}
		}
		for _, s := range order {
			st, err := clRun(ctx, cfg.goroutines, 0, cfg.signDuration, cfg.seed+uint64(r), func(ctx context.Context, rng *rand.Rand, _ []byte) error {
				_, err := s.tbl.Get(ctx, fmt.Appendf(nil, "k%d", rng.IntN(keys)))
				return err
			})
			if err != nil {
				return err
			}
			s.ops = append(s.ops, st.opsPerS())
			fmt.Fprintf(out, "# round %d %s: %.0f gets/s, p99 %.2f ms\n", r, s.name, st.opsPerS(), float64(st.hist.ValueAtQuantile(99))/1000)
		}
	}
	signed, unsigned := medianF(sides[0].ops), medianF(sides[1].ops)
	fmt.Fprintf(out, "figure signed_get_throughput %.0f ops/s\n", signed)
	fmt.Fprintf(out, "figure unsigned_get_throughput %.0f ops/s\n", unsigned)
	fmt.Fprintf(out, "ratio signed/unsigned get_throughput %.3f\n", signed/unsigned)
	return nil
}

// tnOpenLoop issues op at rate per second for d, each call in its own
// goroutine with its own deadline, and returns when each successful call
// ended and its latency (µs), and the failed calls.
func tnOpenLoop(ctx context.Context, rate float64, d, timeout time.Duration, seed uint64, op func(ctx context.Context, rng *rand.Rand) error) (ends []time.Time, lat []int64, failed int64) {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		nBad atomic.Int64
	)
	start := time.Now()
	interval := time.Duration(float64(time.Second) / rate)
	for i := 0; ; i++ {
		at := start.Add(time.Duration(i) * interval)
		if at.Sub(start) >= d {
			break
		}
		if w := time.Until(at); w > 0 {
			time.Sleep(w)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			cctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			t0 := time.Now()
			if err := op(cctx, rng); err != nil {
				nBad.Add(1)
				return
			}
			end := time.Now()
			mu.Lock()
			lat = append(lat, end.Sub(t0).Microseconds())
			ends = append(ends, end)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return ends, lat, nBad.Load()
}

func p99(lat []int64) float64 {
	if len(lat) == 0 {
		return 0
	}
	h := clNewHist()
	for _, v := range lat {
		_ = h.RecordValue(max(1, v))
	}
	return float64(h.ValueAtQuantile(99)) / 1000
}

// tnNoisy runs tenant B's steady load alone and beside tenant A offered
// cfg.offer times its write quota, on one cluster of real processes.
func tnNoisy(ctx context.Context, out io.Writer, dir string, cfg *tenantsConfig) error {
	procs := &clProcs{logDir: dir}
	defer procs.killAll()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tab, err := clStartTabulaAs(ctx, out, procs, dir, &clConfig{servers: cfg.servers, partitions: cfg.partitions, replicas: 3, tabulaBin: cfg.tabulaBin}, "")
	if err != nil {
		return err
	}
	defer tab.close()
	cc, err := grpc.NewClient(tab.masterAddr, append(benchCred.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		return err
	}
	defer cc.Close()
	mc := api.NewMasterClient(cc)
	diag := &tnDiag{}
	tenant := func(name string, q *api.TenantQuota) (*client.Table, *client.Client, error) {
		resp, err := mc.CreateTenant(ctx, &api.CreateTenantRequest{Tenant: name, Quota: q})
		if err != nil {
			return nil, nil, err
		}
		opts := client.Options{Masters: []string{tab.masterAddr}, Seed: cfg.seed,
			Credential: client.TenantCredential(name, 1, resp.GetTenant().GetKeys()[0])}
		if q != nil && cfg.diag {
			// Diagnostics: A's retries, by reason, and the shares its
			// refusals name.
			opts.Logger = slog.New(diag)
		}
		c, err := client.New(ctx, opts)
		if err != nil {
			return nil, nil, err
		}
		if _, err := c.CreateTable(ctx, "t", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: uint32(cfg.partitions), Replication: 3, Storage: "ssd"}); err != nil {
			return nil, nil, errors.Join(err, c.Close())
		}
		return c.Table("t"), c, nil
	}
	ta, ca, err := tenant("tenant-a", &api.TenantQuota{WriteOpsPerSec: uint64(cfg.quota)})
	if err != nil {
		return err
	}
	defer ca.Close()
	tb, cb, err := tenant("tenant-b", nil)
	if err != nil {
		return err
	}
	defer cb.Close()
	const bKeys = 10000
	val := make([]byte, 100)
	for i := range 1000 {
		if err := tb.Put(ctx, fmt.Appendf(nil, "k%d", i), val); err != nil {
			return fmt.Errorf("preload B: %w", err)
		}
	}
	bOp := func(ctx context.Context, rng *rand.Rand) error {
		k := fmt.Appendf(nil, "k%d", rng.IntN(bKeys))
		if rng.IntN(2) == 0 {
			_, err := tb.Get(ctx, k)
			if errors.Is(err, client.ErrKeyNotFound) {
				return nil
			}
			return err
		}
		return tb.Put(ctx, k, val)
	}
	aOp := func(ctx context.Context, rng *rand.Rand) error {
		err := ta.Put(ctx, fmt.Appendf(nil, "a%d", rng.Uint64()), val)
		if cfg.diag {
			diag.outcome(err)
		}
		return err
	}
	fmt.Fprintf(out, "# noisy neighbour: %d servers, each tenant a point table of %d partitions x 3 replicas (ssd); B: %d req/s open loop (half Get, half Put, 100 B); A: write quota %d/s, offered %.0f/s open loop; %v per run, %d rounds; request deadline %v\n",
		cfg.servers, cfg.partitions, cfg.bRate, cfg.quota, cfg.offer*float64(cfg.quota), cfg.duration, cfg.rounds, cfg.opTimeout)
	// Warm up: A's demand reaches the master and the shares settle.
	tnOpenLoop(ctx, cfg.offer*float64(cfg.quota), 3*time.Second, cfg.opTimeout, cfg.seed, aOp)
	diag.take()
	var alone, with, atQuota, admitted []float64
	var bFailed int64
	for r := range cfg.rounds {
		runAlone := func() {
			_, lat, bad := tnOpenLoop(ctx, float64(cfg.bRate), cfg.duration, cfg.opTimeout, cfg.seed+uint64(r), bOp)
			alone = append(alone, p99(lat))
			bFailed += bad
			fmt.Fprintf(out, "# round %d B alone: p99 %.2f ms (%d requests, %d failed)\n", r, p99(lat), len(lat), bad)
		}
		runWith := func(offer float64, p99s *[]float64, what string) {
			var aEnds []time.Time
			var wg sync.WaitGroup
			sampled := make(chan []float64, 1)
			sctx, stopSampling := context.WithCancel(ctx)
			if cfg.diag {
				go func() { sampled <- tnSampleUsage(sctx, mc, "tenant-a") }()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				// A starts a second early so B's run meets it at full force.
				aEnds, _, _ = tnOpenLoop(ctx, offer*float64(cfg.quota), cfg.duration+2*time.Second, cfg.opTimeout, cfg.seed+uint64(r)+1000, aOp)
			}()
			time.Sleep(time.Second)
			from := time.Now()
			_, lat, bad := tnOpenLoop(ctx, float64(cfg.bRate), cfg.duration, cfg.opTimeout, cfg.seed+uint64(r), bOp)
			to := from.Add(cfg.duration)
			wg.Wait()
			stopSampling()
			diagLine := ""
			if cfg.diag {
				diagLine = fmt.Sprintf("#   A: %s; the master heard %s admitted writes/s\n", diag.take(), tnMeanStr(<-sampled))
			}
			// A's admitted rate over B's window (A's calls that ended in it).
			var aOK int
			for _, e := range aEnds {
				if !e.Before(from) && e.Before(to) {
					aOK++
				}
			}
			*p99s = append(*p99s, p99(lat))
			bFailed += bad
			rate := float64(aOK) / cfg.duration.Seconds()
			if p99s == &with {
				admitted = append(admitted, rate/float64(cfg.quota))
			}
			fmt.Fprintf(out, "# round %d B with A %s (offered %.0f/s): p99 %.2f ms (%d requests, %d failed); A admitted %.0f writes/s of a quota of %d\n", r, what, offer*float64(cfg.quota), p99(lat), len(lat), bad, rate, cfg.quota)
			fmt.Fprint(out, diagLine)
		}
		noisy := func() { runWith(cfg.offer, &with, "over its quota") }
		control := func() { runWith(1, &atQuota, "at its quota") }
		if r%2 == 0 {
			runAlone()
			control()
			noisy()
		} else {
			noisy()
			control()
			runAlone()
		}
	}
	fmt.Fprintf(out, "figure b_p99_alone %.2f ms\n", medianF(alone))
	fmt.Fprintf(out, "figure b_p99_with_a %.2f ms\n", medianF(with))
	fmt.Fprintf(out, "figure b_p99_with_a_at_quota %.2f ms\n", medianF(atQuota))
	fmt.Fprintf(out, "figure b_failed_requests %d requests\n", bFailed)
	fmt.Fprintf(out, "ratio with_a/alone b_p99 %.3f\n", medianF(with)/medianF(alone))
	// The part the excess alone costs: A over its quota against A at it.
	fmt.Fprintf(out, "ratio with_a/with_a_at_quota b_p99 %.3f\n", medianF(with)/medianF(atQuota))
	fmt.Fprintf(out, "ratio admitted/quota a_writes %.3f\n", medianF(admitted))
	return nil
}

// tnDiag counts tenant A's outcomes and retries (a slog.Handler on A's
// client). Safe for concurrent use. Diagnostics only.
type tnDiag struct {
	mu       sync.Mutex
	outcomes map[string]int
	retries  map[string]int
	limits   map[string][]float64 // server → shares named by refusals
}

func tnReason(err error) string {
	d := api.DetailOf(err)
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, client.ErrOutcomeUnknown):
		return "outcome_unknown"
	case d.GetReason() != "":
		return d.GetReason()
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	}
	return "other"
}

func (d *tnDiag) outcome(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.outcomes == nil {
		d.outcomes = map[string]int{}
	}
	d.outcomes[tnReason(err)]++
}

func (d *tnDiag) Enabled(context.Context, slog.Level) bool { return true }
func (d *tnDiag) WithAttrs([]slog.Attr) slog.Handler       { return d }
func (d *tnDiag) WithGroup(string) slog.Handler            { return d }
func (d *tnDiag) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "tabula: retrying" {
		return nil
	}
	var err error
	var where string
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "err":
			err, _ = a.Value.Any().(error)
		case "where":
			where = a.Value.String()
		}
		return true
	})
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.retries == nil {
		d.retries, d.limits = map[string]int{}, map[string][]float64{}
	}
	d.retries[tnReason(err)]++
	if det := api.DetailOf(err); det.GetReason() == "tenant_write_rate" {
		addr := where
		if i := strings.LastIndex(where, " at "); i >= 0 {
			addr = strings.TrimSuffix(where[i+4:], ")")
		}
		d.limits[addr] = append(d.limits[addr], float64(det.GetLimit()))
	}
	return nil
}

// take returns the counts since the last take and resets them.
func (d *tnDiag) take() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "outcomes %v, retries by reason %v, median shares named by refusals", d.outcomes, d.retries)
	var sum float64
	for _, addr := range slices.Sorted(maps.Keys(d.limits)) {
		m := medianF(d.limits[addr])
		sum += m
		fmt.Fprintf(&b, " %s:%.0f", addr, m)
	}
	fmt.Fprintf(&b, " (sum %.0f)", sum)
	d.outcomes, d.retries, d.limits = nil, nil, nil
	return b.String()
}

// tnSampleUsage samples tenant's admitted writes per second as the master
// last heard them, every second until ctx ends.
func tnSampleUsage(ctx context.Context, mc api.MasterClient, tenant string) []float64 {
	var out []float64
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return out
		case <-t.C:
		}
		resp, err := mc.DescribeTenant(ctx, &api.DescribeTenantRequest{Tenant: tenant})
		if err == nil {
			out = append(out, resp.GetTenant().GetUsage().GetWriteOpsPerSec())
		}
	}
}

func tnMeanStr(v []float64) string {
	if len(v) == 0 {
		return "?"
	}
	var s float64
	for _, x := range v {
		s += x
	}
	return fmt.Sprintf("%.1f (mean of %d samples; median %.1f)", s/float64(len(v)), len(v), medianF(v))
}
