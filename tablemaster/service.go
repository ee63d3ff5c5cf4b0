package tablemaster

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/tabuladb/tabula/api"
)

// This file holds the RPCs of api.MasterServer. Every error they return is
// a Tabula status (api helpers): a refusal keeps its code, anything else is
// UNAVAILABLE.

func errNilRequest() error {
	return errInvalid("request", "request_nil", 0, "request is nil")
}

// CreateTable creates a table and places its partitions. The table is
// durable when it returns.
func (m *Master) CreateTable(ctx context.Context, req *api.CreateTableRequest) (*api.CreateTableResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	opts := optionsFromProto(req.Options)
	if opts == nil {
		opts = &TableOptions{}
	}
	if opts.Replication == 0 {
		// Logged explicitly, so replaying the command never depends on
		// the default of the master that replays it.
		opts.Replication = m.State().defaultReplicationFor(req.Kind)
	}
	res, st, err := m.propose(Command{UnixMs: m.opts.Now().UnixMilli(), RequestID: requestIDOf(ctx), Payload: CreateTable{Tenant: req.Tenant, Table: req.Name, Kind: req.Kind, Options: opts}}, nil, nil)
	if err != nil {
		return nil, rpcError("create table", err)
	}
	if res.Duplicate {
		// A retry of a create that was applied: answer as the first
		// attempt would have (with no map if the table was dropped since).
		m.logger.Info("tablemaster: create table retried; it was done already", "tenant", req.Tenant, "table", req.Name)
		resp := &api.CreateTableResponse{}
		if res.Table != nil {
			resp.Map = res.Table.MapProto(st.Version)
		}
		return resp, nil
	}
	m.logger.Info("tablemaster: table created", "tenant", req.Tenant, "table", req.Name, "id", res.Table.ID,
		"partitions", len(res.Table.Partitions), "placed", len(res.Moved))
	return &api.CreateTableResponse{Map: res.Table.MapProto(st.Version)}, nil
}

// DropTable removes a table; durable when it returns.
func (m *Master) DropTable(ctx context.Context, req *api.DropTableRequest) (*api.DropTableResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	res, _, err := m.propose(Command{UnixMs: m.opts.Now().UnixMilli(), RequestID: requestIDOf(ctx), Payload: DropTable{Tenant: req.Tenant, Table: req.Name}}, nil, nil)
	if err != nil {
		return nil, rpcError("drop table", err)
	}
	if res.Duplicate {
		m.logger.Info("tablemaster: drop table retried; it was done already", "tenant", req.Tenant, "table", req.Name)
		return &api.DropTableResponse{}, nil
	}
	m.logger.Info("tablemaster: table dropped", "tenant", req.Tenant, "table", req.Name)
	return &api.DropTableResponse{}, nil
}

// ListTables lists a tenant's tables by name.
func (m *Master) ListTables(_ context.Context, req *api.ListTablesRequest) (*api.ListTablesResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	if err := errValidateName("tenant", req.Tenant); err != nil {
		return nil, err
	}
	st := m.State()
	if _, ok := st.Tenants[req.Tenant]; !ok {
		return nil, errTenantNotFound(req.Tenant)
	}
	resp := &api.ListTablesResponse{}
	for _, t := range st.TablesOf(req.Tenant) {
		resp.Tables = append(resp.Tables, t.Proto())
	}
	return resp, nil
}

// lookup validates a tenant/table pair of a request and finds the table.
func lookup(st *State, tenantField, tenant, tableField, table string) (*Table, error) {
	if err := errValidateName(tenantField, tenant); err != nil {
		return nil, err
	}
	if err := errValidateName(tableField, table); err != nil {
		return nil, err
	}
	return st.Table(tenant, table)
}

// DescribeTable returns a table's map and the latest status each hosting
// server reported for its replicas.
func (m *Master) DescribeTable(_ context.Context, req *api.DescribeTableRequest) (*api.DescribeTableResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	st := m.State()
	t, err := lookup(st, "tenant", req.Tenant, "name", req.Name)
	if err != nil {
		return nil, err
	}
	resp := &api.DescribeTableResponse{Map: t.MapProto(st.Version)}
	// Each replica's last report; a replicated partition's carry the
	// master's judgement (insync.go): the primary's view of its log's
	// ack set and each replica's own report, combined.
	sr := m.syncReports(st, m.opts.Now())
	for i := range t.Partitions {
		p := &t.Partitions[i]
		var ps partitionSync
		if p.Log != nil {
			ps = sr.judge(t, p)
		}
		for j, r := range p.Replicas {
			s := sr.reports[r.ServerID][p.ID]
			if s == nil {
				continue
			}
			if p.Log != nil {
				s = withSync(s, ps.replicas[j])
			}
			if l := m.load.replicaLoadProto(r.ServerID, p.ID); l != nil {
				if p.Log == nil {
					s = proto.Clone(s).(*api.ReplicaStatus) // reports are shared, never modified
				}
				s.Load = l
			}
			resp.Replicas = append(resp.Replicas, s)
		}
	}
	return resp, nil
}

