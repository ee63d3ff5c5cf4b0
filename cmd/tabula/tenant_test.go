package main

import (
	"encoding/base64"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestTenantCLI walks a new user through tenants: create one with quotas
// and a saved profile, work as it, see its quotas and usage, change one
// quota (the others stay), get a clear error for a bad size, stay out of
// another tenant's tables, and lose access with a rotated key.
func TestTenantCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process: skipped with -short")
	}
	dir := t.TempDir()
	t.Setenv("TABULA_CONFIG", filepath.Join(dir, "config"))
	masterAddr := freeAddr(t)
	master := start(t, "master", append([]string{"master", "--listen", masterAddr, "--data", filepath.Join(dir, "master")}, fastTiming...)...)
	master.waitOutput("master serving", 15*time.Second)
	server := start(t, "server", "server", "--master", masterAddr, "--data", filepath.Join(dir, "server"))
	server.waitOutput("registered with master", 15*time.Second)

	out := mustCLI(t, masterAddr, "tenant", "create", "acme", "--write-ops", "100", "--stored-bytes", "1MiB", "--save-profile")
	if !strings.Contains(out, "key 1") || !strings.Contains(out, `saved key 1 as profile "acme"`) {
		t.Fatalf("tenant create: %s", out)
	}
	mustCLI(t, masterAddr, "--profile", "acme", "table", "create", "orders", "--partitions", "1")
	mustCLI(t, masterAddr, "--profile", "acme", "put", "orders", "o1", "shipped")
	if got := mustCLI(t, masterAddr, "--profile", "acme", "get", "orders", "o1"); strings.TrimSpace(got) != "shipped" {
		t.Fatalf("get as acme: %q", got)
	}
	q := mustCLI(t, masterAddr, "tenant", "quota", "acme")
	for _, want := range []string{"stored bytes", "1.0 MiB", "100/s", "no limit"} {
		if !strings.Contains(q, want) {
			t.Errorf("tenant quota shows no %q:\n%s", want, q)
		}
	}
	q = mustCLI(t, masterAddr, "tenant", "quota", "acme", "--memory-bytes", "2MiB")
	if !strings.Contains(q, "2.0 MiB") || !strings.Contains(q, "100/s") || !strings.Contains(q, "1.0 MiB") {
		t.Errorf("after --memory-bytes 2MiB the other quotas changed:\n%s", q)
	}
	if d := mustCLI(t, masterAddr, "tenant", "describe", "acme"); !strings.Contains(d, "2.0 MiB") || !strings.Contains(d, "orders") {
		t.Errorf("tenant describe:\n%s", d)
	}
	if _, errOut, err := cli(t, masterAddr, nil, "tenant", "quota", "acme", "--stored-bytes", "lots"); err == nil || !strings.Contains(errOut, "not a byte count") || len(lines(errOut)) != 1 {
		t.Errorf("a bad size: err %v, stderr %q; want one line saying it is not a byte count", err, errOut)
	}

	// A tenant with a given key (the Azure emulator's published one, in
	// standard base64) as key 1: printed in the CLI's form, and it signs.
	const azureKey = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
	raw, err := base64.StdEncoding.DecodeString(azureKey)
	if err != nil {
		t.Fatal(err)
	}
	out = mustCLI(t, masterAddr, "tenant", "create", "devstoreaccount1", "--key", azureKey, "--save-profile")
	if !strings.Contains(out, "key 1  "+base64.RawURLEncoding.EncodeToString(raw)+"\n") || !strings.Contains(out, "key 2  ") {
		t.Fatalf("tenant create --key: %s", out)
	}
	mustCLI(t, masterAddr, "--profile", "devstoreaccount1", "table", "create", "t", "--partitions", "1")
	for _, bad := range [][]string{{"--key", "c2hvcnQ="}, {"--key", azureKey, "--key", azureKey, "--key", azureKey}} {
		if _, errOut, err := cli(t, masterAddr, nil, append([]string{"tenant", "create", "other"}, bad...)...); err == nil || !strings.Contains(errOut, "key") {
			t.Errorf("tenant create %v: err %v, stderr %q; want a refusal naming the key", bad, err, errOut)
		}
	}

	// Another tenant's table is not acme's to see.
	mustCLI(t, masterAddr, "table", "create", "private", "--partitions", "1")
	if _, errOut, err := cli(t, masterAddr, nil, "--profile", "acme", "get", "private", "k"); err == nil || !strings.Contains(errOut, "does not exist") {
		t.Errorf("acme reading the default tenant's table: err %v, stderr %q", err, errOut)
	}

	// Rotating key 1 (the profile's) locks the profile out once the
	// server learns it; key 2 would keep working.
	mustCLI(t, masterAddr, "tenant", "keys", "rotate", "acme", "--key", "1")
	waitFor(t, 15*time.Second, "the rotated key to be refused", func() (bool, error) {
		_, errOut, err := cli(t, masterAddr, nil, "--profile", "acme", "--timeout", "3s", "get", "orders", "o1")
		return err != nil && strings.Contains(errOut, "signature"), nil
	})
}
