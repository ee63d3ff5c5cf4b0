package tablemaster

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/auth"
	"github.com/tabuladb/tabula/internal/tlsfiles"
)

// credential is the cluster credential the master signs its own calls
// with (raft peers, extent nodes); zero when authentication is off.
func (m *Master) credential() auth.Credential {
	if m.opts.ClusterKey == nil {
		return auth.Credential{}
	}
	return auth.Credential{Principal: auth.ClusterPrincipal, Key: m.opts.ClusterKey}
}

// dialOptions sign every call with the cluster credential and dial with
// DialTLS when set.
func (m *Master) dialOptions() []grpc.DialOption {
	return append(m.credential().DialOptions(), tlsfiles.DialOption(m.opts.DialTLS)...)
}

// authInterceptors check every call's signature against the cluster key
// and the tenants' keys in the current state (none when authentication
// is off). They run before every other interceptor.
func (m *Master) authInterceptors() []grpc.ServerOption {
	if m.opts.ClusterKey == nil {
		return nil
	}
	v := auth.NewVerifier(auth.VerifierOptions{Keys: masterKeyring{m}, Now: m.opts.Now, Logger: m.logger, Digests: m.adm.guard.TakeDigest})
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(v.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(v.StreamServerInterceptor()),
	}
}

// masterKeyring reads keys from the master's current state: a follower
// that has not applied a tenant's creation yet refuses its signature,
// and the SDK retries (it is UNAUTHENTICATED only until then).
type masterKeyring struct{ m *Master }

func (k masterKeyring) Key(principal string, id int) []byte {
	if principal == auth.ClusterPrincipal {
		if id == 0 {
			return k.m.opts.ClusterKey
		}
		return nil
	}
	t := k.m.State().Tenants[principal]
	if t == nil || id < 1 || id > len(t.Keys) {
		return nil
	}
	return t.Keys[id-1]
}

func (masterKeyring) Refresh(context.Context, string) bool { return false }

// tenantInfo renders t with its quota and usage; keys only for the
// cluster principal.
func (m *Master) tenantInfo(st *State, t *Tenant, withKeys bool) *api.TenantInfo {
	ti := &api.TenantInfo{Name: t.Name, CreatedUnixMs: t.CreatedUnixMs, Tables: uint32(len(st.TablesOf(t.Name))),
		Quota: t.Quota.Proto(), Usage: m.tenantUsageOf(st, t.Name)}
	if withKeys {
		ti.Keys = t.Keys
	}
	return ti
}

// isCluster reports whether ctx's caller holds the cluster credential (or
// authentication is off).
func isCluster(ctx context.Context) bool {
	p, ok := auth.FromContext(ctx)
	return !ok || p.IsCluster()
}

// CreateTenant implements api.MasterServer.
func (m *Master) CreateTenant(ctx context.Context, req *api.CreateTenantRequest) (*api.CreateTenantResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	if err := errValidateName("tenant", req.Tenant); err != nil {
		return nil, err
	}
	keys, err := newTenantKeys(req.Keys)
	if err != nil {
		return nil, err
	}
	_, st, err := m.propose(Command{UnixMs: m.opts.Now().UnixMilli(), RequestID: requestIDOf(ctx), Payload: CreateTenant{Tenant: req.Tenant, Keys: keys, Quota: quotaOrNil(req.Quota)}}, nil, nil)
	if err != nil {
		return nil, rpcError("create tenant", err)
	}
	t := st.Tenants[req.Tenant]
	if t == nil {
		return nil, errTenantNotFound(req.Tenant) // created and deleted again meanwhile
	}
	m.logger.Info("tablemaster: tenant created", "tenant", req.Tenant)
	return &api.CreateTenantResponse{Tenant: m.tenantInfo(st, t, true)}, nil
}

// newTenantKeys returns a new tenant's two keys: the request's, as many as
// it gives (at most two, each auth.KeyBytes long: an account whose key is
// published, such as the Azure emulator's), then fresh random ones.
func newTenantKeys(given [][]byte) ([][]byte, error) {
	if len(given) > 2 {
		return nil, api.InvalidArgument("keys", "tenant_keys", 2, "%d keys given; a tenant has 2 (key 1, key 2)", len(given))
	}
	keys := make([][]byte, 2)
	for i := range keys {
		if i >= len(given) {
			keys[i] = auth.NewKey()
			continue
		}
		if len(given[i]) != auth.KeyBytes {
			return nil, api.InvalidArgument(fmt.Sprintf("keys[%d]", i), "tenant_key", auth.KeyBytes, "key %d is %d bytes; a tenant key is %d bytes (512 bits)", i+1, len(given[i]), auth.KeyBytes)
		}
		keys[i] = slices.Clone(given[i])
	}
	return keys, nil
}

