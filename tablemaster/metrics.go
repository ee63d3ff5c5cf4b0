package tablemaster

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/metrics"
)

// The master's figures for Prometheus (Options.Metrics), read at scrape
// time from the published State, the liveness table and the raft node's
// status; proposals are counted by two atomics in propose.
var (
	mLeader        = metrics.Gauge("tabula_master_leader", "1 if this master leads (a master alone always does).")
	mRaftTerm      = metrics.Gauge("tabula_master_raft_term", "Raft term this member is in (raft groups only).")
	mRaftLeaderID  = metrics.Gauge("tabula_master_raft_leader_id", "Member id of the raft leader this member knows, 0 if none (raft groups only).")
	mRaftApplied   = metrics.Gauge("tabula_master_raft_applied_index", "Last raft entry this member applied (raft groups only).")
	mProposals     = metrics.Counter("tabula_master_proposals_total", "Commands proposed to the master's state machine (refused and no-op ones included).")
	mProposeTime   = metrics.Counter("tabula_master_propose_seconds_total", "Time proposals took, their log write and fsync (or raft commit) included; divide by tabula_master_proposals_total for the mean.")
	mMapVersion    = metrics.Gauge("tabula_master_map_version", "Cluster map version.")
	mTenants       = metrics.Gauge("tabula_master_tenants", "Tenants in the catalog.")
	mTables        = metrics.Gauge("tabula_master_tables", "Tables in the catalog, by kind.", "kind")
	mPartitions    = metrics.Gauge("tabula_master_partitions", "Partitions of every table.")
	mReplicas      = metrics.Gauge("tabula_master_replicas", "Replicas placed, by role.", "role")
	mNoPrimary     = metrics.Gauge("tabula_master_partitions_without_primary", "Partitions with no primary replica (unavailable for writes).")
	mDataLost      = metrics.Gauge("tabula_master_partitions_data_lost", "Partitions that lost every copy of their data (an operator forgot their server).")
	mUnderRepl     = metrics.Gauge("tabula_partitions_under_replicated", "Replicated partitions with fewer in-sync replicas (in the log's ack set, within the in-sync bound) than their replication factor for longer than the bound; the leader's count (0 elsewhere).")
	mMoves         = metrics.Gauge("tabula_master_moves", "Replica moves in progress.")
	mServers       = metrics.Gauge("tabula_master_servers", "Registered table servers, by state: alive, dead or draining (draining ones are alive too).", "state")
	mSilentServers = metrics.Gauge("tabula_master_servers_silent", "Alive servers not heard from for more than two heartbeat intervals.")
	mStreams       = metrics.Gauge("tabula_master_streams", "Streams the stream manager holds.")
	mExtents       = metrics.Gauge("tabula_master_extents", "Extents the stream manager holds.")
)

// masterMetrics is the Master's metrics state: proposal counters and
// whether its collector is registered. Safe for concurrent use.
type masterMetrics struct {
	proposals atomic.Uint64
	proposeNS atomic.Int64

	once       sync.Once
	err        error
	registered bool // set in once
}

// observe counts a proposal that started at start: defer it.
func (mm *masterMetrics) observe(start time.Time) {
	mm.proposals.Add(1)
	mm.proposeNS.Add(int64(time.Since(start)))
}

// registerMetrics registers the master's collector with Options.Metrics
// (once; Serve calls it for every listener).
func (m *Master) registerMetrics() error {
	mm := &m.metrics
	mm.once.Do(func() {
		if m.opts.Metrics == nil {
			return
		}
		if err := m.opts.Metrics.Register(m.collector()); err != nil {
			mm.err = fmt.Errorf("tablemaster: register metrics: %w", err)
			return
		}
		mm.registered = true
	})
	return mm.err
}

// unregisterMetrics undoes registerMetrics (Close). A collector is known
// by its descriptions, so a new one unregisters the registered one.
func (m *Master) unregisterMetrics() {
	m.metrics.once.Do(func() {}) // no registration after Close
	if m.metrics.registered {
		m.opts.Metrics.Unregister(m.collector())
	}
}

