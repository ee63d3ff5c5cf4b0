package tablemaster

import (
	"context"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/tablemaster/balance"
)

// BalancePlan implements api.MasterServer: the plan tablemaster/balance
// makes from the current map and the load view (load.go). It changes
// nothing unless the request says apply: then it runs one balancing round
// now (rebalance.go) and says which actions started.
func (m *Master) BalancePlan(ctx context.Context, req *api.BalancePlanRequest) (*api.BalancePlanResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	var (
		res     balance.Result
		refs    map[uint64]partRef
		errs    []error
		version uint64
		warm    bool
	)
	if req.GetApply() {
		if !m.leads() {
			return nil, m.notLeader()
		}
		r := m.rebalanceRound(ctx, false)
		res, refs, errs, version, warm = r.plan, r.refs, r.errs, r.version, r.warm
		if errs == nil {
			errs = []error{} // started nothing, but applied: no action without its answer
		}
	} else {
		st := m.State()
		res, refs = m.plan(st, m.opts.Now())
		version, warm = st.Version, m.load.warm(st)
	}
	resp := &api.BalancePlanResponse{Band: res.Band, Note: res.Note, MapVersion: version}
	if !warm {
		resp.Note = "load rates still warming up (a server has sent fewer than two full reports); " + resp.Note
	}
	resp.Actions = balanceActionsProto(res.Actions, refs, errs)
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
