package raftnode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tabuladb/tabula/engines/vfs"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Options configures a Node. Zero values of the optional fields take the
// defaults named.
type Options struct {
	// ID is this member's id, nonzero and unique in the group. Required.
	ID uint64
	// Dir holds the member's log and snapshot on FS. Required.
	Dir string
	// FS is the file system; default vfs.Default.
	FS vfs.FS
	// StateMachine is the replicated state. Required.
	StateMachine StateMachine
	// Transport carries messages to the other members. Required.
	Transport Transport
	// Peers are the founding members (this one included) and their
	// addresses, used only when Dir holds no state yet: the group is
	// bootstrapped with them. Empty means join an existing group: the
	// member waits to be added (AddLearner) and fed by the leader.
	Peers map[uint64]string
	// TickInterval is raft's logical clock period; default 50 ms.
	TickInterval time.Duration
	// ElectionTicks is the election timeout in ticks (raft randomises it
	// in [ElectionTicks, 2×ElectionTicks)); default 10, so a failed leader
	// is replaced within about 1 s of its last heartbeat.
	ElectionTicks int
	// HeartbeatTicks is the leader's heartbeat period in ticks; default 1.
	HeartbeatTicks int
	// SnapshotEvery takes a snapshot after this many applied entries;
	// default 10000.
	SnapshotEvery uint64
	// KeepEntries is how many entries before a snapshot stay in memory for
	// followers that lag a little; default 1000.
	KeepEntries uint64
	// PromoteMaxLag is how far behind the leader's log a learner may be
	// and still be promoted; default 100 entries.
	PromoteMaxLag uint64
	// Clock makes the ticker; default SystemClock.
	Clock Clock
	// Logger receives the node's logs; default discards.
	Logger *slog.Logger
	// OnLeaderChange, if set, is called on the node's goroutine whenever
	// the leader, the term or this member's role changes. It must not block
	// or call the Node's blocking methods. "IsLeader at term T" is the
	// moment a leader starts; a lease-granting application waits out the
	// leases its predecessor may have granted from then.
	OnLeaderChange func(LeaderChange)
}

// Validate reports what is wrong with o.
func (o *Options) Validate() error {
	switch {
	case o.ID == 0:
		return errors.New("raftnode: Options.ID must be nonzero")
	case o.Dir == "":
		return errors.New("raftnode: Options.Dir is required")
	case o.StateMachine == nil:
		return errors.New("raftnode: Options.StateMachine is required")
	case o.Transport == nil:
		return errors.New("raftnode: Options.Transport is required")
	case o.HeartbeatTicks < 0 || o.ElectionTicks < 0 || o.TickInterval < 0:
		return errors.New("raftnode: negative tick option")
	case o.ElectionTicks > 0 && o.ElectionTicks <= max(o.HeartbeatTicks, 1):
		return fmt.Errorf("raftnode: ElectionTicks %d must exceed HeartbeatTicks %d", o.ElectionTicks, max(o.HeartbeatTicks, 1))
	}
	if len(o.Peers) > 0 {
		if _, ok := o.Peers[o.ID]; !ok {
			return fmt.Errorf("raftnode: Options.Peers lacks this member %d", o.ID)
		}
	}
	return nil
}

