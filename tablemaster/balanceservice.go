package tablemaster

import (
	"context"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/tablemaster/balance"
)

// BalancePlan implements api.MasterServer: the plan tablemaster/balance
// makes from the current map and the load view (load.go). It changes
// nothing; carrying a plan out goes through the move path (move.go).
func (m *Master) BalancePlan(_ context.Context, req *api.BalancePlanRequest) (*api.BalancePlanResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	st := m.State()
	snap, refs := m.load.snapshot(st)
	res := balance.Plan(snap, balance.Options{})
	resp := &api.BalancePlanResponse{Band: res.Band, Note: res.Note, MapVersion: st.Version}
	if !m.load.warm(st) {
		resp.Note = "load rates still warming up (a server has sent fewer than two full reports); " + resp.Note
	}
	for _, a := range res.Actions {
		ref := refs[a.Partition]
		kind := api.BalanceActionKind_BALANCE_ACTION_KIND_MOVE_REPLICA
		if a.Kind == balance.TransferPrimary {
			kind = api.BalanceActionKind_BALANCE_ACTION_KIND_TRANSFER_PRIMARY
		}
		resp.Actions = append(resp.Actions, &api.BalanceAction{Kind: kind, PartitionId: a.Partition, Tenant: ref.tenant, Table: ref.table,
			Index: ref.index, From: a.From, To: a.To, Reason: a.Reason})
	}
	resp.Before = balanceServers(res.Before)
	resp.After = balanceServers(res.After)
	return resp, nil
}

func balanceServers(ls []balance.ServerLoad) []*api.BalanceServer {
	out := make([]*api.BalanceServer, len(ls))
	for i, l := range ls {
		out[i] = &api.BalanceServer{
			Id: l.ID, FaultDomain: l.Domain, Replicas: uint32(l.Load[balance.DimReplicas]), Primaries: uint32(l.Primaries),
			ReadsPerSec: l.Load[balance.DimReads], WritesPerSec: l.Load[balance.DimWrites], BusyCores: l.Load[balance.DimBusy],
			DiskBytes: uint64(l.Load[balance.DimDisk]), MemoryBytes: uint64(l.Load[balance.DimMemory]),
			DiskCapacityBytes: uint64(l.Capacity.DiskBytes), MemoryCapacityBytes: uint64(l.Capacity.MemoryBytes),
			Available: !l.Draining, Draining: l.Draining,
		}
	}
	return out
}
