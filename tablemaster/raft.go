package tablemaster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/auth"
	"github.com/tabuladb/tabula/tablemaster/raftnode"
)

// A replicated master is one member of a raft group (raftnode): the
// command log is the raft log, and every member applies each committed
// command, as logged (State.ApplyLogged), to its copy of the State. Only
// the leader proposes: it validates a command against its state
// (State.ApplyChecked), proposes what is to be logged, and answers once
// its own member applied it. Only the leader takes the master's calls
// (followers answer UNAVAILABLE not_leader, naming the leader), grants
// leases through heartbeats and runs the loops that change the state
// (liveness, logs, stream tasks); any member serves map watches from the
// state it applied.
//
// A new leader first applies everything earlier leaders committed (a
// ReadIndex), then counts every live server as heard now plus an
// election timeout: no server is declared dead, and no partition moves,
// before the longest lease an earlier leader may still have granted has
// run out.

// raftDirName is the raft member's directory in Options.DataDir.
const raftDirName = "raft"

// raftState is a replicated master's raft side.
type raftState struct {
	node      *raftnode.Node
	transport *raftnode.GRPCTransport
	// leading: this member leads and has applied every earlier command.
	leading    atomic.Bool
	leaderAddr atomic.Pointer[string]
	// leaseGranted: a heartbeat was answered since this member last
	// became the leader (logged once: when leases flow again).
	leaseGranted atomic.Bool
	// electionTimeout is how long a deposed leader may go on believing it
	// leads (CheckQuorum steps it down within it).
	electionTimeout time.Duration
	// confirmed is when (Options.Now, unix ns) this leader last asked a
	// quorum, successfully, whether it leads; 0: not since it started
	// leading. Leases are renewed only while it is fresh (leasegate.go).
	confirmed atomic.Int64
}

// applied is what the state machine's Apply returns for one command.
type applied struct {
	res   Result
	state *State
	err   error
}

// masterSM is the State as raftnode's state machine. Apply, Snapshot and
// Restore run on the raft node's goroutine, the only publisher of a
// replicated master's state.
type masterSM struct{ m *Master }

func (sm masterSM) Apply(index uint64, data []byte) any {
	var e logEntry
	if err := json.Unmarshal(data, &e); err != nil {
		// Every member fails it alike: the state stays as it was.
		return applied{err: fmt.Errorf("tablemaster: raft entry %d does not decode: %w", index, err)}
	}
	cur := sm.m.view.Load().state
	next := cur.successor()
	res, err := next.ApplyLogged(e.Cmd)
	next.seal()
	if err != nil {
		return applied{err: err, state: cur}
	}
	if res.Changed {
		sm.m.publishLocked(next)
		return applied{res: res, state: next}
	}
	return applied{res: res, state: cur}
}

func (sm masterSM) Snapshot() ([]byte, error) {
	return json.Marshal(snapshotBody{State: sm.m.view.Load().state})
}

func (sm masterSM) Restore(data []byte) error {
	var body snapshotBody
	if err := json.Unmarshal(data, &body); err != nil {
		return fmt.Errorf("tablemaster: raft snapshot does not decode: %w", err)
	}
	if st := body.State; st == nil || st.Tenants == nil || st.Tables == nil || st.Servers == nil {
		return fmt.Errorf("%w: raft snapshot lacks state", ErrCorrupt)
	}
	sm.m.publishLocked(body.State)
	return nil
}

// openRaft starts the raft member of m (Options.RaftID set). The state
// starts empty; raftnode restores it from its snapshot and log.
func (m *Master) openRaft() error {
	if _, err := os.Stat(filepath.Join(m.opts.DataDir, logFileName)); err == nil {
		return fmt.Errorf("tablemaster: %s holds a single master's state (%s): a raft member (--id) needs a directory of its own; "+
			"start it on a new directory, or run this one without --id/--peers", m.opts.DataDir, logFileName)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("tablemaster: %w", err)
	}
	init := NewState()
	m.view.Store(&view{state: init, changed: make(chan struct{}), mv: newMapVersion(nil, init)})
	r := &raftState{transport: raftnode.NewGRPCTransport(m.opts.RaftID, m.logger.With("part", "raft"), m.dialOptions()...)}
	none := ""
	r.leaderAddr.Store(&none)
	tick := m.opts.RaftTick
	const electionTicks = raftElectionTicks
	r.electionTimeout = electionTicks * tick
	m.raft = r
	node, err := raftnode.Start(raftnode.Options{
		ID: m.opts.RaftID, Dir: filepath.Join(m.opts.DataDir, raftDirName), StateMachine: masterSM{m},
		Transport: r.transport, Peers: m.opts.Peers, TickInterval: tick, ElectionTicks: electionTicks,
		SnapshotEvery: uint64(m.opts.SnapshotEvery) * 8, Logger: m.logger.With("part", "raft"),
		OnLeaderChange: m.onLeaderChange,
	})
	if err != nil {
		return errors.Join(fmt.Errorf("tablemaster: start raft member %d: %w", m.opts.RaftID, err), r.transport.Close())
	}
	r.node = node
	return nil
}

