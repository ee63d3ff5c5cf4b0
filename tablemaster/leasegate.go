package tablemaster

import "time"

// LeaseGate is the master's side of the lease protocol as pure decisions:
// when a server counts as dead (so its partitions may move to a new
// primary at a new epoch), given when it was last heard. It reads no
// clock: the caller passes times read from its own (Options.Now), so a
// simulation drives it on virtual, skewed clocks
// (tablemaster/raftnode/leasesim_test.go).
//
// The argument it encodes (ARCHITECTURE.md, the master; DESIGN §5): a
// server's lease runs for LeaseDuration from when it sent the request the
// master answered; the master counts silence from the request's arrival,
// later, and declares the server dead only after DeadAfter > LeaseDuration
// of it, so the old primary has stopped serving by its own clock before
// any partition moves. A master that starts leading (a raft leader, or a
// single master that opened) cannot know when a predecessor last renewed
// a lease, so it counts every live server as heard at its start plus
// Takeover, the longest an earlier leader may go on granting leases after
// this one started.
//
// A LeaseGate is a value; safe for concurrent use.
type LeaseGate struct {
	// DeadAfter is Options.DeadAfter.
	DeadAfter time.Duration
	// Takeover: 0 for a single master (no other one grants leases); a
	// raft leader's is TakeoverWait of its election timeout.
	Takeover time.Duration
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

// TakeoverWait is a raft leader's Takeover for an election timeout e: how
// long after a new leader starts an earlier one may still answer
// heartbeats (until CheckQuorum steps it down).
func TakeoverWait(electionTimeout time.Duration) time.Duration { return electionTimeout }

// leaseGate is m's LeaseGate.
func (m *Master) leaseGate() LeaseGate {
	g := LeaseGate{DeadAfter: m.opts.DeadAfter}
	if m.raft != nil {
		g.Takeover = TakeoverWait(m.raft.electionTimeout)
	}
	return g
}