func (o *Options) withDefaults() Options {
	d := *o
	if d.FS == nil {
		d.FS = vfs.Default
	}
	if d.TickInterval == 0 {
		d.TickInterval = 50 * time.Millisecond
	}
	if d.ElectionTicks == 0 {
		d.ElectionTicks = 10
	}
	if d.HeartbeatTicks == 0 {
		d.HeartbeatTicks = 1
	}
	if d.SnapshotEvery == 0 {
		d.SnapshotEvery = 10000
	}
	if d.KeepEntries == 0 {
		d.KeepEntries = 1000
	}
	if d.PromoteMaxLag == 0 {
		d.PromoteMaxLag = 100
	}
	if d.Clock == nil {
		d.Clock = SystemClock{}
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	return d
}

// LeaderChange is what OnLeaderChange reports.
type LeaderChange struct {
	Term       uint64
	Leader     uint64 // 0: none known
	LeaderAddr string
	IsLeader   bool // this member leads
}

// Member is one member of the configuration.
type Member struct {
	ID      uint64
	Addr    string
	Learner bool
}

// Status is a member's view of the group.
type Status struct {
	ID         uint64
	Leader     uint64 // 0: none known
	LeaderAddr string
	Term       uint64
	IsLeader   bool
	Applied    uint64   // last entry applied to the state machine
	Members    []Member // by ID
	Removed    bool     // this member was removed from the group
	Err        error    // why the node stopped, if it did
}

// Node is one member of a raft group: it owns a core (RawNode, storage,
// state machine) and the one goroutine that drives it, plus one that
// writes snapshot files. Its methods are safe for concurrent use; those
// that block take a context. Close stops both goroutines and waits.
type Node struct {
	opts    Options
	core    *core
	storage *Storage

	recvc     chan raftpb.Message
	reqc      chan func(*core)
	snapc     chan raftpb.Snapshot
	snapDonec chan snapResult
	stopc     chan struct{}
	donec     chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error

	status atomic.Pointer[Status]

	leaderMu sync.Mutex
	// leaderCh is closed and replaced on every leader change.
	leaderCh chan struct{}
}

type snapResult struct {
	snap raftpb.Snapshot
	err  error
}

var _ Handler = (*Node)(nil)

// Start opens the member's storage in opts.Dir, restores the state machine
// from it (the latest snapshot, then the log after it, re-applied) and
// starts the member.
func Start(opts Options) (*Node, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	o := opts.withDefaults()
	st, err := OpenStorage(o.FS, o.Dir, o.Logger)
	if err != nil {
		return nil, err
	}
	n := &Node{
		opts:      o,
		storage:   st,
		recvc:     make(chan raftpb.Message, 256),
		reqc:      make(chan func(*core), 64),
		snapc:     make(chan raftpb.Snapshot, 1),
		snapDonec: make(chan snapResult, 1),
		stopc:     make(chan struct{}),
		donec:     make(chan struct{}),
		leaderCh:  make(chan struct{}),
	}
	cfg := coreConfig{
		id:            o.ID,
		electionTick:  o.ElectionTicks,
		heartbeatTick: o.HeartbeatTicks,
		snapshotEvery: o.SnapshotEvery,
		keepEntries:   o.KeepEntries,
		promoteMaxLag: o.PromoteMaxLag,
		incarnation:   rand.Uint32(),
		logger:        o.Logger,
		send:          o.Transport.Send,
		setPeer:       o.Transport.SetPeer,
		removePeer:    o.Transport.RemovePeer,
		takeSnapshot:  func(s raftpb.Snapshot) { n.snapc <- s },
		onLeaderChange: func(lc LeaderChange) {
			o.Logger.Info("raftnode: leader changed", "term", lc.Term, "leader", lc.Leader, "self", o.ID, "leading", lc.IsLeader)
			n.leaderMu.Lock()
			close(n.leaderCh)
			n.leaderCh = make(chan struct{})
			n.leaderMu.Unlock()
			if o.OnLeaderChange != nil {
				o.OnLeaderChange(lc)
			}
		},
	}
	n.core, err = newCore(cfg, st, o.StateMachine, o.Peers)
	if err != nil {
		return nil, errors.Join(err, st.Close())
	}
	n.publishStatus()
	o.Transport.Attach(n)
	n.wg.Add(2)
	go n.run()
	go n.writeSnapshots()
	return n, nil
}

func (n *Node) run() {
	defer n.wg.Done()
	defer close(n.donec)
	ticker := n.opts.Clock.NewTicker(n.opts.TickInterval)
	defer ticker.Stop()
	c := n.core
	for {
		select {
		case <-n.stopc:
			c.fail(errors.New("closed"))
			n.publishStatus()
			c.answerPublished()
			return
		case <-ticker.C():
			c.tick()
		case m := <-n.recvc:
			c.step(m)
		case f := <-n.reqc:
			f(c)
		case r := <-n.snapDonec:
			_ = c.snapshotWritten(r.snap, r.err)
		}
		if err := c.handleReady(); err != nil {
			n.opts.Logger.Error("raftnode: storage failed; the member stops", "err", err)
			n.publishStatus()
			c.answerPublished()
			return
		}
		n.publishStatus()
		c.answerPublished()
	}
}

// writeSnapshots writes the snapshots the core takes, off its goroutine:
// the fsync of a large file must not stall heartbeats and proposals.
func (n *Node) writeSnapshots() {
	defer n.wg.Done()
	for {
		select {
		case <-n.stopc:
			return
		case s := <-n.snapc:
			err := n.storage.WriteSnapshotFile(s)
			select {
			case n.snapDonec <- snapResult{s, err}:
			case <-n.stopc:
				return
			}
		}
	}
}

func (n *Node) publishStatus() {
	c := n.core
	st := &Status{
		ID: n.opts.ID, Leader: c.lead, LeaderAddr: c.members[c.lead], Term: c.term,
		IsLeader: c.leading, Applied: c.applied, Removed: c.removed, Err: c.err,
	}
	if old := n.status.Load(); old != nil && old.Leader == st.Leader && old.Term == st.Term &&
		old.IsLeader == st.IsLeader && old.Applied == st.Applied && old.Removed == st.Removed &&
		old.Err == st.Err && len(old.Members) == len(c.confState.Voters)+len(c.confState.Learners) && !c.membersChanged {
		return
	}
	c.membersChanged = false
	for _, id := range c.confState.Voters {
		st.Members = append(st.Members, Member{ID: id, Addr: c.members[id]})
	}
	for _, id := range c.confState.Learners {
		st.Members = append(st.Members, Member{ID: id, Addr: c.members[id], Learner: true})
	}
	sort.Slice(st.Members, func(i, j int) bool { return st.Members[i].ID < st.Members[j].ID })
	n.status.Store(st)
}

// Status returns this member's latest view of the group, without waiting.
func (n *Node) Status() Status { return *n.status.Load() }

// Close stops the member and closes its storage; calls waiting on it
// return ErrStopped. Idempotent.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		n.opts.Transport.Attach(nil)
		close(n.stopc)
		n.wg.Wait()
		n.closeErr = n.storage.Close()
	})
	return n.closeErr
}

