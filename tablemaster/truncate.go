package tablemaster

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/replication/stream"
)

// Partition logs are truncated from the front. Every replica reports, in
// its heartbeats, the applied LSN it holds short of losing the replica
// (flushed_lsn) and the log extent holding the record after it
// (keep_from_extent): the first it would read after a crash. An engine
// with files holds what its last Sync made durable; a memory engine holds
// its applied LSN while it lives and copies a snapshot after a crash, so
// a memory table's log is trimmed below what every replica applied and
// stays bounded (tableserver/truncate.go); losing all its replicas at
// once loses the table, as "memory" says. The leader deletes (OpTrimStream) a
// log's extents before the earliest of those over the partition's
// replicas. A replica that has not reported yet, is copying a snapshot,
// or has not flushed since it started (flushed_lsn 0) keeps the whole log;
// a secondary whose flushed LSN is more than MaxLogLag behind the
// partition's best is left out, and copies a snapshot when it finds the
// log trimmed past it (tableserver/truncate.go). The primary is never
// left out: it does not copy, so a primary restarted behind a trimmed log
// could never serve again.

// truncateLogs trims every partition log it can.
func (m *Master) truncateLogs(ctx context.Context) {
	if !m.leads() {
		return
	}
	reports := map[uint64]map[string]*api.ReplicaStatus{}
	m.liveMu.Lock()
	for id, l := range m.live {
		if l.dead {
			continue
		}
		for _, r := range l.statuses {
			if reports[r.PartitionId] == nil {
				reports[r.PartitionId] = map[string]*api.ReplicaStatus{}
			}
			reports[r.PartitionId][id] = r
		}
	}
	m.liveMu.Unlock()
	st := m.State()
	for _, t := range st.tablesByID() {
		for _, p := range t.Partitions {
			if p.Log == nil || p.Log.Extent == 0 || len(p.Replicas) == 0 {
				continue
			}
			info, err := m.streamDriver.Stream(ctx, p.Log.Stream)
			if err != nil || len(info.Extents) < 2 {
				continue
			}
			keep := logKeep(p, reports[p.ID], info, m.opts.MaxLogLag)
			if keep <= 0 {
				continue
			}
			_, err = m.streamDriver.Apply(ctx, stream.Command{Op: stream.OpTrimStream, Stream: p.Log.Stream, Extent: info.Extents[keep].ID})
			switch {
			case err == nil:
				m.logger.Info("tablemaster: partition log truncated", "partition", p.ID, "extents_deleted", keep, "first_kept", info.Extents[keep].ID)
			case errors.Is(err, stream.ErrUnknownExtent), ctx.Err() != nil:
			default:
				m.logger.Warn("tablemaster: truncate a partition log", "partition", p.ID, "err", err)
			}
		}
	}
}

// logKeep is the index in info.Extents of the first extent p's log must
// keep (0: nothing to trim).
func logKeep(p Partition, reports map[string]*api.ReplicaStatus, info stream.StreamInfo, maxLag uint64) int {
	var best uint64
	for _, r := range p.Replicas {
		if rs := reports[r.ServerID]; rs != nil {
			best = max(best, rs.FlushedLsn)
		}
	}
	keep := len(info.Extents) - 1 // never the open extent
	for _, r := range p.Replicas {
		rs := reports[r.ServerID]
		switch {
		case rs == nil || rs.State == api.ReplicaState_REPLICA_STATE_COPYING:
			return 0 // not reported yet, or its copy needs the log from its LSN
		case rs.FlushedLsn == 0 || rs.KeepFromExtent == 0:
			// Not flushed since it started (or copied): it recovers at
			// an applied LSN it has not reported, which a flushed 0 says
			// nothing about; it is not lagging, it has not said yet.
			return 0
		case maxLag > 0 && rs.FlushedLsn+maxLag < best && r.Role != api.ReplicaRole_REPLICA_ROLE_PRIMARY:
			continue // too far behind: it copies a snapshot instead (a primary never does)
		}
		k := slices.IndexFunc(info.Extents, func(e stream.ExtentPlacement) bool { return e.ID == rs.KeepFromExtent })
		if k < 0 {
			return 0 // an extent the stream does not hold (a report older than the stream)
		}
		keep = min(keep, k)
	}
	return keep
}

// truncateDue reports whether the log loop should run truncateLogs now
// (every TruncateInterval), and notes the time if so.
func (m *Master) truncateDue(last *time.Time) bool {
	if time.Since(*last) < m.opts.TruncateInterval {
		return false
	}
	*last = time.Now()
	return true
}
