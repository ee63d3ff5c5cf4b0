package tablemaster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/auth"
	"github.com/tabuladb/tabula/internal/dirlock"
	"github.com/tabuladb/tabula/internal/tlsfiles"
	"github.com/tabuladb/tabula/replication/stream"
)

// Master is the Table Master: it owns the catalog and the partition map (a
// State, persisted in Options.DataDir), tracks server liveness from
// heartbeats, moves the partitions of dead or draining servers, and serves
// api.MasterServer. It is safe for concurrent use.
type Master struct {
	api.UnimplementedMasterServer

	// nextPlaceCheck is when the liveness check next looks for
	// partitions short of replicas (placeShortOnes), in wall-clock Unix
	// nanoseconds. Atomic: the liveness loop runs the check, and so may
	// a caller of checkLiveness (tests do).
	nextPlaceCheck atomic.Int64

	opts   Options
	adm    *admission // admission control (admission.go)
	quotas *quotaTracker
	logger *slog.Logger
	// streamConns dial extent nodes for the stream driver, signed with
	// the cluster credential.
	streamConns *stream.Conns
	lock        *dirlock.Lock // exclusive use of opts.DataDir

	// view is the latest published state. Readers load it without a lock;
	// a published State is never modified again.
	view atomic.Pointer[view]

	// proposeMu is the sequencer: it orders commands and their log appends
	// (the write-ahead order must equal the apply order). It is held across
	// the fsync of one command, on purpose; no read path takes it, and
	// catalog changes are rare (a few per second at most).
	proposeMu sync.Mutex
	// Guarded by proposeMu:
	store  *store // nil once closed
	seq    uint64 // seq of the last logged command
	broken error  // set when a log write failed: the file's tail is unknown, refuse further commands
	// snapJob is the snapshot cut and waiting for snapLoop; snapping is
	// set from the cut until its log trim is done (one at a time).
	snapJob  *snapJob
	snapping bool

	// liveMu guards liveness, which is memory only: heartbeats are not
	// persisted. Lock order: proposeMu, then liveMu.
	liveMu sync.Mutex
	live   map[string]*liveness // by server id

	// mergeMu guards mergeSeen: when the leader first saw a pending
	// merge's primary report both records (merge.go).
	mergeMu   sync.Mutex
	mergeSeen map[uint64]time.Time

	// handoffMu guards handoffs, the leader's clocks of the live
	// handoffs pending (handoff.go). Lock order: handoffMu, then liveMu.
	handoffMu sync.Mutex
	handoffs  handoffClocks

	// srvMu guards the gRPC servers Serve started.
	srvMu   sync.Mutex
	servers []*grpc.Server
	closed  bool

	// streamDriver runs the stream manager's I/O (seals, tasks); streamCtx
	// is cancelled by Close.
	streamDriver *stream.Driver
	streamCtx    context.Context
	streamCancel context.CancelFunc

	// internalAddr is the internal listener's advertised address
	// (ServeInternal; nil: none).
	internalAddr atomic.Pointer[string]

	// logKick wakes the log loop (replication.go) at once; logRetry is
	// its per-partition backoff and attempts under way, under logMu;
	// logSem bounds the attempts running at once.
	logKick  chan struct{}
	logMu    sync.Mutex
	logRetry map[uint64]*logRetry
	logSem   chan struct{}

	// snapKick wakes snapLoop, which writes snapshots off the propose
	// lock.
	snapKick chan struct{}

	// raft is the raft side of a replicated master (raft.go); nil for a
	// single master, whose command log is store.
	raft *raftState

	metrics   masterMetrics // metrics.go
	syncWatch syncWatch     // partitions short of in-sync replicas (insync.go)
	load      loadView      // replicas' smoothed load, servers' capacity (load.go)
	events    eventRing     // recent events, memory only (events.go)
	rebal     rebalancer    // balancing rounds and their recent moves (rebalance.go)

	closing   chan struct{} // closed by Close: stops the liveness loop and watch streams
	closeOnce sync.Once
	closeErr  error
	wg        sync.WaitGroup // the liveness loop
}

var _ api.MasterServer = (*Master)(nil)

