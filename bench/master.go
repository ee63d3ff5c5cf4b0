package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/replication/stream/streampb"
)

func init() {
	register(suite{
		name: "master",
		about: "three raft masters under kill -9s of the leader (time to CreateTable and to leases, failed writes), proposals/s; " +
			"then a tabula master process under a simulated cluster (default 1,000 servers x 100 partitions) heartbeating over real gRPC: " +
			"the master's CPU and the time from a map change to its arrival at every watching server",
		run: runMaster,
	})
}

// msConfig is the master suite's flags.
type msConfig struct {
	servers, perServer, partsPerTable int
	watchers, conns, changes          int
	masterDebug                       string
	settle, window                    time.Duration
	heartbeat, lease, deadAfter       time.Duration
	dir, tabulaBin                    string
	seed                              uint64
	deltas                            bool
}

// The master suite runs `tabula master` as a process and, in this process,
// a simulated cluster:
//
//   - -servers table servers register (each its own fault domain) and
//     heartbeat at the interval the master gives them, each reporting one
//     ReplicaStatus per partition it hosts, over -conns shared gRPC
//     connections;
//   - every server is an extent node too: they share one in-process extent
//     node service that answers the master's inventory calls (Stat) with a
//     disk usage that changes every call, as a live node's does;
//   - -watchers of them watch the whole partition map (WatchPartitionMap,
//     as every table server does, asking for deltas unless -deltas=false).
//     A watcher reads each message whole but decodes only its version, so
//     the simulation's CPU stays small;
//   - bulk tables of -parts-per-table partitions, one replica each (they
//     need no commit-log extents, which simulated servers cannot host),
//     give every server -per-server partitions.
//
// After -settle, for -window the master's CPU is read from /proc (utime +
// stime), first with heartbeats only, then while -changes CreateTables are
// made one after another (1 partition each): the time from the call to the
// arrival of its version at the last watcher is one sample.
func runMaster(out io.Writer, args []string) (err error) {
	fs := flag.NewFlagSet("master", flag.ContinueOnError)
	var cfg msConfig
	fs.IntVar(&cfg.servers, "servers", 1000, "simulated table servers")
	fs.IntVar(&cfg.perServer, "per-server", 100, "partitions hosted by each server (the cluster holds at most 100,000)")
	fs.IntVar(&cfg.partsPerTable, "parts-per-table", 100, "partitions of each table")
	fs.IntVar(&cfg.watchers, "watchers", -1, "servers that watch the map (-1: every server)")
	fs.IntVar(&cfg.conns, "conns", 16, "gRPC connections the simulated servers share")
	fs.IntVar(&cfg.changes, "changes", 20, "map changes (CreateTable) measured")
	fs.StringVar(&cfg.masterDebug, "master-debug-listen", "", "scale: serve the master's /debug/pprof/ on this address, to profile it during the run")
	fs.DurationVar(&cfg.settle, "settle", 10*time.Second, "heartbeating before the measurements")
	fs.DurationVar(&cfg.window, "window", 10*time.Second, "length of the heartbeats-only CPU measurement")
	fs.DurationVar(&cfg.heartbeat, "heartbeat-interval", 0, "the master's --heartbeat-interval (0: its default)")
	fs.DurationVar(&cfg.lease, "lease", 0, "the master's --lease (0: its default)")
	fs.DurationVar(&cfg.deadAfter, "dead-after", 0, "the master's --dead-after (0: its default; with a longer -heartbeat-interval, raise it and -lease)")
	fs.StringVar(&cfg.dir, "dir", "", "directory for data and logs (default: a new temp dir, removed after a successful run)")
	fs.StringVar(&cfg.tabulaBin, "tabula-bin", "", "tabula binary to run (default: built from this checkout)")
	fs.Uint64Var(&cfg.seed, "seed", rand.Uint64(), "random seed (heartbeat phases)")
	sections := fs.String("sections", "failover,scale", "sections to run: failover (3 raft masters, kill -9s of the leader), scale (the simulated cluster)")
	var fc mfConfig
	fs.IntVar(&fc.kills, "kills", 20, "failover: kill -9s of the leader")
	fs.DurationVar(&fc.proposalTime, "proposal-time", 5*time.Second, "failover: how long proposals per second are measured")
	fs.BoolVar(&cfg.deltas, "deltas", true, "watchers ask for deltas after the first full map, as table servers do (false: a full map per version)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	secs := clSet(*sections)
	for s := range secs {
		if s != "failover" && s != "scale" {
			return fmt.Errorf("unknown section %q (want failover, scale)", s)
		}
	}
	if cfg.watchers < 0 || cfg.watchers > cfg.servers {
		cfg.watchers = cfg.servers
	}
	if cfg.servers < 1 || cfg.perServer < 1 || cfg.partsPerTable < 1 || cfg.conns < 1 || cfg.changes < 1 {
		return errors.New("-servers, -per-server, -parts-per-table, -conns and -changes must be ≥ 1")
	}
	dir, keep, err := suiteDir("master", cfg.dir)
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

	bin, err := msTabulaBin(ctx, dir, cfg.tabulaBin)
	if err != nil {
		return err
	}
	if secs["failover"] {
		if err := runMasterFailover(ctx, out, bin, fc, cfg.seed); err != nil {
			return fmt.Errorf("master failover: %w", err)
		}
	}
	if !secs["scale"] {
		return nil
	}
	node, err := msStartNode()
	if err != nil {
		return err
	}
	defer node.stop()
	addrs, err := clFreeAddrs(1)
	if err != nil {
		return err
	}
	margs := []string{"master", "--listen", addrs[0], "--data", filepath.Join(dir, "master")}
	if cfg.masterDebug != "" {
		margs = append(margs, "--debug-listen", cfg.masterDebug)
	}
	if cfg.heartbeat > 0 {
		margs = append(margs, "--heartbeat-interval", cfg.heartbeat.String())
	}
	if cfg.lease > 0 {
		margs = append(margs, "--lease", cfg.lease.String())
	}
	if cfg.deadAfter > 0 {
		margs = append(margs, "--dead-after", cfg.deadAfter.String())
	}
	master, err := procs.start("tabula-master", bin, margs...)
	if err != nil {
		return err
	}
	if err := master.waitLog(ctx, "master serving", 20*time.Second); err != nil {
		return err
	}
	master.mu.Lock()
	pid := master.cmd.Process.Pid
	master.mu.Unlock()

	conns := make([]*grpc.ClientConn, cfg.conns)
	for i := range conns {
		// The simulated servers sign with the cluster credential, as
		// table servers do.
		dopts := append(benchCred.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(api.MaxMessageBytes)))
		if conns[i], err = grpc.NewClient(addrs[0], dopts...); err != nil {
			return err
		}
		defer conns[i].Close()
	}
	mc := func(i int) api.MasterClient { return api.NewMasterClient(conns[i%len(conns)]) }

	fmt.Fprintf(out, "# master: tabula master process; %d simulated servers (%d watching the map, deltas %v) on %d gRPC connections, %d partitions each in bulk tables of %d (1 replica); GOMAXPROCS %d of this process; dir %s; seed %d\n",
		cfg.servers, cfg.watchers, cfg.deltas, cfg.conns, cfg.perServer, cfg.partsPerTable, runtime.GOMAXPROCS(0), dir, cfg.seed)

	// Register the servers.
	t0 := time.Now()
	sims := make([]*msSim, cfg.servers)
	var interval time.Duration
	if err := msParallel(ctx, cfg.servers, 32, func(i int) error {
		s := &msSim{id: fmt.Sprintf("sim-%d", i), mc: mc(i)}
		resp, err := s.mc.RegisterServer(ctx, &api.RegisterServerRequest{ServerId: s.id, Addr: node.addr, Incarnation: uint64(i + 1)})
		if err != nil {
			return fmt.Errorf("register %s: %w", s.id, err)
		}
		sims[i] = s
		if i == 0 {
			interval = time.Duration(resp.HeartbeatIntervalMs) * time.Millisecond
		}
		return nil
	}); err != nil {
		return err
	}
	// Heartbeats start at once: a registered server that stays silent is
	// declared dead.
	hbCtx, hbStop := context.WithCancel(ctx)
	defer hbStop()
	var hbWG sync.WaitGroup
	defer hbWG.Wait()
	defer hbStop()
	var hb msHeartbeats
	r := rand.New(rand.NewPCG(cfg.seed, 7))
	for _, s := range sims {
		phase := time.Duration(r.Int64N(int64(interval)))
		hbWG.Add(1)
		go func() {
			defer hbWG.Done()
			s.heartbeat(hbCtx, interval, phase, &hb)
		}()
	}
	fmt.Fprintf(out, "# registered %d servers in %v; heartbeat interval %v\n", cfg.servers, time.Since(t0).Round(time.Millisecond), interval)

	// The tables.
	total := min(cfg.servers*cfg.perServer, api.MaxClusterPartitions-cfg.changes)
	tables := total / cfg.partsPerTable
	t0 = time.Now()
	if err := msParallel(ctx, tables, 4, func(i int) error {
		_, err := mc(i).CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: fmt.Sprintf("t%d", i), Kind: api.TableKind_TABLE_KIND_BULK,
			Options: &api.TableOptions{Partitions: uint32(cfg.partsPerTable), Replication: 1}})
		return err
	}); err != nil {
		return fmt.Errorf("create tables: %w", err)
	}
	fmt.Fprintf(out, "# created %d tables (%d partitions) in %v\n", tables, tables*cfg.partsPerTable, time.Since(t0).Round(time.Millisecond))
	// Every server reports its partitions from now on.
	byID := map[string]*msSim{}
	for _, s := range sims {
		byID[s.id] = s
	}
	for i := range tables {
		resp, err := mc(i).GetPartitionMap(ctx, &api.GetPartitionMapRequest{Tenant: api.DefaultTenant, Table: fmt.Sprintf("t%d", i)})
		if err != nil {
			return err
		}
		for _, p := range resp.Map.Partitions {
			for _, rp := range p.Replicas {
				if s := byID[rp.ServerId]; s != nil {
					s.addStatus(&api.ReplicaStatus{PartitionId: p.Id, Epoch: p.Epoch, Role: rp.Role, Keys: 1000, Bytes: 100000})
				}
			}
		}
	}

	// The watchers.
	ws := make([]*msWatcher, cfg.watchers)
	wCtx, wStop := context.WithCancel(ctx)
	defer wStop()
	var wWG sync.WaitGroup
	defer wWG.Wait()
	defer wStop()
	for i := range ws {
		ws[i] = &msWatcher{changed: make(chan struct{}, 1), deltas: cfg.deltas}
		wWG.Add(1)
		go func() {
			defer wWG.Done()
			ws[i].run(wCtx, conns[i%len(conns)])
		}()
	}

	// Settle, then heartbeats only.
	if err := clSleep(ctx, cfg.settle); err != nil {
		return err
	}
	hb.reset()
	cpu0, wall0, err := msCPU(pid)
	if err != nil {
		return err
	}
	if err := clSleep(ctx, cfg.window); err != nil {
		return err
	}
	cpu1, wall1, err := msCPU(pid)
	if err != nil {
		return err
	}
	idleCores := (cpu1 - cpu0).Seconds() / wall1.Sub(wall0).Seconds()
	hbRate, hbP99, hbErrs := hb.summary(wall1.Sub(wall0))

	// Map changes.
	var lat []time.Duration
	for i := range cfg.changes {
		start := time.Now()
		resp, err := mc(i).CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: fmt.Sprintf("probe%d", i), Kind: api.TableKind_TABLE_KIND_BULK,
			Options: &api.TableOptions{Partitions: 1, Replication: 1}})
		if err != nil {
			return fmt.Errorf("map change %d: %w", i, err)
		}
		v := resp.Map.Version
		var last time.Duration
		for _, w := range ws {
			at, err := w.await(ctx, v, time.Minute)
			if err != nil {
				return fmt.Errorf("map change %d (version %d): %w", i, v, err)
			}
			last = max(last, at.Sub(start))
		}
		lat = append(lat, last)
	}
	cpu2, wall2, err := msCPU(pid)
	if err != nil {
		return err
	}
	changeCores := (cpu2 - cpu1).Seconds() / wall2.Sub(wall1).Seconds()
	var reconnects int64
	for _, w := range ws {
		reconnects += w.reconnects.Load()
	}
	fmt.Fprintf(out, "# heartbeats: %.0f/s answered, p99 %.1f ms, %d failed or told to re-register; watch streams reopened %d times\n", hbRate, hbP99, hbErrs, reconnects)
	fmt.Fprintf(out, "figure master-cpu-heartbeats %.3f cores\n", idleCores)
	fmt.Fprintf(out, "figure master-cpu-changes %.3f cores\n", changeCores)
	fmt.Fprintf(out, "figure master-heartbeat-p99 %.1f ms\n", hbP99)
	fmt.Fprintf(out, "figure master-map-change-p50 %.1f ms\n", msPct(lat, 0.5))
	fmt.Fprintf(out, "figure master-map-change-p99 %.1f ms\n", msPct(lat, 0.99))
	fmt.Fprintf(out, "# targets (issue 14): master ≤1 core, map change to every server ≤200 ms p99\n")
	return nil
}

