package tablemaster

import (
	"context"
	"sync"
	"time"

	"github.com/tabuladb/tabula/api"
)

// Quotas. A tenant's quotas (Tenant.Quota) live in the replicated state;
// enforcing them is the table servers' work, on shares the leader hands
// out in heartbeat responses:
//
//   - a rate quota (reads, writes, coprocessor CPU per second) is split
//     among the servers hosting the tenant in proportion to the demand each
//     reported (TenantLoad: offered, throttled requests included), plus a
//     floor so that a server with no demand yet can admit the first
//     requests. Each server runs a token bucket at its share. As load
//     moves, shares follow within a few heartbeats.
//   - a size quota (stored bytes, memory bytes) becomes an allowance: the
//     quota less the usage the servers last reported (what `tabula tenant
//     quota` shows), counted from the server's written counter at the
//     report the usage came from. Every server hosting the tenant gets
//     the whole room, so a write is refused (QUOTA_EXCEEDED) exactly when
//     the usage shown plus what this server admitted since plus the write
//     would pass the quota. (Split evenly, as it was, a tenant writing
//     through one server was refused at a third of the room it was shown
//     on three.) The price: servers admitting writes at once, within one
//     report interval, may together pass the quota by what they admitted
//     in it; the next reports close the room on all of them. Deletes are
//     always admitted.
//
// All of it is the leader's soft state: a new leader starts with no
// demand (every server gets an even share) and learns usage from the next
// full reports.

// quotaStaleAfter is how old a server's TenantLoad may be before its
// demand no longer counts.
const quotaStaleAfter = 3 * time.Second

// usageRefresh bounds how often the leader sums its servers' reports into
// per-tenant usage.
const usageRefresh = 250 * time.Millisecond

// quotaTracker is the leader's view of tenants' load and usage. Safe for
// concurrent use.
type quotaTracker struct {
	mu    sync.Mutex
	loads map[string]serverLoads // server id → its last report
	usage map[string]*tenantUsage
	hosts map[string]map[string]bool // tenant → servers holding a replica
	// primaries: tenant → server → the tenant's primaries there.
	primaries map[string]map[string]int
	stamp     time.Time // when usage was summed
	stateV    uint64    // the state version hosts came from
}

type serverLoads struct {
	at    time.Time
	loads map[string]*api.TenantLoad
}

// tenantUsage is a tenant's usage summed over servers, with each server's
// written counters as of the report its bytes came from.
type tenantUsage struct {
	stored, memory uint64
	asOf           map[string][2]uint64 // server → written, memory written
}

func newQuotaTracker() *quotaTracker {
	return &quotaTracker{loads: map[string]serverLoads{}, usage: map[string]*tenantUsage{}}
}

// report records a server's heartbeat loads.
func (q *quotaTracker) report(server string, now time.Time, loads []*api.TenantLoad) {
	m := make(map[string]*api.TenantLoad, len(loads))
	for _, l := range loads {
		if l != nil && l.Tenant != "" {
			m[l.Tenant] = l
		}
	}
	q.mu.Lock()
	q.loads[server] = serverLoads{at: now, loads: m}
	q.mu.Unlock()
}

// forget drops a server (declared dead or forgotten).
func (q *quotaTracker) forget(server string) {
	q.mu.Lock()
	delete(q.loads, server)
	q.mu.Unlock()
}

