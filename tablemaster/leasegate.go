package tablemaster

import (
	"context"
	"fmt"
	"time"

	"github.com/tabuladb/tabula/api"
)

// MaxClockRateError is how far from true time any member's or server's
// clock may run, as a fraction (1%, far beyond a quartz clock's 50 ppm or
// NTP slewing's 500 ppm): the lease margins (LeaseGate.Check) hold against
// it.
const MaxClockRateError = 0.01

// LeaseGate is the master's side of the lease protocol as pure decisions:
// when a server counts as dead (so its partitions may move to a new
// primary at a new epoch), and when a raft leader may renew a lease. It
// reads no clock: the caller passes times read from its own (Options.Now),
// so a simulation drives it on virtual, skewed clocks
// (tablemaster/raftnode/leasesim_test.go).
//
// The argument it encodes (ARCHITECTURE.md, the master): a server's lease
// runs for LeaseDuration from when it sent the request the master
// answered; the master counts silence from the request's arrival, later,
// and declares the server dead only after DeadAfter > LeaseDuration of it,
// so the old primary has stopped serving by its own clock before any
// partition moves.
//
// With several masters (raft) two more rules bound what an earlier leader
// may still grant. A leader renews a lease only within Confirm of asking,
// successfully, a quorum whether it still leads (a ReadIndex): a later
// leader was elected only after that question (the quorum that answered
// had not voted for it yet), so an earlier leader's last grant comes at
// most Confirm after a later leader's start, whatever its raft clock says
// (a leader paused by SIGSTOP or a stalled VM resumes believing it leads
// until CheckQuorum ticks twice, and it ticks on a clock the pause did not
// advance). A new leader then counts every live server as heard at its
// start plus Takeover ≥ Confirm, so it declares nobody dead before every
// lease an earlier leader may have granted has run out. Check states the
// inequality, with clock rate error.
//
// A LeaseGate is a value; safe for concurrent use.
type LeaseGate struct {
	// DeadAfter is Options.DeadAfter.
	DeadAfter time.Duration
	// Takeover is how long past its start a master that starts leading
	// counts every live server as heard: 0 for a single master (no other
	// one grants leases).
	Takeover time.Duration
	// Confirm is how old a raft leader's latest confirmed leadership may
	// be when it renews a lease; 0: a single master, which needs none.
	Confirm time.Duration
}

// RaftLeaseGate is the gate of a raft member whose election timeout is
// electionTimeout: it confirms and waits one election timeout.
func RaftLeaseGate(deadAfter, electionTimeout time.Duration) LeaseGate {
	return LeaseGate{DeadAfter: deadAfter, Takeover: electionTimeout, Confirm: electionTimeout}
}

// TakeoverHeard is when a master that starts leading at now counts every
// live server as last heard.
func (g LeaseGate) TakeoverHeard(now time.Time) time.Time { return now.Add(g.Takeover) }

// Dead reports whether a server last heard at lastHeard (the zero time:
// never) is dead at now: silent for longer than DeadAfter.
func (g LeaseGate) Dead(lastHeard, now time.Time) bool {
	return g.SilentFor(lastHeard, now, g.DeadAfter)
}

// SilentFor reports whether a server last heard at lastHeard (zero:
// never) has been silent for longer than d at now.
func (g LeaseGate) SilentFor(lastHeard, now time.Time, d time.Duration) bool {
	return lastHeard.IsZero() || now.Sub(lastHeard) > d
}

// HandoffWait is how long, on a master's clock, a lease of duration lease
// may still run after the moment the master's map moved on, with every
// clock's rate off by up to MaxClockRateError: the holder counts the lease
// on its own clock (possibly slow) from a send time before that moment,
// the master counts this on its own (possibly fast).
func HandoffWait(lease time.Duration) time.Duration {
	return time.Duration(float64(lease)*(1+MaxClockRateError)/(1-MaxClockRateError)) + time.Millisecond
}

