package tablemaster

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tabuladb/tabula/api"
)

// Which replicas of a replicated partition are in step, from two
// sources: the primary's report says who is in its log's ack set (its
// extent node's view, ReplicaStatus.ack_set), each replica's own report
// says what it applied, its state and how long ago it was last in step
// with the commit point its primary told it (lag_ms). A replica is in sync
// when it is in the ack set (or the primary, caught up) and within the
// bound: Options.SyncLag behind in time or Options.SyncLagRecords behind
// in records. A secondary out of the ack set is DROPPED whatever its own
// report says (it cannot know: it just hears nothing more). A partition
// with fewer in-sync replicas than its table's replication factor is
// under-replicated: counted (tabula_partitions_under_replicated), shown
// (describe, dashboard) and logged once when it becomes so and once when
// it recovers (checkReplication).

// syncBound is the in-sync bound: in time or in records.
type syncBound struct {
	lag     time.Duration
	records uint64
}

// replicaReport is a server's last report of one replica, as the judge
// sees it.
type replicaReport struct {
	st   *api.ReplicaStatus // nil: none
	age  time.Duration      // since the report came
	down bool               // the server is dead (its report is void)
}

// partitionSync is a judged partition: a ReplicaSync per replica, in
// p.Replicas order, how many are in sync, and why it is short.
type partitionSync struct {
	replicas []*api.ReplicaSync
	inSync   int
	short    bool
	reason   string
}

// judgePartition judges p's replicas (a pure function). rf is the
// table's replication factor; report gives a server's report of p.
func judgePartition(p *Partition, rf int, report func(server string) replicaReport, b syncBound) partitionSync {
	var out partitionSync
	var prim *api.ReplicaStatus
	for _, r := range p.Replicas {
		if r.Role == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
			if rep := report(r.ServerID); !rep.down {
				prim = rep.st
			}
		}
	}
	acks := map[string]*api.AckSetMember{}
	for _, m := range prim.GetAckSet() {
		acks[m.GetServerId()] = m
	}
	var why []string
	for _, r := range p.Replicas {
		rep := report(r.ServerID)
		js := judgeReplica(r, rep, prim, acks[r.ServerID], b)
		out.replicas = append(out.replicas, js)
		if js.State == api.ReplicaState_REPLICA_STATE_IN_SYNC {
			out.inSync++
		} else {
			why = append(why, r.ServerID+": "+js.Reason)
		}
	}
	if len(p.Replicas) < rf {
		why = append(why, fmt.Sprintf("%d of %d replicas placed", len(p.Replicas), rf))
	}
	out.short = out.inSync < rf
	if out.short {
		out.reason = fmt.Sprintf("%d of %d replicas in sync (%s)", out.inSync, rf, strings.Join(why, "; "))
	}
	return out
}

