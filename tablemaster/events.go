package tablemaster

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// Events: what the operator wants to see happened recently (the
// dashboard's "recent events"). They are memory only, kept by the master
// that did the thing (a new leader starts with none), in a ring of the
// last maxEvents: older ones are in the logs, which record the same
// moments. Each recording site is a one-line call next to the log line it
// mirrors.

// maxEvents bounds the ring: a server declared dead records one event per
// failed-over partition, so 512 holds a large failover and what led to it.
const maxEvents = 512

// EventKind names what happened. Strings in the dashboard's JSON: never
// change or reuse.
type EventKind string

// Event kinds.
const (
	EventServerDead    EventKind = "server_dead"    // a silent server was declared dead
	EventFailover      EventKind = "failover"       // a partition got a new primary
	EventReplaced      EventKind = "replaced"       // a dead server's replicas were placed elsewhere
	EventPlaced        EventKind = "placed"         // partitions short of replicas were placed again
	EventMove          EventKind = "move"           // a replica move started
	EventMoveDone      EventKind = "move_done"      // a replica move finished
	EventDrain         EventKind = "drain"          // a server was drained
	EventForget        EventKind = "forget"         // an operator forgot a dead server
	EventReplicaFailed EventKind = "replica_failed" // a replica's engine failed
	EventLogReset      EventKind = "log_reset"      // a partition log was sealed and continued
	EventLeader        EventKind = "leader"         // this raft member started or stopped leading
	EventThrottled     EventKind = "throttled"      // a tenant is refused over a quota
	EventUnthrottled   EventKind = "unthrottled"    // ... and no longer is
	// A partition has had fewer in-sync replicas than its replication
	// factor for longer than the in-sync bound (insync.go) ...
	EventUnderReplicated EventKind = "under_replicated"
	EventReplicated      EventKind = "replicated" // ... and no longer has
)

// Event is one thing that happened.
type Event struct {
	Seq       uint64    `json:"seq"`
	UnixMs    int64     `json:"unix_ms"`
	Kind      EventKind `json:"kind"`
	Server    string    `json:"server,omitempty"`
	Tenant    string    `json:"tenant,omitempty"`
	Partition uint64    `json:"partition,omitempty"`
	Message   string    `json:"message"`
}

// eventRing is a bounded ring of Events; its zero value is empty and
// ready. Safe for concurrent use.
type eventRing struct {
	mu   sync.Mutex
	buf  []Event // at most maxEvents; buf[next] is the oldest once full
	next int
	seq  uint64
	// throttled is the tenants last seen refused over a quota, and when
	// noteThrottling last looked (it looks once a second).
	throttled map[string]bool
	looked    time.Time
}

// add appends events, together: a reader sees all of them or none.
func (r *eventRing) add(events ...Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range events {
		r.seq++
		e.Seq = r.seq
		if len(r.buf) < maxEvents {
			r.buf = append(r.buf, e)
			continue
		}
		r.buf[r.next] = e
		r.next = (r.next + 1) % maxEvents
	}
}

// recent returns up to n events, newest first.
func (r *eventRing) recent(n int) []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Event, 0, min(n, len(r.buf)))
	for i := 0; i < len(r.buf) && len(out) < n; i++ {
		j := (r.next - 1 - i + 2*len(r.buf)) % len(r.buf)
		out = append(out, r.buf[j])
	}
	return out
}

// event records an event at the master's clock.
func (m *Master) event(kind EventKind, server string, partition uint64, format string, args ...any) {
	m.events.add(Event{UnixMs: m.opts.Now().UnixMilli(), Kind: kind, Server: server, Partition: partition, Message: fmt.Sprintf(format, args...)})
}

// noteServerDown records a server declared dead (OpServerDown proposed by
// the liveness loop: before is the state it was decided on, after the
// one it made) and one failover event per partition whose primary it
// was.
func (m *Master) noteServerDown(before, after *State, id string, res Result, err error) {
	if err != nil || !res.Changed || after == nil {
		return
	}
	msg := fmt.Sprintf("server %s declared dead (silent for %v): %d partitions moved", id, m.opts.Now().Sub(m.lastHeard(id)).Round(time.Millisecond), len(res.Moved))
	if len(res.Held) > 0 {
		msg += fmt.Sprintf(", %d UNAVAILABLE until it returns (its only copy)", len(res.Held))
	}
	events := []Event{{UnixMs: m.opts.Now().UnixMilli(), Kind: EventServerDead, Server: id, Message: msg}}
	m.events.add(append(events, m.failovers(before, after, id)...)...)
}

