package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/coproc"
	"github.com/tabuladb/tabula/coproc/coproctest"
	"github.com/tabuladb/tabula/engines"
	_ "github.com/tabuladb/tabula/engines/point"
	"github.com/tabuladb/tabula/internal/keyspace"
	"github.com/tabuladb/tabula/internal/testcluster"
)

func init() {
	register(suite{
		name:  "coproc",
		about: "coprocessors: per-call platform overhead (runtime, table server, gRPC) vs Get, 32-key batch get in a guest vs native, compile cold/cached, deploy- and restart-to-ready",
		run:   runCoproc,
	})
}

type coprocConfig struct {
	rounds, calls, rpcCalls int
	compileRounds           int
	deployServers           int
	deployRounds            int
	restarts                int
}

func runCoproc(w io.Writer, args []string) error {
	fs := flag.NewFlagSet("coproc", flag.ContinueOnError)
	var cfg coprocConfig
	fs.IntVar(&cfg.rounds, "rounds", 5, "rounds; the workloads compared alternate within each round, the order reversed every other round; medians over rounds")
	fs.IntVar(&cfg.calls, "calls", 10000, "timed calls per workload per round (runtime and in-process server levels)")
	fs.IntVar(&cfg.rpcCalls, "rpc-calls", 2000, "timed calls per workload per round over gRPC")
	fs.IntVar(&cfg.compileRounds, "compile-rounds", 5, "cold/cached compiles of the 2 MB module (one fresh cache dir each)")
	fs.IntVar(&cfg.deployServers, "deploy-servers", 3, "table servers in the deploy-to-ready cluster")
	fs.IntVar(&cfg.deployRounds, "deploy-rounds", 3, "deploy-to-ready runs (a fresh cluster with cold caches each)")
	fs.IntVar(&cfg.restarts, "restarts", 3, "server restarts timed to the first successful Invoke")
	cpuProf := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	sections := fs.String("sections", "call,batch,compile,server,deploy", "comma list of sections to run: call (1a), batch (2a), compile (3a), server (1b, 1c, 2b, 3b), deploy (4)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if cfg.rounds < 1 || cfg.calls < 1 || cfg.rpcCalls < 1 || cfg.compileRounds < 1 || cfg.deployServers < 1 || cfg.deployRounds < 0 || cfg.restarts < 0 {
		return errors.New("coproc: -rounds, -calls, -rpc-calls, -compile-rounds and -deploy-servers must be positive; -deploy-rounds and -restarts at least 0")
	}
	want := map[string]bool{}
	for _, s := range strings.Split(*sections, ",") {
		switch s = strings.TrimSpace(s); s {
		case "call", "batch", "compile", "server", "deploy":
			want[s] = true
		default:
			return fmt.Errorf("coproc: unknown section %q (call, batch, compile, server, deploy)", s)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "tabula-bench-coproc-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if *cpuProf != "" {
		f, err := os.Create(*cpuProf)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}

	fmt.Fprintf(w, "# coproc: GOMAXPROCS=%d rounds=%d calls=%d rpc-calls=%d compile-rounds=%d deploy-servers=%d deploy-rounds=%d restarts=%d\n",
		runtime.GOMAXPROCS(0), cfg.rounds, cfg.calls, cfg.rpcCalls, cfg.compileRounds, cfg.deployServers, cfg.deployRounds, cfg.restarts)
	fmt.Fprintf(w, "# every latency is one call timed alone with time.Now (a clock read pair costs %.0f ns here, included); p50/p99 per round, medians over rounds\n", cpClockCost())
	start := time.Now()
	benchWasm, err := coproctest.Build(ctx, "testdata/bench", dir)
	if err != nil {
		return err
	}
	scoreWasm, err := coproctest.Build(ctx, "examples/score_candidates", dir)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "# modules built in %.1f s: testdata/bench %d bytes, examples/score_candidates %d bytes\n", time.Since(start).Seconds(), len(benchWasm), len(scoreWasm))

	if want["call"] || want["batch"] {
		if err := coprocRuntimeLevel(ctx, w, cfg, want, benchWasm, filepath.Join(dir, "rt")); err != nil {
			return fmt.Errorf("runtime level: %w", err)
		}
	}
	if want["compile"] {
		if err := coprocCompile(ctx, w, cfg, scoreWasm, filepath.Join(dir, "compile")); err != nil {
			return fmt.Errorf("compile: %w", err)
		}
	}
	if want["server"] {
		if err := coprocServerLevel(ctx, w, cfg, benchWasm, filepath.Join(dir, "server")); err != nil {
			return fmt.Errorf("server level: %w", err)
		}
	}
	if want["deploy"] && cfg.deployRounds > 0 {
		if err := coprocDeploy(ctx, w, cfg, scoreWasm, filepath.Join(dir, "deploy")); err != nil {
			return fmt.Errorf("deploy: %w", err)
		}
	}
	fmt.Fprintf(w, "# coproc suite took %.1f s\n", time.Since(start).Seconds())
	return nil
}

