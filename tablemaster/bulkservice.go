package tablemaster

import (
	"context"
	"errors"
	"fmt"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/streamerr"
)

// BulkPublish registers a version of a bulk table (see bulk.go). Durable
// when it returns; the answer's map says which server each file goes to.
func (m *Master) BulkPublish(_ context.Context, req *api.BulkPublishRequest) (*api.BulkPublishResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	for i, f := range req.Files {
		if f.GetPartition() != uint32(i) {
			return nil, errInvalid("files", "files_out_of_order", 0, "files[%d] is for partition %d; files must be in partition order", i, f.GetPartition())
		}
	}
	if err := m.bulkWithinQuota(req); err != nil {
		return nil, err
	}
	res, st, err := m.propose(Command{UnixMs: m.opts.Now().UnixMilli(), Payload: BulkPublish{Tenant: req.Tenant, Table: req.Table, Version: req.Version, BaseVersion: req.BaseVersion, Files: BulkFilesFromProto(req.Files)}}, nil, nil)
	if err != nil {
		return nil, rpcError("publish bulk version", err)
	}
	if res.Changed {
		m.logger.Info("tablemaster: bulk version published", "tenant", req.Tenant, "table", req.Table,
			"version", req.Version, "base", req.BaseVersion)
	}
	t := st.Tables[tableKey(req.Tenant, req.Table)]
	resp := &api.BulkPublishResponse{Map: t.MapProto(st.Version)}
	if k := t.Bulk.version(req.Version); k >= 0 && t.Bulk.Versions[k].Streams {
		for i := range t.Partitions {
			resp.Streams = append(resp.Streams, BulkStreamName(t.ID, req.Version, i))
		}
	}
	return resp, nil
}

// BulkStored seals the stream a publisher wrote a partition file into and
// records it with the version (OpBulkStored). Durable when it returns.
func (m *Master) BulkStored(ctx context.Context, req *api.BulkStoredRequest) (*api.BulkStoredResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	what := fmt.Sprintf("record partition %d of bulk version %d as stored", req.Partition, req.Version)
	st := m.State()
	t, err := lookup(st, "tenant", req.Tenant, "table", req.Table)
	if err != nil {
		return nil, err
	}
	if want := BulkStreamName(t.ID, req.Version, int(req.Partition)); req.Stream != want {
		return nil, errInvalid("stream", "stream_name", 0, "partition %d of version %d is stored in stream %q, not %q", req.Partition, req.Version, want, req.Stream)
	}
	// Seal the stream's open extent: the file is immutable from here (and
	// a sealed extent may be erasure coded).
	info, err := m.streamDriver.Stream(ctx, req.Stream)
	if err != nil {
		return nil, streamerr.ToStatus(what, err)
	}
	for _, e := range info.Extents {
		if !e.Sealed {
			if _, err := m.streamDriver.Seal(ctx, e.ID); err != nil {
				return nil, streamerr.ToStatus(what, err)
			}
		}
	}
	res, st, err := m.propose(Command{UnixMs: m.opts.Now().UnixMilli(), Payload: BulkStored{Tenant: req.Tenant, Table: req.Table, Version: req.Version, PartitionID: uint64(req.Partition), Stream: req.Stream}}, nil, nil)
	if err != nil {
		return nil, rpcError(what, err)
	}
	if res.Changed && res.Table != nil && res.Table.Bulk != nil && res.Table.Bulk.Current == req.Version {
		m.logger.Info("tablemaster: bulk version loaded and stored everywhere; serving", "tenant", req.Tenant, "table", req.Table, "version", req.Version)
	}
	t = st.Tables[tableKey(req.Tenant, req.Table)]
	return &api.BulkStoredResponse{Map: t.MapProto(st.Version)}, nil
}

// BulkStatus returns a bulk table's versions with per-partition detail.
func (m *Master) BulkStatus(_ context.Context, req *api.BulkStatusRequest) (*api.BulkStatusResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	st := m.State()
	t, err := lookup(st, "tenant", req.Tenant, "table", req.Table)
	if err != nil {
		return nil, err
	}
	if t.Bulk == nil {
		return nil, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_WRONG_KIND, "not_bulk", "table %s/%s is a %s table, not bulk", t.Tenant, t.Name, api.KindName(t.Kind))
	}
	return &api.BulkStatusResponse{Map: t.MapProto(st.Version), Bulk: t.BulkInfoProto(true)}, nil
}

// BulkRollback switches a bulk table to a retained version; durable when
// it returns.
func (m *Master) BulkRollback(_ context.Context, req *api.BulkRollbackRequest) (*api.BulkRollbackResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	_, st, err := m.propose(Command{UnixMs: m.opts.Now().UnixMilli(), Payload: BulkRollback{Tenant: req.Tenant, Table: req.Table, Version: req.Version}}, nil, nil)
	if err != nil {
		return nil, rpcError("roll back bulk version", err)
	}
	m.logger.Info("tablemaster: bulk table switched", "tenant", req.Tenant, "table", req.Table, "version", req.Version)
	t := st.Tables[tableKey(req.Tenant, req.Table)]
	return &api.BulkRollbackResponse{Map: t.MapProto(st.Version)}, nil
}

