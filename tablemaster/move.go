package tablemaster

import (
	"context"
	"errors"
	"slices"

	"github.com/tabuladb/tabula/api"
)

// Moves with data. A replica of a log-replicated partition moves from one
// server to another in four steps, none of which lowers the partition's
// replication: OpMoveReplica adds the target as a secondary (the log's next
// extent includes it; it copies a snapshot and catches up, see
// tableserver/copy.go); once the target reports itself in sync, OpMoveDone
// hands the primary role to it if the source had it (one epoch bump: the
// old primary's in-flight writes are retried by their clients with their
// request ids) and removes the source. A draining server (tabula server
// drain, or SIGTERM) has every such replica moved off it this way, a few
// at a time (moveLoop).

// Move commands. The strings are written to the command log: never change
// or reuse one.
const (
	// OpMoveReplica starts moving partition PartitionID's replica on
	// ServerID to To (chosen by placement when empty; the logged command
	// names it).
	OpMoveReplica Op = "move_replica"
	// OpReplicaFailed drops partition PartitionID's replica on ServerID,
	// which reported its engine failed (REPLICA_STATE_FAILED); Promote
	// names the new primary if it was the primary. Placement puts a new
	// replica elsewhere, which copies from a healthy one. A partition with
	// no other replica keeps it (there is nothing to copy from).
	OpReplicaFailed Op = "replica_failed"
	// OpMoveDone ends partition PartitionID's move from ServerID to To: the
	// source leaves (the target takes the primary role if the source had
	// it). A move whose target is gone is dropped instead.
	OpMoveDone Op = "move_done"
)

// Move is a partition's replica move in progress.
type Move struct {
	From    string `json:"from"`
	To      string `json:"to"`
	SinceMs int64  `json:"since_ms"`
	// Version is the map version that started the move: only a report
	// built from this map or a newer one speaks for the target's new
	// replica (an older one may be about a replica it held before).
	Version uint64 `json:"version,omitempty"`
}

// movesPerServer bounds the moves off one draining server at a time.
const movesPerServer = 4

func (s *State) moveReplica(cmd *MoveReplica, unixMs int64, chk bool) (Result, error) {
	t, p := s.partition(cmd.PartitionID)
	if p == nil {
		return Result{}, errInvalid("partition_id", "partition_not_found", 0, "no partition %d", cmd.PartitionID)
	}
	if chk {
		switch {
		case p.Log == nil:
			return Result{}, errInvalid("partition_id", "not_replicated", 0, "partition %d is not replicated through a commit log: only those move with their data", p.ID)
		case p.Move != nil:
			return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_UNAVAILABLE, "move_in_progress", "partition %d is moving from %s to %s already", p.ID, p.Move.From, p.Move.To)
		case p.Split != nil:
			// Its children would inherit the target and keep the source
			// (OpSplitDone copies the replicas, not the move): move a
			// child's replica once the split is done.
			return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_UNAVAILABLE, "split_in_progress", "partition %d is splitting (into %d and %d): move a replica of a child once the split is done", p.ID, p.Split.Left, p.Split.Right)
		case !hostsReplica(p, cmd.ServerID):
			return Result{}, errInvalid("server_id", "no_replica", 0, "server %s holds no replica of partition %d", cmd.ServerID, p.ID)
		}
		var others []string
		for _, r := range p.Replicas {
			if r.ServerID != cmd.ServerID {
				others = append(others, r.ServerID)
			}
		}
		if cmd.To == "" {
			// The source is not a host of the result, but it cannot be
			// the target either: it holds the replica being moved (and,
			// having fewest replicas, was the pick after a few moves).
			cands := slices.DeleteFunc(s.candidates(), func(c Candidate) bool { return c.ID == cmd.ServerID })
			picks := Place(cands, others, 1)
			if len(picks) == 0 {
				return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_UNAVAILABLE, "no_target", "no live server in a fault domain partition %d does not use can take its replica from %s", p.ID, cmd.ServerID)
			}
			cmd.To = picks[0]
		}
		to := s.Servers[cmd.To]
		switch {
		case to == nil:
			return Result{}, errServerNotFound(cmd.To)
		case !to.Alive || to.Draining:
			return Result{}, errInvalid("to", "server_unavailable", 0, "server %s is dead or draining", cmd.To)
		case hostsReplica(p, cmd.To):
			return Result{}, errInvalid("to", "has_replica", 0, "server %s already holds a replica of partition %d", cmd.To, p.ID)
		}
		for _, r := range p.Replicas {
			if r.ServerID != cmd.ServerID && s.Servers[r.ServerID] != nil && s.Servers[r.ServerID].FaultDomain == to.FaultDomain {
				return Result{}, errInvalid("to", "fault_domain_taken", 0, "server %s is in fault domain %q, which replica %s of partition %d uses", cmd.To, to.FaultDomain, r.ServerID, p.ID)
			}
		}
	}
	to := s.Servers[cmd.To]
	if p.Move != nil || to == nil || hostsReplica(p, cmd.To) || !hostsReplica(p, cmd.ServerID) {
		return Result{}, nil
	}
	t = s.mutTable(t)
	p = &t.Partitions[p.Index]
	p.Replicas = append(p.Replicas, Replica{ServerID: to.ID, Addr: to.Addr, Role: api.ReplicaRole_REPLICA_ROLE_SECONDARY, FaultDomain: to.FaultDomain})
	p.Move = &Move{From: cmd.ServerID, To: cmd.To, SinceMs: unixMs, Version: s.Version + 1} // the version this command makes
	p.resetLog()
	return Result{Changed: true, Moved: []uint64{p.ID}}, nil
}

