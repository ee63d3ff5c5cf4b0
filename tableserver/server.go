package tableserver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/coproc"
	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/internal/auth"
	"github.com/tabuladb/tabula/internal/dirlock"
	"github.com/tabuladb/tabula/internal/tlsfiles"
	"github.com/tabuladb/tabula/replication/stream"
)

// Server is a table server: its registration, lease and map watch, the
// partitions it hosts (hosting.go; a replicated partition's life is a
// logReplica) and its extent node. Its RPC surface is service. Safe for
// concurrent use.
type Server struct {
	opts Options
	log  *slog.Logger
	// mergeMu guards merges: the merges whose parents' replicas here
	// applied their records, by child id (merge.go).
	mergeMu sync.Mutex
	merges  map[uint64]*mergeJob
	// keys checks incoming signatures (nil when authentication is off);
	// streamConns dial extent nodes, signed with the cluster credential.
	keys        *keyring
	streamConns *stream.Conns
	start       time.Time // origin of the monotonic clock the lease is kept on

	serverID atomic.Pointer[string]
	hosting  atomic.Pointer[hosting]
	// lease is the master's lease and the map version it was renewed on,
	// on the clock now reads (lease.go).
	lease    Lease
	beatNS   atomic.Int64
	inflight atomic.Int64
	// internalInflight counts cluster calls (internalCall) in flight.
	internalInflight atomic.Int64
	draining         atomic.Bool
	// drainStarted is closed when a drain starts: Calls streams ask
	// their clients to end them.
	drainStarted chan struct{}
	// callChain runs each call of a Calls stream as a unary call of its
	// kind runs after the signature check: the Options' interceptors,
	// then admission.
	callChain grpc.UnaryServerInterceptor
	advertise atomic.Pointer[string]
	// swept: the stale partition data was swept (sweep.go), once per
	// process.
	swept atomic.Bool
	// Heartbeat bookkeeping, guarded by beatMu: beats sent, the hosting
	// version and master of the last full status report, and whether the
	// last beat was answered.
	beatMu          sync.Mutex
	beats           int
	reportedVersion uint64
	reportedMaster  int32
	lastBeatOK      bool

	lock *dirlock.Lock
	// extents is the server's extent node of the stream layer, served on
	// the same gRPC server.
	extents *stream.Node
	// cp runs the coprocessors of hosted tables.
	cp *coprocs
	// streams reads bulk files from their streams (bulkfetch.go);
	// fetchKick asks the bulk fetcher for a round.
	streams   *stream.Client
	fetchKick chan struct{}
	// repair throttles copies into new replicas (Options.RepairBandwidth).
	repair *rate.Limiter
	// cacheBudget is the read cache every disk-backed partition shares
	// (Options.ReadCacheBytes).
	cacheBudget *engines.CacheBudget
	// limits are the request size limits and byte budget (limits.go).
	limits *serverLimits
	quota  *quotas // tenants' quotas and partitions' limits (quota.go)

	masters []*grpc.ClientConn
	// masterInternal[i] is master i's internal listener, once its answers
	// named one (nil: calls go to its client address).
	masterInternal []atomic.Pointer[masterConn]
	// masterIdx is the master tried first; moves on UNAVAILABLE.
	masterIdx atomic.Int32

	grpc *grpc.Server
	// internal serves Options.InternalListener (nil without one).
	internal          *grpc.Server
	internalAdvertise atomic.Pointer[string]
	ctx               context.Context
	cancel            context.CancelFunc
	wg                sync.WaitGroup // the heartbeat and watch loops

	closeOnce sync.Once
	closeErr  error
	// registered is closed once the first registration succeeded.
	registered chan struct{}

	metricsCollector prometheus.Collector // metrics.go: registered with Options.Metrics
}

// service is the TableServer RPC surface (service.go, writes.go,
// bulkservice.go, coproc.go): the request checks and the read and write
// paths over the Server's hosted replicas.
type service struct {
	api.UnimplementedTableServerServer
	*Server
}