// failovers are the events of the partitions whose primary was server id
// in before and is another server (or none) in after.
func (m *Master) failovers(before, after *State, id string) []Event {
	var out []Event
	for _, t := range before.tablesByID() {
		for i := range t.Partitions {
			p := &t.Partitions[i]
			if primaryID(p) != id {
				continue
			}
			_, np := after.partition(p.ID)
			if np == nil {
				continue
			}
			to := primaryID(np)
			if to == id {
				continue
			}
			e := Event{UnixMs: m.opts.Now().UnixMilli(), Kind: EventFailover, Server: id, Tenant: t.Tenant, Partition: p.ID}
			if to == "" {
				e.Message = fmt.Sprintf("%s/%s partition %d: primary %s lost, no replica to promote (epoch %d)", t.Tenant, t.Name, p.Index, id, np.Epoch)
			} else {
				e.Message = fmt.Sprintf("%s/%s partition %d: primary %s -> %s (epoch %d -> %d)", t.Tenant, t.Name, p.Index, id, to, p.Epoch, np.Epoch)
			}
			out = append(out, e)
		}
	}
	return out
}

// noteThrottling records, at most once a second, the tenants that started
// or stopped being refused over a quota (SERVER_BUSY over a rate,
// QUOTA_EXCEEDED over a size), from the servers' last reports. The leader
// calls it from its liveness loop.
func (m *Master) noteThrottling(now time.Time) {
	r := &m.events
	r.mu.Lock()
	if now.Sub(r.looked) < time.Second {
		r.mu.Unlock()
		return
	}
	r.looked = now
	was := r.throttled
	r.mu.Unlock()

	type refused struct{ busy, quota float64 }
	cur := map[string]refused{}
	q := m.quotas
	q.mu.Lock()
	for _, sl := range q.loads {
		if now.Sub(sl.at) > quotaStaleAfter {
			continue
		}
		for name, l := range sl.loads {
			c := cur[name]
			c.busy += l.GetThrottledPerSec()
			c.quota += l.GetQuotaRefusedPerSec()
			cur[name] = c
		}
	}
	q.mu.Unlock()

	st := m.State()
	now2 := map[string]bool{}
	var names []string
	for name, c := range cur {
		if c.busy > 0 || c.quota > 0 {
			now2[name] = true
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		if was[name] {
			continue
		}
		c := cur[name]
		var quota TenantQuota
		if t := st.Tenants[name]; t != nil {
			quota = t.Quota
		}
		m.events.add(Event{UnixMs: now.UnixMilli(), Kind: EventThrottled, Tenant: name,
			Message: fmt.Sprintf("tenant %s throttled: %.0f/s refused SERVER_BUSY, %.0f/s refused QUOTA_EXCEEDED (quota %s)", name, c.busy, c.quota, quotaString(quota))})
	}
	var gone []string
	for name := range was {
		if !now2[name] {
			gone = append(gone, name)
		}
	}
	slices.Sort(gone)
	for _, name := range gone {
		m.events.add(Event{UnixMs: now.UnixMilli(), Kind: EventUnthrottled, Tenant: name, Message: fmt.Sprintf("tenant %s no longer throttled", name)})
	}
	r.mu.Lock()
	r.throttled = now2
	r.mu.Unlock()
}

// quotaString is a quota as an operator reads it ("none" when unlimited).
func quotaString(q TenantQuota) string {
	var s string
	add := func(v uint64, what string) {
		if v == 0 {
			return
		}
		if s != "" {
			s += ", "
		}
		s += fmt.Sprintf("%d %s", v, what)
	}
	add(q.ReadOpsPerSec, "reads/s")
	add(q.WriteOpsPerSec, "writes/s")
	add(q.CoprocCPUMsPerSec, "coproc ms/s")
	add(q.StoredBytes, "bytes stored")
	add(q.MemoryBytes, "bytes in memory")
	if s == "" {
		return "none"
	}
	return s
}
