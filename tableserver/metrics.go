package tableserver

import (
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/metrics"
)

// The server's figures for Prometheus (Options.Metrics), read at scrape
// time from counters the engines, the extent node, the replicas and the
// coprocessor runtime keep anyway: nothing is added to a request's path.
// Engine figures are the sums over the partitions hosted at the scrape,
// not per partition (a partition per label would let tables multiply
// series); a counter drops when a partition leaves the server, which
// Prometheus's rate() reads as a counter reset.
var (
	mServerPartitions = metrics.Gauge("tabula_server_partitions", "Partitions hosted, by table kind.", "kind")
	mServerFailed     = metrics.Gauge("tabula_server_partitions_failed", "Partitions assigned here whose engine did not open.")
	mServerInFlight   = metrics.Gauge("tabula_server_in_flight_requests", "Requests being served (admission control's count).")
	mServerDraining   = metrics.Gauge("tabula_server_draining", "1 while the server drains.")
	mServerMapVersion = metrics.Gauge("tabula_server_map_version", "Cluster map version the server applied last.")

	mEngineKeys         = metrics.Gauge("tabula_engine_keys", "Live keys in hosted partitions.")
	mEngineDataBytes    = metrics.Gauge("tabula_engine_data_bytes", "Key and value bytes of live keys in hosted partitions.")
	mEngineIndexBytes   = metrics.Gauge("tabula_engine_index_bytes", "Memory of the hosted partitions' indexes.")
	mEngineLogBytes     = metrics.Gauge("tabula_engine_log_bytes", "Bytes of the disk engines' log segments (live and garbage).")
	mEngineLiveBytes    = metrics.Gauge("tabula_engine_live_bytes", "Bytes of current records in the disk engines' logs.")
	mEngineGarbageBytes = metrics.Gauge("tabula_engine_garbage_bytes", "Bytes of dead versions in the disk engines' logs, for garbage collection.")
	mEngineSegments     = metrics.Gauge("tabula_engine_segments", "Log segment files of the disk engines.")
	mEngineReads        = metrics.Counter("tabula_engine_reads_total", "Engine reads in hosted partitions.")
	mEngineWrites       = metrics.Counter("tabula_engine_writes_total", "Engine writes in hosted partitions.")
	mEngineCacheHits    = metrics.Counter("tabula_engine_cache_hits_total", "Disk engine reads served by the read cache.")
	mEngineCacheMisses  = metrics.Counter("tabula_engine_cache_misses_total", "Disk engine reads that went to disk.")
	mEngineSyncs        = metrics.Counter("tabula_engine_syncs_total", "Disk engine group commits (a write and an fsync each).")
	mEngineGCRuns       = metrics.Counter("tabula_engine_gc_segments_total", "Log segments garbage collection rewrote.")
	mEngineGCMoved      = metrics.Counter("tabula_engine_gc_moved_bytes_total", "Live bytes garbage collection copied.")

	mReplicas   = metrics.Gauge("tabula_replication_replicas", "Replicas of replicated (commit-logged) partitions hosted, by role and state.", "role", "state")
	mLag        = metrics.Gauge("tabula_replication_lag_records", "Log records known committed but not yet applied, summed over hosted replicas.")
	mLagMax     = metrics.Gauge("tabula_replication_lag_max_records", "The largest such lag of one hosted replica.")
	mCopyRemain = metrics.Gauge("tabula_replication_copy_remaining_bytes", "Bytes replicas being copied still expect.")
	mLagTimeMax = metrics.Gauge("tabula_replication_lag_max_seconds", "The longest a hosted secondary has been out of step with its primary (since its tail last reached the commit point told it); secondaries never in step count in tabula_replication_replicas_behind.")
	mBehind     = metrics.Gauge("tabula_replication_replicas_behind", "Hosted secondaries not in step with their primary within the default read_any bound (1 s): they refuse such reads.")

	mStreamExtents      = metrics.Gauge("tabula_stream_extents", "Extent replicas on this server's extent node.")
	mStreamUsedBytes    = metrics.Gauge("tabula_stream_used_bytes", "Durable bytes of those extent replicas.")
	mStreamAppends      = metrics.Counter("tabula_stream_appends_total", "Appends this extent node acknowledged as primary.")
	mStreamAppendBytes  = metrics.Counter("tabula_stream_append_bytes_total", "Payload bytes of those appends.")
	mStreamReplicated   = metrics.Counter("tabula_stream_replicated_writes_total", "Writes this extent node took as a secondary.")
	mStreamReplBytes    = metrics.Counter("tabula_stream_replicated_bytes_total", "Bytes of those writes.")
	mStreamJournalSyncs = metrics.Counter("tabula_stream_journal_commits_total", "Journal group commits (one write and one fsync each).")
	mStreamDrops        = metrics.Counter("tabula_stream_secondary_drops_total", "Secondaries this node, as an extent's primary, dropped from the ack set (a replicate failed or timed out).")
	mStreamRejoins      = metrics.Counter("tabula_stream_secondary_rejoins_total", "Dropped secondaries this node, as an extent's primary, brought back into the ack set.")
	mStreamLateTimeouts = metrics.Counter("tabula_stream_late_timeouts_total", "Replicate timeouts that fired late (this node was paused or starved), after which the secondary got another timeout instead of being dropped.")
	mStreamRejoinBytes  = metrics.Counter("tabula_stream_rejoin_bytes_total", "Bytes sent to dropped secondaries to catch them up.")
	mStreamJournalRecs  = metrics.Counter("tabula_stream_journal_records_total", "Records those commits carried.")
	mStreamJournalBytes = metrics.Counter("tabula_stream_journal_bytes_total", "Bytes those commits wrote.")

	mCoprocModules   = metrics.Gauge("tabula_coproc_modules", "Coprocessor module versions loaded.")
	mCoprocCalls     = metrics.Counter("tabula_coproc_calls_total", "Coprocessor guest runs (a conflict retry counts again).")
	mCoprocFailures  = metrics.Counter("tabula_coproc_failures_total", "Coprocessor runs that failed, by why.", "reason")
	mCoprocReplays   = metrics.Counter("tabula_coproc_replays_total", "Coprocessor calls answered from an idempotency record.")
	mCoprocCommits   = metrics.Counter("tabula_coproc_commits_total", "Coprocessor write sets committed.")
	mCoprocInstances = metrics.Counter("tabula_coproc_instances_created_total", "Coprocessor instances created.")
)