var _ api.TableServerServer = (*service)(nil)

// Handler is the server's TableServer RPC surface, for in-process callers
// (benchmarks of the request path without the network). It checks every
// request as the gRPC service does.
func (s *Server) Handler() api.TableServerServer { return &service{Server: s} }

// Open prepares a server: checks options, creates the data directory and
// reads the stored identity. It does not contact the master; Serve does.
func Open(opts Options) (*Server, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	lock, err := dirlock.Acquire(opts.DataDir)
	if err != nil {
		return nil, fmt.Errorf("tableserver: %w", err)
	}
	id, err := loadIdentity(opts.DataDir)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("tableserver: %w", err), lock.Unlock())
	}
	budget, err := engines.NewCacheBudget(opts.ReadCacheBytes)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("tableserver: %w", err), lock.Unlock())
	}
	s := &Server{
		cacheBudget: budget,
		opts:        opts,
		log:         opts.Logger,
		start:       time.Now(),
		registered:  make(chan struct{}),
		lock:        lock,
		fetchKick:   make(chan struct{}, 1),
		repair:      newRepairLimiter(opts.RepairBandwidth),
		limits:      newServerLimits(opts),
		quota:       newQuotas(opts.PartitionOpsPerSec, opts.BusyRetryAfter, time.Now()),
	}
	s.serverID.Store(&id)
	s.hosting.Store(&hosting{replicas: map[uint64]*replica{}, failed: map[uint64]error{}, parts: map[uint64]*api.Partition{}, tables: map[string]*api.PartitionMap{}})
	s.lease.SetDuration(time.Second)
	s.beatNS.Store(int64(100 * time.Millisecond))
	for _, addr := range opts.Masters {
		cc, err := grpc.NewClient(addr, append([]grpc.DialOption{
			grpc.WithTransportCredentials(insecure.NewCredentials()), api.FastReconnect(), api.Keepalive(),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(api.MaxMessageBytes), grpc.MaxCallSendMsgSize(api.MaxMessageBytes)),
		}, s.dialOptions()...)...)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("tableserver: master address %q: %w", addr, err), s.closeMasters(), lock.Unlock())
		}
		s.masters = append(s.masters, cc)
	}
	s.masterInternal = make([]atomic.Pointer[masterConn], len(s.masters))
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.drainStarted = make(chan struct{})
	s.callChain = chainUnary(append(slices.Clone(opts.UnaryInterceptors), s.admitUnary))
	// Order: size guard (before decoding), signatures, then admission,
	// so callers that cannot sign never take a slot.
	grpcOpts := append(s.limits.serverOptions(opts),
		grpc.MaxSendMsgSize(api.MaxMessageBytes),
		api.ServerKeepalive(),
		// A pool of long-lived handler goroutines: a fresh goroutine per
		// call grows its stack again on every call (copying it several
		// times), which cost about a tenth of a Get's CPU.
		grpc.NumStreamWorkers(streamWorkers()),
		// Options' interceptors (metrics) run first, after the size
		// guard: they see every refusal below.
		grpc.ChainUnaryInterceptor(opts.UnaryInterceptors...),
		grpc.ChainStreamInterceptor(opts.StreamInterceptors...))
	grpcOpts = append(grpcOpts, s.authInterceptors()...)
	grpcOpts = append(grpcOpts, tlsfiles.ServerOption(opts.TLS)...)
	s.grpc = grpc.NewServer(append(slices.Clone(grpcOpts),
		grpc.ChainUnaryInterceptor(s.admitUnary),
		grpc.ChainStreamInterceptor(s.admitStream),
	)...)
	api.RegisterTableServerServer(s.grpc, &service{Server: s})
	if opts.InternalListener != nil {
		// The cluster's listener: the same services, the cluster
		// credential only (after the signature check), then admission.
		s.internal = grpc.NewServer(append(slices.Clone(grpcOpts),
			grpc.ChainUnaryInterceptor(s.clusterOnlyUnary, s.admitUnary),
			grpc.ChainStreamInterceptor(s.clusterOnlyStream, s.admitStream),
		)...)
		api.RegisterTableServerServer(s.internal, &service{Server: s})
	}
	s.streamConns = stream.NewConns(s.dialOptions()...)
	node, err := stream.OpenNode(stream.NodeOptions{
		Conns:         s.streamConns,
		Dir:           filepath.Join(opts.DataDir, "extents"),
		ScrubInterval: opts.ScrubInterval,
		// Partition logs: a secondary that does not answer within this
		// leaves the ack set (quorum) rather than stalling writes, and
		// rejoins once it answers again.
		ReplicateTimeout:    cmp.Or(opts.ReplicateTimeout, defaultReplicateTimeout),
		ReplicateTimeoutMax: opts.ReplicateTimeoutMax,
		ReplicateCalls:      opts.ReplicateCalls,
		OnCorrupt:           s.reportCorrupt,
		OnCorruptFragment: func(extent uint64, index int, cause error) {
			s.reportStream("fragment", &api.StreamRequest{Op: api.StreamOp_STREAM_OP_REPORT_CORRUPT_FRAGMENT, Extent: extent, Index: int32(index)}, cause)
		},
		Logger: opts.Logger.With("part", "extent-node"),
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("tableserver: open extent node: %w", err), s.closeMasters(), lock.Unlock())
	}
	s.extents = node
	node.Register(s.grpc)
	if s.internal != nil {
		node.Register(s.internal)
	}
	rt, err := coproc.New(context.Background(), coproc.Options{
		CacheDir:      opts.CoprocCacheDir,
		MaxDeadline:   opts.CoprocMaxDeadline,
		MaxInputBytes: api.MaxCoprocInputBytes,
		Logger:        opts.Logger.With("part", "coproc"),
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("tableserver: start the coprocessor runtime: %w", err), node.Close(), s.closeMasters(), lock.Unlock())
	}
	s.cp = &coprocs{rt: rt, state: map[coproc.ModuleKey]error{}}
	s.streams = stream.NewClient(masterStreams{s}, stream.ClientOptions{Logger: opts.Logger.With("part", "bulk-fetch"), Conns: s.streamConns})
	if err := s.registerMetrics(); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	return s, nil
}