// bulkReports turns a heartbeat's reports of loaded bulk versions into
// OpBulkLoaded commands for what the state does not record yet.
func (m *Master) bulkReports(serverID string, statuses []*api.ReplicaStatus) {
	var cmds []Command
	st := m.State()
	var where map[uint64]bulkPlace // built at the first report
	for _, rs := range statuses {
		if len(rs.GetBulkLoaded()) == 0 {
			continue
		}
		if where == nil {
			where = st.bulkPartitions()
		}
		bp, ok := where[rs.GetPartitionId()]
		if !ok {
			continue
		}
		t, pi := bp.t, bp.i
		for _, l := range rs.GetBulkLoaded() {
			k := t.Bulk.version(l.GetVersion())
			if k < 0 || t.Bulk.Versions[k].loadedBy(pi, serverID) {
				continue
			}
			if l.GetError() != "" && (t.Bulk.Versions[k].Error != "" || t.Bulk.Versions[k].State != BulkLoading) {
				continue // recorded already, or nothing to record
			}
			cmds = append(cmds, Command{UnixMs: m.opts.Now().UnixMilli(), Payload: BulkLoaded{Tenant: t.Tenant, Table: t.Name, Version: l.GetVersion(), PartitionID: rs.GetPartitionId(), ServerID: serverID, File: &BulkFile{Size: l.GetSize(), CRC: l.GetCrc32C()}, Error: l.GetError()}})
		}
	}
	for _, c := range cmds {
		res, _, err := m.propose(c, nil, nil)
		l := c.Payload.(BulkLoaded)
		if err != nil {
			m.logger.Warn("tablemaster: bulk load report refused", "server", serverID, "partition", l.PartitionID, "version", l.Version, "err", err)
			continue
		}
		if res.Changed && res.Table != nil && res.Table.Bulk != nil && res.Table.Bulk.Current == l.Version {
			m.logger.Info("tablemaster: bulk version loaded everywhere; serving", "tenant", l.Tenant, "table", l.Table, "version", l.Version)
		}
	}
}

// bulkPlace is a bulk partition's table and index.
type bulkPlace struct {
	t *Table
	i int
}

// bulkPartitions indexes every bulk partition by id, so a heartbeat's
// reports cost one pass over the bulk tables, not one per report.
func (s *State) bulkPartitions() map[uint64]bulkPlace {
	out := map[uint64]bulkPlace{}
	for _, t := range s.Tables {
		if t.Bulk == nil {
			continue
		}
		for i := range t.Partitions {
			out[t.Partitions[i].ID] = bulkPlace{t, i}
		}
	}
	return out
}

// BulkRollout pauses, resumes or aborts a bulk table's rollout; durable
// when it returns.
func (m *Master) BulkRollout(_ context.Context, req *api.BulkRolloutRequest) (*api.BulkRolloutResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	var action string
	switch req.Action {
	case api.BulkRolloutAction_BULK_ROLLOUT_ACTION_PAUSE:
		action = RolloutPause
	case api.BulkRolloutAction_BULK_ROLLOUT_ACTION_RESUME:
		action = RolloutResume
	case api.BulkRolloutAction_BULK_ROLLOUT_ACTION_ABORT:
		action = RolloutAbort
	default:
		return nil, rpcError("bulk rollout", errInvalid("action", "rollout_action", 0, "action must be pause, resume or abort (got %d)", int32(req.Action)))
	}
	_, st, err := m.propose(Command{UnixMs: m.opts.Now().UnixMilli(), Payload: BulkRolloutAction{Tenant: req.Tenant, Table: req.Table, Action: action}}, nil, nil)
	if err != nil {
		return nil, rpcError("bulk rollout "+action, err)
	}
	m.logger.Info("tablemaster: bulk rollout "+action, "tenant", req.Tenant, "table", req.Table)
	t := st.Tables[tableKey(req.Tenant, req.Table)]
	return &api.BulkRolloutResponse{Map: t.MapProto(st.Version)}, nil
}

// advanceRollouts, run by the liveness loop on the leader, re-evaluates
// every bulk table whose rollout or copies may move on without a command
// of their own (room freed on a server, a server back, a copy replaced
// that loaded since): a no-op, not logged, when nothing can.
func (m *Master) advanceRollouts() {
	if !m.leads() {
		return
	}
	st := m.State()
	for _, t := range st.tablesByID() {
		if t.Bulk == nil || !t.Bulk.Rows {
			continue
		}
		if t.Bulk.Rollout == nil && !t.bulkCopiesLoading() && !t.bulkDropsPending() {
			continue
		}
		_, _, err := m.propose(Command{UnixMs: m.opts.Now().UnixMilli(), Payload: BulkAdvance{Tenant: t.Tenant, Table: t.Name}}, nil, nil)
		if err != nil && !errors.Is(err, ErrClosed) {
			m.logger.Debug("tablemaster: bulk rollout did not advance", "tenant", t.Tenant, "table", t.Name, "err", err)
		}
	}
}
