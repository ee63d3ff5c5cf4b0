package main

import (
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/auth"

	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The multi-process tests run the real binary: built once by TestMain.
var tabulaBin string

// testCred is the cluster credential every test cluster of this package
// runs with: TestMain creates it and exports $TABULA_CLUSTER_KEY, which
// the processes it starts (master, servers, dev, CLI) read.
var testCred client.Credential

func TestMain(m *testing.M) {
	code := func() int {
		dir, err := os.MkdirTemp("", "tabula-bin-*")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		tabulaBin = filepath.Join(dir, "tabula")
		keyPath := filepath.Join(dir, "cluster.key")
		c, _, err := auth.LoadOrCreateClusterCredential(keyPath)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		testCred = client.Credential(c)
		os.Setenv("TABULA_CLUSTER_KEY", keyPath)
		out, err := exec.Command("go", "build", "-o", tabulaBin, ".").CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "build tabula: %v\n%s", err, out)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

// proc is a running tabula process whose output is kept for inspection.
type proc struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer // guarded by mu
	done chan struct{}
	err  error // set before done is closed
}

// lockedWriter appends to the proc's buffer under its lock.
type lockedWriter struct{ p *proc }

func (w lockedWriter) Write(b []byte) (int, error) {
	w.p.mu.Lock()
	defer w.p.mu.Unlock()
	return w.p.out.Write(b)
}

// start runs the binary with args; the process is killed at test cleanup.
func start(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, done: make(chan struct{})}
	p.cmd = exec.Command(tabulaBin, args...)
	p.cmd.Stdout = lockedWriter{p}
	p.cmd.Stderr = lockedWriter{p}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("--- output of %s:\n%s", name, p.output())
		}
	})
	return p
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// signal sends sig and waits up to d for the exit; it returns the exit error.
func (p *proc) stop(sig os.Signal, d time.Duration) error {
	p.t.Helper()
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		return p.err
	case <-time.After(d):
		p.t.Fatalf("%s did not exit within %v of %v", p.name, d, sig)
		return nil
	}
}

// waitOutput waits until the output contains s.
func (p *proc) waitOutput(s string, d time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(d)
	for !strings.Contains(p.output(), s) {
		select {
		case <-p.done:
			p.t.Fatalf("%s exited (%v) before printing %q", p.name, p.err, s)
		default:
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s did not print %q within %v", p.name, s, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// freeAddr returns a 127.0.0.1 address whose port is free now and has not
// been handed out before in this test binary. Ports come from below the
// kernel's ephemeral range (32768 and up on Linux), so neither an outgoing
// connection nor a listener on port 0 elsewhere can take one between this
// call and the process that binds it, and no two processes of one test are
// given the same port (the kernel reuses a just-closed ephemeral port).
func freeAddr(t *testing.T) string {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 1000 {
		port := 20000 + portsRand.IntN(12000)
		if portsGiven[port] {
			continue
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		_ = l.Close()
		portsGiven[port] = true
		return addr
	}
	t.Fatal("no free port in 20000-31999 after 1000 tries")
	return ""
}

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}                                                            // guarded by portsMu
	portsRand  = rand.New(rand.NewPCG(uint64(os.Getpid()), uint64(time.Now().UnixNano()))) // guarded by portsMu
)

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(d)
	var lastErr error
	for time.Now().Before(deadline) {
		ok, err := cond()
		if ok {
			return
		}
		lastErr = err
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("timed out after %v waiting for %s (last error: %v)", d, what, lastErr)
}

// cli runs a client command to completion and returns its stdout.
func cli(t *testing.T, master string, stdin io.Reader, args ...string) (string, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, tabulaBin, append(args, "--master", master)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr, cmd.Stdin = &stdout, &stderr, stdin
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

func mustCLI(t *testing.T, master string, args ...string) string {
	t.Helper()
	out, errOut, err := cli(t, master, nil, args...)
	if err != nil {
		t.Fatalf("tabula %s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

// lines splits s into non-empty lines.
func lines(s string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			out = append(out, l)
		}
	}
	return out
}