// msSim is one simulated table server.
type msSim struct {
	id string
	mc api.MasterClient
	mu sync.Mutex
	st []*api.ReplicaStatus // what it reports
}

func (s *msSim) addStatus(r *api.ReplicaStatus) {
	s.mu.Lock()
	s.st = append(s.st, r)
	s.mu.Unlock()
}

// heartbeat sends a heartbeat every interval (starting after phase) until
// ctx ends, re-registering when told to.
func (s *msSim) heartbeat(ctx context.Context, interval, phase time.Duration, hb *msHeartbeats) {
	if clSleep(ctx, phase) != nil {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for beat := 0; ; beat++ {
		s.mu.Lock()
		// As table servers do: the replicas' statuses in full every 5th
		// heartbeat, the others only renew the lease.
		req := &api.HeartbeatRequest{ServerId: s.id, Replicas: s.st}
		if beat%5 != 0 {
			req.Replicas, req.ReplicasOmitted = nil, true
		}
		s.mu.Unlock()
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := s.mc.Heartbeat(cctx, req)
		cancel()
		if ctx.Err() != nil {
			return
		}
		hb.record(time.Since(start), err != nil || resp.Reregister)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// msHeartbeats collects heartbeat round trips.
type msHeartbeats struct {
	mu   sync.Mutex
	lat  []time.Duration
	errs int
}

func (h *msHeartbeats) record(d time.Duration, failed bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lat = append(h.lat, d)
	if failed {
		h.errs++
	}
}

func (h *msHeartbeats) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lat, h.errs = nil, 0
}

func (h *msHeartbeats) summary(d time.Duration) (perSec, p99ms float64, errs int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return float64(len(h.lat)) / d.Seconds(), msPct(h.lat, 0.99), h.errs
}

// msWatcher watches the whole map as a table server does, recording when
// each version arrived.
type msWatcher struct {
	mu         sync.Mutex
	version    uint64
	arrivals   []msArrival
	changed    chan struct{}
	reconnects atomic.Int64
	deltas     bool // ask for deltas
}

type msArrival struct {
	version uint64
	at      time.Time
}

var msWatchDesc = &grpc.StreamDesc{StreamName: "WatchPartitionMap", ServerStreams: true}

func (w *msWatcher) run(ctx context.Context, cc *grpc.ClientConn) {
	for ctx.Err() == nil {
		w.mu.Lock()
		after := w.version
		w.mu.Unlock()
		st, err := cc.NewStream(ctx, msWatchDesc, api.Master_WatchPartitionMap_FullMethodName, grpc.ForceCodecV2(msVersionCodec{}))
		if err == nil {
			err = st.SendMsg(&api.WatchPartitionMapRequest{AfterVersion: after, Deltas: w.deltas})
		}
		if err == nil {
			err = st.CloseSend()
		}
		for err == nil {
			var m msVersionOnly
			if err = st.RecvMsg(&m); err != nil {
				break
			}
			now := time.Now()
			w.mu.Lock()
			w.version = m.version
			w.arrivals = append(w.arrivals, msArrival{m.version, now})
			w.mu.Unlock()
			select {
			case w.changed <- struct{}{}:
			default:
			}
		}
		if ctx.Err() != nil {
			return
		}
		w.reconnects.Add(1)
		if clSleep(ctx, 100*time.Millisecond) != nil {
			return
		}
	}
}

// await returns when version v (or a later one) arrived.
func (w *msWatcher) await(ctx context.Context, v uint64, d time.Duration) (time.Time, error) {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		for _, a := range w.arrivals {
			if a.version >= v {
				w.mu.Unlock()
				return a.at, nil
			}
		}
		w.mu.Unlock()
		select {
		case <-w.changed:
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-deadline.C:
			return time.Time{}, fmt.Errorf("a watcher did not receive it within %v", d)
		}
	}
}

// msVersionOnly is a WatchPartitionMapResponse of which only the version
// (field 1) is decoded.
type msVersionOnly struct{ version uint64 }

// msVersionCodec encodes requests as protobuf and decodes responses into
// msVersionOnly.
type msVersionCodec struct{}

func (msVersionCodec) Name() string { return "proto" }

func (msVersionCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, err := proto.Marshal(v.(proto.Message))
	if err != nil {
		return nil, err
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

func (msVersionCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m := v.(*msVersionOnly)
	b := data.Materialize()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			x, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			m.version = x
			return nil
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
	}
	return nil
}

// msNode is the extent node service every simulated server names as its
// address: it answers the master's inventory calls with no extents and a
// disk usage that grows, as a live node's does.
type msNode struct {
	streampb.UnimplementedExtentNodeServer
	addr string
	srv  *grpc.Server
	used atomic.Int64
}

func msStartNode() (*msNode, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	n := &msNode{addr: lis.Addr().String(), srv: grpc.NewServer()}
	streampb.RegisterExtentNodeServer(n.srv, n)
	go func() { _ = n.srv.Serve(lis) }()
	return n, nil
}

func (n *msNode) stop() { n.srv.Stop() }

func (n *msNode) Stat(context.Context, *streampb.StatRequest) (*streampb.StatResponse, error) {
	return &streampb.StatResponse{UsedBytes: n.used.Add(4096)}, nil
}

// msCPU returns the user+system CPU time of process pid and when it was
// read.
func msCPU(pid int) (time.Duration, time.Time, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	now := time.Now()
	if err != nil {
		return 0, now, err
	}
	// The command name (field 2) may hold spaces: count from the ')'.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, now, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64) // field 14, utime
	st, err2 := strconv.ParseInt(f[12], 10, 64) // field 15, stime
	if err := errors.Join(err1, err2); err != nil {
		return 0, now, err
	}
	const hz = 100 // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / hz, now, nil
}

// msParallel runs fn(0..n-1) on k goroutines; the first error stops it.
func msParallel(ctx context.Context, n, k int, fn func(i int) error) error {
	var next atomic.Int64
	errs := make(chan error, k)
	for range k {
		go func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					errs <- ctx.Err()
					return
				}
				if err := fn(i); err != nil {
					next.Store(int64(n))
					errs <- err
					return
				}
			}
		}()
	}
	var err error
	for range k {
		err = errors.Join(err, <-errs)
	}
	return err
}

// msTabulaBin returns bin, or builds the tabula binary of this checkout
// into dir.
func msTabulaBin(ctx context.Context, dir, bin string) (string, error) {
	if bin != "" {
		return bin, nil
	}
	bin = filepath.Join(dir, "tabula")
	root, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/tabuladb/tabula").Output()
	if err != nil {
		return "", fmt.Errorf("find the product module: %w", err)
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/tabula")
	cmd.Dir = strings.TrimSpace(string(root))
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build tabula: %w\n%s", err, b)
	}
	return bin, nil
}

// msPct is percentile p (0-1) of ds in milliseconds (0 for none).
func msPct(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	return percentile(ds, p) / 1e6
}