// view is one published State and the channel closed when a State with a
// newer map version replaces it: map watchers wait on it. A State that
// changes only the stream manager (extent seals, node disk usage and
// inventories, every few seconds per node) keeps the map version and the
// channel, so it wakes no watcher.
type view struct {
	state   *State
	changed chan struct{}
	// mv is the map version of state as watchers see it (watch.go),
	// shared by every view at that version.
	mv *mapVersion
}

// snapJob is a snapshot to write: the published state after cut.seq.
type snapJob struct {
	cut   logCut
	state *State
}

// liveness is what the master knows of a server from its heartbeats.
type liveness struct {
	lastHeard time.Time
	// dead is set, under liveMu, in the same step that finds the server
	// silent and commits to declaring it dead; a heartbeat that sees it is
	// told to register again and renews nothing. Without it, a heartbeat
	// racing the decision could renew the lease of a server whose
	// partitions are being moved.
	dead bool
	// statuses is the latest report, replaced wholesale (never modified),
	// with ServerId set.
	statuses []*api.ReplicaStatus
	// statusVersion is the map version statuses were built from (0:
	// unknown, a server from before HeartbeatRequest.map_version).
	statusVersion uint64
	// draining: the process said it is shutting down (SIGTERM,
	// HeartbeatRequest.draining); it admits no client request from
	// then on, so it serves no partition (handoff.go).
	draining bool
	// written is each tenant's written counters (TenantLoad's written
	// and memory written bytes) at the report statuses came from: the
	// base of the size allowances computed from them (quotas.go).
	written map[string][2]uint64
}

// Open loads the master's state from opts.DataDir (creating it), creates
// tenant api.DefaultTenant on a new master and starts the liveness loop.
// Every known live server counts as heard at open time, so a restarted
// master waits a full DeadAfter, longer than any lease it granted, before it
// declares anyone dead. Close releases what Open took.
func Open(opts Options) (*Master, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	// Two masters on one directory would interleave their command logs.
	lock, err := dirlock.Acquire(opts.DataDir)
	if err != nil {
		return nil, fmt.Errorf("tablemaster: %w", err)
	}
	m := &Master{
		lock:     lock,
		opts:     opts,
		adm:      newAdmission(opts),
		quotas:   newQuotaTracker(),
		logger:   opts.Logger,
		live:     map[string]*liveness{},
		closing:  make(chan struct{}),
		logKick:  make(chan struct{}, 1),
		snapKick: make(chan struct{}, 1),
		logRetry: map[uint64]*logRetry{},
		logSem:   make(chan struct{}, logReconfigureParallel),
	}
	m.streamCtx, m.streamCancel = context.WithCancel(context.Background())
	if opts.RaftID != 0 {
		if err := m.openRaft(); err != nil {
			m.streamCancel()
			return nil, errors.Join(err, lock.Unlock())
		}
		m.logger.Info("tablemaster: raft member started", "dir", opts.DataDir, "id", opts.RaftID, "peers", opts.Peers)
		m.startLoops()
		return m, nil
	}
	if _, err := os.Stat(filepath.Join(opts.DataDir, raftDirName)); err == nil {
		m.streamCancel()
		return nil, errors.Join(fmt.Errorf("tablemaster: %s holds a raft member's state (%s/): start it with its member id (--id)", opts.DataDir, raftDirName), lock.Unlock())
	}
	st, state, seq, err := openStore(opts.DataDir, opts.Logger)
	if err != nil {
		m.streamCancel()
		return nil, errors.Join(err, lock.Unlock())
	}
	m.store, m.seq = st, seq
	m.view.Store(&view{state: state, changed: make(chan struct{}), mv: newMapVersion(nil, state)})
	now := opts.Now()
	if _, ok := state.Tenants[api.DefaultTenant]; !ok {
		if _, _, err := m.propose(Command{UnixMs: now.UnixMilli(), Payload: CreateTenant{Tenant: api.DefaultTenant, Keys: [][]byte{auth.NewKey(), auth.NewKey()}}}, nil, nil); err != nil {
			return nil, errors.Join(fmt.Errorf("tablemaster: bootstrap tenant %q: %w", api.DefaultTenant, err), st.close())
		}
	}
	for id, srv := range state.Servers {
		if srv.Alive {
			m.live[id] = &liveness{lastHeard: m.leaseGate().TakeoverHeard(now)}
		}
	}
	// A restarted master counts every pending handoff from now: any lease
	// it granted on an older map was granted before.
	m.resetHandoffClocks(m.leaseGate().TakeoverHeard(now))
	cur := m.State()
	m.logger.Info("tablemaster: opened", "dir", opts.DataDir, "version", cur.Version, "seq", m.seq,
		"tables", len(cur.Tables), "servers", len(cur.Servers))
	m.startLoops()
	return m, nil
}

