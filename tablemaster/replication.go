package tablemaster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/replication/stream"
)

// A point table's partition keeps its writes in a commit log: the stream
// LogStreamName(id), whose open extent lives on the partition's replica
// servers (the primary extent on the primary). Partition.Log.Extent names
// that extent; 0 means the log is being reconfigured (after a replica
// set change or a failed append): the master's log loop seals the last
// extent at the length the reachable replicas agree on and allocates the
// next on the current replicas, then records it (OpPartitionLog). Every
// step is in the command log or re-derivable from the stream manager's
// state, so a master crash at any point resumes: the loop redoes what is
// missing.

// Log commands. The strings are written to the command log: never change
// or reuse one.
const (
	// OpPartitionLog records that Extent, allocated on Servers (primary
	// first), is the open extent of partition PartitionID's log. It is
	// refused (no change) if the partition's epoch or replicas moved on
	// since: the loop allocates again.
	OpPartitionLog Op = "partition_log"
	// OpPartitionLogReset: the open extent Extent of partition
	// PartitionID failed an append (its primary said so); the log is
	// reconfigured, dropping the replicas on Servers (those the seal could
	// not reach). The primary is never dropped this way: it is the one
	// asking.
	OpPartitionLogReset Op = "partition_log_reset"
)

// PartitionLog is where a partition's commit log continues.
type PartitionLog struct {
	Stream string `json:"stream"`
	// Extent is the open extent; 0 while being reconfigured.
	Extent uint64 `json:"extent,omitempty"`
	// Last is the last extent recorded as open (it stays when Extent
	// goes to 0): a reconfiguration seals it, never adopts it again.
	Last uint64 `json:"last,omitempty"`
}

// LogStreamName is the commit-log stream of partition id.
func LogStreamName(id uint64) string { return "log/" + strconv.FormatUint(id, 10) }

// replicatesByLog reports whether t's writes go through a commit log.
func (t *Table) replicatesByLog() bool {
	return t.Kind == api.TableKind_TABLE_KIND_POINT || t.Kind == api.TableKind_TABLE_KIND_ORDERED
}

// resetLog marks p's log for reconfiguration (its replica set changed).
func (p *Partition) resetLog() {
	if p.Log != nil {
		p.Log.Extent = 0
	}
}

// partition finds partition id in any table. A table's partitions have
// consecutive ids from its first (createTable), so it looks at one
// partition per table; a table that split (split.go) has not, and is
// searched whole.
func (s *State) partition(id uint64) (*Table, *Partition) {
	for _, t := range s.Tables {
		n := len(t.Partitions)
		if n == 0 {
			continue
		}
		if first := t.Partitions[0].ID; id >= first {
			if k := id - first; k < uint64(n) && t.Partitions[k].ID == id {
				return t, &t.Partitions[k]
			}
		}
		if t.Resplit {
			for k := range t.Partitions {
				if t.Partitions[k].ID == id {
					return t, &t.Partitions[k]
				}
			}
		}
	}
	return nil, nil
}

// holdsLogReplicas reports whether server id holds a replica of a
// partition replicated through a log.
func (s *State) holdsLogReplicas(id string) bool {
	for _, t := range s.Tables {
		if !t.replicatesByLog() {
			continue
		}
		for i := range t.Partitions {
			if hostsReplica(&t.Partitions[i], id) {
				return true
			}
		}
	}
	return false
}

// hostsReplica reports whether server id holds a replica of p.
func hostsReplica(p *Partition, id string) bool {
	return slices.ContainsFunc(p.Replicas, func(r Replica) bool { return r.ServerID == id })
}

// liveServersOf is serversOf without the replicas whose servers are dead
// or draining (kept until replaced, Command.Keep): the servers the log's
// next extent goes to. The primary stays first.
func (s *State) liveServersOf(p *Partition) []string {
	var out []string
	for _, r := range p.Replicas {
		if srv := s.Servers[r.ServerID]; srv != nil && srv.Alive && (!srv.Draining || r.Role == api.ReplicaRole_REPLICA_ROLE_PRIMARY) {
			out = append(out, r.ServerID)
		}
	}
	return out
}

func serversOf(p *Partition) []string {
	out := make([]string, len(p.Replicas))
	for i, r := range p.Replicas {
		out[i] = r.ServerID
	}
	return out
}

// dropLogStreams deletes the log streams of a dropped table.
func (s *State) dropLogStreams(t *Table) {
	for _, p := range t.Partitions {
		if p.Log != nil {
			_, _ = s.streams().Apply(stream.Command{Op: stream.OpDeleteStream, Stream: p.Log.Stream})
		}
	}
}

