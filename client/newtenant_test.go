package client_test

import (
	"fmt"
	"testing"

	"github.com/tabuladb/tabula/api"
)

// TestNewTenantServedAtOnce: a tenant's first requests to the table
// servers, right after the tenant and its table were created, verify. The
// servers learn tenants' keys from the master at their next heartbeat; a
// signature from a principal they hold no keys of fetches the keys at
// once (bounded per principal and in all), and concurrent first requests
// of one tenant all see that fetch. Before, a fetch made by one request
// within the last second refused the others as unverifiable.
func TestNewTenantServedAtOnce(t *testing.T) {
	tc := startCluster(t, 2)
	ctx := testCtx(t)
	for i := range 5 {
		c, _ := newTenant(t, tc, fmt.Sprintf("fresh%d", i), nil)
		if _, err := c.CreateTable(ctx, "t", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 4, Replication: 1, Storage: "memory"}); err != nil {
			t.Fatal(err)
		}
		tb := c.Table("t")
		errs := make(chan error, 8)
		for k := range 8 {
			go func() { errs <- tb.Put(ctx, fmt.Appendf(nil, "k%d", k), []byte("v")) }()
		}
		for range 8 {
			if err := <-errs; err != nil {
				t.Fatalf("tenant fresh%d: a first write: %v", i, err)
			}
		}
	}
}