// judgeReplica judges replica r from its report rep, the primary's
// report prim and the primary's view of r in its ack set, ack (nil: r is
// the primary, or every secondary is in the set, or the primary has not
// appended to the open extent yet or did not report).
func judgeReplica(r Replica, rep replicaReport, prim *api.ReplicaStatus, ack *api.AckSetMember, b syncBound) *api.ReplicaSync {
	js := &api.ReplicaSync{LagMs: -1}
	st := rep.st
	switch {
	case rep.down:
		js.Reason = "server down"
		return js
	case st == nil:
		js.Reason = "not reported yet"
		return js
	}
	commit := st.GetCommitLsn()
	if prim != nil {
		commit = prim.GetCommitLsn()
	}
	if commit > st.GetAppliedLsn() {
		js.LagRecords = commit - st.GetAppliedLsn()
	}
	if lag := st.GetLagMs(); lag >= 0 {
		js.LagMs = lag + rep.age.Milliseconds()
	}
	primary := r.Role == api.ReplicaRole_REPLICA_ROLE_PRIMARY
	if primary {
		js.InAckSet, js.LagRecords, js.LagMs = true, 0, 0
	} else if ack != nil {
		js.InAckSet = ack.GetInAckSet()
	} else {
		// The primary lists its ack set only while someone is out of it.
		js.InAckSet = prim != nil
	}
	lag := time.Duration(js.LagMs) * time.Millisecond
	within := js.LagRecords <= b.records || js.LagMs >= 0 && lag <= b.lag
	js.State = st.GetState()
	switch {
	case st.GetState() == api.ReplicaState_REPLICA_STATE_FAILED:
		js.Reason = "failed: it serves nothing and is being replaced"
	case st.GetState() == api.ReplicaState_REPLICA_STATE_COPYING:
		js.Reason = fmt.Sprintf("copying a snapshot (%d of %d bytes)", st.GetCopiedBytes(), st.GetCopyTotalBytes())
	case primary && st.GetState() != api.ReplicaState_REPLICA_STATE_IN_SYNC:
		js.State = api.ReplicaState_REPLICA_STATE_CATCHING_UP
		js.Reason = "a new primary applying the log it inherited"
	case primary:
	case ack != nil && !ack.GetInAckSet() && ack.GetRejoining():
		js.State = api.ReplicaState_REPLICA_STATE_CATCHING_UP
		js.Reason = fmt.Sprintf("out of the log's ack set, rejoining (%s); %s", ack.GetReason(), lagText(js))
	case ack != nil && !ack.GetInAckSet():
		js.State = api.ReplicaState_REPLICA_STATE_DROPPED
		js.Reason = fmt.Sprintf("dropped from the log's ack set (%s); %s", ack.GetReason(), lagText(js))
	case st.GetState() != api.ReplicaState_REPLICA_STATE_IN_SYNC:
		js.State = api.ReplicaState_REPLICA_STATE_CATCHING_UP
		js.Reason = "catching up on the log; " + lagText(js)
	case !within:
		js.State = api.ReplicaState_REPLICA_STATE_CATCHING_UP
		js.Reason = "behind its primary; " + lagText(js)
	}
	return js
}

func lagText(js *api.ReplicaSync) string {
	if js.LagMs < 0 {
		return fmt.Sprintf("%d records behind, not in step since it became a secondary", js.LagRecords)
	}
	return fmt.Sprintf("%d records behind, last in step %v ago", js.LagRecords, time.Duration(js.LagMs)*time.Millisecond)
}

// syncReports is the servers' last reports, by server and partition, and
// how to judge a partition's replicas by them.
type syncReports struct {
	now     time.Time
	st      *State
	reports map[string]map[uint64]*api.ReplicaStatus
	heard   map[string]time.Time
	bound   syncBound
}

// syncReports copies what the liveness table holds (under liveMu).
func (m *Master) syncReports(st *State, now time.Time) *syncReports {
	sr := &syncReports{now: now, st: st, reports: map[string]map[uint64]*api.ReplicaStatus{}, heard: map[string]time.Time{},
		bound: syncBound{lag: m.opts.SyncLag, records: m.opts.SyncLagRecords}}
	m.liveMu.Lock()
	defer m.liveMu.Unlock()
	for id, l := range m.live {
		if l == nil || l.dead {
			continue
		}
		byPart := make(map[uint64]*api.ReplicaStatus, len(l.statuses))
		for _, s := range l.statuses {
			byPart[s.GetPartitionId()] = s
		}
		sr.reports[id], sr.heard[id] = byPart, l.lastHeard
	}
	return sr
}

// judge judges partition p of table t.
func (sr *syncReports) judge(t *Table, p *Partition) partitionSync {
	return judgePartition(p, int(t.Options.Replication), func(id string) replicaReport {
		srv := sr.st.Servers[id]
		byPart, ok := sr.reports[id]
		if srv == nil || !srv.Alive || !ok {
			return replicaReport{down: srv == nil || !srv.Alive}
		}
		return replicaReport{st: byPart[p.ID], age: max(0, sr.now.Sub(sr.heard[id]))}
	}, sr.bound)
}