func (s *State) replicaFailed(cmd *ReplicaFailed) (Result, error) {
	t, p := s.partition(cmd.PartitionID)
	if p == nil || len(p.Replicas) < 2 {
		return Result{}, nil
	}
	k := slices.IndexFunc(p.Replicas, func(r Replica) bool { return r.ServerID == cmd.ServerID })
	if k < 0 {
		return Result{}, nil
	}
	cands := s.candidates()
	for i := range cands {
		if cands[i].ID == cmd.ServerID {
			cands[i].Available = false // not back where it failed
		}
	}
	t = s.mutTable(t)
	s.dropReplica(t, int(p.Index), k, cmd.Promote[p.ID], cands)
	return Result{Changed: true, Moved: []uint64{p.ID}}, nil
}

func (s *State) moveDone(cmd *MoveDone) (Result, error) {
	t, p := s.partition(cmd.PartitionID)
	if p == nil || p.Move == nil || p.Move.From != cmd.ServerID || p.Move.To != cmd.To {
		return Result{}, nil // done or dropped already
	}
	t = s.mutTable(t)
	p = &t.Partitions[p.Index]
	p.Move = nil
	k := slices.IndexFunc(p.Replicas, func(r Replica) bool { return r.ServerID == cmd.ServerID })
	j := slices.IndexFunc(p.Replicas, func(r Replica) bool { return r.ServerID == cmd.To })
	if k < 0 || j < 0 {
		return Result{Changed: true, Moved: []uint64{p.ID}}, nil // one end is gone: the move is dropped
	}
	if p.Replicas[k].Role == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
		p.Replicas[k].Role = api.ReplicaRole_REPLICA_ROLE_SECONDARY
		p.Replicas[j].Role = api.ReplicaRole_REPLICA_ROLE_PRIMARY
		p.Epoch++
	}
	p.Replicas = slices.Delete(p.Replicas, k, k+1)
	if j = slices.IndexFunc(p.Replicas, func(r Replica) bool { return r.Role == api.ReplicaRole_REPLICA_ROLE_PRIMARY }); j > 0 {
		p.Replicas[0], p.Replicas[j] = p.Replicas[j], p.Replicas[0]
	}
	p.resetLog()
	return Result{Changed: true, Moved: []uint64{p.ID}}, nil
}

// moveLoop, run by the log loop on the leader: finishes moves whose target
// reports itself in sync (or is gone), and starts moves off draining
// servers.
func (m *Master) moveLoop(ctx context.Context) {
	if !m.leads() {
		return
	}
	st := m.State()
	insync := map[uint64]map[string]uint64{} // partition -> server -> map version of the report
	type failure struct {
		pid    uint64
		server string
	}
	var failed []failure
	m.liveMu.Lock()
	for id, l := range m.live {
		if l.dead {
			continue
		}
		for _, r := range l.statuses {
			if r.State == api.ReplicaState_REPLICA_STATE_FAILED {
				failed = append(failed, failure{r.PartitionId, id})
			}
			if r.State == api.ReplicaState_REPLICA_STATE_IN_SYNC {
				if insync[r.PartitionId] == nil {
					insync[r.PartitionId] = map[string]uint64{}
				}
				insync[r.PartitionId][id] = l.statusVersion
			}
		}
	}
	m.liveMu.Unlock()
	for _, f := range failed {
		_, p := st.partition(f.pid)
		if p == nil || !hostsReplica(p, f.server) || len(p.Replicas) < 2 {
			continue
		}
		res, _, err := m.propose(Command{UnixMs: m.opts.Now().UnixMilli(), Payload: ReplicaFailed{PartitionID: f.pid, ServerID: f.server, Promote: m.promotions(st, f.server)}}, nil, nil)
		if err == nil && res.Changed {
			m.logger.Warn("tablemaster: a replica's engine failed; placing a new one", "partition", f.pid, "server", f.server)
			m.event(EventReplicaFailed, f.server, f.pid, "partition %d: the replica on %s failed; placing a new one", f.pid, f.server)
			m.kickLogs()
		}
	}
	moving := map[string]int{} // moves off each server
	// Runs every heartbeat interval: tables without a log (no moves) are
	// skipped whole, and partitions are looked at in place.
	for _, t := range st.tablesByID() {
		if !t.replicatesByLog() {
			continue
		}
		for i := range t.Partitions {
			p := &t.Partitions[i]
			if p.Move == nil {
				continue
			}
			moving[p.Move.From]++
			to := st.Servers[p.Move.To]
			// In sync by a report from the move's map or a newer one: an
			// older report may be about a replica the target held before.
			v, reported := insync[p.ID][p.Move.To]
			if reported && v >= p.Move.Version || !hostsReplica(p, p.Move.To) || to == nil {
				res, _, err := m.propose(Command{UnixMs: m.opts.Now().UnixMilli(), Payload: MoveDone{PartitionID: p.ID, ServerID: p.Move.From, To: p.Move.To}}, nil, nil)
				if err == nil && res.Changed {
					m.logger.Info("tablemaster: replica moved", "partition", p.ID, "from", p.Move.From, "to", p.Move.To)
					m.event(EventMoveDone, p.Move.From, p.ID, "partition %d: replica moved %s -> %s", p.ID, p.Move.From, p.Move.To)
					m.kickLogs()
				}
			}
		}
	}
	for _, id := range st.ServerIDs() {
		srv := st.Servers[id]
		if !srv.Draining || moving[id] >= movesPerServer {
			continue
		}
		for _, t := range st.tablesByID() {
			if !t.replicatesByLog() {
				continue
			}
			for _, p := range t.Partitions {
				if moving[id] >= movesPerServer || p.Move != nil || p.Split != nil || !hostsReplica(&p, id) {
					continue
				}
				res, _, err := m.propose(Command{UnixMs: m.opts.Now().UnixMilli(), Payload: MoveReplica{PartitionID: p.ID, ServerID: id}}, nil, nil)
				switch {
				case err == nil && res.Changed:
					moving[id]++
					m.kickLogs()
				case err != nil && !errors.Is(err, ErrClosed) && ctx.Err() == nil:
					m.logger.Debug("tablemaster: cannot move a replica off a draining server yet", "server", id, "partition", p.ID, "err", err)
				}
			}
		}
	}
}