// startLoops starts the stream driver and the loops; they act only while
// this master leads (leads).
func (m *Master) startLoops() {
	m.streamConns = stream.NewConns(m.dialOptions()...)
	m.streamDriver = stream.NewDriver(masterStreamLog{m}, stream.DriverOptions{Logger: m.logger.With("part", "stream-manager"), Conns: m.streamConns})
	m.wg.Add(6)
	go m.autoSplitLoop()
	go m.snapLoop()
	go m.livenessLoop()
	go m.streamLoop()
	go m.logLoop()
	go m.rebalanceLoop()
}

// State returns the current state. It is shared and immutable: read it,
// never modify it.
func (m *Master) State() *State { return m.view.Load().state }

// Serve serves api.MasterServer on lis until Close, with its own gRPC
// server. It may be called for several listeners. It returns nil after
// Close.
func (m *Master) Serve(lis net.Listener) error { return m.serve(lis, false) }

// ServeInternal serves the cluster's own listener until Close: the same
// services, to the cluster credential only (table servers' registration,
// heartbeats, stream and bulk calls; raft between the masters), so client
// load on the client listener never meets them. advertise is the address
// servers and the other raft members are told to use (default lis's):
// servers learn it from their registration and heartbeat answers, members
// by asking this one's membership (client) address (raftnode.GRPCTransport),
// and both fall back to the client address when it fails.
func (m *Master) ServeInternal(lis net.Listener, advertise string) error {
	if advertise == "" {
		advertise = lis.Addr().String()
	}
	m.internalAddr.Store(&advertise)
	if m.raft != nil {
		m.raft.transport.SetInternalAddr(advertise)
	}
	return m.serve(lis, true)
}

// InternalAddr is the advertised address of the internal listener ("":
// none).
func (m *Master) InternalAddr() string {
	if p := m.internalAddr.Load(); p != nil {
		return *p
	}
	return ""
}

func (m *Master) serve(lis net.Listener, internal bool) error {
	opts := append(m.adm.serverOptions(m.opts), // size limits, the watch codec
		grpc.MaxSendMsgSize(api.MaxMessageBytes),
		grpc.WaitForHandlers(true), // Close returns only after every handler has
		api.ServerKeepalive(),
		// Options' interceptors (metrics) run first, after the size
		// guard: they see every refusal below.
		grpc.ChainUnaryInterceptor(m.opts.UnaryInterceptors...),
		grpc.ChainStreamInterceptor(m.opts.StreamInterceptors...),
	)
	// Signatures are checked before admission, so callers that cannot
	// sign never take a slot.
	opts = append(opts, m.authInterceptors()...)
	if internal {
		opts = append(opts, grpc.ChainUnaryInterceptor(m.clusterOnlyUnary), grpc.ChainStreamInterceptor(m.clusterOnlyStream))
	}
	opts = append(opts, tlsfiles.ServerOption(m.opts.TLS)...)
	opts = append(opts,
		grpc.ChainUnaryInterceptor(m.admitUnary, m.leaderOnlyUnary),
		grpc.ChainStreamInterceptor(m.admitStream, m.leaderOnlyStream))
	s := grpc.NewServer(opts...)
	if err := m.registerMetrics(); err != nil {
		return errors.Join(err, lis.Close())
	}
	api.RegisterMasterServer(s, m)
	if m.raft != nil {
		m.raft.transport.Register(s)
	}
	m.srvMu.Lock()
	if m.closed {
		m.srvMu.Unlock()
		return errors.Join(ErrClosed, lis.Close())
	}
	m.servers = append(m.servers, s)
	m.srvMu.Unlock()
	if err := s.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("tablemaster: serve: %w", err)
	}
	return nil
}

