package tableserver

import (
	"slices"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/replication/partition"
	"github.com/tabuladb/tabula/replication/stream"
)

// When a secondary was last in step with its primary: the fact behind a
// read_any read's staleness bound (writes.go readable) and the lag a
// replica reports (hosting.go). The secondary decides from what it
// knows: its extent replica records the commit length its primary last
// told it and when (stream.Extent.CommitHeard; told at least every
// stream.CommitKeepalive while it is in the ack set). When the tailer has
// read the log up to that length told at time t, and the engine has
// applied the records read, the replica reflects every write committed
// by t: it is in step as of t. A secondary the primary dropped from the
// ack set hears nothing more, so its t stops and its lag grows: it is
// behind by definition once the bound has passed, whether it knows why or
// not.

// maxStepPoints bounds the points read but not yet applied; past it the
// oldest is forgotten, which only makes the replica look staler.
const maxStepPoints = 8

// stepPoint: the tail had observed records up to lsn when it reached the
// commit length told at at.
type stepPoint struct {
	lsn uint64
	at  time.Time
}

// stepTracker is a logReplica's record of being in step; guarded by the
// replica's mu.
type stepTracker struct {
	pending []stepPoint // read, not yet applied; lsn and at ascending
	at      time.Time   // in step as of at (zero: never)
}

// reachedLocked notes a step point and confirms those the engine has
// applied.
func (t *stepTracker) reachedLocked(p stepPoint, applied uint64) {
	if n := len(t.pending); n > 0 && t.pending[n-1].lsn == p.lsn {
		if p.at.After(t.pending[n-1].at) {
			t.pending[n-1].at = p.at
		}
	} else {
		if n == maxStepPoints {
			t.pending = append(t.pending[:0], t.pending[1:]...)
		}
		t.pending = append(t.pending, p)
	}
	t.confirmLocked(applied)
}

// confirmLocked moves the points at or below applied into at.
func (t *stepTracker) confirmLocked(applied uint64) time.Time {
	i := 0
	for ; i < len(t.pending) && t.pending[i].lsn <= applied; i++ {
		if t.pending[i].at.After(t.at) {
			t.at = t.pending[i].at
		}
	}
	if i > 0 {
		t.pending = append(t.pending[:0], t.pending[i:]...)
	}
	return t.at
}

// heardCommit is what a local extent replica had heard of its commit
// point before the tailer read it.
type heardCommit struct {
	told int64
	at   time.Time
}

func heardOf(local *stream.Extent) heardCommit {
	told, at := local.CommitHeard()
	return heardCommit{told, at}
}

// noteInStep records that the tail read the local replica of the open
// extent up to end (every record before it observed): in step as of the
// latest commit told that end covers, now or before the read.
func (l *logReplica) noteInStep(local *stream.Extent, end int64, before heardCommit) {
	h := heardOf(local)
	if end < h.told || h.at.IsZero() {
		h = before
	}
	if end < h.told || h.at.IsZero() {
		return // the primary told it of records it does not have yet
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.want.role != partition.RoleSecondary {
		return
	}
	l.step.reachedLocked(stepPoint{lsn: l.core.Last(), at: h.at}, l.core.Applied())
}

// lag is how far this replica is behind its primary in time: 0 for a
// primary that serves, since the secondary was last in step otherwise;
// ok is false when it has not been in step since it became a secondary
// (or is a primary not serving yet).
func (l *logReplica) lag(now time.Time) (lag time.Duration, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.want.role == partition.RolePrimary {
		return 0, l.caughtUp
	}
	at := l.step.confirmLocked(l.core.Applied())
	if at.IsZero() || l.want.role != partition.RoleSecondary {
		return 0, false
	}
	return max(0, now.Sub(at)), true
}

// lagMs is lag for a status report: ms, -1 when not known.
func (l *logReplica) lagMs(now time.Time) int64 {
	d, ok := l.lag(now)
	if !ok {
		return -1
	}
	return d.Milliseconds()
}

// behindErr refuses a read_any read on a replica that is not in step
// within the header's bound; nil when it may answer.
func (l *logReplica) behindErr(hdr *api.RequestHeader, serverID string, now time.Time) error {
	bound := api.MaxStaleness(hdr)
	d, ok := l.lag(now)
	switch {
	case !ok:
		return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "replica_behind",
			"partition %d on %s has not been in step with its primary since it became a replica of this term (the read allows %v behind): read another replica", l.pid, serverID, bound)
	case d > bound:
		return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "replica_behind",
			"partition %d on %s is %v behind its primary (last in step then; the read allows %v): read another replica", l.pid, serverID, d.Round(time.Millisecond), bound)
	}
	return nil
}

// ackSet is, on a primary, its extent node's view of the secondaries of
// the open extent it appends to, for the status report: the master tells
// a dropped secondary from one in the ack set by it. Nil while every
// secondary is in the set: a heartbeat carries one entry per partition
// only while something is wrong.
func (l *logReplica) ackSet() []*api.AckSetMember {
	l.mu.Lock()
	primary, ext := l.want.role == partition.RolePrimary && l.caughtUp, l.extent
	l.mu.Unlock()
	if !primary || ext == 0 {
		return nil
	}
	secs, ok := l.s.extents.Secondaries(ext)
	if !ok {
		return nil
	}
	if !slices.ContainsFunc(secs, func(sc stream.SecondaryState) bool { return !sc.InAckSet }) {
		return nil
	}
	out := make([]*api.AckSetMember, 0, len(secs))
	for _, sc := range secs {
		m := &api.AckSetMember{ServerId: sc.Node, InAckSet: sc.InAckSet, Rejoining: sc.Rejoining, BehindBytes: sc.Behind, Reason: sc.Reason}
		if !sc.Since.IsZero() {
			m.SinceUnixMs = sc.Since.UnixMilli()
		}
		out = append(out, m)
	}
	return out
}