// cpWorkload is one thing timed call by call.
type cpWorkload struct {
	name string
	call func() error
}

// cpLats holds, per workload, each round's p50 and p99 in nanoseconds.
type cpLats map[string]*struct{ p50, p99 []float64 }

func (l cpLats) add(name string, ds []time.Duration) {
	e := l[name]
	if e == nil {
		e = &struct{ p50, p99 []float64 }{}
		l[name] = e
	}
	slices.Sort(ds)
	e.p50 = append(e.p50, float64(cpPct(ds, 0.50)))
	e.p99 = append(e.p99, float64(cpPct(ds, 0.99)))
}

// p50 and p99 are medians over rounds, in ns.
func (l cpLats) p50(name string) float64 { return cpMedian(l[name].p50) }
func (l cpLats) p99(name string) float64 { return cpMedian(l[name].p99) }

func cpPct(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(p*float64(len(sorted))))]
}

func cpMedian(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// cpRounds runs the workloads rounds times, each round in order and every
// other round in reverse (ABBA), calls/10 untimed calls then calls timed
// calls per workload, and returns each round's percentiles.
func cpRounds(rounds, calls int, ws []cpWorkload) (cpLats, error) {
	lats := cpLats{}
	ds := make([]time.Duration, calls)
	for r := range rounds {
		order := slices.Clone(ws)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, wl := range order {
			for range max(1, calls/10) {
				if err := wl.call(); err != nil {
					return nil, fmt.Errorf("%s: %w", wl.name, err)
				}
			}
			runtime.GC()
			for i := range ds {
				t0 := time.Now()
				err := wl.call()
				ds[i] = time.Since(t0)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", wl.name, err)
				}
			}
			lats.add(wl.name, ds)
		}
	}
	return lats, nil
}

func cpUs(ns float64) float64 { return ns / 1000 }

// raw prints each round's p50 and p99 of the workloads, prefixed.
func (l cpLats) raw(w io.Writer, prefix string, names ...string) {
	for _, n := range names {
		e := l[n]
		fmt.Fprintf(w, "raw %s_%s p50 %.2f us p99 %.2f us (rounds p50 %s, p99 %s)\n", prefix, n, cpUs(l.p50(n)), cpUs(l.p99(n)), cpRoundList(e.p50), cpRoundList(e.p99))
	}
}

func cpRoundList(ns []float64) string {
	var b strings.Builder
	for i, x := range ns {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%.2f", cpUs(x))
	}
	return b.String()
}

// cpClockCost is the median cost of the time.Now/time.Since pair the
// suite wraps around every call.
func cpClockCost() float64 {
	const n = 100000
	var per []float64
	for range 5 {
		t0 := time.Now()
		var sink time.Duration
		for range n {
			sink += time.Since(time.Now())
		}
		per = append(per, float64(time.Since(t0).Nanoseconds())/n)
		_ = sink
	}
	return cpMedian(per)
}

// coprocBatchKeys returns the first n generated keys that fits accepts
// (nil: any).
func coprocBatchKeys(n int, fits func([]byte) bool) [][]byte {
	var keys [][]byte
	for i := 0; len(keys) < n; i++ {
		k := fmt.Appendf(nil, "batch-key-%06d", i)
		if fits == nil || fits(k) {
			keys = append(keys, k)
		}
	}
	return keys
}