// Close stops the gRPC servers (ending watch streams), the liveness loop,
// and closes the state files. Every command acknowledged before is durable.
// It is idempotent.
func (m *Master) Close() error {
	m.closeOnce.Do(func() {
		m.srvMu.Lock()
		m.closed = true
		servers := m.servers
		m.srvMu.Unlock()
		close(m.closing)
		m.streamCancel()
		for _, s := range servers {
			s.Stop()
		}
		var raftErr error
		if m.raft != nil {
			raftErr = errors.Join(m.raft.node.Close(), m.raft.transport.Close())
		}
		m.wg.Wait()
		driverErr := errors.Join(m.streamDriver.Close(), m.streamConns.Close())
		m.proposeMu.Lock()
		var storeErr error
		if m.store != nil {
			storeErr = m.store.close()
		}
		m.unregisterMetrics()
		m.closeErr = errors.Join(raftErr, driverErr, storeErr, m.lock.Unlock())
		m.store = nil
		m.proposeMu.Unlock()
	})
	return m.closeErr
}

// propose applies cmd to a copy of the current state, logs it durably and
// publishes the result: nothing is visible before the fsync. check, if not
// nil, runs first under the lock and can turn the command into a no-op (a
// server that heartbeated after all); after, if not nil, runs under the lock
// once the command is durable (or was a valid no-op). It returns the result
// and the state the caller should answer from.
func (m *Master) propose(cmd Command, check func(*State) bool, after func(Result)) (Result, *State, error) {
	defer m.metrics.observe(time.Now())
	if m.raft != nil {
		return m.proposeRaft(cmd, check, after)
	}
	m.proposeMu.Lock()
	defer m.proposeMu.Unlock()
	if m.store == nil {
		return Result{}, nil, ErrClosed
	}
	if m.broken != nil {
		return Result{}, nil, m.broken
	}
	cur := m.view.Load().state
	if check != nil && !check(cur) {
		return Result{}, cur, nil
	}
	next, res, cmd, err := successor(cur, cmd)
	if err != nil {
		return Result{}, cur, err
	}
	if !res.Changed {
		if after != nil {
			after(res)
		}
		return res, cur, nil
	}
	if err := m.store.append(logEntry{Seq: m.seq + 1, Cmd: cmd}); err != nil {
		m.broken = fmt.Errorf("tablemaster: command log failed, restart the master: %w", err)
		m.logger.Error("tablemaster: command log write failed; refusing further commands", "err", err)
		return Result{}, nil, m.broken
	}
	m.seq++
	m.publishLocked(next)
	if after != nil {
		after(res)
	}
	if m.store.records >= m.opts.SnapshotEvery && !m.snapping {
		// next is published, so immutable: snapLoop encodes and writes
		// it without the lock while commands go on.
		m.snapping = true
		m.snapJob = &snapJob{cut: m.store.cut(m.seq), state: next}
		select {
		case m.snapKick <- struct{}{}:
		default:
		}
	}
	return res, next, nil
}

// snapLoop writes the snapshots propose cuts until Close (which drops one
// not yet started: the log still holds its commands).
func (m *Master) snapLoop() {
	defer m.wg.Done()
	for {
		select {
		case <-m.closing:
			return
		case <-m.snapKick:
		}
		m.writeSnapshot()
	}
}

// writeSnapshot writes the pending snapshot, then, under the propose lock,
// trims the log to the commands after it (see store).
func (m *Master) writeSnapshot() {
	m.proposeMu.Lock()
	job, st := m.snapJob, m.store
	m.snapJob = nil
	m.proposeMu.Unlock()
	if job == nil || st == nil {
		return
	}
	err := writeSnapshot(m.opts.DataDir, job.state, job.cut.seq)
	if err == nil {
		err = st.step("snapshot-written")
	}
	m.proposeMu.Lock()
	defer m.proposeMu.Unlock()
	m.snapping = false
	if err == nil && m.store != nil && m.broken == nil {
		err = m.store.trim(job.cut)
	}
	switch {
	case errors.Is(err, errLogUncertain):
		// Every acknowledged command is durable (in the old log, or the
		// snapshot and the new one), but where the next would go is not
		// known.
		m.broken = fmt.Errorf("tablemaster: snapshot failed mid-way, restart the master: %w", err)
		m.logger.Error("tablemaster: snapshot left the command log uncertain; refusing further commands", "err", err)
	case err != nil:
		// Not fatal: the log still holds every command.
		m.logger.Warn("tablemaster: snapshot failed", "seq", job.cut.seq, "err", err)
	}
}