// onLeaderChange runs on the raft node's goroutine: it must not block.
func (m *Master) onLeaderChange(lc raftnode.LeaderChange) {
	addr := lc.LeaderAddr
	m.raft.leaderAddr.Store(&addr)
	if !lc.IsLeader {
		m.raft.confirmed.Store(0)
		if m.raft.leading.Swap(false) {
			m.logger.Warn("tablemaster: no longer the leader", "term", lc.Term, "leader", lc.Leader, "leader_addr", addr)
			m.event(EventLeader, "", 0, "member %d no longer leads (term %d; leader %d at %s)", m.opts.RaftID, lc.Term, lc.Leader, addr)
		}
		return
	}
	m.wg.Add(1)
	go m.becomeLeader(lc.Term)
}

// becomeLeader makes this member serve as the leader of term: once it has
// applied every earlier command, with every live server heard now (see the
// top of the file).
func (m *Master) becomeLeader(term uint64) {
	defer m.wg.Done()
	ctx, cancel := context.WithTimeout(m.streamCtx, 10*time.Second)
	defer cancel()
	asked := m.opts.Now()
	if err := m.raft.node.ReadIndex(ctx); err != nil {
		m.logger.Warn("tablemaster: elected, but could not catch up; waiting for the next election", "term", term, "err", err)
		return
	}
	if st := m.raft.node.Status(); !st.IsLeader || st.Term != term {
		return
	}
	m.raft.confirmed.Store(asked.UnixNano())
	m.wg.Add(1)
	go m.confirmLeadership(term)
	heard := m.leaseGate().TakeoverHeard(m.opts.Now())
	m.liveMu.Lock()
	clear(m.live)
	for id, srv := range m.State().Servers {
		if srv.Alive {
			m.live[id] = &liveness{lastHeard: heard}
		}
	}
	m.liveMu.Unlock()
	// Pending handoffs count from the takeover: an earlier leader may
	// have renewed an old primary's lease on an older map until then.
	m.resetHandoffClocks(heard)
	m.raft.leaseGranted.Store(false)
	m.raft.leading.Store(true)
	// Leadership may have ended between the check above and the store (its
	// notice cleared a flag not yet set): check again, or a follower would
	// take calls as the leader until the next change.
	if st := m.raft.node.Status(); !st.IsLeader || st.Term != term {
		m.raft.leading.Store(false)
		return
	}
	m.logger.Info("tablemaster: leading", "term", term, "member", m.opts.RaftID, "version", m.State().Version)
	m.event(EventLeader, "", 0, "member %d leads (term %d)", m.opts.RaftID, term)
	if _, ok := m.State().Tenants[api.DefaultTenant]; !ok {
		if _, _, err := m.propose(Command{UnixMs: m.opts.Now().UnixMilli(), Payload: CreateTenant{Tenant: api.DefaultTenant, Keys: [][]byte{auth.NewKey(), auth.NewKey()}}}, nil, nil); err != nil {
			m.logger.Error("tablemaster: bootstrap the default tenant", "err", err)
		}
	}
	m.kickLogs()
}

// leads reports whether this master may change the state: always for a
// single master; for a raft member, while it leads.
func (m *Master) leads() bool { return m.raft == nil || m.raft.leading.Load() }