// GetPartitionMap returns one table's map.
func (m *Master) GetPartitionMap(_ context.Context, req *api.GetPartitionMapRequest) (*api.GetPartitionMapResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	st := m.State()
	t, err := lookup(st, "tenant", req.Tenant, "table", req.Table)
	if err != nil {
		return nil, err
	}
	return &api.GetPartitionMapResponse{Map: t.MapProto(st.Version)}, nil
}

func (m *Master) leaseMs() uint32 { return uint32(m.opts.LeaseDuration.Milliseconds()) }

// RegisterServer adds a table server, or brings a known one back, and
// places unplaced partitions on it. Durable when it returns.
func (m *Master) RegisterServer(_ context.Context, req *api.RegisterServerRequest) (*api.RegisterServerResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	// The answer renews the server's lease, as a heartbeat's does.
	if err := m.mayGrantLease(); err != nil {
		return nil, err
	}
	now := m.opts.Now()
	res, next, err := m.propose(Command{UnixMs: now.UnixMilli(), Payload: RegisterServer{
		ServerID: req.ServerId, Addr: req.Addr, InternalAddr: req.InternalAddr, FaultDomain: req.FaultDomain, Incarnation: req.Incarnation,
		BulkCapacity: req.BulkCapacityBytes,
		// The process holding the id (if another) has not been heard from
		// for longer than its lease, counted from when its last heartbeat
		// arrived (after it was sent, when the lease starts): it serves
		// nothing now, so a new process may take the id over.
		HolderSilent: req.ServerId != "" && m.silentFor(req.ServerId, now, m.opts.LeaseDuration),
	}}, nil, func(res Result) {
		m.liveMu.Lock()
		m.live[res.ServerID] = &liveness{lastHeard: m.opts.Now()}
		m.liveMu.Unlock()
	})
	if err != nil {
		return nil, rpcError("register server", err)
	}
	m.logger.Info("tablemaster: server registered", "server", res.ServerID, "addr", req.Addr,
		"fault_domain", next.Servers[res.ServerID].FaultDomain, "incarnation", req.Incarnation, "placed", len(res.Moved))
	return &api.RegisterServerResponse{
		ServerId:            res.ServerID,
		HeartbeatIntervalMs: uint32(m.opts.HeartbeatInterval.Milliseconds()),
		LeaseMs:             m.leaseMs(),
		MapVersion:          next.Version,
		MasterInternalAddr:  m.InternalAddr(),
	}, nil
}

// Heartbeat records that a server is alive and what its replicas report.
// An unknown or dead-declared server is told to register again; a draining
// one has its partitions moved before the answer.
func (m *Master) Heartbeat(_ context.Context, req *api.HeartbeatRequest) (*api.HeartbeatResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	if err := ValidateServerID("server_id", req.ServerId); err != nil {
		return nil, err
	}
	if err := m.mayGrantLease(); err != nil {
		return nil, err
	}
	st := m.State()
	resp := &api.HeartbeatResponse{MapVersion: st.Version, LeaseMs: m.leaseMs(), TenantsVersion: st.TenantsVersion, MasterInternalAddr: m.InternalAddr()}
	srv := st.Servers[req.ServerId]
	if srv == nil || !srv.Alive {
		resp.Reregister = true
		return resp, nil
	}
	// The request is this call's own (gRPC decodes a new one per call):
	// its statuses are kept as they are, not copied.
	statuses := make([]*api.ReplicaStatus, 0, len(req.Replicas))
	for _, r := range req.Replicas {
		if r == nil {
			continue
		}
		r.ServerId = req.ServerId
		statuses = append(statuses, r)
	}
	m.liveMu.Lock()
	l := m.live[req.ServerId]
	if l == nil || l.dead {
		// Being (or just) declared dead: renew nothing.
		m.liveMu.Unlock()
		resp.Reregister = true
		return resp, nil
	}
	written, statusVersion := l.written, l.statusVersion
	if req.ReplicasOmitted {
		statuses = l.statuses // as last reported
	} else {
		statusVersion = req.MapVersion
		written = make(map[string][2]uint64, len(req.TenantLoad))
		for _, tl := range req.TenantLoad {
			written[tl.GetTenant()] = [2]uint64{tl.GetWrittenBytes(), tl.GetMemoryWrittenBytes()}
		}
	}
	m.live[req.ServerId] = &liveness{lastHeard: m.opts.Now(), statuses: statuses, statusVersion: statusVersion, written: written, draining: l.draining || req.Draining}
	m.liveMu.Unlock()
	if m.raft != nil && !m.raft.leaseGranted.Swap(true) {
		m.logger.Info("tablemaster: leases granted again: first heartbeat answered as leader", "server", req.ServerId)
	}
	if !req.ReplicasOmitted {
		m.bulkReports(req.ServerId, statuses)
		m.splitReports(statuses)
		m.mergeReports(statuses)
		m.load.report(req.ServerId, m.opts.Now(), statuses, req.Capacity)
	}
	m.coprocReports(req.ServerId, req.CoprocReady)
	m.quotas.report(req.ServerId, m.opts.Now(), req.TenantLoad)
	resp.TenantShares = m.quotaShares(st, req.ServerId)
	if req.Draining && !srv.Draining {
		// As DrainServer: primaries only to replicas holding the data.
		res, next, err := m.propose(Command{UnixMs: m.opts.Now().UnixMilli(), Payload: ServerDown{ServerID: req.ServerId, Draining: true, Keep: m.opts.ReplaceAfter > 0, Promote: m.promotions(st, req.ServerId)}}, nil, nil)
		if err != nil {
			return nil, rpcError("drain server", err)
		}
		resp.MapVersion = next.Version
		m.logger.Info("tablemaster: server draining; its partitions moved", "server", req.ServerId, "moved", len(res.Moved))
		m.event(EventDrain, req.ServerId, 0, "server %s shutting down: drained, %d partitions moved", req.ServerId, len(res.Moved))
	}
	return resp, nil
}

