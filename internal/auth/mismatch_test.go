package auth

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/tabuladb/tabula/api"
)

// tenantKeys is a keyring of one tenant's two keys and the cluster key.
type tenantKeys struct {
	tenant          string
	k1, k2, cluster []byte
}

func (k tenantKeys) Key(principal string, id int) []byte {
	switch {
	case principal == ClusterPrincipal && id == 0:
		return k.cluster
	case principal == k.tenant && id == 1:
		return k.k1
	case principal == k.tenant && id == 2:
		return k.k2
	}
	return nil
}
func (tenantKeys) Refresh(context.Context, string) bool { return false }

// A signature that does not verify says which key it was checked
// against, and one made with the tenant's other key says the key number
// is wrong and which to set (issue 32, item 6).
func TestMismatchNamesTheKey(t *testing.T) {
	keys := tenantKeys{tenant: "acme", k1: NewKey(), k2: NewKey(), cluster: NewKey()}
	v := NewVerifier(VerifierOptions{Keys: keys})
	req := &api.GetRequest{Header: &api.RequestHeader{Tenant: "acme", Table: "t"}, Key: []byte("k")}
	const method = "/tabula.v1.TableServer/Get"
	try := func(c Credential) error {
		kv, err := c.Sign(method, req, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		_, err = v.authenticate(metadata.NewIncomingContext(context.Background(), metadata.Pairs(kv...)), method, req)
		return err
	}
	for _, c := range []struct {
		name       string
		cred       Credential
		reason     string
		wantInText []string
	}{
		{"key 2 sent as key 1", Credential{Principal: "acme", KeyID: 1, Key: keys.k2}, "wrong_key_number",
			[]string{"made with key 2", `tenant "acme"`, "sent as key 1", "set it to 2"}},
		{"key 1 sent as key 2", Credential{Principal: "acme", KeyID: 2, Key: keys.k1}, "wrong_key_number",
			[]string{"made with key 1", "sent as key 2"}},
		{"an old key 1", Credential{Principal: "acme", KeyID: 1, Key: NewKey()}, "signature_mismatch",
			[]string{"does not verify with key 1 of tenant \"acme\"", "the request named key 1", "rotated?", "--show-keys", "--save-profile"}},
		{"an unknown tenant", Credential{Principal: "nobody", KeyID: 2, Key: keys.k2}, "signature_mismatch",
			[]string{"key 2 of tenant \"nobody\""}},
		{"a wrong cluster key", Credential{Principal: ClusterPrincipal, Key: NewKey()}, "signature_mismatch",
			[]string{"cluster key"}},
	} {
		err := try(c.cred)
		d := api.DetailOf(err)
		if d.GetCode() != api.ErrorCode_ERROR_CODE_UNAUTHENTICATED || d.GetReason() != c.reason {
			t.Errorf("%s: %v (reason %q), want UNAUTHENTICATED %s", c.name, err, d.GetReason(), c.reason)
			continue
		}
		for _, w := range c.wantInText {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", c.name, err, w)
			}
		}
	}
	// The right key still verifies.
	if err := try(Credential{Principal: "acme", KeyID: 2, Key: keys.k2}); err != nil {
		t.Fatal(err)
	}
}

// An unsigned request's error names flags the CLI has.
func TestUnsignedNamesRealFlags(t *testing.T) {
	v := NewVerifier(VerifierOptions{Keys: tenantKeys{}})
	_, err := v.authenticate(context.Background(), "/tabula.v1.TableServer/Get", &api.GetRequest{})
	if err == nil || !strings.Contains(err.Error(), "--key-file") || strings.Contains(err.Error(), "--key ") || strings.HasSuffix(err.Error(), "--key") {
		t.Fatalf("unsigned: %v; want it to name --key-file, not --key", err)
	}
}
