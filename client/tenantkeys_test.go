package client_test

import (
	"bytes"
	"testing"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
)

// TestCreateTenantGivenKey: a tenant created with a known key (the Azure
// emulator's published one) signs with it; key 2, not given, is fresh;
// a key of the wrong length is refused.
func TestCreateTenantGivenKey(t *testing.T) {
	tc := startCluster(t, 1)
	admin := newClient(t, tc)
	ctx := testCtx(t)
	key, err := client.DecodeKey("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==")
	if err != nil {
		t.Fatal(err)
	}
	ti, err := admin.CreateTenant(ctx, "devstoreaccount1", nil, key)
	if err != nil {
		t.Fatal(err)
	}
	if ks := ti.GetKeys(); len(ks) != 2 || !bytes.Equal(ks[0], key) || len(ks[1]) != 64 || bytes.Equal(ks[1], key) {
		t.Fatalf("keys %x; want the given one and a fresh one", ks)
	}
	for i, k := range ti.GetKeys() {
		c, err := client.New(ctx, client.Options{Masters: tc.MasterAddrs(), Seed: testSeed, Credential: client.TenantCredential("devstoreaccount1", i+1, k)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if i == 0 {
			if _, err := c.CreateTable(ctx, "t", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 1, Replication: 1, Storage: "memory"}); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Table("t").Put(ctx, []byte("k"), []byte("v")); err != nil {
			t.Fatalf("put signed with key %d: %v", i+1, err)
		}
	}
	_, err = admin.CreateTenant(ctx, "other", nil, key[:32])
	wantCode(t, "a 32-byte key", err, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT)
	_, err = admin.CreateTenant(ctx, "other", nil, key, key, key)
	wantCode(t, "three keys", err, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT)
}