// HandoffOver reports whether, at now, every lease of duration lease that a
// master answered before since has run out: a live handoff's old primary,
// whose last renewal on the older map came before the map that demoted it
// (since: when the leader saw that map, or its takeover if later), no
// longer serves from the older map.
func (g LeaseGate) HandoffOver(since, now time.Time, lease time.Duration) bool {
	return now.Sub(since) > HandoffWait(lease)
}

// MayGrant reports whether a leader may renew a lease at now (answer a
// heartbeat or a registration) when a quorum last confirmed its
// leadership for a question asked at confirmed (zero: never).
func (g LeaseGate) MayGrant(confirmed, now time.Time) bool {
	return g.Confirm == 0 || (!confirmed.IsZero() && now.Sub(confirmed) <= g.Confirm)
}

// Check reports whether leases of duration lease are safe under the gate
// with every clock's rate off by up to MaxClockRateError: an earlier
// leader's last grant (at most Confirm after a later leader's start) plus
// the lease, both on fast clocks, end before the later leader's Takeover
// plus DeadAfter, on a slow one.
func (g LeaseGate) Check(lease time.Duration) error {
	last := float64(g.Confirm+lease) * (1 + MaxClockRateError)
	first := float64(g.Takeover+g.DeadAfter) * (1 - MaxClockRateError)
	if g.Takeover < g.Confirm || last >= first {
		need := time.Duration(last/(1-MaxClockRateError)) - g.Takeover + time.Millisecond
		return fmt.Errorf("tablemaster: DeadAfter %v is too close to LeaseDuration %v: a partition could move while its old primary still holds a lease "+
			"(clocks may run %.0f%% off and a raft leader confirms its leadership every %v: DeadAfter must be at least %v)",
			g.DeadAfter, lease, MaxClockRateError*100, g.Confirm, need.Round(time.Millisecond))
	}
	return nil
}

// raftElectionTicks is a raft member's election timeout in RaftTicks.
const raftElectionTicks = 10

// leaseGate is m's LeaseGate.
func (m *Master) leaseGate() LeaseGate {
	if m.raft != nil {
		return RaftLeaseGate(m.opts.DeadAfter, m.raft.electionTimeout)
	}
	return LeaseGate{DeadAfter: m.opts.DeadAfter}
}

// mayGrantLease refuses a heartbeat or registration (UNAVAILABLE: the
// server tries another master) while this leader's leadership is not
// freshly confirmed (LeaseGate.MayGrant).
func (m *Master) mayGrantLease() error {
	if m.raft == nil {
		return nil
	}
	confirmed := time.Time{}
	if ns := m.raft.confirmed.Load(); ns != 0 {
		confirmed = time.Unix(0, ns)
	}
	if !m.leaseGate().MayGrant(confirmed, m.opts.Now()) {
		return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "leadership_unconfirmed",
			"tablemaster: this leader has not confirmed its leadership with a quorum within %v; it renews no lease", m.raft.electionTimeout)
	}
	return nil
}

// confirmLeadership keeps, while this member leads term, the quorum's
// confirmation fresh (raftState.confirmed): a ReadIndex every quarter of
// the gate's Confirm window, recording when it was asked.
func (m *Master) confirmLeadership(term uint64) {
	defer m.wg.Done()
	every := max(m.leaseGate().Confirm/4, time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-m.streamCtx.Done():
			return
		case <-t.C:
		}
		if st := m.raft.node.Status(); !st.IsLeader || st.Term != term {
			return
		}
		m.confirmLeader(term, every*4)
	}
}

// confirmLeader asks a quorum whether this member still leads term and,
// if so, records when it asked. It reports whether it does.
func (m *Master) confirmLeader(term uint64, timeout time.Duration) bool {
	asked := m.opts.Now()
	ctx, cancel := context.WithTimeout(m.streamCtx, timeout)
	err := m.raft.node.ReadIndex(ctx)
	cancel()
	if err != nil {
		return false
	}
	if st := m.raft.node.Status(); !st.IsLeader || st.Term != term {
		return false
	}
	m.raft.confirmed.Store(asked.UnixNano())
	return true
}
