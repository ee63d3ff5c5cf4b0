package tenantkeys

import (
	"context"
	"crypto/tls"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
)

// Options configure a Cache.
type Options struct {
	// Masters are the Table Master addresses (required).
	Masters []string
	// Credential is the cluster credential the master asks of callers of
	// TenantKeys.
	Credential client.Credential
	// TLS, when set, is the client TLS configuration to dial masters with.
	TLS *tls.Config
	// Refresh bounds how often Refresh fetches when not forced.
	Refresh time.Duration
	// Now is the clock Refresh is measured by. Default time.Now.
	Now func() time.Time
}

// Cache is the tenants' keys as a master last gave them. An unknown
// account or a refused signature calls Refresh, which fetches them again
// at most every Options.Refresh, so a new tenant or a rotated key is taken
// up at once. Safe for concurrent use.
type Cache struct {
	opts  Options
	conns []*grpc.ClientConn

	mu sync.Mutex
	// Guarded by mu.
	keys    map[string][][]byte
	fetched time.Time
}

// New dials the masters; it fetches nothing yet (Refresh).
func New(o Options) (*Cache, error) {
	if o.Now == nil {
		o.Now = time.Now
	}
	k := &Cache{opts: o, keys: map[string][][]byte{}}
	for _, addr := range o.Masters {
		dopts := append([]grpc.DialOption{api.FastReconnect(), api.Keepalive(),
			grpc.WithTransportCredentials(insecure.NewCredentials())}, o.Credential.DialOptions()...)
		if o.TLS != nil {
			dopts = append(dopts, grpc.WithTransportCredentials(credentials.NewTLS(o.TLS)))
		}
		cc, err := grpc.NewClient(addr, dopts...)
		if err != nil {
			return nil, errors.Join(err, k.Close())
		}
		k.conns = append(k.conns, cc)
	}
	return k, nil
}

// Close closes the connections to the masters.
func (k *Cache) Close() error {
	var errs []error
	for _, cc := range k.conns {
		errs = append(errs, cc.Close())
	}
	return errors.Join(errs...)
}

// Lookup implements sharedkey.Keys.
func (k *Cache) Lookup(account string) ([][]byte, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	v, ok := k.keys[account]
	return v, ok
}

// Refresh fetches the keys from a master, unless they were fetched
// within Options.Refresh (force: regardless). It tries each master in
// turn and returns the last error when none answered.
func (k *Cache) Refresh(ctx context.Context, force bool) error {
	k.mu.Lock()
	if !force && k.opts.Now().Sub(k.fetched) < k.opts.Refresh {
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