// coprocRuntimeLevel: coproc.Runtime.Call on an EnginePartition over the
// point engine in memory: per-call cost and the 32-key batch get.
func coprocRuntimeLevel(ctx context.Context, w io.Writer, cfg coprocConfig, want map[string]bool, wasm []byte, dir string) (err error) {
	rt, err := coproc.New(ctx, coproc.Options{CacheDir: filepath.Join(dir, "cache")})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, rt.Close(ctx)) }()
	key := coproc.ModuleKey{Tenant: "bench", Table: "bench", Name: "bench", Version: 1}
	if _, err := rt.Compile(ctx, key, wasm); err != nil {
		return err
	}
	e, err := engines.Open(engines.KindPoint, engines.Options{Storage: "memory"})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, e.Close()) }()
	keys := coprocBatchKeys(32, nil)
	muts := make([]engines.Mutation, len(keys))
	for i, k := range keys {
		muts[i] = engines.Mutation{Key: k, Value: make([]byte, 100)}
	}
	wr, ok := e.(engines.Writer)
	if !ok {
		return errors.New("the point engine is not an engines.Writer")
	}
	if err := wr.Apply(muts); err != nil {
		return err
	}
	part := coproc.PartitionFromEngine(e, coproc.PartitionInfo{ID: 1, Count: 1, HashEnd: ^uint64(0), Primary: true}, nil)
	call := func(method string, req coproc.CallRequest) func() error {
		return func() error {
			_, err := rt.Call(ctx, key, method, req)
			return err
		}
	}

	if want["call"] {
		fmt.Fprintf(w, "# 1a. platform overhead per partition call, runtime level: Runtime.Call on the point engine in memory (nop: raw export, no guest SDK; input: guest SDK Serve reading a 1 KiB input)\n")
		lats, err := cpRounds(cfg.rounds, cfg.calls, []cpWorkload{
			{"nop", call("nop", coproc.CallRequest{Partition: part})},
			{"input_1k", call("input", coproc.CallRequest{Partition: part, Input: make([]byte, 1024)})},
		})
		if err != nil {
			return err
		}
		lats.raw(w, "coproc_call", "nop", "input_1k")
		for _, n := range []string{"nop", "input_1k"} {
			fmt.Fprintf(w, "figure coproc_call_%s_p50 %.2f us\n", n, cpUs(lats.p50(n)))
			fmt.Fprintf(w, "figure coproc_call_%s_p99 %.2f us\n", n, cpUs(lats.p99(n)))
		}
	}
	if !want["batch"] {
		return nil
	}
	fmt.Fprintf(w, "# 2a. 32-key batch get inside a guest, runtime level (100-byte values in the memory engine): keys_only (Serve, reads nothing), batch (GetKeys: one batch get of the call's keys), batch_multi (Keys + GetMulti), native (EnginePartition.GetBatch, no guest)\n")
	req := coproc.CallRequest{Partition: part, Keys: keys}
	lats, err := cpRounds(cfg.rounds, cfg.calls, []cpWorkload{
		{"keys_only", call("keys_only", req)},
		{"batch", call("batch", req)},
		{"batch_multi", call("batch_multi", req)},
		{"native", func() error {
			_, found, err := part.GetBatch(keys)
			if err == nil && !found[len(found)-1] {
				err = errors.New("native batch get: last key missing")
			}
			return err
		}},
	})
	if err != nil {
		return err
	}
	lats.raw(w, "coproc_batch32", "keys_only", "batch", "batch_multi", "native")
	coprocBatchFigures(w, "coproc_batch32", lats.p50("keys_only"), lats.p50("batch"), lats.p50("batch_multi"), lats.p50("native"), len(keys))
	return nil
}

