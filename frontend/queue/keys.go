package queue

import (
	"context"

	"github.com/tabuladb/tabula/frontend/tenantkeys"
)

// tenantKeys are the tenants' keys as the master last gave them
// (tenantkeys.Cache, shared with the Table gateway).
type tenantKeys struct{ *tenantkeys.Cache }

func newTenantKeys(o Options) (*tenantKeys, error) {
	c, err := tenantkeys.New(tenantkeys.Options{Masters: o.Masters, Credential: o.Credential, TLS: o.TLS, Refresh: o.KeyRefresh, Now: o.Now})
	if err != nil {
		return nil, err
	}
	return &tenantKeys{c}, nil
}

func (k *tenantKeys) close() error { return k.Close() }

// refresh fetches the keys again (tenantkeys.Cache.Refresh).
func (k *tenantKeys) refresh(ctx context.Context, force bool) error { return k.Refresh(ctx, force) }