// withSync returns a copy of status s (of replica i of p) carrying the
// master's judgement, for a DescribeTable answer.
func withSync(s *api.ReplicaStatus, js *api.ReplicaSync) *api.ReplicaStatus {
	c := proto.Clone(s).(*api.ReplicaStatus)
	c.Sync = js
	return c
}

// syncWatch is the leader's record of the partitions short of in-sync
// replicas, for the gauge and the log lines. Safe for concurrent use.
type syncWatch struct {
	mu sync.Mutex
	// Guarded by mu:
	next  time.Time // the next check, by the wall clock
	short map[uint64]*shortPartition
	count int // short ones declared (logged)
}

type shortPartition struct {
	since    time.Time
	declared bool
	table    string
}

// syncCheckEvery paces checkReplication (each walks every partition).
const syncCheckEvery = 500 * time.Millisecond

// checkReplication judges every replicated partition and logs a partition
// that has been short of in-sync replicas for longer than SyncLag (once,
// at WARN, with the reason) and one that recovers (once, at INFO).
// The liveness loop calls it on the leader.
func (m *Master) checkReplication(st *State, now time.Time) {
	w := &m.syncWatch
	w.mu.Lock()
	wall := time.Now()
	if wall.Before(w.next) {
		w.mu.Unlock()
		return
	}
	w.next = wall.Add(min(syncCheckEvery, m.opts.SyncLag/2))
	w.mu.Unlock()

	sr := m.syncReports(st, now)
	type judged struct {
		table string
		ps    partitionSync
	}
	cur := map[uint64]judged{}
	for _, t := range st.Tables {
		for i := range t.Partitions {
			p := &t.Partitions[i]
			if p.Log == nil {
				continue // bulk tables: copies, not a log
			}
			if ps := sr.judge(t, p); ps.short {
				cur[p.ID] = judged{t.Tenant + "/" + t.Name, ps}
			}
		}
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	if w.short == nil {
		w.short = map[uint64]*shortPartition{}
	}
	var events []Event
	for _, id := range slices.Sorted(maps.Keys(w.short)) {
		sp := w.short[id]
		if _, still := cur[id]; still {
			continue
		}
		delete(w.short, id)
		if !sp.declared {
			continue
		}
		w.count--
		if _, p := st.partition(id); p == nil {
			continue // its table was dropped
		}
		m.logger.Info("tablemaster: partition back to its replication factor of in-sync replicas", "table", sp.table, "partition", id,
			"was_short_for", now.Sub(sp.since).Round(time.Millisecond))
		events = append(events, Event{Kind: EventReplicated, Partition: id, Message: fmt.Sprintf("%s partition %d is fully replicated again", sp.table, id)})
	}
	for _, id := range slices.Sorted(maps.Keys(cur)) {
		j := cur[id]
		sp := w.short[id]
		if sp == nil {
			sp = &shortPartition{since: now, table: j.table}
			w.short[id] = sp
		}
		if sp.declared || now.Sub(sp.since) < m.opts.SyncLag {
			continue
		}
		sp.declared = true
		w.count++
		m.logger.Warn("tablemaster: partition under-replicated", "table", j.table, "partition", id, "in_sync", j.ps.inSync, "reason", j.ps.reason)
		events = append(events, Event{Kind: EventUnderReplicated, Partition: id, Message: fmt.Sprintf("%s partition %d under-replicated: %s", j.table, id, j.ps.reason)})
	}
	if len(events) > 0 {
		m.events.add(events...)
	}
}

// underReplicated is how many partitions the leader has declared short
// of in-sync replicas.
func (m *Master) underReplicated() int {
	m.syncWatch.mu.Lock()
	defer m.syncWatch.mu.Unlock()
	return m.syncWatch.count
}