// submit runs f on the node's goroutine.
func (n *Node) submit(ctx context.Context, f func(*core)) error {
	select {
	case n.reqc <- f:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-n.donec:
		return n.stoppedErr()
	}
}

func (n *Node) stoppedErr() error {
	if err := n.Status().Err; err != nil {
		return err
	}
	return ErrStopped
}

type outcome struct {
	index  uint64
	result any
	err    error
}

// call runs f on the node's goroutine and waits for the done it is given.
func (n *Node) call(ctx context.Context, f func(*core, done)) (outcome, error) {
	ch := make(chan outcome, 1)
	d := func(index uint64, result any, err error) { ch <- outcome{index, result, err} }
	if err := n.submit(ctx, func(c *core) { f(c, d) }); err != nil {
		return outcome{}, err
	}
	select {
	case o := <-ch:
		return o, o.err
	case <-ctx.Done():
		return outcome{}, ctx.Err()
	case <-n.donec:
		select {
		case o := <-ch:
			return o, o.err
		default:
			return outcome{}, n.stoppedErr()
		}
	}
}

// Propose replicates data and returns once it is committed and applied
// here, with its index and the state machine's result. Only the leader
// takes proposals; another member returns a *NotLeaderError. On
// ErrProposalDropped the entry is certainly not committed; on a ctx error
// or ErrOutcomeUnknown it may be.
func (n *Node) Propose(ctx context.Context, data []byte) (index uint64, result any, err error) {
	o, err := n.call(ctx, func(c *core, d done) { c.propose(data, d) })
	return o.index, o.result, err
}

// ReadIndex returns once this member applied everything committed when it
// was called (confirmed with a quorum by the leader, as raft's ReadIndex
// does), so a read of the state machine after it is linearizable. It works
// on followers too; it waits while no leader is known.
func (n *Node) ReadIndex(ctx context.Context) error {
	_, err := n.call(ctx, func(c *core, d done) { c.readIndex(d) })
	return err
}