// publishLocked makes next the current state and, if its map version
// moved, wakes the map watchers.
func (m *Master) publishLocked(next *State) {
	old := m.view.Load()
	if next.Version == old.state.Version {
		m.view.Store(&view{state: next, changed: old.changed, mv: old.mv})
		return
	}
	m.view.Store(&view{state: next, changed: make(chan struct{}), mv: newMapVersion(old.mv, next)})
	old.mv.superseded()
	close(old.changed)
	m.forgetJoined(old.state, next)
}

// forgetJoined drops the last reports about the replicas next places on a
// server that held no replica of the partition in prev. Such a report is
// about the replica the server held before (it left the partition and was
// placed there again): it may say in sync while the new one copies, and
// the balancer's transfers (load.go) and the promotions of a dead
// primary's partitions read it. The server's next heartbeat reports the
// new replica; one built from an older map is true of the replica the
// server still held then. Found by the elastic simulation.
func (m *Master) forgetJoined(prev, next *State) {
	type joined struct {
		server string
		pid    uint64
	}
	var js []joined
	for k, t := range next.Tables {
		o := prev.Tables[k]
		if o == nil || o == t || o.ID != t.ID || !t.replicatesByLog() {
			continue // unchanged, or new: no report is about its replicas yet
		}
		before := make(map[uint64]*Partition, len(o.Partitions))
		for i := range o.Partitions {
			before[o.Partitions[i].ID] = &o.Partitions[i]
		}
		for i := range t.Partitions {
			p := &t.Partitions[i]
			op := before[p.ID]
			if op == nil {
				continue // a split's child: reported only as itself
			}
			for _, r := range p.Replicas {
				if !hostsReplica(op, r.ServerID) {
					js = append(js, joined{r.ServerID, p.ID})
				}
			}
		}
	}
	if len(js) == 0 {
		return
	}
	m.liveMu.Lock()
	for _, j := range js {
		of := func(r *api.ReplicaStatus) bool { return r.GetPartitionId() == j.pid }
		if l := m.live[j.server]; l != nil && slices.ContainsFunc(l.statuses, of) {
			l.statuses = slices.DeleteFunc(slices.Clone(l.statuses), of) // the slice may be a heartbeat's
		}
	}
	m.liveMu.Unlock()
	m.load.mu.Lock()
	for _, j := range js {
		delete(m.load.replicas[j.server], j.pid)
	}
	m.load.mu.Unlock()
}

// livenessLoop declares silent servers dead every half HeartbeatInterval
// until Close (a failover waits for this tick after DeadAfter).
func (m *Master) livenessLoop() {
	defer m.wg.Done()
	t := time.NewTicker(max(m.opts.HeartbeatInterval/2, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-m.closing:
			return
		case <-t.C:
			m.checkLiveness()
		}
	}
}

