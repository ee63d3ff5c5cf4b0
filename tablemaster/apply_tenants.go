package tablemaster

import (
	"github.com/tabuladb/tabula/api"
)

// The tenants sub-machine: OpCreateTenant, OpDeleteTenant,
// OpRotateTenantKey, OpSetTenantQuota.

func (s *State) createTenant(cmd *CreateTenant, unixMs int64, chk bool) (Result, error) {
	if err := checkName(chk, "tenant", cmd.Tenant); err != nil {
		return Result{}, err
	}
	if _, ok := s.Tenants[cmd.Tenant]; ok {
		return Result{}, errCode(ErrTenantExists, api.ErrorCode_ERROR_CODE_ALREADY_EXISTS, "tenant_exists", "tenant %q already exists", cmd.Tenant)
	}
	// No keys: only the cluster credential acts for the tenant until a
	// rotation gives it some (states from before tenants had keys).
	if chk && len(cmd.Keys) != 2 && len(cmd.Keys) != 0 {
		return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "tenant_keys", "a new tenant has 2 keys, got %d", len(cmd.Keys))
	}
	for _, k := range cmd.Keys {
		if err := checkKey(chk, k); err != nil {
			return Result{}, err
		}
	}
	t := &Tenant{Name: cmd.Tenant, CreatedUnixMs: unixMs, Keys: cmd.Keys}
	if cmd.Quota != nil {
		t.Quota = *cmd.Quota
	}
	s.tenantsW()[cmd.Tenant] = t
	s.TenantsVersion++
	return Result{Changed: true}, nil
}

// TenantKeyBytes is the length of a tenant key (auth.KeyBytes).
const TenantKeyBytes = 64

func checkKey(chk bool, k []byte) error {
	if chk && len(k) != TenantKeyBytes {
		return errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "tenant_key", "a tenant key is %d bytes, got %d", TenantKeyBytes, len(k))
	}
	return nil
}

// deleteTenant removes a tenant with no tables: its tables' data is never
// dropped as a side effect.
func (s *State) deleteTenant(cmd *DeleteTenant, chk bool) (Result, error) {
	if _, ok := s.Tenants[cmd.Tenant]; !ok {
		return Result{}, errTenantNotFound(cmd.Tenant)
	}
	if n := len(s.TablesOf(cmd.Tenant)); n > 0 {
		return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, "tenant_has_tables",
			"tenant %q has %d table(s); drop them first (tabula table drop)", cmd.Tenant, n)
	}
	delete(s.tenantsW(), cmd.Tenant)
	s.TenantsVersion++
	return Result{Changed: true}, nil
}

// rotateTenantKey replaces one of a tenant's keys; the other keeps
// signing.
func (s *State) rotateTenantKey(cmd *RotateTenantKey, chk bool) (Result, error) {
	t, ok := s.Tenants[cmd.Tenant]
	if !ok {
		return Result{}, errTenantNotFound(cmd.Tenant)
	}
	if cmd.KeyIndex != 1 && cmd.KeyIndex != 2 {
		return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "tenant_key_number", "key %d: a tenant has key 1 and key 2", cmd.KeyIndex)
	}
	if len(cmd.Keys) != 1 {
		return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "tenant_keys", "a rotation carries 1 key, got %d", len(cmd.Keys))
	}
	if err := checkKey(chk, cmd.Keys[0]); err != nil {
		return Result{}, err
	}
	n := *t
	n.Keys = make([][]byte, 2)
	copy(n.Keys, t.Keys)
	n.Keys[cmd.KeyIndex-1] = cmd.Keys[0]
	s.tenantsW()[cmd.Tenant] = &n
	s.TenantsVersion++
	return Result{Changed: true}, nil
}

// setTenantQuota replaces a tenant's quotas. Quotas are not keys: the
// tenants' version (which makes servers fetch keys) stays.
func (s *State) setTenantQuota(cmd *SetTenantQuota) (Result, error) {
	t, ok := s.Tenants[cmd.Tenant]
	if !ok {
		return Result{}, errTenantNotFound(cmd.Tenant)
	}
	n := *t
	n.Quota = TenantQuota{}
	if cmd.Quota != nil {
		n.Quota = *cmd.Quota
	}
	if n.Quota == t.Quota {
		return Result{}, nil
	}
	s.tenantsW()[cmd.Tenant] = &n
	return Result{Changed: true}, nil
}