// coprocBatchFigures prints the per-key figures of a 32-key batch: the
// batch get's part of a call (the call minus the same call reading
// nothing), the native batch get, and their difference.
func coprocBatchFigures(w io.Writer, prefix string, keysOnly, batch, multi, native float64, n int) {
	perKey := func(ns float64) float64 { return ns / float64(n) }
	getKeys := batch - keysOnly
	getMulti := multi - keysOnly
	fmt.Fprintf(w, "figure %s_getkeys_total %.1f ns/key\n", prefix, perKey(getKeys))
	fmt.Fprintf(w, "figure %s_native %.1f ns/key\n", prefix, perKey(native))
	fmt.Fprintf(w, "figure %s_overhead %.1f ns/key\n", prefix, perKey(getKeys-native))
	fmt.Fprintf(w, "figure %s_getmulti_total %.1f ns/key\n", prefix, perKey(getMulti))
	fmt.Fprintf(w, "figure %s_getmulti_overhead %.1f ns/key\n", prefix, perKey(getMulti-native))
	if native > 0 {
		fmt.Fprintf(w, "ratio guest/native %s_p50 %.2f\n", prefix, getKeys/native)
		fmt.Fprintf(w, "ratio guest_multi/native %s_p50 %.2f\n", prefix, getMulti/native)
	}
}

// coprocTable is a table's routing as the bench sees it: the master's map.
type coprocTable struct {
	mc    api.MasterClient
	table string
	parts []*api.Partition
}

func (t *coprocTable) refresh(ctx context.Context) error {
	resp, err := t.mc.GetPartitionMap(ctx, &api.GetPartitionMapRequest{Tenant: api.DefaultTenant, Table: t.table})
	if err != nil {
		return err
	}
	t.parts = resp.GetMap().GetPartitions()
	return nil
}

// header addresses the partition that owns key.
func (t *coprocTable) header(key []byte) (*api.RequestHeader, *api.Partition) {
	h := keyspace.Hash(key)
	for _, p := range t.parts {
		if h >= p.GetStart() && h <= p.GetEnd() {
			return &api.RequestHeader{Tenant: api.DefaultTenant, Table: t.table, PartitionId: p.GetId(), Epoch: p.GetEpoch()}, p
		}
	}
	return nil, nil
}

