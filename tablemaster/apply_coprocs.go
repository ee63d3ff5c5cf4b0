package tablemaster

import (
	"slices"

	"github.com/tabuladb/tabula/api"
)

// The coprocessors sub-machine: OpCoprocDeploy, OpCoprocReady,
// OpCoprocRollback.

func (s *State) coprocTable(tenant, table, name string, chk bool) (*Table, error) {
	if err := checkName(chk, "tenant", tenant); err != nil {
		return nil, err
	}
	if err := checkName(chk, "table", table); err != nil {
		return nil, err
	}
	if err := checkName(chk, "name", name); err != nil {
		return nil, err
	}
	t, err := s.Table(tenant, table)
	if err != nil {
		return nil, err
	}
	// Coprocessor commands modify the table (a no-op's copy is dropped).
	return s.mutTable(t), nil
}

func (s *State) coprocDeploy(cmd *CoprocDeploy, unixMs int64, chk bool) (Result, error) {
	t, err := s.coprocTable(cmd.Tenant, cmd.Table, cmd.Name, chk)
	if err != nil {
		return Result{}, err
	}
	v := cmd.Coproc
	if v == nil || chk && (len(v.SHA256) != 64 || v.Size == 0) {
		return Result{}, errInvalid("coproc", "coproc_missing", 0, "the module's sha256 and size are missing")
	}
	c := t.Coprocs[cmd.Name]
	if c == nil {
		if chk && len(t.Coprocs) >= MaxCoprocsPerTable {
			return Result{}, errInvalid("name", "too_many_coprocessors", MaxCoprocsPerTable, "table %s/%s has %d coprocessors; the limit is %d", t.Tenant, t.Name, len(t.Coprocs), MaxCoprocsPerTable)
		}
		c = &Coproc{Next: 1}
	} else if k := slices.IndexFunc(c.Versions, func(x CoprocVersion) bool { return x.SHA256 == v.SHA256 }); k >= 0 {
		return Result{Changed: false, Version: c.Versions[k].Version}, nil
	}
	// Validation is over: mutate.
	if t.Coprocs == nil {
		t.Coprocs = map[string]*Coproc{}
	}
	t.Coprocs[cmd.Name] = c
	nv := CoprocVersion{Version: c.Next, SHA256: v.SHA256, Size: v.Size, CreatedUnixMs: unixMs, Methods: slices.Clone(v.Methods), Writes: v.Writes}
	c.Next++
	c.Versions = append(c.Versions, nv)
	for len(c.Versions) > MaxCoprocVersions {
		k := slices.IndexFunc(c.Versions, func(x CoprocVersion) bool { return x.Version != c.Live })
		c.Versions = slices.Delete(c.Versions, k, k+1)
	}
	return Result{Changed: true, Version: nv.Version}, nil
}

func (s *State) coprocReady(cmd *CoprocReady, chk bool) (Result, error) {
	t, err := s.coprocTable(cmd.Tenant, cmd.Table, cmd.Name, chk)
	if err != nil {
		return Result{}, err
	}
	c := t.Coprocs[cmd.Name]
	if c == nil {
		return Result{}, nil // dropped meanwhile
	}
	k := c.version(cmd.Version)
	if k < 0 {
		return Result{}, nil
	}
	v := &c.Versions[k]
	changed := false
	if !slices.Contains(v.ReadyOn, cmd.ServerID) {
		v.ReadyOn = append(v.ReadyOn, cmd.ServerID)
		slices.Sort(v.ReadyOn)
		changed = true
	}
	// A report already recorded still promotes: the hosts may have changed
	// since (a replica moved off the last server without the version), and
	// no other report would come.
	if c.promotable(v.Version) && t.readyEverywhere(v) {
		c.Live, c.MaxLive = v.Version, v.Version
		changed = true
	}
	return Result{Changed: changed}, nil
}

func (s *State) coprocRollback(cmd *CoprocRollback, chk bool) (Result, error) {
	t, err := s.coprocTable(cmd.Tenant, cmd.Table, cmd.Name, chk)
	if err != nil {
		return Result{}, err
	}
	c := t.Coprocs[cmd.Name]
	if c == nil {
		return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_NOT_FOUND, "coprocessor_not_found", "table %s/%s has no coprocessor %q", t.Tenant, t.Name, cmd.Name)
	}
	k := c.version(cmd.Version)
	if k < 0 {
		return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_NOT_FOUND, "coproc_version_not_found", "coprocessor %q has no version %d", cmd.Name, cmd.Version)
	}
	if chk && !t.readyEverywhere(&c.Versions[k]) {
		return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_UNAVAILABLE, "coproc_not_ready", "version %d of %q is not compiled on every server hosting %s/%s yet", cmd.Version, cmd.Name, t.Tenant, t.Name)
	}
	if c.Live == cmd.Version {
		return Result{}, nil
	}
	c.MaxLive = max(c.MaxLive, c.Live) // a state from before MaxLive learns it here
	c.Live = cmd.Version
	return Result{Changed: true}, nil
}