// logLoop reconfigures the logs of partitions that need it, every
// HeartbeatInterval and when kicked, until Close.
func (m *Master) logLoop() {
	defer m.wg.Done()
	t := time.NewTicker(m.opts.HeartbeatInterval)
	defer t.Stop()
	var truncated time.Time
	truncating := make(chan struct{}, 1) // full while a truncation runs
	for {
		select {
		case <-m.closing:
			return
		case <-t.C:
		case <-m.logKick:
		}
		m.reconfigureLogs()
		m.moveLoop(m.streamCtx)
		merged := m.mergeLoop(m.streamCtx)
		if m.splitLoop() || merged {
			// Allocate the children's logs now, not a round later: they
			// serve writes only once they have one.
			m.reconfigureLogs()
		}
		m.advanceRollouts()
		if m.truncateDue(&truncated) {
			select {
			case truncating <- struct{}{}:
				// Off the loop: a truncation talks to every log's nodes
				// (up to 30 s) and must not delay a reconfiguration.
				m.wg.Add(1)
				go func() {
					defer m.wg.Done()
					defer func() { <-truncating }()
					ctx, cancel := context.WithTimeout(m.streamCtx, 30*time.Second)
					defer cancel()
					m.truncateLogs(ctx)
				}()
			default: // the last one is still running
			}
		}
	}
}

func (m *Master) kickLogs() {
	select {
	case m.logKick <- struct{}{}:
	default:
	}
}

// logRetryMax bounds the wait between attempts at reconfiguring a
// partition's log.
const logRetryMax = time.Second

// reconfigureLogs gives every partition whose log is being reconfigured
// its next extent. Partitions are independent: one that cannot proceed
// (a replica unreachable) does not hold up the others, and retries with
// backoff (each failed allocation leaves an empty sealed extent behind).
func (m *Master) reconfigureLogs() {
	if !m.leads() {
		return
	}
	st := m.State()
	now := time.Now()
	m.logMu.Lock()
	defer m.logMu.Unlock()
	// Runs every heartbeat interval over every partition: tables without
	// a log are skipped whole, and partitions are looked at in place.
	for _, t := range st.tablesByID() {
		if !t.replicatesByLog() {
			continue
		}
		for i := range t.Partitions {
			p := &t.Partitions[i]
			if p.Log == nil || p.Log.Extent != 0 || len(p.Replicas) == 0 {
				if r := m.logRetry[p.ID]; r != nil && !r.running {
					delete(m.logRetry, p.ID)
				}
				continue
			}
			nodes := st.liveServersOf(p)
			if len(nodes) == 0 || nodes[0] != primaryID(p) {
				continue // its primary's server is down, with no live replica to take over: it waits
			}
			r := m.logRetry[p.ID]
			if r != nil && (r.running || now.Before(r.next)) {
				continue
			}
			if r == nil {
				r = &logRetry{}
				m.logRetry[p.ID] = r
			}
			// Each partition's reconfiguration runs on its own: one
			// stuck on a slow node (up to its 10 s deadline) does not
			// hold up the others, nor this loop's next round.
			r.running = true
			m.wg.Add(1)
			go m.reconfigureOne(*p, int(t.Options.Replication), nodes, r)
		}
	}
	for id, r := range m.logRetry {
		if t, _ := st.partition(id); (t == nil || !t.replicatesByLog()) && !r.running {
			delete(m.logRetry, id) // its table was dropped
		}
	}
}

// reconfigureOne runs one partition's log reconfiguration (a goroutine of
// reconfigureLogs) and records its outcome in r.
func (m *Master) reconfigureOne(p Partition, replicas int, nodes []string, r *logRetry) {
	defer m.wg.Done()
	select {
	case m.logSem <- struct{}{}:
	case <-m.streamCtx.Done():
		m.logMu.Lock()
		r.running = false
		m.logMu.Unlock()
		return
	}
	ctx, cancel := context.WithTimeout(m.streamCtx, 10*time.Second)
	err := m.reconfigureLog(ctx, p, replicas, nodes)
	cancel()
	<-m.logSem
	m.logMu.Lock()
	defer m.logMu.Unlock()
	r.running = false
	if m.streamCtx.Err() != nil {
		return
	}
	if err == nil {
		if m.logRetry[p.ID] == r {
			delete(m.logRetry, p.ID)
		}
		return
	}
	// At most a second between attempts: a partition whose log is being
	// reconfigured takes no writes, and under load a few failures in a
	// row (a node slow to answer while another drains) grew the wait to
	// 5 s, past the 10 s a writer waits in all. Each failed attempt
	// leaves an empty sealed extent: one a second.
	r.wait = min(max(2*r.wait, m.opts.HeartbeatInterval), logRetryMax)
	r.next = time.Now().Add(r.wait)
	if r.since.IsZero() {
		r.since = time.Now()
	}
	if msg := err.Error(); msg != r.lastErr {
		r.lastErr = msg
		// A restart or a move fails a few attempts as a matter of
		// course (a node not up yet): an operator need act only on one
		// that goes on failing.
		lvl := slog.LevelInfo
		if time.Since(r.since) >= logRetryWarnAfter {
			lvl = slog.LevelWarn
		}
		m.logger.Log(context.Background(), lvl, "tablemaster: partition log not reconfigured yet; retrying", "partition", p.ID, "retry_in", r.wait, "failing_for", time.Since(r.since).Round(time.Millisecond), "err", err)
	}
}

