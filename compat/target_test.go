package compat

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/data/aztables"
)

// clientOpts are the options of every client of the suite: no retries,
// so that an answer the SDK would retry (a 500, a 503) fails the check at
// once instead of after the SDK's backoff.
var clientOpts = &aztables.ClientOptions{ClientOptions: policy.ClientOptions{Retry: policy.RetryOptions{MaxRetries: -1}}}

// The well-known development account of the Azure storage emulators,
// which `tabula dev` serves too.
const (
	devAccount = "devstoreaccount1"
	devKey     = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)

// azuriteVersion is the npm package the suite installs when
// compat/.azurite holds none (the version the suite was checked against).
const azuriteVersion = "3.35.0"

// Targets.
const (
	targetTabula  = "tabula"
	targetAzurite = "azurite"
)

// target is the endpoint under test, set up by TestMain and read-only
// afterwards (safe for concurrent reads by parallel tests).
var target struct {
	kind     string // targetTabula, targetAzurite, or what TABULA_COMPAT_TARGET says of an external endpoint
	endpoint string // table endpoint URL: http://127.0.0.1:PORT/devstoreaccount1
	account  string
	key      string
	connStr  string
	cred     *aztables.SharedKeyCredential
	svc      *aztables.ServiceClient
	runID    string // in every table name, so runs against one endpoint do not collide
}

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	stop, err := setUpTarget()
	if err != nil {
		fmt.Fprintf(os.Stderr, "compat: %v\n", err)
		if stop != nil {
			stop()
		}
		return 1
	}
	code := m.Run()
	stop()
	return code
}

// setUpTarget resolves or starts the endpoint under test. stop, when not
// nil, ends whatever it started.
func setUpTarget() (stop func(), err error) {
	target.kind = os.Getenv("TABULA_COMPAT_TARGET")
	if target.kind == "" {
		target.kind = targetTabula
	}
	target.runID = fmt.Sprintf("%06x", time.Now().UnixNano()&0xffffff)
	stop = func() {}
	if ep := os.Getenv("TABULA_COMPAT_ENDPOINT"); ep != "" {
		if err := useEndpoint(ep); err != nil {
			return nil, err
		}
		fmt.Fprintf(os.Stderr, "compat: testing %s (%s)\n", target.endpoint, target.kind)
		return stop, waitServing(nil, 30*time.Second)
	}
	tmp, err := os.MkdirTemp("", "tabula-compat-")
	if err != nil {
		return nil, err
	}
	var p *proc
	switch target.kind {
	case targetTabula:
		p, err = startTabula(tmp)
	case targetAzurite:
		p, err = startAzurite(tmp)
	default:
		err = fmt.Errorf("TABULA_COMPAT_TARGET=%q: want %s or %s (or set TABULA_COMPAT_ENDPOINT)", target.kind, targetTabula, targetAzurite)
	}
	stop = func() {
		if p != nil {
			p.stop()
		}
		_ = os.RemoveAll(tmp)
	}
	if err != nil {
		return stop, err
	}
	fmt.Fprintf(os.Stderr, "compat: testing %s (%s, started by the suite)\n", target.endpoint, target.kind)
	return stop, nil
}

// useEndpoint sets target from a connection string or a table endpoint URL.
func useEndpoint(ep string) error {
	account, key := os.Getenv("TABULA_COMPAT_ACCOUNT"), os.Getenv("TABULA_COMPAT_KEY")
	if account == "" {
		account = devAccount
	}
	if key == "" {
		key = devKey
	}
	if strings.Contains(ep, "AccountName=") {
		kv := map[string]string{}
		for _, part := range strings.Split(strings.TrimRight(ep, ";"), ";") {
			k, v, ok := strings.Cut(part, "=")
			if !ok {
				return fmt.Errorf("TABULA_COMPAT_ENDPOINT: malformed connection string part %q", part)
			}
			kv[k] = v
		}
		if kv["TableEndpoint"] == "" || kv["AccountKey"] == "" {
			return errors.New("TABULA_COMPAT_ENDPOINT: the connection string needs AccountName, AccountKey and TableEndpoint")
		}
		account, key, ep = kv["AccountName"], kv["AccountKey"], kv["TableEndpoint"]
	}
	return setTarget(strings.TrimRight(ep, "/"), account, key)
}

func setTarget(endpoint, account, key string) error {
	if _, err := url.Parse(endpoint); err != nil {
		return fmt.Errorf("endpoint %q: %w", endpoint, err)
	}
	target.endpoint, target.account, target.key = endpoint, account, key
	target.connStr = fmt.Sprintf("DefaultEndpointsProtocol=http;AccountName=%s;AccountKey=%s;TableEndpoint=%s;", account, key, endpoint)
	cred, err := aztables.NewSharedKeyCredential(account, key)
	if err != nil {
		return fmt.Errorf("shared key credential: %w", err)
	}
	target.cred = cred
	// The connection string is what users of the emulators write
	// (UseDevelopmentStorage=true expands to it); the suite's main client
	// comes from it.
	target.svc, err = aztables.NewServiceClientFromConnectionString(target.connStr, clientOpts)
	if err != nil {
		return fmt.Errorf("service client from %q: %w", target.connStr, err)
	}
	return nil
}

