package tablemaster

import (
	"bytes"
	"context"
	"encoding/base64"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
)

// TestCreateTenantGivenKeys: CreateTenant takes the keys it is given (one:
// key 2 is generated), refuses keys of the wrong length or number, and the
// keys outlive a restart (they are in the raft-logged command).
func TestCreateTenantGivenKeys(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dir := t.TempDir()
	opts := Options{DataDir: dir, Logger: testLogger(t)}
	r := start(t, opts)
	azure, err := base64.StdEncoding.DecodeString("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==")
	if err != nil {
		t.Fatal(err)
	}
	two := bytes.Repeat([]byte{2}, 64)

	resp, err := r.c.CreateTenant(ctx, &api.CreateTenantRequest{Tenant: "devstoreaccount1", Keys: [][]byte{azure}})
	if err != nil {
		t.Fatal(err)
	}
	keys := resp.GetTenant().GetKeys()
	if len(keys) != 2 || !bytes.Equal(keys[0], azure) || len(keys[1]) != 64 || bytes.Equal(keys[1], azure) {
		t.Fatalf("keys %x; want the given one, then a fresh one", keys)
	}
	generated := keys[1]
	if resp, err = r.c.CreateTenant(ctx, &api.CreateTenantRequest{Tenant: "both", Keys: [][]byte{two, azure}}); err != nil {
		t.Fatal(err)
	}
	if keys := resp.GetTenant().GetKeys(); len(keys) != 2 || !bytes.Equal(keys[0], two) || !bytes.Equal(keys[1], azure) {
		t.Fatalf("keys %x; want the two given", keys)
	}
	if resp, err = r.c.CreateTenant(ctx, &api.CreateTenantRequest{Tenant: "fresh"}); err != nil {
		t.Fatal(err)
	}
	if keys := resp.GetTenant().GetKeys(); len(keys) != 2 || len(keys[0]) != 64 || bytes.Equal(keys[0], keys[1]) {
		t.Fatalf("fresh keys %x", keys)
	}
	for _, tc := range []struct {
		name          string
		keys          [][]byte
		reason, field string
	}{
		{"three", [][]byte{two, two, two}, "tenant_keys", "keys"},
		{"short", [][]byte{azure[:63]}, "tenant_key", "keys[0]"},
		{"long second", [][]byte{two, append(two, 0)}, "tenant_key", "keys[1]"},
		{"empty", [][]byte{{}}, "tenant_key", "keys[0]"},
	} {
		_, err := r.c.CreateTenant(ctx, &api.CreateTenantRequest{Tenant: "bad", Keys: tc.keys})
		if d := api.DetailOf(err); d.GetCode() != api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT || d.GetReason() != tc.reason || d.GetField() != tc.field {
			t.Errorf("%s: %v (%v); want INVALID_ARGUMENT %s on %s", tc.name, err, d, tc.reason, tc.field)
		}
	}
	if _, ok := r.m.State().Tenants["bad"]; ok {
		t.Fatal("a refused tenant was created")
	}
	r.stop(t)

	r = start(t, opts)
	defer r.stop(t)
	got, err := r.c.DescribeTenant(ctx, &api.DescribeTenantRequest{Tenant: "devstoreaccount1"})
	if err != nil {
		t.Fatal(err)
	}
	if keys := got.GetTenant().GetKeys(); len(keys) != 2 || !bytes.Equal(keys[0], azure) || !bytes.Equal(keys[1], generated) {
		t.Fatalf("after a restart: keys %x; want %x, %x", keys, azure, generated)
	}
}