// logRetryWarnAfter is how long a partition's log reconfiguration fails
// before its failures are logged as warnings.
const logRetryWarnAfter = 5 * time.Second

// logReconfigureParallel bounds the partitions reconfigured at once.
const logReconfigureParallel = 32

// logRetry is the backoff of one partition's log reconfiguration, under
// Master.logMu.
type logRetry struct {
	running bool // an attempt is under way
	next    time.Time
	wait    time.Duration
	lastErr string
	since   time.Time // the first failure of this run of failures
}

// reconfigureLog seals p's last extent and allocates the next on nodes (p's
// live replicas, primary first), then records it. Idempotent: a crash anywhere is redone by the
// next call.
func (m *Master) reconfigureLog(ctx context.Context, p Partition, replicas int, nodes []string) error {
	d := m.streamDriver
	name := p.Log.Stream
	// Quorum acks: a slow or stopped secondary does not hold the
	// partition's writes (RATIONALE.md, Partition replication).
	if _, err := d.Apply(ctx, stream.Command{Op: stream.OpCreateStream, Stream: name, Replicas: replicas, Ack: stream.AckQuorum}); err != nil && !errors.Is(err, stream.ErrStreamExists) {
		return fmt.Errorf("create log stream %s: %w", name, err)
	}
	info, err := d.Stream(ctx, name)
	if err != nil {
		return err
	}
	if last := info.Last(); last != nil && !last.Sealed {
		if last.ID != p.Log.Last && sameNodes(last, nodes) {
			// Allocated on exactly these replicas by an earlier round
			// that did not get to record it: no primary was told of it,
			// so it is unused.
			return m.recordLog(p, last.ID, nodes)
		}
		unreachable, err := d.Seal(ctx, last.ID)
		if err != nil {
			return fmt.Errorf("seal extent %d of %s: %w", last.ID, name, err)
		}
		var drop []string
		for _, id := range unreachable {
			if slices.Contains(nodes, id) && id != nodes[0] {
				drop = append(drop, id)
			}
		}
		if len(drop) > 0 {
			// Secondaries the seal could not reach leave the replica set
			// (placement adds others, which replay the log).
			_, _, err := m.propose(Command{UnixMs: m.opts.Now().UnixMilli(), Payload: PartitionLogReset{PartitionID: p.ID, Epoch: p.Epoch, Servers: drop}}, nil, nil)
			if err == nil {
				m.kickLogs()
			}
			return err
		}
	}
	info, err = d.SealAndAllocateOn(ctx, name, 0, 0, nodes)
	if err != nil {
		return fmt.Errorf("allocate the next extent of %s on %v: %w", name, nodes, err)
	}
	last := info.Last()
	if last == nil || last.Sealed {
		return fmt.Errorf("log stream %s has no open extent after allocation", name)
	}
	return m.recordLog(p, last.ID, nodes)
}

func (m *Master) recordLog(p Partition, extent uint64, nodes []string) error {
	res, _, err := m.propose(Command{UnixMs: m.opts.Now().UnixMilli(), Payload: PartitionLogAllocated{PartitionID: p.ID, Epoch: p.Epoch, Servers: nodes, Extent: extent}}, nil, nil)
	if err == nil && res.Changed {
		m.logger.Info("tablemaster: partition log continues", "partition", p.ID, "epoch", p.Epoch, "extent", extent, "replicas", nodes)
	}
	return err
}

func sameNodes(e *stream.ExtentPlacement, nodes []string) bool {
	if len(e.Replicas) != len(nodes) {
		return false
	}
	for i, r := range e.Replicas {
		if r.Node != nodes[i] {
			return false
		}
	}
	return true
}