// waitServing waits until the endpoint answers an authorized List Tables,
// or p (when not nil) exits, or d passes.
func waitServing(p *proc, d time.Duration) error {
	deadline := time.Now().Add(d)
	var last error
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		pager := target.svc.NewListTablesPager(&aztables.ListTablesOptions{Top: ptr[int32](1)})
		_, err := pager.NextPage(ctx)
		cancel()
		if err == nil {
			return nil
		}
		last = err
		if p != nil && p.exited() {
			return fmt.Errorf("%s exited while the suite waited for %s to answer; output tail:\n%s", p.name, target.endpoint, p.tail(30))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer List Tables within %v (last error: %v)", target.endpoint, d, last)
		}
		time.Sleep(100 * time.Millisecond) // polling interval between probes
	}
}

// proc is a child process in its own process group, with its output kept
// in memory. Safe for concurrent use.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}

	mu  sync.Mutex // guards out
	out bytes.Buffer
}

func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

func (p *proc) tail(n int) string {
	lines := strings.Split(strings.TrimRight(p.output(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func startProc(name, dir, bin string, args ...string) (*proc, error) {
	p := &proc{name: name, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Dir = dir
	p.cmd.Stdout, p.cmd.Stderr = p, p
	// Own process group, so stop ends every descendant; Pdeathsig, so the
	// child dies with the test binary even if that is killed.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop interrupts the process group, and kills it after 10 s.
func (p *proc) stop() {
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGINT)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		fmt.Fprintf(os.Stderr, "compat: %s ignored SIGINT for 10 s; killing its process group\n", p.name)
	}
	// Whatever is left of the group (children that outlived the leader).
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-p.done
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// startTabula builds ../cmd/tabula and runs `tabula dev` with its Azure
// Table gateway on a free port.
func startTabula(tmp string) (*proc, error) {
	root, err := filepath.Abs("..")
	if err != nil {
		return nil, err
	}
	if b, err := os.ReadFile(filepath.Join(root, "go.mod")); err != nil || !bytes.Contains(b, []byte("module github.com/tabuladb/tabula\n")) {
		return nil, fmt.Errorf("%s is not the tabula repository (the suite builds ../cmd/tabula): %v", root, err)
	}
	bin := os.Getenv("TABULA_COMPAT_TABULA_BIN")
	if bin == "" {
		bin = filepath.Join(tmp, "tabula")
		t0 := time.Now()
		build := exec.Command("go", "build", "-o", bin, "./cmd/tabula")
		build.Dir = root
		if out, err := build.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("build tabula: %w\n%s", err, out)
		}
		fmt.Fprintf(os.Stderr, "compat: built tabula in %v\n", time.Since(t0).Round(time.Millisecond))
	}
	master, err := freeAddr()
	if err != nil {
		return nil, err
	}
	gateway, err := freeAddr()
	if err != nil {
		return nil, err
	}
	p, err := startProc("tabula dev", tmp, bin, "dev",
		"--data", filepath.Join(tmp, "data"),
		"--cluster-key", filepath.Join(tmp, "cluster.key"),
		"--listen", master,
		"--azure-listen", gateway,
		"--dashboard-listen", "")
	if err != nil {
		return nil, err
	}
	if err := setTarget("http://"+gateway+"/"+devAccount, devAccount, devKey); err != nil {
		return p, err
	}
	// First the cluster: "tabula dev ready" (or an exit, e.g. on an
	// unknown --azure-listen flag).
	deadline := time.Now().Add(90 * time.Second)
	for !strings.Contains(p.output(), "tabula dev ready") {
		if p.exited() {
			msg := "tabula dev exited before it was ready"
			if strings.Contains(p.output(), "unknown flag: --azure-listen") {
				msg = "this tabula dev has no --azure-listen flag: the Azure Table gateway is not served yet"
			}
			return p, fmt.Errorf("%s; output tail:\n%s", msg, p.tail(30))
		}
		if time.Now().After(deadline) {
			return p, fmt.Errorf("tabula dev did not print \"tabula dev ready\" within 90 s; output tail:\n%s", p.tail(30))
		}
		time.Sleep(50 * time.Millisecond) // polling interval for the output
	}
	// Then the gateway.
	if err := waitServing(p, 20*time.Second); err != nil {
		return p, fmt.Errorf("tabula dev is ready but does not serve the Azure Table gateway on %s (--azure-listen): %w", gateway, err)
	}
	return p, nil
}

// startAzurite installs Azurite into compat/.azurite when missing and runs
// its table service in memory on a free port.
func startAzurite(tmp string) (*proc, error) {
	prefix, err := filepath.Abs(".azurite")
	if err != nil {
		return nil, err
	}
	bin := filepath.Join(prefix, "node_modules", ".bin", "azurite-table")
	if _, err := os.Stat(bin); err != nil {
		fmt.Fprintf(os.Stderr, "compat: installing azurite@%s into %s\n", azuriteVersion, prefix)
		npm := exec.Command("npm", "install", "--prefix", prefix, "--no-audit", "--no-fund", "azurite@"+azuriteVersion)
		if out, err := npm.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("npm install azurite: %w\n%s", err, out)
		}
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	host, port, _ := net.SplitHostPort(addr)
	p, err := startProc("azurite-table", tmp, bin,
		"--inMemoryPersistence", "--tableHost", host, "--tablePort", port,
		"--silent", "--disableTelemetry") // in-memory: it writes nothing (and refuses --location)
	if err != nil {
		return nil, err
	}
	if err := setTarget("http://"+addr+"/"+devAccount, devAccount, devKey); err != nil {
		return p, err
	}
	return p, waitServing(p, 60*time.Second)
}

func ptr[T any](v T) *T { return &v }