// refresh sums usage from the servers' last full reports, at most every
// usageRefresh. Called with q.mu held.
func (m *Master) refreshUsage(q *quotaTracker, st *State, now time.Time) {
	if now.Sub(q.stamp) < usageRefresh && q.stateV == st.Version && q.hosts != nil {
		return
	}
	q.stamp, q.stateV = now, st.Version
	type part struct {
		tenant string
		memory bool // its bytes are held in memory
		bulk   bool // its index is held in memory
	}
	parts := map[uint64]part{}
	hosts := map[string]map[string]bool{}
	prims := map[string]map[string]int{}
	for _, tb := range st.Tables {
		p := part{tenant: tb.Tenant, memory: !tb.durable() && tb.Kind != api.TableKind_TABLE_KIND_BULK, bulk: tb.Kind == api.TableKind_TABLE_KIND_BULK}
		h := hosts[tb.Tenant]
		if h == nil {
			h = map[string]bool{}
			hosts[tb.Tenant] = h
		}
		pr := prims[tb.Tenant]
		if pr == nil {
			pr = map[string]int{}
			prims[tb.Tenant] = pr
		}
		for _, pt := range tb.Partitions {
			parts[pt.ID] = p
			for _, r := range pt.Replicas {
				h[r.ServerID] = true
				if r.Role == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
					pr[r.ServerID]++
				}
			}
		}
	}
	// One copy per partition: the largest any replica reports.
	type sizes struct{ stored, memory uint64 }
	per := map[uint64]sizes{}
	usage := map[string]*tenantUsage{}
	m.liveMu.Lock()
	for id, l := range m.live {
		if l == nil || l.dead {
			continue
		}
		for _, r := range l.statuses {
			p, ok := parts[r.PartitionId]
			if !ok {
				continue
			}
			sz := sizes{stored: r.Bytes}
			switch {
			case p.memory:
				sz.memory = r.Bytes
			case p.bulk:
				sz.memory = r.IndexBytes
			}
			old := per[r.PartitionId]
			per[r.PartitionId] = sizes{stored: max(old.stored, sz.stored), memory: max(old.memory, sz.memory)}
		}
		for t, w := range l.written {
			u := usage[t]
			if u == nil {
				u = &tenantUsage{asOf: map[string][2]uint64{}}
				usage[t] = u
			}
			u.asOf[id] = w
		}
	}
	m.liveMu.Unlock()
	for id, sz := range per {
		t := parts[id].tenant
		u := usage[t]
		if u == nil {
			u = &tenantUsage{asOf: map[string][2]uint64{}}
			usage[t] = u
		}
		u.stored += sz.stored
		u.memory += sz.memory
	}
	q.usage, q.hosts, q.primaries = usage, hosts, prims
}

// shares returns server's part of every limited tenant's quotas.
func (m *Master) quotaShares(st *State, server string) []*api.TenantShare {
	limited := false
	for _, t := range st.Tenants {
		if t.Quota.Limited() {
			limited = true
			break
		}
	}
	if !limited {
		return nil
	}
	q := m.quotas
	now := m.opts.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	m.refreshUsage(q, st, now)
	var out []*api.TenantShare
	for name, t := range st.Tenants {
		if !t.Quota.Limited() {
			continue
		}
		hosts := q.hosts[name]
		n := len(hosts)
		if !hosts[server] {
			n++ // a server about to host the tenant gets a floor too
		}
		sh := &api.TenantShare{Tenant: name}
		demand := func(s string, get func(*api.TenantLoad) float64) float64 {
			sl, ok := q.loads[s]
			if !ok || now.Sub(sl.at) > quotaStaleAfter {
				return 0
			}
			if l := sl.loads[name]; l != nil {
				return get(l)
			}
			return 0
		}
		prims := q.primaries[name]
		var allPrims int
		for _, c := range prims {
			allPrims += c
		}
		share := func(quota uint64, get func(*api.TenantLoad) float64) float64 {
			if quota == 0 {
				return 0
			}
			var allDemand float64
			for s := range hosts {
				allDemand += demand(s, get)
			}
			if !hosts[server] {
				allDemand += demand(server, get)
			}
			return shareOf(quota, n, prims[server], allPrims, demand(server, get), allDemand)
		}
		sh.ReadOpsPerSec = share(t.Quota.ReadOpsPerSec, (*api.TenantLoad).GetReadOpsPerSec)
		sh.WriteOpsPerSec = share(t.Quota.WriteOpsPerSec, (*api.TenantLoad).GetWriteOpsPerSec)
		sh.CoprocCpuMsPerSec = share(t.Quota.CoprocCPUMsPerSec, (*api.TenantLoad).GetCoprocCpuMsPerSec)
		u := q.usage[name]
		if u == nil {
			u = &tenantUsage{}
		}
		asOf := u.asOf[server]
		left := func(quota, used uint64) uint64 {
			if used >= quota {
				return 0
			}
			return quota - used // the whole room, to every server: see above
		}
		if t.Quota.StoredBytes > 0 {
			sh.StoredLimited, sh.StoredLeft, sh.StoredAsOf = true, left(t.Quota.StoredBytes, u.stored), asOf[0]
		}
		if t.Quota.MemoryBytes > 0 {
			sh.MemoryLimited, sh.MemoryLeft, sh.MemoryAsOf = true, left(t.Quota.MemoryBytes, u.memory), asOf[1]
		}
		out = append(out, sh)
	}
	return out
}

