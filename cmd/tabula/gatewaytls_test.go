package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tabuladb/tabula/frontend/sharedkey"
	"github.com/tabuladb/tabula/internal/tlsfiles"
	"github.com/tabuladb/tabula/internal/tlsfiles/tlsfilestest"
)

// TestGatewayTLSConfigs: the gateway serves HTTPS with its own pair, else
// the cluster's; beside a TLS cluster with no pair to serve it refuses.
func TestGatewayTLSConfigs(t *testing.T) {
	f := tlsfilestest.Write(t, t.TempDir())
	az := gatewayTLS{cert: f.Cert, key: f.Key}
	for _, c := range []struct {
		name        string
		az          gatewayTLS
		cluster     tlsfiles.Files
		serve, dial bool
		err         error
	}{
		{"plaintext", gatewayTLS{}, tlsfiles.Files{}, false, false, nil},
		{"own pair", az, tlsfiles.Files{}, true, false, nil},
		{"cluster pair", gatewayTLS{}, f, true, true, nil},
		{"own pair, TLS cluster", az, tlsfiles.Files{CA: f.CA}, true, true, nil},
		{"only the cluster's CA", gatewayTLS{}, tlsfiles.Files{CA: f.CA}, false, false, errGatewayPlaintext},
	} {
		serve, dial, err := gatewayTLSConfigs(c.az, c.cluster)
		if !errors.Is(err, c.err) || (serve != nil) != c.serve || (dial != nil) != c.dial {
			t.Errorf("%s: serve %v dial %v err %v", c.name, serve != nil, dial != nil, err)
		}
	}
	if _, _, err := gatewayTLSConfigs(gatewayTLS{cert: f.Cert}, tlsfiles.Files{}); err == nil {
		t.Error("a certificate without its key was accepted")
	}
}

// TestDevAzureTLS: tabula dev --azure-tls-cert/--azure-tls-key serves the
// gateway over HTTPS only, and says so in its banner; tabula gateway
// with only the cluster's CA refuses to start.
func TestDevAzureTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process: skipped with -short")
	}
	dir := t.TempDir()
	f := tlsfilestest.Write(t, dir)
	azAddr := freeAddr(t)
	dev := start(t, "dev", "dev", "--data", filepath.Join(dir, "data"), "--listen", freeAddr(t), "--azure-listen", azAddr,
		"--azure-tls-cert", f.Cert, "--azure-tls-key", f.Key)
	dev.waitOutput("tabula dev ready", 30*time.Second)
	if !strings.Contains(dev.output(), "DefaultEndpointsProtocol=https;") || !strings.Contains(dev.output(), "https://"+azAddr+"/devstoreaccount1") {
		t.Fatalf("the banner does not give the HTTPS endpoint:\n%s", dev.output())
	}
	pem, err := os.ReadFile(f.CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	key, _ := sharedkey.DevKeys().Lookup(sharedkey.DevAccount)
	get := func(c *http.Client, scheme string) (int, error) {
		req, _ := http.NewRequest("GET", scheme+"://"+azAddr+"/devstoreaccount1/Tables", nil)
		req.Header.Set("x-ms-date", time.Now().UTC().Format(http.TimeFormat))
		req.Header.Set("Accept", "application/json;odata=nometadata")
		sharedkey.SignSharedKeyLite(req, sharedkey.DevAccount, key[0])
		resp, err := c.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	if st, err := get(hc, "https"); err != nil || st != 200 {
		t.Fatalf("query tables over HTTPS: %d %v", st, err)
	}
	if st, err := get(http.DefaultClient, "http"); err == nil && st == 200 {
		t.Fatal("the TLS gateway answered plaintext HTTP")
	}

	_, errOut, err := cli(t, "127.0.0.1:1", nil, "gateway", "--tls-ca", f.CA, "--listen", freeAddr(t))
	if err == nil || !strings.Contains(errOut, "--azure-tls-cert") {
		t.Fatalf("gateway beside a TLS cluster without a pair: err %v, stderr %s", err, errOut)
	}
}
