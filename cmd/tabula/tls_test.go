package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tabuladb/tabula/internal/tlsfiles/tlsfilestest"
)

// TestTLSCluster runs a master and two servers with --tls-cert,
// --tls-key and --tls-ca (replication between the servers over TLS too)
// and works through the CLI with --tls-ca; a plaintext client is refused.
func TestTLSCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process: skipped with -short")
	}
	dir := t.TempDir()
	f := tlsfilestest.Write(t, dir)
	tlsArgs := []string{"--tls-cert", f.Cert, "--tls-key", f.Key, "--tls-ca", f.CA}
	masterAddr := freeAddr(t)
	master := start(t, "master", append(append([]string{"master", "--listen", masterAddr, "--data", filepath.Join(dir, "master")}, fastTiming...), tlsArgs...)...)
	master.waitOutput("master serving", 15*time.Second)
	for i := range 2 {
		s := start(t, fmt.Sprintf("server-%d", i), append([]string{"server", "--master", masterAddr,
			"--data", filepath.Join(dir, fmt.Sprintf("server-%d", i)), "--fault-domain", fmt.Sprintf("fd-%d", i)}, tlsArgs...)...)
		s.waitOutput("registered with master", 15*time.Second)
	}
	mustCLI(t, masterAddr, "--tls-ca", f.CA, "table", "create", "secure", "--partitions", "1", "--replicas", "2")
	waitFor(t, 20*time.Second, "a replicated write over TLS", func() (bool, error) {
		_, _, err := cli(t, masterAddr, nil, "--tls-ca", f.CA, "--timeout", "3s", "put", "secure", "k", "v")
		return err == nil, nil
	})
	if got := mustCLI(t, masterAddr, "--tls-ca", f.CA, "get", "secure", "k"); strings.TrimSpace(got) != "v" {
		t.Fatalf("get over TLS: %q", got)
	}
	if _, _, err := cli(t, masterAddr, nil, "--timeout", "2s", "get", "secure", "k"); err == nil {
		t.Fatal("a plaintext client was served by a TLS cluster")
	}
}
