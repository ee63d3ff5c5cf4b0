package queue

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabuladb/tabula/api"
)

// tenantKeys are the tenants' keys as the master last gave them, for
// checking signatures (sharedkey.Keys). An unknown account or a refused
// signature fetches them again, at most every KeyRefresh, so a new
// tenant or a rotated key is taken up at once. (The Table gateway keeps
// its own copy: the two services run apart.) Safe for concurrent use.
type tenantKeys struct {
	opts  Options
	conns []*grpc.ClientConn

	mu sync.Mutex
	// Guarded by mu.
	keys    map[string][][]byte
	fetched time.Time
}

func newTenantKeys(o Options) (*tenantKeys, error) {
	k := &tenantKeys{opts: o, keys: map[string][][]byte{}}
	for _, addr := range o.Masters {
		dopts := append([]grpc.DialOption{api.FastReconnect(), api.Keepalive(),
			grpc.WithTransportCredentials(insecure.NewCredentials())}, o.Credential.DialOptions()...)
		if o.TLS != nil {
			dopts = append(dopts, grpc.WithTransportCredentials(credentials.NewTLS(o.TLS)))
		}
		cc, err := grpc.NewClient(addr, dopts...)
		if err != nil {
			return nil, errors.Join(err, k.close())
		}
		k.conns = append(k.conns, cc)
	}
	return k, nil
}

func (k *tenantKeys) close() error {
	var errs []error
	for _, cc := range k.conns {
		errs = append(errs, cc.Close())
	}
	return errors.Join(errs...)
}

// Lookup implements sharedkey.Keys.
func (k *tenantKeys) Lookup(account string) ([][]byte, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	v, ok := k.keys[account]
	return v, ok
}

// refresh fetches the keys from a master, unless they were fetched
// within KeyRefresh (force: regardless).
func (k *tenantKeys) refresh(ctx context.Context, force bool) error {
	k.mu.Lock()
	if !force && k.opts.Now().Sub(k.fetched) < k.opts.KeyRefresh {
		k.mu.Unlock()
		return nil
	}
	k.fetched = k.opts.Now()
	k.mu.Unlock()
	var last error
	for _, cc := range k.conns {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := api.NewMasterClient(cc).TenantKeys(cctx, &api.TenantKeysRequest{})
		cancel()
		if err != nil {
			last = err
			continue
		}
		keys := make(map[string][][]byte, len(resp.GetTenants()))
		for _, t := range resp.GetTenants() {
			keys[t.GetName()] = t.GetKeys()
		}
		k.mu.Lock()
		k.keys = keys
		k.mu.Unlock()
		return nil
	}
	return last
}
