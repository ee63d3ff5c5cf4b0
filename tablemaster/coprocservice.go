package tablemaster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/coproc"
	"github.com/tabuladb/tabula/internal/atomicfile"
)

// Modules are kept in <DataDir>/coproc/<sha256>.wasm, written (fsynced,
// renamed) before the deploy command that names them is logged, and read
// back verified against their name.
const coprocDir = "coproc"

func (m *Master) modulePath(sum string) string {
	return filepath.Join(m.opts.DataDir, coprocDir, sum+".wasm")
}

// CoprocDeploy validates a module, stores it and registers it as the next
// version of the coprocessor (the same bytes again return the existing
// version). Durable when it returns.
func (m *Master) CoprocDeploy(_ context.Context, req *api.CoprocDeployRequest) (*api.CoprocDeployResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	if _, err := lookup(m.State(), "tenant", req.Tenant, "table", req.Table); err != nil {
		return nil, err
	}
	if err := errValidateName("name", req.Name); err != nil {
		return nil, err
	}
	man, err := coproc.Validate(req.Wasm)
	if err != nil {
		return nil, errInvalid("wasm", "module_invalid", coproc.DefaultMaxModuleBytes, "the module is refused: %v", err)
	}
	sum := hex.EncodeToString(man.Digest[:])
	path := m.modulePath(sum)
	if _, err := os.Stat(path); err != nil {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, rpcError("store module", err)
		}
		if err := atomicfile.WriteFile(path, req.Wasm, 0o644); err != nil {
			return nil, rpcError("store module", err)
		}
	}
	res, st, err := m.propose(Command{UnixMs: m.opts.Now().UnixMilli(), Payload: CoprocDeploy{Tenant: req.Tenant, Table: req.Table, Name: req.Name, Coproc: &CoprocVersion{SHA256: sum, Size: uint64(man.Size), Methods: man.Methods, Writes: man.Writes}}}, nil, nil)
	if err != nil {
		return nil, rpcError("deploy coprocessor", err)
	}
	m.logger.Info("tablemaster: coprocessor deployed", "tenant", req.Tenant, "table", req.Table, "name", req.Name,
		"version", res.Version, "sha256", sum[:16], "methods", man.Methods)
	return &api.CoprocDeployResponse{Coprocessor: coprocOf(st, req.Tenant, req.Table, req.Name), Version: res.Version}, nil
}

func coprocOf(st *State, tenant, table, name string) *api.Coprocessor {
	t := st.Tables[tableKey(tenant, table)]
	if t == nil {
		return nil
	}
	for _, c := range t.CoprocsProto() {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// CoprocList lists a table's coprocessors.
func (m *Master) CoprocList(_ context.Context, req *api.CoprocListRequest) (*api.CoprocListResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	t, err := lookup(m.State(), "tenant", req.Tenant, "table", req.Table)
	if err != nil {
		return nil, err
	}
	return &api.CoprocListResponse{Coprocessors: t.CoprocsProto()}, nil
}

// CoprocRollback points a coprocessor's live alias at a version compiled on
// every hosting server. Durable when it returns.
func (m *Master) CoprocRollback(_ context.Context, req *api.CoprocRollbackRequest) (*api.CoprocRollbackResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	_, st, err := m.propose(Command{UnixMs: m.opts.Now().UnixMilli(), Payload: CoprocRollback{Tenant: req.Tenant, Table: req.Table, Name: req.Name, Version: req.Version}}, nil, nil)
	if err != nil {
		return nil, rpcError("roll back coprocessor", err)
	}
	return &api.CoprocRollbackResponse{Coprocessor: coprocOf(st, req.Tenant, req.Table, req.Name)}, nil
}

// CoprocFetch returns a version's module, verified against its SHA-256.
func (m *Master) CoprocFetch(_ context.Context, req *api.CoprocFetchRequest) (*api.CoprocFetchResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	t, err := lookup(m.State(), "tenant", req.Tenant, "table", req.Table)
	if err != nil {
		return nil, err
	}
	c := t.Coprocs[req.Name]
	k := -1
	if c != nil {
		k = c.version(req.Version)
	}
	if k < 0 {
		return nil, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_NOT_FOUND, "coproc_version_not_found", "table %s/%s has no coprocessor %q version %d", req.Tenant, req.Table, req.Name, req.Version)
	}
	sum := c.Versions[k].SHA256
	b, err := os.ReadFile(m.modulePath(sum))
	if err != nil {
		return nil, rpcError("read module", err)
	}
	if got := sha256.Sum256(b); hex.EncodeToString(got[:]) != sum {
		return nil, rpcError("read module", fmt.Errorf("module %s fails its sha256: %w", sum, errors.New("corrupt module file")))
	}
	return &api.CoprocFetchResponse{Wasm: b, Sha256: sum}, nil
}

// coprocReports turns a heartbeat's compiled-module reports into
// OpCoprocReady for what the state does not record yet, or for a version
// every host now has that is not live yet.
func (m *Master) coprocReports(serverID string, ready []*api.CoprocReady) {
	st := m.State()
	for _, r := range ready {
		t := st.Tables[tableKey(r.GetTenant(), r.GetTable())]
		if t == nil {
			continue
		}
		c := t.Coprocs[r.GetName()]
		if c == nil {
			continue
		}
		k := c.version(r.GetVersion())
		if k < 0 {
			continue
		}
		// Recorded already: proposed again only if it would now promote
		// the version (its hosts changed since the last report).
		if v := &c.Versions[k]; slices.Contains(v.ReadyOn, serverID) && (!c.promotable(v.Version) || !t.readyEverywhere(v)) {
			continue
		}
		res, _, err := m.propose(Command{UnixMs: m.opts.Now().UnixMilli(), Payload: CoprocReady{Tenant: r.GetTenant(), Table: r.GetTable(), Name: r.GetName(), Version: r.GetVersion(), ServerID: serverID}}, nil, nil)
		if err != nil {
			m.logger.Warn("tablemaster: coprocessor ready report refused", "server", serverID, "name", r.GetName(), "err", err)
		} else if res.Changed {
			m.logger.Debug("tablemaster: coprocessor compiled", "server", serverID, "table", r.GetTable(), "name", r.GetName(), "version", r.GetVersion())
		}
	}
}