// AddLearner adds member id at addr as a learner (a non-voting member that
// receives the log) and returns once the change is applied here. Start
// the new member with empty Peers.
func (n *Node) AddLearner(ctx context.Context, id uint64, addr string) error {
	_, err := n.call(ctx, func(c *core, d done) {
		if _, ok := c.members[id]; ok {
			d(0, nil, fmt.Errorf("raftnode: %d is already a member", id))
			return
		}
		c.proposeConfChange(raftpb.ConfChange{Type: raftpb.ConfChangeAddLearnerNode, NodeID: id, Context: []byte(addr)}, d)
	})
	return err
}

// PromoteLearner makes learner id a voter, if its log is within
// Options.PromoteMaxLag entries of the leader's (else ErrNotCaughtUp).
func (n *Node) PromoteLearner(ctx context.Context, id uint64) error {
	_, err := n.call(ctx, func(c *core, d done) {
		if err := c.learnerCaughtUp(id); err != nil {
			d(0, nil, err)
			return
		}
		c.proposeConfChange(raftpb.ConfChange{Type: raftpb.ConfChangeAddNode, NodeID: id, Context: []byte(c.members[id])}, d)
	})
	return err
}

// RemoveMember removes member id (voter or learner) from the group.
func (n *Node) RemoveMember(ctx context.Context, id uint64) error {
	_, err := n.call(ctx, func(c *core, d done) {
		if _, ok := c.members[id]; !ok {
			d(0, nil, fmt.Errorf("%w: %d", ErrUnknownMember, id))
			return
		}
		c.proposeConfChange(raftpb.ConfChange{Type: raftpb.ConfChangeRemoveNode, NodeID: id}, d)
	})
	return err
}

// TransferLeadership asks the leader (this member) to hand leadership to
// voter to, and returns once this member sees to lead.
func (n *Node) TransferLeadership(ctx context.Context, to uint64) error {
	ask := func() error {
		_, err := n.call(ctx, func(c *core, d done) {
			if !c.leading {
				d(0, nil, c.notLeader())
				return
			}
			isVoter := false
			for _, v := range c.confState.Voters {
				isVoter = isVoter || v == to
			}
			if !isVoter {
				d(0, nil, fmt.Errorf("%w: %d is not a voter", ErrUnknownMember, to))
				return
			}
			c.rn.TransferLeader(to)
			d(0, nil, nil)
		})
		return err
	}
	if err := ask(); err != nil {
		return err
	}
	// raft abandons a transfer whose target does not catch up within an
	// election timeout, and nothing then changes: ask again every two.
	retry := n.opts.Clock.NewTicker(2 * time.Duration(n.opts.ElectionTicks) * n.opts.TickInterval)
	defer retry.Stop()
	for {
		n.leaderMu.Lock()
		ch := n.leaderCh
		n.leaderMu.Unlock()
		st := n.Status()
		if st.Leader == to {
			return nil
		}
		if st.Err != nil {
			return st.Err
		}
		select {
		case <-ch:
		case <-retry.C():
			if st.Leader == st.ID {
				if err := ask(); err != nil {
					return err
				}
			}
		case <-ctx.Done():
			return ctx.Err()
		case <-n.donec:
			return n.stoppedErr()
		}
	}
}

// Step implements Handler: it queues an incoming message for the node's
// goroutine.
func (n *Node) Step(ctx context.Context, m raftpb.Message) error {
	select {
	case n.recvc <- m:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-n.donec:
		return n.stoppedErr()
	}
}

// ReportUnreachable implements Handler.
func (n *Node) ReportUnreachable(id uint64) {
	_ = n.submit(context.Background(), func(c *core) { c.rn.ReportUnreachable(id) })
}

// ReportSnapshot implements Handler.
func (n *Node) ReportSnapshot(id uint64, failed bool) {
	status := raft.SnapshotFinish
	if failed {
		status = raft.SnapshotFailure
	}
	_ = n.submit(context.Background(), func(c *core) { c.rn.ReportSnapshot(id, status) })
}
