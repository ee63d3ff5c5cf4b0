package stream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/tabuladb/tabula/replication/stream/streampb"
)

// StateLog is where a Driver's commands go and how it reads the manager's
// state: LocalLog (a Manager in memory), or the master's replicated log in
// front of one.
type StateLog interface {
	// Apply applies c once it is durable (replicated) and returns its
	// result.
	Apply(ctx context.Context, c Command) (Result, error)
	// View calls fn with the current state; fn must neither keep nor
	// modify m.
	View(fn func(m *Manager))
}

// LocalLog is a StateLog over a Manager in memory, with no persistence:
// for tests and single-process clusters. Safe for concurrent use.
type LocalLog struct {
	mu sync.Mutex
	m  *Manager
}

// NewLocalLog returns a LocalLog over m.
func NewLocalLog(m *Manager) *LocalLog { return &LocalLog{m: m} }

// Apply implements StateLog.
func (l *LocalLog) Apply(_ context.Context, c Command) (Result, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.m.Apply(c)
}

// View implements StateLog.
func (l *LocalLog) View(fn func(m *Manager)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fn(l.m)
}

// StreamInfo is a stream as a client sees it.
type StreamInfo struct {
	Name string
	// Epoch is the writer epoch (see OpOpenWriter).
	Epoch   uint64
	Extents []ExtentPlacement
}

// Last is the stream's last extent, or nil.
func (s StreamInfo) Last() *ExtentPlacement {
	if len(s.Extents) == 0 {
		return nil
	}
	return &s.Extents[len(s.Extents)-1]
}

// ExtentPlacement is an extent and where its replicas are.
type ExtentPlacement struct {
	ID      uint64
	Sealed  bool
	Length  int64 // once sealed
	LastSeq uint64
	// SeqRestart: a new sequence number space starts at this extent (a
	// concatenated stream's source boundary).
	SeqRestart bool
	// Replicas: the primary first while the extent is open. Empty once
	// the extent is coded.
	Replicas []ReplicaAddr
	// Coding is set once coding started (Coded: done; until then the
	// replicas serve reads).
	Coding *CodingPlacement
	// Ack is the extent's acknowledgement policy (AckAll or AckQuorum).
	Ack AckPolicy
}

// ReplicaAddr is one replica's node.
type ReplicaAddr struct {
	Node string
	Addr string
	// OK: the replica holds the data (not being copied or repaired) and
	// its node is alive.
	OK bool
}

func placementOf(m *Manager, e ExtentMeta) ExtentPlacement {
	p := ExtentPlacement{ID: e.ID, Sealed: e.Sealed, Length: e.Length, LastSeq: e.LastSeq, Ack: cmp.Or(e.Ack, AckAll)}
	for _, r := range e.Replicas {
		nd := m.nodes.Get(r.Node)
		ra := ReplicaAddr{Node: r.Node, Addr: nd.Addr, OK: r.State == ReplicaOK && nd.Alive}
		if r.Node == e.Primary && !e.Sealed {
			p.Replicas = append([]ReplicaAddr{ra}, p.Replicas...)
		} else {
			p.Replicas = append(p.Replicas, ra)
		}
	}
	p.Coding = codingPlacementOf(m, e)
	return p
}

// DriverOptions configure a Driver; the zero value works.
type DriverOptions struct {
	// Conns dials extent nodes. Default: the driver's own, closed by
	// Close.
	Conns *Conns
	// RPCTimeout bounds each Create, CommitLength, Seal and Delete RPC to
	// a node: an unreachable replica costs at most this during a seal.
	// Default 1 s.
	RPCTimeout time.Duration
	// CopyTimeout bounds one re-replication copy, one coding of an
	// extent and one fragment rebuild. Default 10 min.
	CopyTimeout time.Duration
	// Logger gets the driver's logs. Default: discarded.
	Logger *slog.Logger
}

// Driver runs a stream manager's state machine and does the I/O it needs:
// creating extents on nodes after allocation, the seal protocol, and the
// copy and delete tasks. It is what a Client talks to (it implements
// ManagerClient) when the manager runs in-process; the master does the
// same through its raft log. Safe for concurrent use.
type Driver struct {
	log      StateLog
	conns    *Conns
	ownConns bool
	opts     DriverOptions
	lg       *slog.Logger

	// locks serialise seals per extent (two seals of one extent would
	// probe, and could decide, different lengths) and allocations per
	// stream (two writers that fail together get one new extent). Streams
	// are independent: a failed server's many partition logs are sealed
	// and continued in parallel. Order: a stream's key before an extent's.
	locks keyedLocks
}