// coprocServerLevel: one table server, the bench module deployed on a
// point table; Invoke and Get in process and over gRPC, then restarts.
func coprocServerLevel(ctx context.Context, w io.Writer, cfg coprocConfig, wasm []byte, dir string) (err error) {
	tc, err := testcluster.Start(ctx, testcluster.Options{Servers: 1, Dir: filepath.Join(dir, "cluster")})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, tc.Close()) }()
	c, err := client.New(ctx, client.Options{Credential: tc.Credential(), Masters: []string{tc.MasterAddr()}, Seed: 1})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, c.Close()) }()
	const table, name = "bench", "bench"
	if _, err := c.CreateTable(ctx, table, api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 4}); err != nil {
		return err
	}
	tb := c.Table(table)
	start := time.Now()
	v, err := tb.DeployCoprocBytes(ctx, name, wasm)
	if err != nil {
		return err
	}
	if err := tb.WaitCoprocLive(ctx, name, v); err != nil {
		return err
	}
	fmt.Fprintf(w, "# server level: 1 table server, point table of 4 partitions (default storage), bench module (%d bytes) live in %.0f ms\n", len(wasm), float64(time.Since(start).Microseconds())/1000)

	conn, err := grpc.NewClient(tc.MasterAddr(), append(tc.Credential().DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, conn.Close()) }()
	routes := &coprocTable{mc: api.NewMasterClient(conn), table: table}
	if err := routes.refresh(ctx); err != nil {
		return err
	}

	pointKey := []byte("point-key")
	if err := tb.Put(ctx, pointKey, make([]byte, 100)); err != nil {
		return err
	}
	hdr, p0 := routes.header(pointKey)
	if hdr == nil {
		return errors.New("no partition owns the point key")
	}
	// 32 keys that all land in the point key's partition.
	keys := coprocBatchKeys(32, func(k []byte) bool {
		h := keyspace.Hash(k)
		return h >= p0.GetStart() && h <= p0.GetEnd()
	})
	for _, k := range keys {
		if err := tb.Put(ctx, k, make([]byte, 100)); err != nil {
			return err
		}
	}

	srv := tc.Server(0).Handler()
	invoke := func(method string, keys [][]byte) func() error {
		req := &api.InvokeRequest{Header: hdr, Name: name, Method: method, Keys: keys}
		return func() error {
			_, err := srv.Invoke(ctx, req)
			return err
		}
	}
	fmt.Fprintf(w, "# 1b. table server level, in process: Server.Invoke (nop, 1 key) vs Server.Get of a 100-byte value\n")
	getReq := &api.GetRequest{Header: hdr, Key: pointKey}
	lats, err := cpRounds(cfg.rounds, cfg.calls, []cpWorkload{
		{"invoke_nop", invoke("nop", [][]byte{pointKey})},
		{"get", func() error {
			resp, err := srv.Get(ctx, getReq)
			if err == nil && !resp.GetFound() {
				err = errors.New("point key not found")
			}
			return err
		}},
	})
	if err != nil {
		return err
	}
	lats.raw(w, "coproc_server", "invoke_nop", "get")
	for _, n := range []string{"invoke_nop", "get"} {
		fmt.Fprintf(w, "figure coproc_server_%s_p50 %.2f us\n", n, cpUs(lats.p50(n)))
		fmt.Fprintf(w, "figure coproc_server_%s_p99 %.2f us\n", n, cpUs(lats.p99(n)))
	}
	fmt.Fprintf(w, "figure coproc_server_invoke_minus_get_p50 %.2f us\n", cpUs(lats.p50("invoke_nop")-lats.p50("get")))
	fmt.Fprintf(w, "ratio invoke/get server_point_p50 %.2f\n", lats.p50("invoke_nop")/lats.p50("get"))
	fmt.Fprintf(w, "ratio invoke/get server_point_p99 %.2f\n", lats.p99("invoke_nop")/lats.p99("get"))

	fmt.Fprintf(w, "# 1c. end to end over gRPC (loopback): client Table.Invoke (nop, 1 key) vs Table.Get of the same key\n")
	lats, err = cpRounds(cfg.rounds, cfg.rpcCalls, []cpWorkload{
		{"invoke_nop", func() error {
			_, err := tb.Invoke(ctx, name, "nop", client.Invocation{Keys: [][]byte{pointKey}})
			return err
		}},
		{"get", func() error {
			_, err := tb.Get(ctx, pointKey)
			return err
		}},
	})
	if err != nil {
		return err
	}
	lats.raw(w, "coproc_rpc", "invoke_nop", "get")
	for _, n := range []string{"invoke_nop", "get"} {
		fmt.Fprintf(w, "figure coproc_rpc_%s_p50 %.1f us\n", n, cpUs(lats.p50(n)))
		fmt.Fprintf(w, "figure coproc_rpc_%s_p99 %.1f us\n", n, cpUs(lats.p99(n)))
	}
	fmt.Fprintf(w, "ratio invoke/get rpc_point_p50 %.2f\n", lats.p50("invoke_nop")/lats.p50("get"))
	fmt.Fprintf(w, "ratio invoke/get rpc_point_p99 %.2f\n", lats.p99("invoke_nop")/lats.p99("get"))

	fmt.Fprintf(w, "# 2b. 32-key batch at table server level, in process: Server.Invoke with 32 keys of one partition (keys_only, batch, batch_multi) vs Server.BatchGet of the same keys\n")
	bgReq := &api.BatchGetRequest{Header: hdr, Keys: keys}
	lats, err = cpRounds(cfg.rounds, cfg.calls, []cpWorkload{
		{"keys_only", invoke("keys_only", keys)},
		{"batch", invoke("batch", keys)},
		{"batch_multi", invoke("batch_multi", keys)},
		{"batchget", func() error {
			_, err := srv.BatchGet(ctx, bgReq)
			return err
		}},
	})
	if err != nil {
		return err
	}
	lats.raw(w, "coproc_server_batch32", "keys_only", "batch", "batch_multi", "batchget")
	fmt.Fprintf(w, "figure coproc_server_batch32_getkeys_total %.1f ns/key\n", (lats.p50("batch")-lats.p50("keys_only"))/32)
	fmt.Fprintf(w, "figure coproc_server_batch32_getmulti_total %.1f ns/key\n", (lats.p50("batch_multi")-lats.p50("keys_only"))/32)
	fmt.Fprintf(w, "ratio invoke/batchget server_batch32_p50 %.2f\n", lats.p50("batch")/lats.p50("batchget"))

	if cfg.restarts == 0 {
		return nil
	}
	fmt.Fprintf(w, "# 3b. restart-to-ready at server level: KillServer, RestartServer (same data dir, warm compilation cache), until an in-process Invoke succeeds\n")
	var total, afterOpen []float64
	for range cfg.restarts {
		if err := tc.KillServer(0); err != nil {
			return err
		}
		t0 := time.Now()
		if err := tc.RestartServer(ctx, 0); err != nil {
			return err
		}
		t1 := time.Now()
		if err := coprocWaitInvoke(ctx, tc.Server(0).Handler(), routes, name, pointKey); err != nil {
			return err
		}
		total = append(total, float64(time.Since(t0).Microseconds())/1000)
		afterOpen = append(afterOpen, float64(time.Since(t1).Microseconds())/1000)
	}
	fmt.Fprintf(w, "raw coproc_restart_to_invoke_ms %v\n", total)
	fmt.Fprintf(w, "figure coproc_server_restart_to_ready %.0f ms (RestartServer call to the first successful Invoke, median of %d)\n", cpMedian(total), len(total))
	fmt.Fprintf(w, "figure coproc_server_registered_to_ready %.0f ms (RestartServer's return to the first successful Invoke)\n", cpMedian(afterOpen))
	return nil
}

