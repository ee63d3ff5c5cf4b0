package frontend_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tabuladb/tabula/frontend"
	"github.com/tabuladb/tabula/frontend/bearer"
)

// devToken is an unsigned development token for aud.
func devToken(aud string, exp time.Time) string {
	h, _ := json.Marshal(map[string]string{"alg": "RS256", "typ": "JWT"})
	p, _ := json.Marshal(map[string]any{"aud": aud, "iss": "https://sts.windows.net/t/", "nbf": time.Now().Add(-time.Hour).Unix(),
		"iat": time.Now().Add(-time.Hour).Unix(), "exp": exp.Unix()})
	return base64.RawURLEncoding.EncodeToString(h) + "." + base64.RawURLEncoding.EncodeToString(p) + ".c2ln"
}

// TestGatewayBearer: over HTTPS a development token creates and reads a
// table; an expired one or a foreign audience is refused naming the
// claim; table ACLs refuse bearer tokens; plain HTTP refuses them.
func TestGatewayBearer(t *testing.T) {
	a := startGateway(t)
	gw, err := frontend.New(context.Background(), frontend.Options{Masters: a.masters, Credential: a.cred, Bearer: bearer.Dev()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	srv := httptest.NewTLSServer(gw)
	t.Cleanup(srv.Close)
	plain := httptest.NewServer(gw)
	t.Cleanup(plain.Close)
	send := func(base, method, path, tok, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, base+"/acct"+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("x-ms-version", "2019-02-02")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json;odata=nometadata")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("x-ms-error-code") + " " + string(b)
	}
	good := devToken("https://storage.azure.com", time.Now().Add(time.Hour))
	if st, b := send(srv.URL, "POST", "/Tables", good, `{"TableName":"Oauth"}`); st != 201 {
		t.Fatalf("create table with a token: %d %s", st, b)
	}
	if st, b := send(srv.URL, "GET", "/Tables", devToken(srv.URL+"/acct", time.Now().Add(time.Hour)), ""); st != 200 || !strings.Contains(b, "Oauth") {
		t.Fatalf("list tables with the account's URL as audience: %d %s", st, b)
	}
	for _, c := range []struct{ what, tok, want string }{
		{"expired", devToken("https://storage.azure.com", time.Now().Add(-time.Minute)), "expired"},
		{"audience", devToken("https://other.table.core.windows.net", time.Now().Add(time.Hour)), "audience"},
		{"garbage", "invalid token", "not supported"},
	} {
		if st, b := send(srv.URL, "GET", "/Tables", c.tok, ""); st != 403 || !strings.Contains(b, "AuthenticationFailed") || !strings.Contains(b, c.want) {
			t.Fatalf("%s token: %d %s", c.what, st, b)
		}
	}
	if st, b := send(srv.URL, "GET", "/Oauth?comp=acl", good, ""); st != 403 || !strings.Contains(b, "AuthorizationFailure") {
		t.Fatalf("get table ACL with a token: %d %s", st, b)
	}
	if st, b := send(plain.URL, "GET", "/Tables", good, ""); st != 403 || !strings.Contains(b, "HTTP") {
		t.Fatalf("a token over HTTP: %d %s", st, b)
	}
	if st, b := send(srv.URL, "GET", "/Tables", good, ""); st != 200 {
		t.Fatalf("list tables: %d %s", st, b)
	}
}