// collector reports the server's figures at each scrape.
func (s *Server) collector() prometheus.Collector {
	return metrics.NewCollector(s.collectMetrics,
		mServerPartitions, mServerFailed, mServerInFlight, mServerDraining, mServerMapVersion,
		mEngineKeys, mEngineDataBytes, mEngineIndexBytes, mEngineLogBytes, mEngineLiveBytes, mEngineGarbageBytes,
		mEngineSegments, mEngineReads, mEngineWrites, mEngineCacheHits, mEngineCacheMisses, mEngineSyncs,
		mEngineGCRuns, mEngineGCMoved,
		mReplicas, mLag, mLagMax, mCopyRemain, mLagTimeMax, mBehind,
		mStreamExtents, mStreamUsedBytes, mStreamAppends, mStreamAppendBytes, mStreamReplicated, mStreamReplBytes,
		mStreamJournalSyncs, mStreamJournalRecs, mStreamJournalBytes,
		mCoprocModules, mCoprocCalls, mCoprocFailures, mCoprocReplays, mCoprocCommits, mCoprocInstances,
	)
}

// registerMetrics registers the server's collector with Options.Metrics,
// if set; unregisterMetrics (Close) takes it away.
func (s *Server) registerMetrics() error {
	if s.opts.Metrics == nil {
		return nil
	}
	c := s.collector()
	if err := s.opts.Metrics.Register(c); err != nil {
		return fmt.Errorf("tableserver: register metrics: %w", err)
	}
	s.metricsCollector = c
	return nil
}

func (s *Server) unregisterMetrics() {
	if s.metricsCollector != nil {
		s.opts.Metrics.Unregister(s.metricsCollector)
	}
}

type replicaKey struct{ role, state string }