// MovePartition implements api.MasterServer.
func (m *Master) MovePartition(_ context.Context, req *api.MovePartitionRequest) (*api.MovePartitionResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	st := m.State()
	t, err := lookup(st, "tenant", req.GetTenant(), "table", req.GetTable())
	if err != nil {
		return nil, err
	}
	if int(req.GetIndex()) >= len(t.Partitions) {
		return nil, api.InvalidArgument("index", "partition_not_found", uint64(len(t.Partitions)), "table %s has %d partitions; there is no index %d", t.Name, len(t.Partitions), req.GetIndex())
	}
	p := t.Partitions[req.GetIndex()]
	from := req.GetFrom()
	if from == "" {
		from = primaryID(&p)
	}
	cmd := Command{UnixMs: m.opts.Now().UnixMilli(), Payload: MoveReplica{PartitionID: p.ID, ServerID: from, To: req.GetTo()}}
	_, next, err := m.propose(cmd, nil, nil)
	if err != nil {
		return nil, rpcError("move partition", err)
	}
	_, np := next.partition(p.ID)
	out := &api.MovePartitionResponse{From: from, MapVersion: next.Version}
	if np != nil && np.Move != nil {
		out.To = np.Move.To
	}
	m.logger.Info("tablemaster: moving a replica", "partition", p.ID, "from", from, "to", out.To)
	m.event(EventMove, from, p.ID, "partition %d: moving a replica %s -> %s", p.ID, from, out.To)
	m.kickLogs()
	return out, nil
}

// DrainServer implements api.MasterServer.
func (m *Master) DrainServer(_ context.Context, req *api.DrainServerRequest) (*api.DrainServerResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	st := m.State()
	srv := st.Servers[req.GetServerId()]
	if srv == nil {
		return nil, rpcError("drain server", errServerNotFound(req.GetServerId()))
	}
	if !srv.Alive {
		return nil, rpcError("drain server", errInvalid("server_id", "server_dead", 0,
			"server %s is dead: its replicas are placed again after --replace-after (or forget it: tabula server forget)", req.GetServerId()))
	}
	// Its primaries go to the replicas that reported holding the data
	// (promotions); with none, a primary stays until a move takes it.
	_, next, err := m.propose(Command{UnixMs: m.opts.Now().UnixMilli(), Payload: ServerDown{ServerID: req.GetServerId(), Draining: true, Keep: true, Promote: m.promotions(st, req.GetServerId())}}, nil, nil)
	if err != nil {
		return nil, rpcError("drain server", err)
	}
	var n uint32
	for _, t := range next.Tables {
		for i := range t.Partitions {
			if hostsReplica(&t.Partitions[i], req.GetServerId()) {
				n++
			}
		}
	}
	m.logger.Info("tablemaster: draining a server: its replicas move off", "server", req.GetServerId(), "replicas", n)
	m.event(EventDrain, req.GetServerId(), 0, "server %s draining: %d replicas move off", req.GetServerId(), n)
	m.kickLogs()
	return &api.DrainServerResponse{Replicas: n, MapVersion: next.Version}, nil
}