// NewDriver returns a driver over log.
func NewDriver(log StateLog, opts DriverOptions) *Driver {
	if opts.RPCTimeout <= 0 {
		opts.RPCTimeout = time.Second
	}
	if opts.CopyTimeout <= 0 {
		opts.CopyTimeout = 10 * time.Minute
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	d := &Driver{log: log, conns: opts.Conns, opts: opts, lg: opts.Logger}
	if d.conns == nil {
		d.conns, d.ownConns = NewConns(), true
	}
	return d
}

// Close closes the driver's own connections. Idempotent.
func (d *Driver) Close() error {
	if d.ownConns {
		return d.conns.Close()
	}
	return nil
}

// Apply applies c to the state log.
func (d *Driver) Apply(ctx context.Context, c Command) (Result, error) { return d.log.Apply(ctx, c) }

// View reads the state.
func (d *Driver) View(fn func(m *Manager)) { d.log.View(fn) }

// Stream implements ManagerClient.
func (d *Driver) Stream(_ context.Context, name string) (StreamInfo, error) {
	var out StreamInfo
	var err error
	d.log.View(func(m *Manager) {
		var s StreamMeta
		var es []ExtentMeta
		if s, es, err = m.Stream(name); err != nil {
			return
		}
		out = StreamInfo{Name: s.Name, Epoch: s.Epoch}
		for i, e := range es {
			p := placementOf(m, e)
			p.SeqRestart = slices.Contains(s.Restarts, i)
			out.Extents = append(out.Extents, p)
		}
	})
	return out, err
}

// Extent implements ManagerClient.
func (d *Driver) Extent(_ context.Context, id uint64) (ExtentPlacement, error) {
	var out ExtentPlacement
	var err error
	d.log.View(func(m *Manager) {
		var e ExtentMeta
		if e, err = m.Extent(id); err == nil {
			out = placementOf(m, e)
		}
	})
	return out, err
}

// OpenWriter implements ManagerClient.
func (d *Driver) OpenWriter(ctx context.Context, name string) (StreamInfo, error) {
	if _, err := d.log.Apply(ctx, Command{Op: OpOpenWriter, Stream: name}); err != nil {
		return StreamInfo{}, err
	}
	return d.Stream(ctx, name)
}

// SealAndAllocate implements ManagerClient: it seals extent (if not 0 and
// not sealed yet), then, if the stream's last extent is sealed or there is
// none, allocates a new one on healthy nodes (avoiding those the seal could
// not reach) and creates its replicas. A writer epoch other than 0 must be
// the stream's.
func (d *Driver) SealAndAllocate(ctx context.Context, name string, epoch, extent uint64) (StreamInfo, error) {
	return d.SealAndAllocateOn(ctx, name, epoch, extent, nil)
}

// SealAndAllocateOn is SealAndAllocate with the new extent's placement
// decided by the caller (a partition putting its log's open extent on its
// replica servers): nodes are the extent node ids, primary first, as many
// as the stream's replicas (see OpAllocate). With nodes nil the manager
// places it. A replica that cannot be created on a named node makes the
// extent sealed empty and the call fail (the caller picks other nodes).
func (d *Driver) SealAndAllocateOn(ctx context.Context, name string, epoch, extent uint64, nodes []string) (StreamInfo, error) {
	defer d.locks.lock("s" + name)()
	var avoid []string
	if extent != 0 {
		var err error
		unlock := d.locks.lock(extentKey(extent))
		avoid, err = d.sealLocked(ctx, extent)
		unlock()
		if err != nil {
			return StreamInfo{}, err
		}
	}
	info, err := d.Stream(ctx, name)
	if err != nil {
		return StreamInfo{}, err
	}
	if epoch != 0 && epoch != info.Epoch {
		return StreamInfo{}, fmt.Errorf("stream %q at epoch %d, writer at %d: %w", name, info.Epoch, epoch, ErrFenced)
	}
	if last := info.Last(); last != nil && !last.Sealed {
		return info, nil // another writer's call allocated it already
	}
	if err := d.allocateLocked(ctx, name, epoch, avoid, nodes); err != nil {
		return StreamInfo{}, err
	}
	return d.Stream(ctx, name)
}

// ReportCorrupt implements ManagerClient.
func (d *Driver) ReportCorrupt(ctx context.Context, extent uint64, node string) error {
	_, err := d.log.Apply(ctx, Command{Op: OpReportCorrupt, Extent: extent, Node: node})
	return err
}

// allocateLocked allocates and creates a new last extent of name. A
// replica that cannot be created makes the extent sealed empty and the
// allocation retried without that node.
func (d *Driver) allocateLocked(ctx context.Context, name string, epoch uint64, avoid, nodes []string) error {
	var errs []error
	for range 3 {
		res, err := d.log.Apply(ctx, Command{Op: OpAllocate, Stream: name, Epoch: epoch, Avoid: avoid, Nodes: nodes})
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		p, err := d.Extent(ctx, res.Extent)
		if err != nil {
			return err
		}
		errc := d.createReplicas(ctx, p)
		var created []string
		for i, r := range p.Replicas {
			if errc[i] != nil {
				avoid = append(avoid, r.Node)
				errs = append(errs, fmt.Errorf("create extent %d on %s: %w", p.ID, r.Node, errc[i]))
			} else {
				created = append(created, r.Node)
			}
		}
		if len(created) == len(p.Replicas) {
			return nil
		}
		// Abandon it: sealed empty, so the stream can take another.
		d.lg.Warn("extent creation failed; sealing it empty", "extent", p.ID, "err", errors.Join(errs...))
		if _, err := d.log.Apply(ctx, Command{Op: OpSeal, Extent: p.ID, Length: 0, Nodes: created}); err != nil {
			return err
		}
		d.sealReplicas(ctx, p, 0, created)
		if len(nodes) > 0 {
			break // the caller's placement: it decides again
		}
	}
	return fmt.Errorf("allocate extent in %q: %w", name, errors.Join(errs...))
}

// createReplicas creates p's replicas (the primary first, told its
// secondaries and the ack policy) in parallel and returns each one's error.
func (d *Driver) createReplicas(ctx context.Context, p ExtentPlacement) []error {
	errc := make([]error, len(p.Replicas))
	var secs []*streampb.ReplicaRef
	for _, r := range p.Replicas[1:] {
		secs = append(secs, &streampb.ReplicaRef{Node: r.Node, Addr: r.Addr})
	}
	var wg sync.WaitGroup
	for i, r := range p.Replicas {
		req := &streampb.CreateRequest{Extent: p.ID}
		if i == 0 {
			req.Primary, req.Secondaries, req.Ack = true, secs, string(p.Ack)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errc[i] = d.nodeCall(ctx, r.Addr, func(ctx context.Context, c streampb.ExtentNodeClient) error {
				_, err := c.Create(ctx, req)
				return err
			})
		}()
	}
	wg.Wait()
	return errc
}

// nodeCall runs fn against the node at addr with the RPC timeout.
func (d *Driver) nodeCall(ctx context.Context, addr string, fn func(context.Context, streampb.ExtentNodeClient) error) error {
	c, err := d.conns.Node(addr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, d.opts.RPCTimeout)
	defer cancel()
	return fromStatus(fn(ctx, c))
}

// Seal seals extent by the WAS protocol: freeze every reachable replica
// and read its commit length, record the smallest (every acknowledged
// append is on all replicas, so none is cut) as the sealed length, then
// seal the replicas at it. An AckQuorum extent needs a majority reachable
// and is sealed at the largest length among them (an acknowledged append
// is on a majority, so on one of them); the shorter ones are rebuilt. Replicas that miss the seal are rebuilt later
// (TaskCopy). It returns the nodes it could not reach.
func (d *Driver) Seal(ctx context.Context, extent uint64) (unreachable []string, err error) {
	defer d.locks.lock(extentKey(extent))()
	return d.sealLocked(ctx, extent)
}

// sealGrace is how long a seal waits for the replicas that have not
// answered once enough have to decide the length.
const sealGrace = 50 * time.Millisecond

func extentKey(id uint64) string { return "e" + strconv.FormatUint(id, 10) }

// keyedLocks is a set of mutexes by key, created on demand and dropped
// when unused. The zero value works; safe for concurrent use.
type keyedLocks struct {
	mu sync.Mutex
	// Guarded by mu: each key's lock and how many hold or wait for it.
	m map[string]*keyedLock
}

type keyedLock struct {
	sync.Mutex
	refs int
}

// lock locks key and returns its unlock.
func (k *keyedLocks) lock(key string) func() {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyedLock{}
	}
	l := k.m[key]
	if l == nil {
		l = &keyedLock{}
		k.m[key] = l
	}
	l.refs++
	k.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		k.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}