// shareOf is one server's share of a rate quota, of n servers: nine
// tenths split half by where the tenant's primaries are (prims of
// allPrims here) and half by where its demand is (demand of allDemand),
// a tenth split evenly as a floor. A client that paces itself sends what
// its share lets through, so demand alone would feed on itself (a small
// share draws little demand, which shrinks it further); the primaries'
// half pulls every share back toward the static split, and the demand
// half still moves a raw client's hot spot. Summed over the servers it is
// the quota.
func shareOf(quota uint64, n, prims, allPrims int, demand, allDemand float64) float64 {
	var frac float64
	switch {
	case allPrims > 0 && allDemand > 0:
		frac = (float64(prims)/float64(allPrims) + demand/allDemand) / 2
	case allPrims > 0:
		frac = float64(prims) / float64(allPrims)
	case allDemand > 0:
		frac = demand / allDemand
	default:
		frac = 1 / float64(n)
	}
	return float64(quota) * (0.9*frac + 0.1/float64(n))
}

// tenantUsageOf is a tenant's usage as the leader last summed it (nil on a
// follower, which hears no heartbeats).
func (m *Master) tenantUsageOf(st *State, name string) *api.TenantUsage {
	q := m.quotas
	now := m.opts.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.loads) == 0 {
		return nil
	}
	m.refreshUsage(q, st, now)
	out := &api.TenantUsage{}
	if u := q.usage[name]; u != nil {
		out.StoredBytes, out.MemoryBytes = u.stored, u.memory
	}
	for _, sl := range q.loads {
		if now.Sub(sl.at) > quotaStaleAfter {
			continue
		}
		if l := sl.loads[name]; l != nil {
			out.ReadOpsPerSec += l.AdmittedReadOpsPerSec
			out.WriteOpsPerSec += l.AdmittedWriteOpsPerSec
			out.CoprocCpuMsPerSec += l.AdmittedCoprocCpuMsPerSec
			out.ThrottledPerSec += l.ThrottledPerSec
			out.QuotaRefusedPerSec += l.QuotaRefusedPerSec
		}
	}
	return out
}

// bulkWithinQuota refuses a bulk version that would take its tenant past
// its stored-bytes quota (the files' sizes on top of the usage last
// reported), or whose tenant is already at its memory quota (a version's
// index size is known only once servers load it).
func (m *Master) bulkWithinQuota(req *api.BulkPublishRequest) error {
	st := m.State()
	t := st.Tenants[req.Tenant]
	if t == nil || (t.Quota.StoredBytes == 0 && t.Quota.MemoryBytes == 0) {
		return nil
	}
	u := m.tenantUsageOf(st, req.Tenant)
	if u == nil {
		u = &api.TenantUsage{}
	}
	var size uint64
	for _, f := range req.Files {
		size += f.GetSize()
	}
	if q := t.Quota.StoredBytes; q > 0 && u.StoredBytes+size > q {
		return errCode(ErrQuotaExceeded, api.ErrorCode_ERROR_CODE_QUOTA_EXCEEDED, "stored_bytes_quota",
			"tenant %s stores %d bytes and this version adds %d: over its quota of %d stored bytes", req.Tenant, u.StoredBytes, size, q)
	}
	if q := t.Quota.MemoryBytes; q > 0 && u.MemoryBytes >= q {
		return errCode(ErrQuotaExceeded, api.ErrorCode_ERROR_CODE_QUOTA_EXCEEDED, "memory_bytes_quota",
			"tenant %s holds %d bytes in memory: at its quota of %d", req.Tenant, u.MemoryBytes, q)
	}
	return nil
}

// SetTenantQuota implements api.MasterServer (cluster credential only).
func (m *Master) SetTenantQuota(ctx context.Context, req *api.SetTenantQuotaRequest) (*api.SetTenantQuotaResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	if err := errValidateName("tenant", req.Tenant); err != nil {
		return nil, err
	}
	q := TenantQuotaOf(req.Quota)
	_, st, err := m.propose(Command{UnixMs: m.opts.Now().UnixMilli(), RequestID: requestIDOf(ctx), Payload: SetTenantQuota{Tenant: req.Tenant, Quota: &q}}, nil, nil)
	if err != nil {
		return nil, rpcError("set tenant quota", err)
	}
	t := st.Tenants[req.Tenant]
	if t == nil {
		return nil, errTenantNotFound(req.Tenant)
	}
	m.logger.Info("tablemaster: tenant quota set", "tenant", req.Tenant, "quota", q)
	return &api.SetTenantQuotaResponse{Tenant: m.tenantInfo(st, t, isCluster(ctx))}, nil
}