func (s *Server) id() string { return *s.serverID.Load() }

// ID is the server's id, empty until its first registration.
func (s *Server) ID() string { return s.id() }

// Addr is the address the server advertises, empty before Serve.
func (s *Server) Addr() string {
	if a := s.advertise.Load(); a != nil {
		return *a
	}
	return ""
}

// InternalAddr is the address of the cluster's listener the server
// advertises (Options.InternalListener), empty without one or before Serve.
func (s *Server) InternalAddr() string {
	if a := s.internalAdvertise.Load(); a != nil {
		return *a
	}
	return ""
}

// clusterOnlyUnary and clusterOnlyStream keep the internal listener to the
// cluster credential (the signature is checked before them).
func (s *Server) clusterOnlyUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := s.clusterOnly(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (s *Server) clusterOnlyStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := s.clusterOnly(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return h(srv, ss)
}

func (s *Server) clusterOnly(ctx context.Context, method string) error {
	if s.opts.ClusterKey == nil {
		return nil // authentication off (in-process tests)
	}
	if p, ok := auth.FromContext(ctx); ok && p.IsCluster() {
		return nil
	}
	return api.Errorf(api.ErrorCode_ERROR_CODE_PERMISSION_DENIED, "internal_listener",
		"%s: server %s's internal listener serves the cluster credential only; clients call %s", method, s.id(), s.Addr())
}

// Serve registers with the master, starts heartbeating and watching the map,
// and serves gRPC on lis until Close or Drain. A master that cannot be reached
// is retried (with a log line), never fatal. It returns nil after Close.
func (s *Server) Serve(lis net.Listener) error {
	adv := s.opts.Advertise
	if adv == "" {
		adv = lis.Addr().String()
	}
	s.advertise.Store(&adv)
	if s.internal != nil {
		iadv := s.opts.InternalAdvertise
		if iadv == "" {
			iadv = s.opts.InternalListener.Addr().String()
		}
		s.internalAdvertise.Store(&iadv)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := s.internal.Serve(s.opts.InternalListener); err != nil && !errors.Is(err, grpc.ErrServerStopped) && s.ctx.Err() == nil {
				s.log.Error("the internal listener stopped", "addr", iadv, "err", err)
			}
		}()
	}
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		s.run()
	}()
	go s.bulkFetchLoop()
	err := s.grpc.Serve(lis)
	if errors.Is(err, grpc.ErrServerStopped) || s.ctx.Err() != nil {
		return nil
	}
	return err
}