func (d *Driver) sealLocked(ctx context.Context, extent uint64) ([]string, error) {
	p, err := d.Extent(ctx, extent)
	if err != nil {
		return nil, err
	}
	if p.Sealed {
		return nil, nil
	}
	type probe struct {
		resp *streampb.CommitLengthResponse
		err  error
	}
	probes := make([]probe, len(p.Replicas))
	type answer struct {
		i int
		probe
	}
	answers := make(chan answer, len(p.Replicas)) // buffered: a late probe never blocks
	for i, r := range p.Replicas {
		go func() {
			var a answer
			a.i = i
			a.err = d.nodeCall(ctx, r.Addr, func(ctx context.Context, c streampb.ExtentNodeClient) error {
				var err error
				a.resp, err = c.CommitLength(ctx, &streampb.CommitLengthRequest{Extent: extent, Freeze: true})
				return err
			})
			answers <- a
		}()
	}
	// Wait for every replica, or, once enough answered to decide (the
	// seal quorum), for a short grace more: a stopped or cut-off node
	// would otherwise hold every write of the stream for the whole RPC
	// timeout. A replica that did not answer is left out of the seal and
	// rebuilt, as an unreachable one.
	need := p.Ack.SealQuorum(len(p.Replicas))
	for i := range probes {
		probes[i].err = fmt.Errorf("no answer within the seal's grace: %w", ErrUnavailable)
	}
	var grace <-chan time.Time
	ok := 0
	for got := 0; got < len(p.Replicas); got++ {
		var a answer
		select {
		case a = <-answers:
		case <-grace:
			got = len(p.Replicas)
			continue
		}
		probes[a.i] = a.probe
		if a.err == nil {
			ok++
		}
		if ok >= need && grace == nil {
			grace = time.After(sealGrace)
		}
	}
	var (
		unreachable, reached, missing []string
		length                        = int64(-1)
		lastSeq                       uint64
		sealedAt                      = int64(-1)
		sealedSeq                     uint64
	)
	for i, r := range p.Replicas {
		pr := probes[i]
		if pr.err != nil {
			unreachable = append(unreachable, r.Node)
			if errors.Is(pr.err, ErrNoExtent) {
				missing = append(missing, r.Node)
			}
			d.lg.Info("seal: replica unreachable", "extent", extent, "node", r.Node, "err", pr.err)
			continue
		}
		reached = append(reached, r.Node)
		if pr.resp.Sealed {
			sealedAt, sealedSeq = pr.resp.Length, pr.resp.LastSeq
		}
		longer := pr.resp.Length > length
		if p.Ack != AckQuorum {
			longer = pr.resp.Length < length // AckAll: the smallest
		}
		if length < 0 || longer {
			length, lastSeq = pr.resp.Length, pr.resp.LastSeq
		}
	}
	if n := len(p.Replicas); len(reached) > 0 && len(reached) < p.Ack.SealQuorum(n) && sealedAt < 0 {
		// An acknowledged append is on Required(n) copies, not on all: a
		// seal that meets fewer could cut it.
		return unreachable, fmt.Errorf("seal extent %d: %d of %d replicas reachable, %d needed: %w", extent, len(reached), n, p.Ack.SealQuorum(n), ErrUnavailable)
	}
	if len(reached) == 0 {
		if n := len(p.Replicas); len(missing) > 0 && len(missing) >= p.Ack.SealQuorum(n) {
			return d.sealNeverCreated(ctx, p, missing, unreachable)
		}
		return unreachable, fmt.Errorf("seal extent %d: %w", extent, ErrUnavailable)
	}
	if sealedAt >= 0 {
		// A replica sealed by an earlier seal whose record was lost: its
		// length was the decision.
		length, lastSeq = sealedAt, sealedSeq
	}
	keep := reached
	if p.Ack == AckQuorum {
		// The shorter replicas cannot be sealed at the longest length:
		// they are left out of the seal and rebuilt from the others
		// (TaskCopy), as a replica that missed it.
		keep = nil
		for i, r := range p.Replicas {
			if probes[i].err == nil && probes[i].resp.Length >= length {
				keep = append(keep, r.Node)
			}
		}
	}
	if _, err := d.log.Apply(ctx, Command{Op: OpSeal, Extent: extent, Length: length, LastSeq: lastSeq, Nodes: keep}); err != nil {
		return unreachable, err
	}
	d.sealReplicas(ctx, p, length, keep)
	return unreachable, nil
}