// ListServers lists every known server by id.
func (m *Master) ListServers(_ context.Context, req *api.ListServersRequest) (*api.ListServersResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	st := m.State()
	counts := st.ReplicaCounts()
	resp := &api.ListServersResponse{}
	m.liveMu.Lock()
	defer m.liveMu.Unlock()
	for _, id := range st.ServerIDs() {
		srv := st.Servers[id]
		info := &api.ServerInfo{
			Id: id, Addr: srv.Addr, InternalAddr: srv.InternalAddr, FaultDomain: srv.FaultDomain, Alive: srv.Alive,
			Replicas: uint32(counts[id]), Draining: srv.Draining,
		}
		if l := m.live[id]; l != nil {
			info.LastHeartbeatUnixMs = l.lastHeard.UnixMilli()
		}
		resp.Servers = append(resp.Servers, info)
	}
	return resp, nil
}

// ForgetServer removes a dead server; see OpForgetServer. Durable when it
// returns.
func (m *Master) ForgetServer(_ context.Context, req *api.ForgetServerRequest) (*api.ForgetServerResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	res, next, err := m.propose(Command{UnixMs: m.opts.Now().UnixMilli(), Payload: ForgetServer{ServerID: req.ServerId, AcceptDataLoss: req.AcceptDataLoss}}, nil, func(Result) {
		m.liveMu.Lock()
		delete(m.live, req.ServerId)
		m.liveMu.Unlock()
	})
	if err != nil {
		return nil, rpcError("forget server", err)
	}
	resp := &api.ForgetServerResponse{Moved: uint32(len(res.Moved)), MapVersion: next.Version}
	lost := map[uint64]bool{}
	for _, id := range res.Lost {
		lost[id] = true
	}
	for _, lp := range next.DataLoss("", "") {
		if lost[lp.PartitionId] {
			resp.Lost = append(resp.Lost, lp)
		}
	}
	m.event(EventForget, req.ServerId, 0, "server %s forgotten by the operator: %d partitions moved, %d placed again empty", req.ServerId, len(res.Moved), len(resp.Lost))
	if len(resp.Lost) > 0 {
		m.logger.Error("tablemaster: server forgotten; partitions whose only copy it held are placed again EMPTY (data loss accepted by the operator)",
			"server", req.ServerId, "moved", len(res.Moved), "lost", len(resp.Lost))
	} else {
		m.logger.Warn("tablemaster: server forgotten; its partitions moved", "server", req.ServerId, "moved", len(res.Moved))
	}
	return resp, nil
}

// ClearDataLoss clears the data-loss records of a table's partitions (one,
// or every lost one); see OpClearDataLoss.
func (m *Master) ClearDataLoss(_ context.Context, req *api.ClearDataLossRequest) (*api.ClearDataLossResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	what := fmt.Sprintf("clear the data loss of %s/%s", req.Tenant, req.Table)
	res, st, err := m.propose(Command{UnixMs: m.opts.Now().UnixMilli(), Payload: ClearDataLoss{Tenant: req.Tenant, Table: req.Table, PartitionID: req.PartitionId}}, nil, nil)
	if err != nil {
		return nil, rpcError(what, err)
	}
	if len(res.Lost) > 0 {
		m.logger.Warn("tablemaster: data loss acknowledged by the operator", "tenant", req.Tenant, "table", req.Table, "partitions", res.Lost)
		m.event(EventForget, "", 0, "%s/%s: the operator acknowledged the data loss of %d partition(s) %v", req.Tenant, req.Table, len(res.Lost), res.Lost)
	}
	resp := &api.ClearDataLossResponse{Cleared: res.Lost}
	if t := st.Tables[tableKey(req.Tenant, req.Table)]; t != nil {
		resp.Map = t.MapProto(st.Version)
	}
	return resp, nil
}

// ListDataLoss lists the partitions that lost every copy of their data, of
// one table or (tenant and table empty) of all.
func (m *Master) ListDataLoss(_ context.Context, req *api.ListDataLossRequest) (*api.ListDataLossResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	st := m.State()
	if req.Tenant != "" || req.Table != "" {
		if _, err := lookup(st, "tenant", req.Tenant, "table", req.Table); err != nil {
			return nil, err
		}
	}
	return &api.ListDataLossResponse{Lost: st.DataLoss(req.Tenant, req.Table)}, nil
}
