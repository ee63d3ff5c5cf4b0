package client_test

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/auth"
)

func TestProfileRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config")
	key := auth.NewKey()
	if err := client.SaveProfile(path, "acme", client.Profile{Masters: []string{"a:1", "b:2"}, Tenant: "acme", Credential: client.TenantCredential("acme", 2, key)}); err != nil {
		t.Fatal(err)
	}
	if err := client.SaveProfile(path, "other", client.Profile{Tenant: "other", Credential: client.TenantCredential("other", 1, auth.NewKey())}); err != nil {
		t.Fatal(err)
	}
	p, err := client.LoadProfile(path, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Masters) != 2 || p.Tenant != "acme" || p.Credential.KeyID != 2 || !bytes.Equal(p.Credential.Key, key) {
		t.Fatalf("loaded %+v", p)
	}
	if _, err := client.LoadProfile(path, "nope"); err == nil {
		t.Fatal("missing profile loaded")
	}
}

func FuzzParseProfiles(f *testing.F) {
	f.Add([]byte("[default]\nmaster = a:1\ntenant = x\nkey = abc\n"))
	f.Add([]byte("# c\n[a]\n[b]\nkey-id=2\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		all, err := client.ParseProfiles(b)
		if err != nil {
			return
		}
		for name, kv := range all {
			if name == "" || len(kv) > 5 {
				t.Fatalf("profile %q with %d keys", name, len(kv))
			}
		}
	})
}