// invoker is the in-process Invoke handler of a table server.
type invoker interface {
	Invoke(context.Context, *api.InvokeRequest) (*api.InvokeResponse, error)
}

// coprocWaitInvoke polls Invoke nop on key until it succeeds, refreshing
// the partition map after a failure (the epoch may have moved).
func coprocWaitInvoke(ctx context.Context, s invoker, t *coprocTable, name string, key []byte) error {
	deadline := time.Now().Add(30 * time.Second)
	var lastErr error
	for time.Now().Before(deadline) {
		hdr, _ := t.header(key)
		if hdr != nil {
			_, err := s.Invoke(ctx, &api.InvokeRequest{Header: hdr, Name: name, Method: "nop", Keys: [][]byte{key}})
			if err == nil {
				return nil
			}
			lastErr = err
		}
		time.Sleep(2 * time.Millisecond)
		if err := t.refresh(ctx); err != nil {
			lastErr = err
		}
	}
	return fmt.Errorf("no successful Invoke within 30 s: %w", lastErr)
}

// coprocCompile: Compile of the 2 MB module cold (empty cache dir) and
// from the cache (a new Runtime on the same dir, as a restarted server),
// and starting one more instance.
func coprocCompile(ctx context.Context, w io.Writer, cfg coprocConfig, wasm []byte, dir string) error {
	fmt.Fprintf(w, "# 3a. compile of examples/score_candidates (%d bytes): cold (new Runtime, empty CacheDir) vs cached (new Runtime on the same CacheDir: a restarted server); Compile includes starting one instance\n", len(wasm))
	key := coproc.ModuleKey{Tenant: "bench", Table: "bench", Name: "score", Version: 1}
	var cold, cached, newRT, inst []float64
	const extraInstances = 5
	for r := range cfg.compileRounds {
		cache := filepath.Join(dir, fmt.Sprintf("cache-%d", r))
		rt, err := coproc.New(ctx, coproc.Options{CacheDir: cache, PoolSize: 1 + extraInstances})
		if err != nil {
			return err
		}
		t0 := time.Now()
		_, err = rt.Compile(ctx, key, wasm)
		cold = append(cold, float64(time.Since(t0).Microseconds())/1000)
		if err != nil {
			return errors.Join(err, rt.Close(ctx))
		}
		for i := range extraInstances {
			t0 := time.Now()
			n, err := rt.Warm(ctx, key, 2+i)
			d := time.Since(t0)
			if err == nil && n != 1 {
				err = fmt.Errorf("warm started %d instances, want 1", n)
			}
			if err != nil {
				return errors.Join(err, rt.Close(ctx))
			}
			inst = append(inst, float64(d.Microseconds())/1000)
		}
		if err := rt.Close(ctx); err != nil {
			return err
		}

		t0 = time.Now()
		rt, err = coproc.New(ctx, coproc.Options{CacheDir: cache})
		newRT = append(newRT, float64(time.Since(t0).Microseconds())/1000)
		if err != nil {
			return err
		}
		t0 = time.Now()
		_, err = rt.Compile(ctx, key, wasm)
		cached = append(cached, float64(time.Since(t0).Microseconds())/1000)
		if err := errors.Join(err, rt.Close(ctx)); err != nil {
			return err
		}
		if err := os.RemoveAll(cache); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "raw coproc_compile_cold_ms %v\n", cold)
	fmt.Fprintf(w, "raw coproc_compile_cached_ms %v\n", cached)
	fmt.Fprintf(w, "figure coproc_module_size %d bytes\n", len(wasm))
	fmt.Fprintf(w, "figure coproc_compile_cold %.0f ms\n", cpMedian(cold))
	fmt.Fprintf(w, "figure coproc_compile_cached %.1f ms (restart-to-ready per version)\n", cpMedian(cached))
	fmt.Fprintf(w, "figure coproc_runtime_new %.1f ms (coproc.New with a populated CacheDir)\n", cpMedian(newRT))
	fmt.Fprintf(w, "figure coproc_instance_start %.2f ms (Warm starting one more instance; median of %d)\n", cpMedian(inst), len(inst))
	return nil
}

