package tableserver

import (
	"sync/atomic"
	"time"
)

// Lease is a table server's lease from the master and the map version it
// was renewed on: the server serves only while Serves holds (replicaFor
// checks the same two conditions, with an error for each).
//
// It reads no clock: every time is passed in as a duration since the
// origin of the holder's monotonic clock, so a simulation drives it on
// virtual time (tablemaster/raftnode/leasesim_test.go does, with skewed
// clocks). The rules, in the order a heartbeat applies them:
//
//   - The lease runs for the master's lease duration from the moment the
//     holder SENT the request the master answered (a heartbeat or a
//     registration), never from the answer's arrival: the master counts a
//     server's silence from the request's arrival, which is later, so the
//     holder's lease always ends first (by the network delay, plus the
//     master's DeadAfter − LeaseDuration margin).
//   - Every answer raises the minimum map version to the master's: nothing
//     is served from an older map, so a primary deposed while it was away
//     learns it from its map watch before it serves again.
//   - A lease never grows from an older request: Renew keeps the later end.
//
// The zero Lease holds no lease, a duration of 0 and map version 0; set
// the duration the master has not told yet with SetDuration. Safe for
// concurrent use.
type Lease struct {
	end           atomic.Int64  // ns since the clock's origin; 0: no lease
	dur           atomic.Int64  // ns, as the master last told
	minMapVersion atomic.Uint64 // nothing is served from an older map
}

// SetDuration sets the lease duration used by the next Renew; d ≤ 0 keeps
// the current one (a master that did not say).
func (l *Lease) SetDuration(d time.Duration) {
	if d > 0 {
		l.dur.Store(int64(d))
	}
}

// Duration is the lease duration the next Renew uses.
func (l *Lease) Duration() time.Duration { return time.Duration(l.dur.Load()) }

// Answered records what an answer of the master carried: its lease
// duration (≤ 0: unchanged) and its map version (raises MinMapVersion).
// It does not renew the lease: the caller does, with the time it sent the
// request, once the whole call succeeded (Renew).
func (l *Lease) Answered(leaseDur time.Duration, mapVersion uint64) {
	l.SetDuration(leaseDur)
	l.RaiseMinMapVersion(mapVersion)
}

// Renew extends the lease to sentAt + Duration(): a request sent at sentAt
// was answered. An answer to an older request never shortens the lease.
func (l *Lease) Renew(sentAt time.Duration) {
	end := int64(sentAt) + l.dur.Load()
	for {
		cur := l.end.Load()
		if end <= cur || l.end.CompareAndSwap(cur, end) {
			return
		}
	}
}

// Renewed is Answered then Renew: a request sent at sentAt was answered
// with leaseDur and mapVersion.
func (l *Lease) Renewed(sentAt, leaseDur time.Duration, mapVersion uint64) {
	l.Answered(leaseDur, mapVersion)
	l.Renew(sentAt)
}

// RaiseMinMapVersion raises the minimum map version served from to v (a
// lower v changes nothing).
func (l *Lease) RaiseMinMapVersion(v uint64) {
	for {
		cur := l.minMapVersion.Load()
		if v <= cur || l.minMapVersion.CompareAndSwap(cur, v) {
			return
		}
	}
}

// MinMapVersion is the oldest map version the holder may serve from.
func (l *Lease) MinMapVersion() uint64 { return l.minMapVersion.Load() }

// Valid reports whether the lease holds at now.
func (l *Lease) Valid(now time.Duration) bool { return int64(now) < l.end.Load() }

// End is when the lease runs out (0: never held).
func (l *Lease) End() time.Duration { return time.Duration(l.end.Load()) }

// Serves reports whether the holder may serve, at now, from a map of
// version mapVersion: the lease holds and the map is not older than the
// master's at the last answer. Whether it serves a given partition as
// primary is then the map's to say, at the epoch the map gives.
func (l *Lease) Serves(now time.Duration, mapVersion uint64) bool {
	return l.Valid(now) && mapVersion >= l.MinMapVersion()
}