// sealNeverCreated seals empty an extent none of whose reachable replicas
// exists: an owner crashed between allocating it (OpAllocate) and creating
// its replicas. Nothing was ever acknowledged on it: an append is
// acknowledged only once the ack policy's number of copies holds it, and
// missing lists more replicas that never existed than an acknowledgement
// could do without. Each missing replica is created as an empty secondary
// and sealed at 0 (a late Create of the primary then fails with
// ErrExists), and the seal is recorded with those that made it; the others
// are rebuilt from them.
func (d *Driver) sealNeverCreated(ctx context.Context, p ExtentPlacement, missing, unreachable []string) ([]string, error) {
	d.lg.Warn("seal: no replica of the extent exists; sealing it empty", "extent", p.ID, "missing", missing)
	var made []string
	var errs []error
	for _, r := range p.Replicas {
		if !contains(missing, r.Node) {
			continue
		}
		err := d.nodeCall(ctx, r.Addr, func(ctx context.Context, c streampb.ExtentNodeClient) error {
			if _, err := c.Create(ctx, &streampb.CreateRequest{Extent: p.ID}); err != nil {
				return err
			}
			_, err := c.Seal(ctx, &streampb.SealRequest{Extent: p.ID, Length: 0})
			return err
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("create extent %d on %s sealed empty: %w", p.ID, r.Node, err))
			continue
		}
		made = append(made, r.Node)
	}
	if len(made) == 0 {
		return unreachable, fmt.Errorf("seal extent %d: %w: %w", p.ID, ErrUnavailable, errors.Join(errs...))
	}
	var still []string
	for _, u := range unreachable {
		if !contains(made, u) {
			still = append(still, u)
		}
	}
	if _, err := d.log.Apply(ctx, Command{Op: OpSeal, Extent: p.ID, Length: 0, Nodes: made}); err != nil {
		return still, err
	}
	return still, nil
}