// WaitRegistered blocks until the server has registered with the master.
func (s *Server) WaitRegistered(ctx context.Context) error {
	select {
	case <-s.registered:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run registers, then runs the heartbeat and watch loops until Close.
func (s *Server) run() {
	if !s.register() {
		return
	}
	close(s.registered)
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		s.watchLoop()
	}()
	go s.flushLoop()
	s.heartbeatLoop()
}

// withMaster calls fn with a master client, moving to the next master
// address when one is unreachable.
func (s *Server) withMaster(ctx context.Context, fn func(api.MasterClient) error) error {
	return s.withMasterEach(ctx, 0, func(_ context.Context, mc api.MasterClient) error { return fn(mc) })
}

// withMasterEach is withMaster giving each master at most per (0: the
// whole of ctx), so a master that hangs (stopped, or partitioned away)
// costs only that before the next is tried. A follower of a raft group
// that names its leader sends the next try there.
func (s *Server) withMasterEach(ctx context.Context, per time.Duration, fn func(context.Context, api.MasterClient) error) error {
	return s.withMasterAt(ctx, per, func(ctx context.Context, _ int, mc api.MasterClient) error { return fn(ctx, mc) })
}

// withMasterAt is withMasterEach telling fn which master it calls.
func (s *Server) withMasterAt(ctx context.Context, per time.Duration, fn func(context.Context, int, api.MasterClient) error) error {
	var err error
	for range s.masters {
		i := int(s.masterIdx.Load()) % len(s.masters)
		actx, cancel := ctx, context.CancelFunc(func() {})
		if per > 0 {
			actx, cancel = context.WithTimeout(ctx, per)
		}
		cc, internal := s.masters[i], s.masterInternal[i].Load()
		if internal != nil {
			cc = internal.cc
		}
		err = fn(actx, i, api.NewMasterClient(cc))
		cancel()
		if err != nil && internal != nil && unreachable(err) && ctx.Err() == nil {
			// The internal listener does not answer (the master
			// restarted elsewhere, or a firewall): back to the client
			// address, whose answers name the current one.
			s.forgetMasterInternal(i, internal)
		}
		if err == nil || api.CodeOf(err) != api.ErrorCode_ERROR_CODE_UNAVAILABLE || ctx.Err() != nil {
			return err
		}
		next := (i + 1) % len(s.masters)
		if leader := api.DetailOf(err).GetLeader(); leader != "" {
			for k, addr := range s.opts.Masters {
				if addr == leader {
					next = k
				}
			}
		}
		s.masterIdx.CompareAndSwap(int32(i), int32(next))
	}
	return err
}

// backoff sleeps the jittered, doubling delay for attempt n; false when the
// server is closing.
func (s *Server) backoff(n int) bool {
	d := 50 * time.Millisecond << min(n, 5) // 50ms .. 1.6s
	d = d/2 + rand.N(d/2+1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.ctx.Done():
		return false
	}
}

// register registers with the master, retrying until it succeeds or the
// server closes. It logs the first failure and then every few seconds.
func (s *Server) register() bool {
	var lastLog time.Time
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(s.ctx, 2*time.Second)
		sent := s.now()
		var resp *api.RegisterServerResponse
		err := s.withMasterAt(ctx, 0, func(ctx context.Context, i int, mc api.MasterClient) error {
			var err error
			defer func() {
				if err == nil {
					s.learnMasterInternal(i, resp.GetMasterInternalAddr())
				}
			}()
			resp, err = mc.RegisterServer(ctx, &api.RegisterServerRequest{
				ServerId:     s.id(),
				Addr:         s.Addr(),
				InternalAddr: s.InternalAddr(),
				FaultDomain:  s.opts.FaultDomain,
				Incarnation:  s.opts.Incarnation,

				BulkCapacityBytes: s.bulkCapacity(),
			})
			return err
		})
		cancel()
		if err == nil {
			id := resp.GetServerId()
			if id != s.id() {
				if err := storeIdentity(s.opts.DataDir, id); err != nil {
					s.log.Error("cannot persist server identity; retrying", "err", err)
					if !s.backoff(attempt) {
						return false
					}
					continue
				}
				s.serverID.Store(&id)
			}
			if ms := resp.GetHeartbeatIntervalMs(); ms > 0 {
				s.beatNS.Store(int64(time.Duration(ms) * time.Millisecond))
			}
			// Fence first: a server declared dead while it was away still
			// hosts partitions that were moved; it serves nothing until its
			// watch has delivered the map the master has now. An answered
			// registration is contact with the master, like an answered
			// heartbeat: the lease runs from when it was sent.
			s.lease.Renewed(sent, time.Duration(resp.GetLeaseMs())*time.Millisecond, resp.GetMapVersion())
			fd := s.opts.FaultDomain
			if fd == "" {
				fd = "(its own)"
			}
			s.log.Info("registered with master", "server_id", id, "addr", s.Addr(), "fault_domain", fd, "incarnation", s.opts.Incarnation)
			return true
		}
		if s.ctx.Err() != nil {
			return false
		}
		if time.Since(lastLog) > 5*time.Second {
			if d := api.DetailOf(err); d.GetReason() == "server_id_in_use" {
				// Another process holds this id (a restart before the
				// master noticed the old one died, or a copied data
				// directory): wait until it drains or its lease runs out.
				s.log.Warn("the master refuses this registration while another process holds the server id; retrying", "server_id", s.id(), "err", err)
			} else {
				s.log.Warn("cannot reach the master; retrying", "masters", s.opts.Masters, "err", err)
			}
			lastLog = time.Now()
		}
		if !s.backoff(attempt) {
			return false
		}
	}
}