// ListTenants implements api.MasterServer.
func (m *Master) ListTenants(ctx context.Context, req *api.ListTenantsRequest) (*api.ListTenantsResponse, error) {
	st := m.State()
	names := make([]string, 0, len(st.Tenants))
	for n := range st.Tenants {
		names = append(names, n)
	}
	slices.Sort(names)
	resp := &api.ListTenantsResponse{}
	for _, n := range names {
		resp.Tenants = append(resp.Tenants, m.tenantInfo(st, st.Tenants[n], false))
	}
	return resp, nil
}

// DescribeTenant implements api.MasterServer. A tenant may describe
// itself (the auth interceptor holds it to its own name), without keys.
func (m *Master) DescribeTenant(ctx context.Context, req *api.DescribeTenantRequest) (*api.DescribeTenantResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	if err := errValidateName("tenant", req.Tenant); err != nil {
		return nil, err
	}
	st := m.State()
	t := st.Tenants[req.Tenant]
	if t == nil {
		return nil, errTenantNotFound(req.Tenant)
	}
	resp := &api.DescribeTenantResponse{Tenant: m.tenantInfo(st, t, isCluster(ctx))}
	tables := st.TablesOf(req.Tenant)
	slices.SortFunc(tables, func(a, b *Table) int { return strings.Compare(a.Name, b.Name) })
	for _, tb := range tables {
		resp.Tables = append(resp.Tables, tb.Proto())
	}
	return resp, nil
}

// DeleteTenant implements api.MasterServer.
func (m *Master) DeleteTenant(ctx context.Context, req *api.DeleteTenantRequest) (*api.DeleteTenantResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	if err := errValidateName("tenant", req.Tenant); err != nil {
		return nil, err
	}
	if _, _, err := m.propose(Command{UnixMs: m.opts.Now().UnixMilli(), RequestID: requestIDOf(ctx), Payload: DeleteTenant{Tenant: req.Tenant}}, nil, nil); err != nil {
		return nil, rpcError("delete tenant", err)
	}
	m.logger.Info("tablemaster: tenant deleted", "tenant", req.Tenant)
	return &api.DeleteTenantResponse{}, nil
}

// RotateTenantKey implements api.MasterServer.
func (m *Master) RotateTenantKey(ctx context.Context, req *api.RotateTenantKeyRequest) (*api.RotateTenantKeyResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	if err := errValidateName("tenant", req.Tenant); err != nil {
		return nil, err
	}
	_, st, err := m.propose(Command{UnixMs: m.opts.Now().UnixMilli(), RequestID: requestIDOf(ctx), Payload: RotateTenantKey{Tenant: req.Tenant, KeyIndex: int(req.Key), Keys: [][]byte{auth.NewKey()}}}, nil, nil)
	if err != nil {
		return nil, rpcError("rotate tenant key", err)
	}
	t := st.Tenants[req.Tenant]
	if t == nil {
		return nil, errTenantNotFound(req.Tenant)
	}
	m.logger.Info("tablemaster: tenant key rotated", "tenant", req.Tenant, "key", req.Key)
	return &api.RotateTenantKeyResponse{Tenant: m.tenantInfo(st, t, true)}, nil
}

// TenantKeys implements api.MasterServer (cluster credential only).
func (m *Master) TenantKeys(context.Context, *api.TenantKeysRequest) (*api.TenantKeysResponse, error) {
	st := m.State()
	resp := &api.TenantKeysResponse{Version: st.TenantsVersion}
	for _, t := range st.Tenants {
		resp.Tenants = append(resp.Tenants, &api.TenantInfo{Name: t.Name, Keys: t.Keys})
	}
	return resp, nil
}

// quotaOrNil converts a request's quota (nil: none).
func quotaOrNil(q *api.TenantQuota) *TenantQuota {
	if q == nil {
		return nil
	}
	c := TenantQuotaOf(q)
	return &c
}

// clusterOnlyUnary and clusterOnlyStream keep the internal listener
// (ServeInternal) to the cluster credential; the signature is checked
// before them.
func (m *Master) clusterOnlyUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := m.clusterOnly(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (m *Master) clusterOnlyStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := m.clusterOnly(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return h(srv, ss)
}

func (m *Master) clusterOnly(ctx context.Context, method string) error {
	if m.opts.ClusterKey == nil {
		return nil // authentication off (in-process tests)
	}
	if p, ok := auth.FromContext(ctx); ok && p.IsCluster() {
		return nil
	}
	return api.Errorf(api.ErrorCode_ERROR_CODE_PERMISSION_DENIED, "internal_listener",
		"%s: the master's internal listener serves the cluster credential only; clients call its client address", method)
}