// notLeader is the error followers answer with.
func (m *Master) notLeader() error {
	addr := ""
	if p := m.raft.leaderAddr.Load(); p != nil {
		addr = *p
	}
	msg := "this master is not the leader"
	if addr != "" {
		msg += "; the leader is " + addr
	} else {
		msg += "; no leader is elected yet"
	}
	return api.Status(&api.ErrorDetail{Code: api.ErrorCode_ERROR_CODE_UNAVAILABLE, Reason: "not_leader", Leader: addr}, msg)
}

// proposeRaft is propose for a raft member: validate on the leader,
// commit through raft, answer with what this member applied.
func (m *Master) proposeRaft(cmd Command, check func(*State) bool, after func(Result)) (Result, *State, error) {
	m.proposeMu.Lock()
	defer m.proposeMu.Unlock()
	if m.streamCtx.Err() != nil {
		return Result{}, nil, ErrClosed
	}
	if !m.raft.leading.Load() {
		return Result{}, nil, m.notLeader()
	}
	cur := m.view.Load().state
	if check != nil && !check(cur) {
		return Result{}, cur, nil
	}
	_, res, logged, err := successor(cur, cmd)
	if err != nil {
		return Result{}, cur, err
	}
	if !res.Changed {
		if after != nil {
			after(res)
		}
		return res, cur, nil
	}
	data, err := json.Marshal(logEntry{Cmd: logged})
	if err != nil {
		return Result{}, cur, fmt.Errorf("tablemaster: encode command: %w", err)
	}
	ctx, cancel := context.WithTimeout(m.streamCtx, 10*time.Second)
	defer cancel()
	_, out, err := m.raft.node.Propose(ctx, data)
	if err != nil {
		var nl *raftnode.NotLeaderError
		switch {
		case errors.As(err, &nl), errors.Is(err, raftnode.ErrProposalDropped):
			return Result{}, cur, m.notLeader()
		case errors.Is(err, raftnode.ErrStopped):
			return Result{}, cur, ErrClosed
		}
		return Result{}, cur, api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "outcome_unknown", "tablemaster: the command may or may not have been committed: %v", err)
	}
	a, _ := out.(applied)
	if a.err != nil {
		return Result{}, cur, a.err
	}
	if after != nil {
		after(a.res)
	}
	return a.res, a.state, nil
}

// anyMemberMethods are the master calls every raft member answers: the
// map watch (from the state it applied) and the membership listing.
var anyMemberMethods = map[string]bool{
	"/tabula.v1.Master/WatchPartitionMap": true,
	"/tabula.v1.Master/MasterMembers":     true,
}

// readMethods answer from the state: on a raft leader they first confirm
// with a quorum that it still leads and has applied everything committed
// (ReadIndex), so a deposed leader that has not noticed yet never answers
// with a stale catalog or map.
var readMethods = map[string]bool{
	"/tabula.v1.Master/GetPartitionMap": true,
	"/tabula.v1.Master/DescribeTable":   true,
	"/tabula.v1.Master/ListTables":      true,
	"/tabula.v1.Master/ListServers":     true,
	"/tabula.v1.Master/ListDataLoss":    true,
	"/tabula.v1.Master/BulkStatus":      true,
	"/tabula.v1.Master/CoprocList":      true,
}

func (m *Master) leaderOnlyUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if m.raft != nil && !anyMemberMethods[info.FullMethod] && strings.HasPrefix(info.FullMethod, "/tabula.v1.Master/") {
		if !m.leads() {
			return nil, m.notLeader()
		}
		if readMethods[info.FullMethod] {
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			err := m.raft.node.ReadIndex(rctx)
			cancel()
			if err != nil || !m.leads() {
				return nil, m.notLeader()
			}
		}
	}
	return h(ctx, req)
}

func (m *Master) leaderOnlyStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if m.raft != nil && !anyMemberMethods[info.FullMethod] && strings.HasPrefix(info.FullMethod, "/tabula.v1.Master/") && !m.leads() {
		return m.notLeader()
	}
	return h(srv, ss)
}

