package tablemaster

import (
	"time"
)

// Live handoffs. When the primary role of a log-replicated partition moves
// off a server that is still alive — a drain or SIGTERM (OpServerDown with
// Draining), the end of a move (OpMoveDone), placement, a failed engine —
// the old primary may go on serving strong reads from its older map until
// its lease runs out: its heartbeats or its map watch may be slow. Were the
// new primary to serve at once, a write it acknowledged could be followed
// by a read of the old value at the old primary. So the new term starts
// fenced: the partition's Handoff names the old primary and the map version
// that demoted it, and the new primary catches up on the log but takes no
// writes and serves no strong reads (tableserver: UNAVAILABLE
// handoff_pending) until the leader clears it with OpHandoffDone, once
// either
//
//   - the old primary acknowledged its demotion: a heartbeat whose
//     statuses were built from a map at least as new as Handoff.Version
//     (HeartbeatRequest.map_version), so it no longer serves from an older
//     one, or a heartbeat saying it is shutting down (SIGTERM: it admits
//     no client request from then on); or
//   - its lease provably ran out: LeaseGate.HandoffOver, counted on the
//     leader's monotonic clock from when it first saw the handoff, or from
//     its own takeover if later (an earlier leader's stale grants end by
//     then, leasegate.go).
//
// A death needs no fence: the master declared the server dead only after
// DeadAfter > LeaseDuration of silence, so OpServerDown of a dead server
// promotes at once, and a pending handoff whose old primary dies is
// cleared on the next liveness tick.
//
// One mechanism serves every path: State.apply compares the primaries of
// each table a command changed (mutTable records them before the first
// change, see notePrimaries) with the primaries after it, and fences every
// partition whose primary moved off a live server. A new path (split,
// merge, rebalance) that changes tables through mutTable is fenced without
// code of its own.

// OpHandoffDone clears the Handoff of each partition in Handoffs (partition
// id → the Handoff.Version the proposer found over) whose Handoff is still
// that one: its new primary may serve. The string is written to the command
// log: never change or reuse it.
const OpHandoffDone Op = "handoff_done"

// Handoff is a live handoff in progress: the primary role moved off From,
// whose server was alive, in the command that made map Version. A Handoff
// is never modified once set (clones share it).
type Handoff struct {
	From    string `json:"from"`
	Version uint64 `json:"version"`
}

// primariesBefore is a table's primaries before the command being applied
// changed it, by partition index.
type primariesBefore struct {
	id   uint64 // the table's id: a table replaced under its name is not compared
	prim []string
}

// notePrimaries records t's primaries before the command being applied
// changes it (once per table and command); mutTable calls it.
func (s *State) notePrimaries(t *Table) {
	if !t.replicatesByLog() {
		return // no strong reads served by a lease-holding primary through a log
	}
	key := tableKey(t.Tenant, t.Name)
	if _, ok := s.before[key]; ok {
		return
	}
	if s.before == nil {
		s.before = map[string]primariesBefore{}
	}
	b := primariesBefore{id: t.ID, prim: make([]string, len(t.Partitions))}
	for i := range t.Partitions {
		b.prim[i] = primaryID(&t.Partitions[i])
	}
	s.before[key] = b
}

// fenceHandoffs fences every partition whose primary the command just
// applied moved (see the top of the file). It runs after the map version
// was bumped: s.Version is the demoting version.
func (s *State) fenceHandoffs() {
	for key, b := range s.before {
		t := s.Tables[key]
		if t == nil || t.ID != b.id || len(t.Partitions) != len(b.prim) {
			continue // dropped, replaced, or split: nothing to compare with
		}
		for i := range t.Partitions {
			p := &t.Partitions[i]
			if now := primaryID(p); now != b.prim[i] {
				s.fenceTerm(p, b.prim[i], now)
			}
		}
	}
}