func (s *Server) collectMetrics(emit func(prometheus.Metric)) {
	h := s.hosting.Load()
	id := s.id()
	kinds := map[string]int{}
	replicas := map[replicaKey]int{}
	var (
		keys, data, index, logBytes, live, garbage, segments uint64
		reads, writes, hits, misses, syncs, gcRuns, gcMoved  uint64
		lag, lagMax, copyRemain                              uint64
		lagTimeMax                                           time.Duration
		behind                                               int
	)
	now := time.Now()
	for _, r := range h.replicas {
		kinds[label(r.table.GetKind().String(), "TABLE_KIND_")]++
		st := r.engine.Stats()
		keys += st.Keys
		data += st.Bytes
		index += st.IndexBytes
		logBytes += st.LiveBytes + st.GarbageBytes
		live += st.LiveBytes
		garbage += st.GarbageBytes
		segments += st.Segments
		reads += st.Reads
		writes += st.Writes
		hits += st.CacheHits
		misses += st.CacheMisses
		syncs += st.Syncs
		gcRuns += st.GCRuns
		gcMoved += st.GCBytesMoved
		if r.log == nil {
			continue
		}
		state, copied, total := r.log.progress()
		role := roleOf(r.part, id)
		replicas[replicaKey{label(role.String(), "REPLICA_ROLE_"), label(state.String(), "REPLICA_STATE_")}]++
		applied, commit := r.log.positions()
		if commit > applied {
			lag += commit - applied
			lagMax = max(lagMax, commit-applied)
		}
		if total > copied {
			copyRemain += total - copied
		}
		if role == api.ReplicaRole_REPLICA_ROLE_SECONDARY {
			d, ok := r.log.lag(now)
			lagTimeMax = max(lagTimeMax, d)
			if !ok || d > api.DefaultMaxStalenessMs*time.Millisecond {
				behind++
			}
		}
	}
	for k, n := range kinds {
		emit(mServerPartitions.Metric(float64(n), k))
	}
	emit(mServerFailed.Metric(float64(len(h.failed))))
	emit(mServerInFlight.Metric(float64(s.inflight.Load())))
	draining := 0.0
	if s.draining.Load() {
		draining = 1
	}
	emit(mServerDraining.Metric(draining))
	emit(mServerMapVersion.Metric(float64(h.version)))

	for _, m := range []struct {
		f metrics.Family
		v uint64
	}{
		{mEngineKeys, keys}, {mEngineDataBytes, data}, {mEngineIndexBytes, index}, {mEngineLogBytes, logBytes},
		{mEngineLiveBytes, live}, {mEngineGarbageBytes, garbage}, {mEngineSegments, segments},
		{mEngineReads, reads}, {mEngineWrites, writes}, {mEngineCacheHits, hits}, {mEngineCacheMisses, misses},
		{mEngineSyncs, syncs}, {mEngineGCRuns, gcRuns}, {mEngineGCMoved, gcMoved},
		{mLag, lag}, {mLagMax, lagMax}, {mCopyRemain, copyRemain},
	} {
		emit(m.f.Metric(float64(m.v)))
	}
	emit(mLagTimeMax.Metric(lagTimeMax.Seconds()))
	emit(mBehind.Metric(float64(behind)))
	for k, n := range replicas {
		emit(mReplicas.Metric(float64(n), k.role, k.state))
	}

	ns := s.extents.Stats()
	emit(mStreamExtents.Metric(float64(ns.Extents)))
	emit(mStreamUsedBytes.Metric(float64(ns.UsedBytes)))
	emit(mStreamAppends.Metric(float64(ns.Appends)))
	emit(mStreamAppendBytes.Metric(float64(ns.AppendBytes)))
	emit(mStreamReplicated.Metric(float64(ns.Replicated)))
	emit(mStreamReplBytes.Metric(float64(ns.ReplicatedBytes)))
	emit(mStreamJournalSyncs.Metric(float64(ns.JournalCommits)))
	emit(mStreamJournalRecs.Metric(float64(ns.JournalRecords)))
	emit(mStreamJournalBytes.Metric(float64(ns.JournalBytes)))
	emit(mStreamDrops.Metric(float64(ns.SecondaryDrops)))
	emit(mStreamRejoins.Metric(float64(ns.SecondaryRejoins)))
	emit(mStreamLateTimeouts.Metric(float64(ns.LateTimeouts)))
	emit(mStreamRejoinBytes.Metric(float64(ns.RejoinBytes)))

	cs := s.cp.rt.Stats()
	emit(mCoprocModules.Metric(float64(cs.Modules)))
	emit(mCoprocCalls.Metric(float64(cs.Calls)))
	for reason, n := range map[string]uint64{
		"guest_error": cs.GuestErrors, "trap": cs.Traps, "timeout": cs.Timeouts,
		"memory_limit": cs.MemoryLimits, "busy": cs.Busy, "conflict": cs.Conflicts,
	} {
		emit(mCoprocFailures.Metric(float64(n), reason))
	}
	emit(mCoprocReplays.Metric(float64(cs.Replays)))
	emit(mCoprocCommits.Metric(float64(cs.Commits)))
	emit(mCoprocInstances.Metric(float64(cs.InstancesCreated)))
}

// label is an enum value's name as a label: lower case, without its
// prefix ("REPLICA_ROLE_PRIMARY" -> "primary").
func label(name, prefix string) string {
	return strings.ToLower(strings.TrimPrefix(name, prefix))
}