func (s *Server) raiseMinMapVersion(v uint64) { s.lease.RaiseMinMapVersion(v) }

// now is the server's monotonic clock.
func (s *Server) now() time.Duration { return time.Since(s.start) }

func (s *Server) leaseValid() bool { return s.lease.Valid(s.now()) }

// heartbeatLoop reports status every heartbeat interval and renews the lease
// from each answered heartbeat.
func (s *Server) heartbeatLoop() {
	var lastLog time.Time
	for {
		t := time.NewTimer(time.Duration(s.beatNS.Load()))
		select {
		case <-s.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		sent := s.now()
		err := s.beat(false, false)
		if err == nil {
			s.lease.Renew(sent)
			continue
		}
		if errors.Is(err, errReregister) {
			s.log.Warn("master does not know this server; registering again")
			if !s.register() {
				return
			}
			continue
		}
		if s.ctx.Err() == nil && time.Since(lastLog) > 5*time.Second {
			s.log.Warn("heartbeat failed; lease runs out unless one succeeds", "err", err)
			lastLog = time.Now()
		}
	}
}

var errReregister = errors.New("tableserver: master asks to register again")

// fullStatusEvery: a heartbeat carries the replicas' statuses in full every
// this many beats (500 ms at the default 100 ms), and otherwise only
// renews the lease.
const fullStatusEvery = 5

// heartbeat reports every replica's status now (a bulk version loaded, a
// coprocessor ready, a drain) and renews the lease.
func (s *Server) heartbeat(draining bool) error { return s.beat(draining, true) }

// beat sends one heartbeat; with full false the replicas' statuses go only
// if due (fullStatusEvery, or something changed).
func (s *Server) beat(draining, full bool) (err error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.lease.Duration())
	defer cancel()
	h := s.hosting.Load()
	req := &api.HeartbeatRequest{
		ServerId:    s.id(),
		Draining:    draining,
		CoprocReady: s.coprocReady(h),
	}
	// Replica statuses go in full every fullStatusEvery heartbeats, and at
	// once after a map change, a failed heartbeat or a move to another
	// master (a new leader starts with none); the others only renew the
	// lease.
	master := s.masterIdx.Load()
	s.beatMu.Lock()
	full = full || s.beats%fullStatusEvery == 0 || h.version != s.reportedVersion || master != s.reportedMaster || !s.lastBeatOK || draining
	s.beats++
	s.beatMu.Unlock()
	// Written counters before the statuses: bytes written in between are
	// in both, which errs on the side of the quota.
	now := time.Now()
	s.quota.chargeCPU(s.cp.rt.TenantCPU(), now)
	req.TenantLoad = s.quota.load(now)
	if full {
		req.Replicas = h.status(s.id())
		req.MapVersion = h.version
		req.Capacity = s.capacity()
		s.quota.keepPartitions(func(id uint64) bool { return h.replicas[id] != nil })
	} else {
		req.ReplicasOmitted = true
	}
	defer func() {
		s.beatMu.Lock()
		defer s.beatMu.Unlock()
		s.lastBeatOK = err == nil
		if err == nil && full {
			s.reportedVersion, s.reportedMaster = h.version, s.masterIdx.Load()
		}
	}()
	// Each master gets a third of the lease: a stopped leader must not
	// use all of it.
	return s.withMasterAt(ctx, s.lease.Duration()/3, func(ctx context.Context, i int, mc api.MasterClient) error {
		resp, err := mc.Heartbeat(ctx, req)
		if err != nil {
			return err
		}
		s.learnMasterInternal(i, resp.GetMasterInternalAddr())
		if resp.GetReregister() {
			return errReregister
		}
		// The lease renews on the master's map: nothing is served from an
		// older one (a primary deposed while it was away learns it before
		// it serves again).
		s.lease.Answered(time.Duration(resp.GetLeaseMs())*time.Millisecond, resp.GetMapVersion())
		if s.keys != nil {
			s.keys.noteVersion(resp.GetTenantsVersion())
		}
		s.quota.apply(resp.GetTenantShares(), time.Now())
		return nil
	})
}

