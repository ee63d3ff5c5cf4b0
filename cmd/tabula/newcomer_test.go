package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tabuladb/tabula/client"
)

// cliEnv runs the binary with args as given (no --master added) and env
// on top of the test's environment.
func cliEnv(t *testing.T, env []string, args ...string) (string, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, tabulaBin, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// TestNewcomerPath follows what a new user did off the defaults (issue
// 32): `tabula dev` with another --data, master and Azure port says how
// to reach it; a saved profile's master is used with nothing on the
// default address, in the documented order (--master, $TABULA_MASTER,
// the profile's, the default); rotating the key a profile uses can save
// the new one into it; a key sent under the wrong number says so.
func TestNewcomerPath(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process: skipped with -short")
	}
	dir := t.TempDir()
	data := filepath.Join(dir, "elsewhere")
	t.Setenv("TABULA_CONFIG", filepath.Join(dir, "config"))
	t.Setenv("TABULA_CLUSTER_KEY", "") // as a new user: dev makes <data>/cluster.key
	t.Setenv("TABULA_MASTER", "")
	addr, azure, dead := freeAddr(t), freeAddr(t), freeAddr(t)
	dev := start(t, "dev", "dev", "--data", data, "--listen", addr, "--azure-listen", azure, "--servers", "1")
	dev.waitOutput("tabula dev ready", 30*time.Second)

	// The banner.
	keyPath := filepath.Join(data, "cluster.key")
	banner := dev.output()
	for _, want := range []string{
		"credential " + keyPath + "  (the cluster's; the CLI does not look there on its own: give --cluster-key " + keyPath + " or export TABULA_CLUSTER_KEY=" + keyPath + ")",
		"give --master " + addr + " or export TABULA_MASTER=" + addr,
		"connection string: DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;TableEndpoint=http://" + azure + "/devstoreaccount1;",
	} {
		if !strings.Contains(banner, want) {
			t.Errorf("the dev banner does not say %q:\n%s", want, banner)
		}
	}
	for _, wrong := range []string{"the CLI run here finds it", "UseDevelopmentStorage=true"} {
		if strings.Contains(banner, wrong) {
			t.Errorf("the dev banner says %q off the defaults:\n%s", wrong, banner)
		}
	}
	t.Setenv("TABULA_CLUSTER_KEY", keyPath) // as the banner says

	// A profile's master, with nothing asked of the default address.
	out, errOut, err := cliEnv(t, nil, "--master", addr, "tenant", "create", "acme", "--save-profile")
	if err != nil {
		t.Fatalf("tenant create: %v\n%s%s", err, out, errOut)
	}
	if _, errOut, err := cliEnv(t, nil, "--profile", "acme", "table", "create", "orders", "--partitions", "1"); err != nil {
		t.Fatalf("table create with the profile's master %s and no --master: %v\n%s", addr, err, errOut)
	}
	mustEnv := func(env []string, args ...string) string {
		t.Helper()
		out, errOut, err := cliEnv(t, env, args...)
		if err != nil {
			t.Fatalf("%v tabula %s: %v\n%s", env, strings.Join(args, " "), err, errOut)
		}
		return out
	}
	mustEnv(nil, "--profile", "acme", "put", "orders", "o1", "shipped")

	// The order: --master, $TABULA_MASTER, the profile's, the default.
	refused := func(env []string, args ...string) {
		t.Helper()
		_, errOut, err := cliEnv(t, env, args...)
		if err == nil || !strings.Contains(errOut, "no master answers at "+dead) {
			t.Errorf("%v tabula %s: err %v, stderr %q; want it to try %s only", env, strings.Join(args, " "), err, errOut, dead)
		}
	}
	refused([]string{"TABULA_MASTER=" + dead}, "--profile", "acme", "get", "orders", "o1")
	mustEnv([]string{"TABULA_MASTER=" + dead}, "--profile", "acme", "--master", addr, "get", "orders", "o1")
	refused([]string{"TABULA_MASTER=" + addr}, "--profile", "acme", "--master", dead, "get", "orders", "o1")
	mustEnv([]string{"TABULA_MASTER=" + addr}, "table", "list") // the cluster credential, no profile
	if err := client.SaveProfile(filepath.Join(dir, "config"), "stale", client.Profile{Masters: []string{dead}, ClusterKeyFile: keyPath}); err != nil {
		t.Fatal(err)
	}
	mustEnv([]string{"TABULA_MASTER=" + addr}, "--profile", "stale", "table", "list")
	refused(nil, "--profile", "stale", "table", "list")

	// Rotating the profile's key, saving the new one into it: the profile
	// keeps its master and works on.
	out = mustEnv(nil, "--master", addr, "tenant", "keys", "rotate", "acme", "--key", "1", "--save-profile")
	if !strings.Contains(out, `saved key 1 as profile "acme"`) {
		t.Fatalf("rotate --save-profile: %s", out)
	}
	waitFor(t, 15*time.Second, "the profile with the new key 1 to read", func() (bool, error) {
		out, _, err := cliEnv(t, nil, "--profile", "acme", "--timeout", "3s", "get", "orders", "o1")
		return err == nil && strings.TrimSpace(out) == "shipped", nil
	})
	// `--save-profile NAME` names the profile; key 2 is saved as key-id 2.
	rotated := mustEnv(nil, "--master", addr, "tenant", "keys", "rotate", "acme", "--key", "2", "--save-profile", "acme2")
	if !strings.Contains(rotated, `saved key 2 as profile "acme2"`) {
		t.Fatalf("rotate --save-profile acme2: %s", rotated)
	}
	p, err := client.LoadProfile(filepath.Join(dir, "config"), "acme2")
	if err != nil || p.Credential.KeyID != 2 || len(p.Masters) != 1 || p.Masters[0] != addr {
		t.Fatalf("profile acme2 = %+v, %v; want key 2 and master %s", p, err, addr)
	}
	waitFor(t, 15*time.Second, "the profile with the new key 2 to read", func() (bool, error) {
		out, _, err := cliEnv(t, nil, "--profile", "acme2", "--timeout", "3s", "get", "orders", "o1")
		return err == nil && strings.TrimSpace(out) == "shipped", nil
	})

	// workload kv with every Put refused (a value over the table's
	// limit): the errors show live and in the summary, apart from ops/s
	// and latency; piped output has no carriage returns; it exits 1.
	mustEnv(nil, "--master", addr, "table", "create", "small", "--partitions", "1", "--max-value-bytes", "64")
	out, errOut, err = cliEnv(t, nil, "--master", addr, "workload", "kv", "--table", "small", "--duration", "2500ms",
		"--concurrency", "2", "--read-percent", "50", "--value-size", "100", "--keys", "100", "--no-preload")
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Errorf("workload kv with failing Puts: %v, want exit status 1\n%s%s", err, out, errOut)
	}
	if strings.Contains(errOut+out, "\r") {
		t.Errorf("piped workload output holds carriage returns: %q", errOut)
	}
	if !regexp.MustCompile(`(?m)^run 1s/2\.5s  \d+ ok  \d+ ok/s  [1-9]\d* errors \(most: INVALID_ARGUMENT`).MatchString(errOut) {
		t.Errorf("no live line with the errors counted and named:\n%s", errOut)
	}
	if !strings.Contains(errOut, "calls failed (most: INVALID_ARGUMENT") {
		t.Errorf("the exit error does not say the calls failed:\n%s", errOut)
	}
	if !regexp.MustCompile(`(?m)^ops      \d+ in .* \(reads (\d+), writes 0, misses (\d+)\)$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^errors   [1-9]\d* failed calls, not in the figures above`).MatchString(out) {
		t.Errorf("summary:\n%s", out)
	}

	// Key 2 sent as key 1: the error names the key numbers.
	key2 := regexp.MustCompile(`key 2  (\S+)`).FindStringSubmatch(rotated)
	if key2 == nil {
		t.Fatalf("no key 2 in %q", rotated)
	}
	_, errOut, err = cliEnv(t, []string{"TABULA_TENANT=acme", "TABULA_KEY=" + key2[1], "TABULA_KEY_ID=1", "TABULA_CLUSTER_KEY="},
		"--master", addr, "--timeout", "3s", "get", "orders", "o1")
	if err == nil || !strings.Contains(errOut, "made with key 2") || !strings.Contains(errOut, "sent as key 1") {
		t.Fatalf("key 2 sent as key 1: err %v, stderr %q; want it to name both key numbers", err, errOut)
	}
}
