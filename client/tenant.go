package client

import (
	"context"
	"fmt"

	"github.com/tabuladb/tabula/api"
)

// CreateTenant creates tenant name (the client must hold the cluster
// credential) with quota (nil: no limits) and returns it with its two keys.
// keys, if given (at most two, each 64 bytes: DecodeKey's form), become
// its key 1 and key 2 instead of fresh random ones; a key not given is
// generated. Given keys are for accounts whose key is published or set
// elsewhere (the Azure storage emulator's devstoreaccount1); fresh keys
// are safer everywhere else. Like CreateTable, a call retried after a lost
// reply takes effect once.
func (c *Client) CreateTenant(ctx context.Context, name string, quota *api.TenantQuota, keys ...[]byte) (*api.TenantInfo, error) {
	what := fmt.Sprintf("client: create tenant %q", name)
	if err := api.ValidateName("name", name); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	var resp *api.CreateTenantResponse
	err := c.masterCall(withMasterRequestID(ctx), what, func(ctx context.Context, mc api.MasterClient) error {
		var err error
		resp, err = mc.CreateTenant(ctx, &api.CreateTenantRequest{Tenant: name, Quota: quota, Keys: keys})
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp.GetTenant(), nil
}