// fenceTerm fences p's new term: its primary moved from (the old primary's
// server, "" none) to now ("" none yet).
func (s *State) fenceTerm(p *Partition, from, now string) {
	if h := p.Handoff; h != nil {
		if now == h.From {
			// The old primary is the primary again: nobody else served
			// meanwhile (the fenced one never did).
			p.Handoff = nil
		}
		// Else the earlier old primary still binds: the primary in
		// between never served, so its lease is the one to wait out.
		return
	}
	if from == "" {
		return
	}
	if srv := s.Servers[from]; srv == nil || !srv.Alive {
		return // dead: it was silent past its lease already
	}
	p.Handoff = &Handoff{From: from, Version: s.Version}
}

// handoffClocks is the leader's memory of when it first saw each pending
// handoff, so it can tell when the old primary's lease has run out. Only
// the liveness loop uses it.
type handoffClocks struct {
	// floor: no handoff counts from before it (this master's start as
	// leader plus the gate's Takeover).
	floor time.Time
	seen  map[handoffKey]time.Time
	// none is a map version found with no handoff pending: the scan is
	// skipped until the map moves on (handoffs appear only with it).
	none uint64
}

type handoffKey struct {
	pid     uint64
	version uint64
}

// resetHandoffClocks starts counting afresh from floor: this member just
// started leading (or opened, as a single master).
func (m *Master) resetHandoffClocks(floor time.Time) {
	m.handoffMu.Lock()
	m.handoffs = handoffClocks{floor: floor, seen: map[handoffKey]time.Time{}}
	m.handoffMu.Unlock()
}

// clearHandoffs, run by the leader's liveness loop, proposes OpHandoffDone
// for every pending handoff whose old primary acknowledged its demotion,
// is dead, or whose lease has provably run out.
func (m *Master) clearHandoffs(st *State, now time.Time) {
	gate, lease := m.leaseGate(), m.opts.LeaseDuration
	done := map[uint64]uint64{}
	m.handoffMu.Lock()
	if m.handoffs.seen == nil {
		m.handoffs.seen = map[handoffKey]time.Time{}
	}
	if m.handoffs.none == st.Version && len(m.handoffs.seen) == 0 {
		m.handoffMu.Unlock()
		return
	}
	pending := make(map[handoffKey]bool, len(m.handoffs.seen))
	for _, t := range st.tablesByID() {
		if !t.replicatesByLog() {
			continue
		}
		for i := range t.Partitions {
			p := &t.Partitions[i]
			h := p.Handoff
			if h == nil {
				continue
			}
			k := handoffKey{p.ID, h.Version}
			pending[k] = true
			since, ok := m.handoffs.seen[k]
			if !ok {
				since = now
				m.handoffs.seen[k] = now
			}
			since = maxTime(since, m.handoffs.floor)
			srv := st.Servers[h.From]
			if srv == nil || !srv.Alive || m.demoted(h.From, h.Version) || gate.HandoffOver(since, now, lease) {
				done[p.ID] = h.Version
			}
		}
	}
	for k := range m.handoffs.seen {
		if !pending[k] {
			delete(m.handoffs.seen, k)
		}
	}
	if len(pending) == 0 {
		m.handoffs.none = st.Version
	}
	m.handoffMu.Unlock()
	if len(done) == 0 {
		return
	}
	res, _, err := m.propose(Command{UnixMs: now.UnixMilli(), Payload: HandoffDone{Handoffs: done}}, nil, nil)
	switch {
	case err != nil:
		m.logger.Debug("tablemaster: clear live handoffs", "err", err)
	case res.Changed:
		m.logger.Debug("tablemaster: live handoffs done: the new primaries serve", "partitions", len(done))
	}
}

// demoted reports whether server id told this leader that it serves from
// map version v or later (its latest statuses were built from one), or
// that it is shutting down.
func (m *Master) demoted(id string, v uint64) bool {
	m.liveMu.Lock()
	defer m.liveMu.Unlock()
	l := m.live[id]
	return l != nil && !l.dead && (l.statusVersion >= v || l.draining)
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