// checkLiveness applies OpServerDown to every alive server silent longer
// than DeadAfter.
func (m *Master) checkLiveness() {
	if !m.leads() {
		return
	}
	now := m.opts.Now()
	m.noteThrottling(now)
	st := m.State()
	defer m.replaceDead(st, now)
	defer m.placeShortOnes(st, now)
	defer func() { m.clearHandoffs(m.State(), now) }() // after the deaths below: a dead old primary needs no wait
	defer m.checkReplication(st, now)
	for _, id := range st.ServerIDs() {
		if !st.Servers[id].Alive || !m.silent(id, now) {
			continue
		}
		stillSilent := func(s *State) bool {
			srv := s.Servers[id]
			if srv == nil || !srv.Alive {
				return false
			}
			m.liveMu.Lock()
			defer m.liveMu.Unlock()
			l := m.live[id]
			if l != nil && !m.leaseGate().Dead(l.lastHeard, now) {
				return false
			}
			if l == nil {
				l = &liveness{}
				m.live[id] = l
			}
			l.dead = true
			return true
		}
		res, next, err := m.propose(Command{UnixMs: now.UnixMilli(), Payload: ServerDown{ServerID: id, Promote: m.promotions(st, id), Keep: m.opts.ReplaceAfter > 0}}, stillSilent, func(Result) {
			m.liveMu.Lock()
			if l := m.live[id]; l != nil {
				l.statuses = nil
			}
			m.liveMu.Unlock()
		})
		m.noteServerDown(st, next, id, res, err)
		switch {
		case errors.Is(err, ErrClosed):
			return
		case err != nil:
			m.logger.Error("tablemaster: declare server dead", "server", id, "err", err)
		case res.Changed && len(res.Held) > 0:
			m.logger.Error("tablemaster: server declared dead; partitions whose only copy it holds are UNAVAILABLE until it returns "+
				"(if it never will: tabula server forget --accept-data-loss, which places them again empty)", "server", id,
				"silent_for", now.Sub(m.lastHeard(id)), "moved", len(res.Moved), "held_for_its_return", len(res.Held))
		case res.Changed:
			m.kickLogs()
			m.logger.Warn("tablemaster: server declared dead; its partitions moved", "server", id,
				"silent_for", now.Sub(m.lastHeard(id)), "moved", len(res.Moved))
		}
	}
}

// placeShortCheckEvery is how often the leader looks for partitions
// short of replicas that a server could now take.
const placeShortCheckEvery = 2 * time.Second

// placeShortOnes proposes OpPlace when a partition is short of replicas
// and some available server could take one (a server back from a drain,
// one a log reset dropped answering again): every path that leaves a
// partition short is repaired here at the latest.
func (m *Master) placeShortOnes(st *State, now time.Time) {
	// The wall clock paces the check (opts.Now may be a test's frozen one).
	wall := time.Now().UnixNano()
	next := m.nextPlaceCheck.Load()
	if wall < next || !m.nextPlaceCheck.CompareAndSwap(next, wall+int64(placeShortCheckEvery)) {
		return // not due, or another caller took this check
	}
	if !st.placeable() {
		return
	}
	res, _, err := m.propose(Command{UnixMs: now.UnixMilli(), Payload: PlaceShort{}}, func(s *State) bool { return s.placeable() }, nil)
	switch {
	case errors.Is(err, ErrClosed):
	case err != nil:
		m.logger.Error("tablemaster: place partitions short of replicas", "err", err)
	case res.Changed:
		m.kickLogs()
		m.logger.Warn("tablemaster: partitions short of replicas placed again", "partitions", len(res.Moved))
		m.event(EventPlaced, "", 0, "%d partitions short of replicas placed again", len(res.Moved))
	}
}

// replaceDead drops the kept replicas (Command.Keep) of servers dead for
// longer than ReplaceAfter; placement puts new ones on live servers, which
// copy them.
func (m *Master) replaceDead(st *State, now time.Time) {
	if m.opts.ReplaceAfter <= 0 {
		return
	}
	for _, id := range st.ServerIDs() {
		srv := st.Servers[id]
		if srv.Alive || srv.DownSinceMs == 0 || now.Sub(time.UnixMilli(srv.DownSinceMs)) < m.opts.ReplaceAfter || !st.holdsLogReplicas(id) {
			continue
		}
		hold, replaceable := m.replaceHolds(st, id)
		if replaceable == 0 {
			continue // nothing it holds can go yet: no proposal every tick
		}
		res, _, err := m.propose(Command{UnixMs: now.UnixMilli(), Payload: ServerDown{ServerID: id, Replace: true, Hold: hold}}, func(s *State) bool {
			srv := s.Servers[id]
			return srv != nil && !srv.Alive
		}, nil)
		switch {
		case errors.Is(err, ErrClosed):
			return
		case err != nil:
			m.logger.Error("tablemaster: replace a dead server's replicas", "server", id, "err", err)
		case res.Changed:
			m.kickLogs()
			m.logger.Warn("tablemaster: server dead past --replace-after; its replicas are placed again elsewhere", "server", id,
				"down_for", now.Sub(time.UnixMilli(srv.DownSinceMs)).Round(time.Second), "partitions", len(res.Moved), "held", len(res.Held))
			m.event(EventReplaced, id, 0, "server %s dead past --replace-after: %d partitions' replicas placed again elsewhere", id, len(res.Moved))
			if len(res.Held) > 0 {
				m.event(EventReplaced, id, 0, "server %s: %d partitions keep their replica there: no live replica reported their data (in sync, or a secondary catching up)", id, len(res.Held))
			}
		}
	}
}