// watchLoop follows the cluster partition map and reconciles the hosted
// partitions. It asks for deltas (a full map first): a map change costs
// this server work and bytes in proportion to the change. A delta that
// does not start at the version held (a gap) reopens the watch for a full
// map.
func (s *Server) watchLoop() {
	full := false // the next watch asks for a full map
	for attempt := 0; s.ctx.Err() == nil; attempt++ {
		err := s.withMaster(s.ctx, func(mc api.MasterClient) error {
			after := s.hosting.Load().version
			if full {
				after = 0
			}
			stream, err := mc.WatchPartitionMap(s.ctx, &api.WatchPartitionMapRequest{AfterVersion: after, Deltas: true})
			if err != nil {
				return err
			}
			for {
				resp, err := stream.Recv()
				if err != nil {
					return err
				}
				attempt = 0
				full = false
				if err := s.apply(resp); err != nil {
					full = true
					return err
				}
			}
		})
		if s.ctx.Err() != nil {
			return
		}
		s.log.Debug("partition map watch broke; reconnecting", "err", err, "full_map", full)
		if full {
			continue // a gap: at once
		}
		if !s.backoff(attempt) {
			return
		}
	}
}

// apply applies a watch response: a full map newer than the one held, or
// a delta from the version held (api.ErrMapGap otherwise, and nothing
// changes). A full map at the version held is applied again (it follows
// a gap).
func (s *Server) apply(resp *api.WatchPartitionMapResponse) error {
	old := s.hosting.Load()
	if (!resp.GetDelta() && resp.GetVersion() < old.version) || (resp.GetDelta() && resp.GetVersion() <= old.version) {
		return nil
	}
	start := time.Now()
	h, gone, err := s.reconcile(old, resp)
	if err != nil {
		return err
	}
	s.hosting.Store(h)
	defer s.sweep(h) // after the partitions that left are closed below
	s.syncCoprocs(h)
	s.kickBulkFetch()
	if f := s.opts.OnMapApplied; f != nil {
		defer func() { f(resp.GetVersion(), time.Since(start)) }()
	}
	live := func(t *api.Table) bool { // the table is still in the map
		return h.tables[tableKey(t.GetTenant(), t.GetName())].GetTable().GetId() == t.GetId()
	}
	for _, r := range gone {
		id := r.part.GetId()
		if r.log != nil {
			r.log.close()
			r.log.closeKids()
			r.log.closeMerged()
		}
		if err := r.engine.Close(); err != nil {
			s.log.Error("close partition engine", "partition", id, "err", err)
		}
		switch {
		case !durable(r.table):
			s.log.Info("partition moved away or dropped; closed", "partition", id)
		case !live(r.table):
			s.log.Info("table dropped; deleting partition data", "partition", id)
			if err := s.removePartitionDir(id); err != nil {
				s.log.Error("delete dropped partition", "partition", id, "err", err)
			}
		case r.log != nil:
			// The engine's files are state derived from the partition's
			// commit log, whose extents the stream layer keeps: a replica
			// placed here again replays the log.
			s.log.Info("replica moved away; deleting its engine files (the log holds the data)", "partition", id)
			if err := s.removePartitionDir(id); err != nil {
				s.log.Error("delete a moved replica's files", "partition", id, "err", err)
			}
		case r.bulk != nil && bulkAllInStreams(h.tables[tableKey(r.table.GetTenant(), r.table.GetName())]):
			// Every version's files are in streams, where the new server
			// fetches them: this copy is not the only one.
			s.log.Info("bulk partition moved away; deleting its files (they are in streams)", "partition", id)
			if err := s.removePartitionDir(id); err != nil {
				s.log.Error("delete moved bulk partition", "partition", id, "err", err)
			}
		default:
			// Moved to another server: this copy is stale from now on.
			if err := s.orphan(id, r.part.GetEpoch(), "the partition moved to another server"); err != nil {
				s.log.Error("move aside a partition that moved away", "partition", id, "err", err)
			}
		}
	}
	return nil
}

