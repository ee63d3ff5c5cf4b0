package frontend

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/frontend/entity"
	"github.com/tabuladb/tabula/frontend/sharedkey"
	"github.com/tabuladb/tabula/frontend/tenantkeys"
)

// tenantKeys are the tenants' keys as the master last gave them
// (tenantkeys.Cache, shared with the Queue service), with the gateway's
// verification around them.
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

// verify authenticates r for account, fetching the keys again once when
// the account is unknown or the signature refused.
// keys (which may add stored access policies) are k's for the request.
func (k *tenantKeys) verify(r *http.Request, account string, keys sharedkey.Keys, now time.Time) (sharedkey.Principal, error) {
	p, err := sharedkey.Verify(r, account, keys, now)
	if err == nil {
		return p, nil
	}
	var se *sharedkey.Error
	if !errors.As(err, &se) || se.Code == "AuthorizationPermissionMismatch" {
		return p, err
	}
	if rerr := k.refresh(r.Context(), false); rerr != nil {
		return p, &svcError{status: http.StatusServiceUnavailable, code: "ServerBusy", msg: "The server cannot read the accounts' keys: " + rerr.Error()}
	}
	return sharedkey.Verify(r, account, keys, now)
}

// account is one account (tenant): a client acting for it, and its
// tables by lower-case name (table names are case-insensitive).
type account struct {
	c        *client.Client
	settings *settings

	mu sync.Mutex
	// Guarded by mu.
	tables map[string]string // lower-case name -> name as created
	listed bool              // tables was filled from the master
}

// account returns the account's state, making its client on first use.
func (g *Gateway) account(name string) (*account, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, &svcError{status: http.StatusServiceUnavailable, code: "ServerBusy", msg: "The gateway is shutting down."}
	}
	if a := g.accounts[name]; a != nil {
		return a, nil
	}
	c, err := client.New(context.Background(), client.Options{Masters: g.opts.Masters, Credential: g.opts.Credential,
		Tenant: name, TLS: g.opts.TLS, Logger: g.log})
	if err != nil {
		return nil, err
	}
	a := &account{c: c, settings: &settings{c: c, now: g.opts.Now}, tables: map[string]string{}}
	g.accounts[name] = a
	return a, nil
}

// table resolves a table name as the request spells it to the name it
// was created with; ok is false when the account has no such table.
func (a *account) table(ctx context.Context, name string) (string, bool, error) {
	low := strings.ToLower(name)
	a.mu.Lock()
	actual, ok := a.tables[low]
	a.mu.Unlock()
	if ok {
		return actual, true, nil
	}
	if err := a.list(ctx); err != nil {
		return "", false, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	actual, ok = a.tables[low]
	return actual, ok, nil
}

// tableFresh is table without the cache: for creates and gets, which
// must not trust a table another gateway (or the CLI) may have dropped
// or created since.
func (a *account) tableFresh(ctx context.Context, name string) (string, bool, error) {
	if err := a.list(ctx); err != nil {
		return "", false, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	actual, ok := a.tables[strings.ToLower(name)]
	return actual, ok, nil
}

// list reads the account's tables (its ordered tables) from the master.
func (a *account) list(ctx context.Context) error {
	ts, err := a.c.ListTables(ctx)
	if err != nil {
		return err
	}
	// Names differing only in case are one Azure table: the oldest (the
	// lowest id) is it, on every gateway (createTable drops a younger one
	// it made).
	tables, ids := map[string]string{}, map[string]uint64{}
	for _, t := range ts {
		// Other services' tables (the queue service's azure-queue-store)
		// are no legal Azure table names: not the account's tables.
		if t.GetKind() != api.TableKind_TABLE_KIND_ORDERED || entity.ValidateTableName(t.GetName()) != nil {
			continue
		}
		low := strings.ToLower(t.GetName())
		if id, seen := ids[low]; !seen || t.GetId() < id {
			tables[low], ids[low] = t.GetName(), t.GetId()
		}
	}
	a.mu.Lock()
	a.tables, a.listed = tables, true
	a.mu.Unlock()
	return nil
}

// forget drops a table from the cache (dropped, or found missing).
func (a *account) forget(name string) {
	a.mu.Lock()
	delete(a.tables, strings.ToLower(name))
	a.mu.Unlock()
}

// remember adds a table to the cache.
func (a *account) remember(name string) {
	a.mu.Lock()
	a.tables[strings.ToLower(name)] = name
	a.mu.Unlock()
}

// knownAccount says whether name is a tenant the gateway knows the keys
// of (fetching them again at most every KeyRefresh): unauthenticated
// requests (CORS) must not make clients for any name they like.
func (g *Gateway) knownAccount(ctx context.Context, name string) bool {
	if _, ok := g.keys.Lookup(name); ok {
		return true
	}
	_ = g.keys.refresh(ctx, false)
	_, ok := g.keys.Lookup(name)
	return ok
}