// coprocDeploy: DeployCoprocBytes to WaitCoprocLive of the 2 MB module on
// a fresh cluster (every server's compilation cache empty).
func coprocDeploy(ctx context.Context, w io.Writer, cfg coprocConfig, wasm []byte, dir string) error {
	fmt.Fprintf(w, "# 4. deploy-to-ready of examples/score_candidates (%d bytes): DeployCoprocBytes to WaitCoprocLive on a fresh %d-server cluster (cold caches), point table of %d partitions\n", len(wasm), cfg.deployServers, 2*cfg.deployServers)
	var took []float64
	for r := range cfg.deployRounds {
		d, hosts, err := coprocDeployOnce(ctx, cfg.deployServers, wasm, filepath.Join(dir, fmt.Sprintf("cluster-%d", r)))
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "# deploy round %d: %d of %d servers host the table (each compiles the module)\n", r, hosts, cfg.deployServers)
		took = append(took, float64(d.Microseconds())/1000)
	}
	fmt.Fprintf(w, "raw coproc_deploy_to_ready_ms %v\n", took)
	fmt.Fprintf(w, "figure coproc_deploy_to_ready %.0f ms\n", cpMedian(took))
	return nil
}

func coprocDeployOnce(ctx context.Context, servers int, wasm []byte, dir string) (_ time.Duration, hosts int, err error) {
	tc, err := testcluster.Start(ctx, testcluster.Options{Servers: servers, Dir: dir})
	if err != nil {
		return 0, 0, err
	}
	defer func() { err = errors.Join(err, tc.Close(), os.RemoveAll(dir)) }()
	c, err := client.New(ctx, client.Options{Credential: tc.Credential(), Masters: []string{tc.MasterAddr()}, Seed: 1})
	if err != nil {
		return 0, 0, err
	}
	defer func() { err = errors.Join(err, c.Close()) }()
	const table = "deploy"
	if _, err := c.CreateTable(ctx, table, api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: uint32(2 * servers)}); err != nil {
		return 0, 0, err
	}
	tb := c.Table(table)
	if err := tb.Put(ctx, []byte("warm"), []byte("x")); err != nil {
		return 0, 0, err
	}
	conn, err := grpc.NewClient(tc.MasterAddr(), append(tc.Credential().DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		return 0, 0, err
	}
	defer func() { err = errors.Join(err, conn.Close()) }()
	routes := &coprocTable{mc: api.NewMasterClient(conn), table: table}
	if err := routes.refresh(ctx); err != nil {
		return 0, 0, err
	}
	ids := map[string]bool{}
	for _, p := range routes.parts {
		for _, r := range p.GetReplicas() {
			ids[r.GetServerId()] = true
		}
	}

	t0 := time.Now()
	v, err := tb.DeployCoprocBytes(ctx, "score", wasm)
	if err != nil {
		return 0, 0, err
	}
	if err := tb.WaitCoprocLive(ctx, "score", v); err != nil {
		return 0, 0, err
	}
	return time.Since(t0), len(ids), nil
}