// Drain shuts the server down cleanly: new requests are refused with
// UNAVAILABLE (so clients go elsewhere), the master is told to move the
// partitions now, in-flight requests finish (up to DrainTimeout), then the
// server closes.
func (s *Server) Drain() error {
	if s.draining.Swap(true) {
		return s.Close()
	}
	s.log.Info("draining")
	close(s.drainStarted)
	if s.id() != "" {
		if err := s.heartbeat(true); err != nil {
			s.log.Warn("could not tell the master about the drain; it will notice the silence", "err", err)
		}
	}
	// Other servers' replication streams into this one stay open while
	// they have batches to send: GracefulStop would wait them out.
	s.extents.StopReplicateStreams()
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		if s.internal != nil {
			s.internal.GracefulStop()
		}
		close(done)
	}()
	t := time.NewTimer(s.opts.DrainTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.log.Warn("drain timed out; stopping in-flight requests", "timeout", s.opts.DrainTimeout)
	}
	return s.Close()
}

// Close stops the server at once: gRPC, loops, engines. Idempotent.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.cancel()
		s.grpc.Stop()
		if s.internal != nil {
			s.internal.Stop()
		}
		s.wg.Wait()
		var errs []error
		for _, r := range s.hosting.Load().replicas {
			if r.log != nil {
				r.log.close()
			}
			if err := r.engine.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close partition %d: %w", r.part.GetId(), err))
			}
		}
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		errs = append(errs, s.cp.rt.Close(cctx))
		ccancel()
		errs = append(errs, s.streams.Close(), s.extents.Close(), s.streamConns.Close(), s.closeMasters(), s.lock.Unlock())
		s.closeErr = errors.Join(errs...)
		s.unregisterMetrics()
	})
	return s.closeErr
}