// sealReplicas seals the replicas of p on nodes at length; one that fails
// is reported for repair.
func (d *Driver) sealReplicas(ctx context.Context, p ExtentPlacement, length int64, nodes []string) {
	errs := make([]error, len(p.Replicas))
	var wg sync.WaitGroup
	for i, r := range p.Replicas {
		if !contains(nodes, r.Node) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = d.nodeCall(ctx, r.Addr, func(ctx context.Context, c streampb.ExtentNodeClient) error {
				_, err := c.Seal(ctx, &streampb.SealRequest{Extent: p.ID, Length: length})
				return err
			})
		}()
	}
	wg.Wait()
	for i, r := range p.Replicas {
		if errs[i] != nil {
			d.lg.Warn("seal: replica failed; it will be rebuilt", "extent", p.ID, "node", r.Node, "err", errs[i])
			if _, err := d.log.Apply(ctx, Command{Op: OpReportCorrupt, Extent: p.ID, Node: r.Node}); err != nil {
				d.lg.Warn("seal: report failed replica", "extent", p.ID, "err", err)
			}
		}
	}
}

func contains(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

// RunTasks does every task the manager lists now (seals, copies, deletes),
// applying their outcomes, and returns how many succeeded. Failures are
// joined into the error; their tasks stay listed (or are re-planned).
func (d *Driver) RunTasks(ctx context.Context) (int, error) {
	var tasks []Task
	d.log.View(func(m *Manager) { tasks = m.Tasks() })
	done := 0
	var errs []error
	for _, t := range tasks {
		var err error
		switch t.Kind {
		case TaskSeal:
			_, err = d.Seal(ctx, t.Extent)
		case TaskCopy:
			err = d.copy(ctx, t)
		case TaskCode:
			err = d.code(ctx, t)
		case TaskRebuild:
			err = d.rebuild(ctx, t)
		case TaskDeleteFragment:
			err = d.nodeCall(ctx, t.Addr, func(ctx context.Context, c streampb.ExtentNodeClient) error {
				_, err := c.DeleteFragment(ctx, &streampb.DeleteFragmentRequest{Extent: t.Extent, Index: uint32(t.Index)})
				return err
			})
			if err == nil {
				_, err = d.log.Apply(ctx, Command{Op: OpFragmentDeleted, Extent: t.Extent, Index: t.Index, Node: t.Node})
			}
		case TaskDelete:
			err = d.nodeCall(ctx, t.Addr, func(ctx context.Context, c streampb.ExtentNodeClient) error {
				_, err := c.Delete(ctx, &streampb.DeleteRequest{Extent: t.Extent})
				return err
			})
			if err == nil {
				_, err = d.log.Apply(ctx, Command{Op: OpReplicaDeleted, Extent: t.Extent, Node: t.Node})
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s extent %d on %q: %w", t.Kind, t.Extent, t.Node, err))
			continue
		}
		done++
	}
	return done, errors.Join(errs...)
}

func (d *Driver) copy(ctx context.Context, t Task) error {
	c, err := d.conns.Node(t.Addr)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, d.opts.CopyTimeout)
	_, err = c.Copy(cctx, &streampb.CopyRequest{Extent: t.Extent, Sources: t.Sources, Length: t.Length})
	cancel()
	if err != nil {
		err = fromStatus(err)
		if _, aerr := d.log.Apply(ctx, Command{Op: OpReplicaFailed, Extent: t.Extent, Node: t.Node}); aerr != nil {
			err = errors.Join(err, aerr)
		}
		return err
	}
	_, err = d.log.Apply(ctx, Command{Op: OpReplicaReady, Extent: t.Extent, Node: t.Node})
	return err
}

// SyncNode reads node's inventory (Stat) and applies what it says: its
// load, replicas it holds that the manager did not place there (garbage),
// and replicas it found corrupt.
func (d *Driver) SyncNode(ctx context.Context, node string) error {
	var nd NodeMeta
	var err error
	d.log.View(func(m *Manager) { nd, err = m.Node(node) })
	if err != nil {
		return err
	}
	var st *streampb.StatResponse
	if err := d.nodeCall(ctx, nd.Addr, func(ctx context.Context, c streampb.ExtentNodeClient) error {
		var err error
		st, err = c.Stat(ctx, &streampb.StatRequest{})
		return err
	}); err != nil {
		return err
	}
	ids := make([]uint64, 0, len(st.Extents))
	var errs []error
	frags := make([]FragmentRef, 0, len(st.Fragments))
	for _, f := range st.Fragments {
		frags = append(frags, FragmentRef{Extent: f.Extent, Index: int(f.Index)})
		if f.Corrupt {
			if err := d.ReportCorruptFragment(ctx, f.Extent, int(f.Index), node); err != nil && !errors.Is(err, ErrUnknownExtent) && !errors.Is(err, ErrUnknownNode) && !errors.Is(err, ErrBadCommand) {
				errs = append(errs, err)
			}
		}
	}
	for _, e := range st.Extents {
		ids = append(ids, e.Extent)
		if e.Corrupt {
			if _, err := d.log.Apply(ctx, Command{Op: OpReportCorrupt, Extent: e.Extent, Node: node}); err != nil && !errors.Is(err, ErrUnknownExtent) && !errors.Is(err, ErrUnknownNode) {
				errs = append(errs, err)
			}
		}
	}
	if _, err := d.log.Apply(ctx, Command{Op: OpNodeLoad, Node: node, UsedBytes: st.UsedBytes}); err != nil {
		errs = append(errs, err)
	}
	if _, err := d.log.Apply(ctx, Command{Op: OpNodeExtents, Node: node, Extents: ids, Fragments: frags}); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