func (m *Master) collector() prometheus.Collector {
	return metrics.NewCollector(m.collectMetrics,
		mLeader, mRaftTerm, mRaftLeaderID, mRaftApplied, mProposals, mProposeTime,
		mMapVersion, mTenants, mTables, mPartitions, mReplicas, mNoPrimary, mDataLost, mUnderRepl, mMoves,
		mServers, mSilentServers, mStreams, mExtents)
}

func (m *Master) collectMetrics(emit func(prometheus.Metric)) {
	leads := 0.0
	if m.leads() {
		leads = 1
	}
	emit(mLeader.Metric(leads))
	if m.raft != nil {
		st := m.raft.node.Status()
		emit(mRaftTerm.Metric(float64(st.Term)))
		emit(mRaftLeaderID.Metric(float64(st.Leader)))
		emit(mRaftApplied.Metric(float64(st.Applied)))
	}
	emit(mProposals.Metric(float64(m.metrics.proposals.Load())))
	emit(mProposeTime.Metric(time.Duration(m.metrics.proposeNS.Load()).Seconds()))

	v := m.view.Load()
	if v == nil {
		return
	}
	s := v.state
	emit(mMapVersion.Metric(float64(s.Version)))
	emit(mTenants.Metric(float64(len(s.Tenants))))
	kinds := map[string]int{}
	roles := map[string]int{}
	var parts, noPrimary, lost, moves int
	for _, t := range s.Tables {
		kinds[enumLabel(t.Kind.String(), "TABLE_KIND_")]++
		for i := range t.Partitions {
			p := &t.Partitions[i]
			parts++
			primary := false
			for _, r := range p.Replicas {
				roles[enumLabel(r.Role.String(), "REPLICA_ROLE_")]++
				primary = primary || r.Role == api.ReplicaRole_REPLICA_ROLE_PRIMARY
			}
			if !primary {
				noPrimary++
			}
			if p.DataLost != nil {
				lost++
			}
			if p.Move != nil {
				moves++
			}
		}
	}
	for k, n := range kinds {
		emit(mTables.Metric(float64(n), k))
	}
	for k, n := range roles {
		emit(mReplicas.Metric(float64(n), k))
	}
	emit(mPartitions.Metric(float64(parts)))
	emit(mNoPrimary.Metric(float64(noPrimary)))
	emit(mDataLost.Metric(float64(lost)))
	under := 0
	if leads == 1 {
		under = m.underReplicated()
	}
	emit(mUnderRepl.Metric(float64(under)))
	emit(mMoves.Metric(float64(moves)))

	var alive, dead, draining int
	for _, sv := range s.Servers {
		switch {
		case !sv.Alive:
			dead++
		case sv.Draining:
			alive++
			draining++
		default:
			alive++
		}
	}
	emit(mServers.Metric(float64(alive), "alive"))
	emit(mServers.Metric(float64(dead), "dead"))
	emit(mServers.Metric(float64(draining), "draining"))
	silent := 0
	now := m.opts.Now()
	m.liveMu.Lock()
	for id, l := range m.live {
		if sv := s.Servers[id]; sv != nil && sv.Alive && now.Sub(l.lastHeard) > 2*m.opts.HeartbeatInterval {
			silent++
		}
	}
	m.liveMu.Unlock()
	emit(mSilentServers.Metric(float64(silent)))

	streams, extents := s.StreamManager().Counts()
	emit(mStreams.Metric(float64(streams)))
	emit(mExtents.Metric(float64(extents)))
}

// enumLabel is an enum value's name as a label: lower case, without its
// prefix ("REPLICA_ROLE_PRIMARY" -> "primary").
func enumLabel(name, prefix string) string {
	return strings.ToLower(strings.TrimPrefix(name, prefix))
}