// replaceHolds sorts the log-replicated partitions with a replica on the
// dead server id: those no live replica reported holding the data of (by
// the latest heartbeats) are held — dropping the dead replica could drop
// the only full copy, say while the others are still copying it — and the
// rest are replaceable. In sync counts; catching up counts only for a
// secondary (it replays the log from its own engine's restart point). A
// primary catching up is replaying the log after its promotion, maybe from
// the start over an empty engine (promoted before it copied anything): if
// the log no longer holds the start it fails, and the dead server's copy
// was the only full one. The role is the map's as well as the report's,
// so a report from before a promotion does not count either.
func (m *Master) replaceHolds(st *State, id string) (hold []uint64, replaceable int) {
	type held struct {
		state api.ReplicaState
		role  api.ReplicaRole
	}
	reports := map[uint64]map[string]held{} // partition -> live server -> its report
	m.liveMu.Lock()
	for sid, l := range m.live {
		if sid == id || l.dead {
			continue
		}
		for _, r := range l.statuses {
			if reports[r.PartitionId] == nil {
				reports[r.PartitionId] = map[string]held{}
			}
			reports[r.PartitionId][sid] = held{r.GetState(), r.GetRole()}
		}
	}
	m.liveMu.Unlock()
	for _, t := range st.tablesByID() {
		if !t.replicatesByLog() {
			continue
		}
		for i := range t.Partitions {
			p := &t.Partitions[i]
			if !hostsReplica(p, id) {
				continue
			}
			ok := false
			for _, r := range p.Replicas {
				if r.ServerID == id || st.Servers[r.ServerID] == nil || !st.Servers[r.ServerID].Alive {
					continue
				}
				rep, found := reports[p.ID][r.ServerID]
				switch {
				case !found:
				case rep.state == api.ReplicaState_REPLICA_STATE_IN_SYNC:
					ok = true
				case rep.state == api.ReplicaState_REPLICA_STATE_CATCHING_UP:
					ok = r.Role != api.ReplicaRole_REPLICA_ROLE_PRIMARY && rep.role != api.ReplicaRole_REPLICA_ROLE_PRIMARY
				}
				if ok {
					break
				}
			}
			if ok {
				replaceable++
			} else {
				hold = append(hold, p.ID)
			}
		}
	}
	return hold, replaceable
}

func (m *Master) silent(id string, now time.Time) bool { return m.silentFor(id, now, m.opts.DeadAfter) }

// silentFor reports whether server id has not been heard from for longer
// than d (never heard counts as silent).
func (m *Master) silentFor(id string, now time.Time, d time.Duration) bool {
	m.liveMu.Lock()
	defer m.liveMu.Unlock()
	l := m.live[id]
	return l == nil || m.leaseGate().SilentFor(l.lastHeard, now, d)
}

func (m *Master) lastHeard(id string) time.Time {
	m.liveMu.Lock()
	defer m.liveMu.Unlock()
	if l := m.live[id]; l != nil {
		return l.lastHeard
	}
	return time.Time{}
}

// successor applies cmd, validated (it is proposed), to a copy of the
// published state cur, leaving cur as it was. It returns the new state, the
// result and the command to log.
func successor(cur *State, cmd Command) (*State, Result, Command, error) {
	next := cur.successor() // copy on write: see cow.go
	res, cmd, err := next.ApplyChecked(cmd)
	next.seal()
	return next, res, cmd, err
}
