package bearer

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"testing"
	"time"
)

var now = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// sign makes a JWT of claims, signed with priv (nil: a dummy signature).
func sign(t testing.TB, alg, kid string, claims map[string]any, priv crypto.Signer) string {
	t.Helper()
	h, _ := json.Marshal(map[string]string{"alg": alg, "typ": "JWT", "kid": kid})
	p, _ := json.Marshal(claims)
	in := base64.RawURLEncoding.EncodeToString(h) + "." + base64.RawURLEncoding.EncodeToString(p)
	sum := sha256.Sum256([]byte(in))
	sig := []byte("not a signature")
	switch k := priv.(type) {
	case *rsa.PrivateKey:
		sig, _ = rsa.SignPKCS1v15(rand.Reader, k, crypto.SHA256, sum[:])
	case *ecdsa.PrivateKey:
		r, s, err := ecdsa.Sign(rand.Reader, k, sum[:])
		if err != nil {
			t.Fatal(err)
		}
		sig = make([]byte, 64)
		r.FillBytes(sig[:32])
		s.FillBytes(sig[32:])
	}
	return in + "." + base64.RawURLEncoding.EncodeToString(sig)
}

func claims(mod func(map[string]any)) map[string]any {
	c := map[string]any{"aud": "https://storage.azure.com", "iss": "https://sts.windows-ppe.net/ab1f708d/",
		"nbf": now.Add(-time.Hour).Unix(), "iat": now.Add(-time.Hour).Unix(), "exp": now.Add(time.Hour).Unix(), "oid": "user-1"}
	if mod != nil {
		mod(c)
	}
	return c
}

// TestDev: the development verifier checks the claims as Azurite's basic
// mode does and names the failing one.
func TestDev(t *testing.T) {
	v := Dev()
	for _, c := range []struct {
		name   string
		tok    string
		detail string
	}{
		{"valid", sign(t, "RS256", "", claims(nil), nil), ""},
		{"audience as the account's table URL", sign(t, "RS256", "", claims(func(c map[string]any) { c["aud"] = "https://acct.table.core.windows.net/" }), nil), ""},
		{"audience as the account's URL here", sign(t, "RS256", "", claims(func(c map[string]any) { c["aud"] = "https://127.0.0.1:1/acct" }), nil), ""},
		{"audience list", sign(t, "RS256", "", claims(func(c map[string]any) { c["aud"] = []string{"x", "e406a681-f3d4-42a8-90b6-c2b029497af1"} }), nil), ""},
		{"another account's URL", sign(t, "RS256", "", claims(func(c map[string]any) { c["aud"] = "https://other.table.core.windows.net" }), nil), DetailAudience},
		{"foreign audience", sign(t, "RS256", "", claims(func(c map[string]any) { c["aud"] = "https://vault.azure.net" }), nil), DetailAudience},
		{"foreign issuer", sign(t, "RS256", "", claims(func(c map[string]any) { c["iss"] = "https://evil.example/" }), nil), DetailIssuer},
		{"not yet", sign(t, "RS256", "", claims(func(c map[string]any) { c["nbf"] = now.Add(time.Minute).Unix() }), nil), DetailNotYet},
		{"expired", sign(t, "RS256", "", claims(func(c map[string]any) { c["exp"] = now.Add(-time.Minute).Unix() }), nil), DetailExpired},
		{"no iat", sign(t, "RS256", "", claims(func(c map[string]any) { delete(c, "iat") }), nil), DetailUnsupported},
		{"not a JWT", "invalid token", DetailUnsupported},
	} {
		role, err := v.Verify(c.tok, "acct", "https://127.0.0.1:1/acct", now)
		var e *Error
		switch {
		case c.detail == "" && (err != nil || role != RoleContributor):
			t.Errorf("%s: %v %v", c.name, role, err)
		case c.detail != "" && (!errors.As(err, &e) || e.Detail != c.detail):
			t.Errorf("%s: %v, want %q", c.name, err, c.detail)
		}
	}
}

func pemOf(t *testing.T, pub crypto.PublicKey) string {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

// TestProduction: signatures verify with the configured keys only (RS256
// and ES256, by kid), the issuer must be configured, and the principal
// gets the role its grant says in that account only.
func TestProduction(t *testing.T) {
	rk, _ := rsa.GenerateKey(rand.Reader, 2048)
	ek, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	other, _ := rsa.GenerateKey(rand.Reader, 2048)
	var c Config
	c.Issuers = []string{"https://sts.windows.net/t1/"}
	c.Keys = append(c.Keys, struct {
		Kid string `json:"kid"`
		PEM string `json:"pem"`
	}{"r", pemOf(t, &rk.PublicKey)}, struct {
		Kid string `json:"kid"`
		PEM string `json:"pem"`
	}{"e", pemOf(t, &ek.PublicKey)})
	c.Grants = []Grant{{Principal: "user-1", Account: "acct", Role: "reader"}, {Principal: "user-2", Account: "acct", Role: "contributor"}}
	v, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	iss := func(m map[string]any) { m["iss"] = "https://sts.windows.net/t1/" }
	for _, tc := range []struct {
		name   string
		tok    string
		role   Role
		detail string
	}{
		{"RS256 reader", sign(t, "RS256", "r", claims(iss), rk), RoleReader, ""},
		{"ES256 contributor", sign(t, "ES256", "e", claims(func(m map[string]any) { iss(m); m["oid"] = "user-2" }), ek), RoleContributor, ""},
		{"no kid", sign(t, "RS256", "", claims(iss), rk), RoleReader, ""},
		{"wrong kid", sign(t, "RS256", "e", claims(iss), rk), 0, DetailSignature},
		{"unknown key", sign(t, "RS256", "r", claims(iss), other), 0, DetailSignature},
		{"unsigned", sign(t, "none", "", claims(iss), nil), 0, DetailSignature},
		{"an Azure issuer not configured", sign(t, "RS256", "r", claims(nil), rk), 0, DetailIssuer},
		{"no grant", sign(t, "RS256", "r", claims(func(m map[string]any) { iss(m); m["oid"] = "user-3" }), rk), 0, DetailPrincipal},
	} {
		role, err := v.Verify(tc.tok, "acct", "", now)
		var e *Error
		switch {
		case tc.detail == "" && (err != nil || role != tc.role):
			t.Errorf("%s: %v %v", tc.name, role, err)
		case tc.detail != "" && (!errors.As(err, &e) || e.Detail != tc.detail):
			t.Errorf("%s: %v, want %q", tc.name, err, tc.detail)
		}
	}
	if _, err := v.Verify(sign(t, "RS256", "r", claims(iss), rk), "other", "", now); err == nil {
		t.Error("a grant of acct opened another account")
	}
}

func FuzzParse(f *testing.F) {
	f.Add(sign(f, "RS256", "k", claims(nil), nil))
	f.Add("a.b.c")
	f.Add("invalid token")
	f.Fuzz(func(t *testing.T, tok string) {
		_, _ = Parse(tok)
		_, _ = Dev().Verify(tok, "acct", "https://h/acct", now)
	})
}