// MasterMembers implements api.MasterServer.
func (m *Master) MasterMembers(context.Context, *api.MasterMembersRequest) (*api.MasterMembersResponse, error) {
	if m.raft == nil {
		return &api.MasterMembersResponse{Replicated: false}, nil
	}
	st := m.raft.node.Status()
	out := &api.MasterMembersResponse{Replicated: true, Term: st.Term, Self: st.ID, Applied: st.Applied}
	for _, mb := range st.Members {
		raftAddr := m.raft.transport.PeerAddr(mb.ID)
		if mb.ID == st.ID {
			if raftAddr = m.InternalAddr(); raftAddr == "" {
				raftAddr = mb.Addr
			}
		}
		out.Members = append(out.Members, &api.MasterMember{Id: mb.ID, Addr: mb.Addr, Learner: mb.Learner, Leader: mb.ID == st.Leader, RaftAddr: raftAddr})
	}
	return out, nil
}

func (m *Master) needRaft() error {
	if m.raft == nil {
		return api.Errorf(api.ErrorCode_ERROR_CODE_UNIMPLEMENTED, "not_replicated", "this master runs alone (no --id/--peers): it has no members to change")
	}
	return nil
}

// AddMaster implements api.MasterServer.
func (m *Master) AddMaster(ctx context.Context, req *api.AddMasterRequest) (*api.AddMasterResponse, error) {
	if err := m.needRaft(); err != nil {
		return nil, err
	}
	if req.GetId() == 0 || req.GetAddr() == "" {
		return nil, api.InvalidArgument("id", "member_invalid", 0, "a member needs a nonzero id and an address")
	}
	if err := m.raft.node.AddLearner(ctx, req.GetId(), req.GetAddr()); err != nil {
		return nil, raftErr("add member", err)
	}
	m.logger.Info("tablemaster: member added as a learner", "id", req.GetId(), "addr", req.GetAddr())
	if !req.GetPromote() {
		return &api.AddMasterResponse{}, nil
	}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		err := m.raft.node.PromoteLearner(ctx, req.GetId())
		if err == nil {
			m.logger.Info("tablemaster: member promoted to voter", "id", req.GetId())
			return &api.AddMasterResponse{}, nil
		}
		if !errors.Is(err, raftnode.ErrNotCaughtUp) && !errors.Is(err, raftnode.ErrConfChangeInProgress) {
			return nil, raftErr("promote member", err)
		}
		select {
		case <-ctx.Done():
			return nil, api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "not_caught_up", "member %d was added as a learner but has not caught up yet (%v); add it again with promote to retry", req.GetId(), err)
		case <-t.C:
		}
	}
}

// RemoveMaster implements api.MasterServer.
func (m *Master) RemoveMaster(ctx context.Context, req *api.RemoveMasterRequest) (*api.RemoveMasterResponse, error) {
	if err := m.needRaft(); err != nil {
		return nil, err
	}
	if err := m.raft.node.RemoveMember(ctx, req.GetId()); err != nil {
		return nil, raftErr("remove member", err)
	}
	m.logger.Info("tablemaster: member removed", "id", req.GetId())
	return &api.RemoveMasterResponse{}, nil
}

// TransferLeader implements api.MasterServer.
func (m *Master) TransferLeader(ctx context.Context, req *api.TransferLeaderRequest) (*api.TransferLeaderResponse, error) {
	if err := m.needRaft(); err != nil {
		return nil, err
	}
	if err := m.raft.node.TransferLeadership(ctx, req.GetTo()); err != nil {
		return nil, raftErr("transfer leadership", err)
	}
	return &api.TransferLeaderResponse{}, nil
}

func raftErr(what string, err error) error {
	var nl *raftnode.NotLeaderError
	switch {
	case errors.As(err, &nl):
		return api.Status(&api.ErrorDetail{Code: api.ErrorCode_ERROR_CODE_UNAVAILABLE, Reason: "not_leader", Leader: nl.LeaderAddr}, what+": "+err.Error())
	case errors.Is(err, raftnode.ErrUnknownMember):
		return api.Errorf(api.ErrorCode_ERROR_CODE_NOT_FOUND, "member_not_found", "%s: %v", what, err)
	case errors.Is(err, raftnode.ErrNotCaughtUp), errors.Is(err, raftnode.ErrConfChangeInProgress):
		return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "membership_busy", "%s: %v", what, err)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "timeout", "%s: %v", what, err)
	}
	return api.Errorf(api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "membership_refused", "%s: %v", what, err)
}

// Leads reports whether this master takes changes now: a single master
// always; a raft member while it leads and has caught up.
func (m *Master) Leads() bool { return m.leads() }