// reportCorrupt tells the stream manager that the scrubber found a
// replica corrupt, so it is rebuilt from a good one.
func (s *Server) reportCorrupt(extent uint64, cause error) {
	s.reportStream("replica", &api.StreamRequest{Op: api.StreamOp_STREAM_OP_REPORT_CORRUPT, Extent: extent}, cause)
}

// reportStream sends a corrupt replica or fragment report (req, with this
// node filled in) to the stream manager.
func (s *Server) reportStream(what string, req *api.StreamRequest, cause error) {
	s.log.Error("extent "+what+" corrupt; reporting it for repair", "extent", req.Extent, "index", req.Index, "err", cause)
	req.Node = s.id()
	ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
	defer cancel()
	err := s.withMaster(ctx, func(mc api.MasterClient) error {
		_, err := mc.Stream(ctx, req)
		return err
	})
	if err != nil {
		s.log.Warn("could not report a corrupt extent "+what+"; the master's inventory sync finds it", "extent", req.Extent, "err", err)
	}
}

func (s *Server) closeMasters() error {
	var errs []error
	for _, cc := range s.masters {
		errs = append(errs, cc.Close())
	}
	for i := range s.masterInternal {
		if c := s.masterInternal[i].Swap(nil); c != nil {
			errs = append(errs, c.cc.Close())
		}
	}
	return errors.Join(errs...)
}

// masterConn is a connection to a master's internal listener.
type masterConn struct {
	addr string
	cc   *grpc.ClientConn
}

// learnMasterInternal records master i's internal listener as its answer
// named it (addr; "": none): later calls to it go there.
func (s *Server) learnMasterInternal(i int, addr string) {
	cur := s.masterInternal[i].Load()
	if cur != nil && cur.addr == addr || cur == nil && addr == "" {
		return
	}
	var next *masterConn
	if addr != "" {
		cc, err := grpc.NewClient(addr, append([]grpc.DialOption{
			grpc.WithTransportCredentials(insecure.NewCredentials()), api.FastReconnect(), api.Keepalive(),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(api.MaxMessageBytes), grpc.MaxCallSendMsgSize(api.MaxMessageBytes)),
		}, s.dialOptions()...)...)
		if err != nil {
			s.log.Warn("master's internal listener address does not parse; calling its client address", "master", s.opts.Masters[i], "internal", addr, "err", err)
			return
		}
		next = &masterConn{addr: addr, cc: cc}
	}
	if !s.masterInternal[i].CompareAndSwap(cur, next) {
		if next != nil {
			_ = next.cc.Close()
		}
		return
	}
	if cur != nil {
		_ = cur.cc.Close()
	}
	if next != nil {
		s.log.Info("calling the master on its internal listener", "master", s.opts.Masters[i], "internal", addr)
	}
}

// forgetMasterInternal drops master i's internal connection c, which did
// not answer.
func (s *Server) forgetMasterInternal(i int, c *masterConn) {
	if s.masterInternal[i].CompareAndSwap(c, nil) {
		_ = c.cc.Close()
		s.log.Warn("the master's internal listener does not answer; calling its client address", "master", s.opts.Masters[i], "internal", c.addr)
	}
}

// unreachable reports whether err is gRPC failing to reach the peer or
// hearing nothing back in time: no Tabula error detail, so no server
// answered.
func unreachable(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	for _, d := range st.Details() {
		if _, ok := d.(*api.ErrorDetail); ok {
			return false
		}
	}
	return st.Code() == codes.Unavailable || st.Code() == codes.DeadlineExceeded
}

// streamWorkers is the size of the gRPC handler pool: calls past it get a
// goroutine of their own, as without a pool.
func streamWorkers() uint32 {
	return uint32(max(8, 4*runtime.GOMAXPROCS(0)))
}