// promotions chooses, for every partition whose primary is on server, the
// secondary that reported the highest applied LSN: it has the least of
// the log to apply before it serves. Reports are the latest heartbeats;
// a secondary that sent none, or only copying or failed, or on a draining
// server, is not chosen. A
// partition none of whose other replicas qualifies gets "": nobody; its
// primary stays on the dead server (OpServerDown with Keep) and the
// partition waits for a replica that has the data (a live replica that
// never reported the partition is new to it, or silent itself). The state
// machine takes the first live replica only when a command names no
// choice at all (logs from before this rule).
func (m *Master) promotions(st *State, server string) map[uint64]string {
	applied := map[uint64]map[string]uint64{} // partition -> server -> LSN
	m.liveMu.Lock()
	for id, l := range m.live {
		if id == server || l.dead {
			continue
		}
		for _, r := range l.statuses {
			if r.GetState() == api.ReplicaState_REPLICA_STATE_COPYING || r.GetState() == api.ReplicaState_REPLICA_STATE_FAILED {
				// A replica still copying holds part of a snapshot (and
				// the log may no longer hold what it lacks); a failed one
				// serves nothing. Neither takes over: the partition waits
				// for a replica that has the data.
				continue
			}
			if applied[r.PartitionId] == nil {
				applied[r.PartitionId] = map[string]uint64{}
			}
			applied[r.PartitionId][id] = r.AppliedLsn
		}
	}
	m.liveMu.Unlock()
	out := map[uint64]string{}
	for _, t := range st.Tables {
		for _, p := range t.Partitions {
			if len(p.Replicas) < 2 || p.Replicas[0].ServerID != server && primaryID(&p) != server {
				continue
			}
			best, bestLSN := "", uint64(0)
			for _, r := range p.Replicas {
				if srv := st.Servers[r.ServerID]; r.ServerID == server || srv == nil || !srv.Alive || srv.Draining {
					// A draining server gives its primaries away: the
					// state machine would not take it, and fall back
					// to any live replica.
					continue
				}
				if lsn, ok := applied[p.ID][r.ServerID]; ok && (best == "" || lsn > bestLSN) {
					best, bestLSN = r.ServerID, lsn
				}
			}
			out[p.ID] = best
		}
	}
	return out
}

func primaryID(p *Partition) string {
	for _, r := range p.Replicas {
		if r.Role == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
			return r.ServerID
		}
	}
	return ""
}

// PartitionLogFailed implements api.MasterServer: a primary's append
// failed; the log is reconfigured and the answer is the new entry once it
// is (or the current one if the primary is stale).
func (m *Master) PartitionLogFailed(ctx context.Context, req *api.PartitionLogFailedRequest) (*api.PartitionLogFailedResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	st := m.State()
	_, p := st.partition(req.PartitionId)
	if p == nil || p.Log == nil {
		return nil, rpcError("partition log failed", errInvalid("partition_id", "no_log", 0, "partition %d has no commit log", req.PartitionId))
	}
	if p.Epoch == req.Epoch && p.Log.Extent == req.Extent {
		m.logger.Warn("tablemaster: partition log append failed; sealing and continuing", "partition", p.ID, "extent", req.Extent, "server", req.ServerId, "reason", req.Reason)
		m.event(EventLogReset, req.ServerId, p.ID, "partition %d: log append on %s failed (%s); sealing extent %d and continuing", p.ID, req.ServerId, req.Reason, req.Extent)
		if _, _, err := m.propose(Command{UnixMs: m.opts.Now().UnixMilli(), Payload: PartitionLogReset{PartitionID: p.ID, Epoch: req.Epoch, Extent: req.Extent}}, nil, nil); err != nil {
			return nil, rpcError("partition log failed", err)
		}
		m.kickLogs()
	}
	// Wait for the next extent (or a change that makes the caller stale).
	for {
		v := m.view.Load()
		_, p := v.state.partition(req.PartitionId)
		if p == nil || p.Log == nil || p.Epoch != req.Epoch || p.Log.Extent != 0 {
			resp := &api.PartitionLogFailedResponse{MapVersion: v.state.Version}
			if p != nil {
				resp.Partition = p.Proto()
			}
			return resp, nil
		}
		select {
		case <-v.changed:
		case <-ctx.Done():
			return nil, rpcError("partition log failed", ctx.Err())
		case <-m.closing:
			return nil, rpcError("partition log failed", ErrClosed)
		}
	}
}
