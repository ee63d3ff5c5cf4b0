package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// clProc is one child process of the cluster suite (a tabula master or
// server, an etcd member, redis). Its stdout and stderr go to a log file
// that survives restarts (each incarnation appends). Methods are called
// from the suite's goroutine only, except kill, which the signal handler
// may also call (guarded by mu).
type clProc struct {
	name    string
	bin     string
	args    []string
	env     []string // added to the suite's environment
	logPath string

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{} // closed when cmd has exited
	logOff int64         // log size when this incarnation started
}

// clProcs owns every child process the suite starts: killAll ends them
// all (on return, on error, on Ctrl-C). Safe for concurrent use.
type clProcs struct {
	logDir string
	// gomaxprocs, when > 0, is the GOMAXPROCS of every child (the Go
	// ones heed it: tabula, etcd): processes sharing a small machine each
	// get their share of its cores rather than all of them.
	gomaxprocs int
	mu         sync.Mutex
	procs      []*clProc
}

// start runs bin with args as a new process named name.
func (r *clProcs) start(name, bin string, args ...string) (*clProc, error) {
	p := &clProc{name: name, bin: bin, args: args, logPath: filepath.Join(r.logDir, name+".log")}
	if r.gomaxprocs > 0 {
		p.env = []string{fmt.Sprintf("GOMAXPROCS=%d", r.gomaxprocs)}
	}
	r.mu.Lock()
	r.procs = append(r.procs, p)
	r.mu.Unlock()
	return p, p.launch()
}

// killAll SIGKILLs every process still running and waits for each.
func (r *clProcs) killAll() {
	r.mu.Lock()
	ps := append([]*clProc(nil), r.procs...)
	r.mu.Unlock()
	for _, p := range ps {
		p.kill()
	}
}

func (p *clProc) launch() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close() // the child holds its own descriptor
	st, err := f.Stat()
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, p.args...)
	if len(p.env) > 0 {
		cmd.Env = append(os.Environ(), p.env...)
	}
	cmd.Stdout, cmd.Stderr = f, f
	// Own process group: a Ctrl-C on the terminal reaches the suite only,
	// which then kills its children itself. Pdeathsig: they die with the
	// suite even if it is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s (%s): %w", p.name, p.bin, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	p.cmd, p.done, p.logOff = cmd, done, st.Size()
	return nil
}

// restart starts the process again with the same arguments (same data
// directory and port); it must have exited.
func (p *clProc) restart() error {
	if p.running() {
		return fmt.Errorf("restart %s: still running", p.name)
	}
	return p.launch()
}

// cpu is the CPU time the running incarnation has used (procCPU).
func (p *clProc) cpu() (time.Duration, error) {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return 0, fmt.Errorf("%s is not running", p.name)
	}
	return procCPU(cmd.Process.Pid)
}

func (p *clProc) running() bool {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// kill sends SIGKILL (kill -9) and waits for the process to be gone.
func (p *clProc) kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// signal sends sig to the running process.
func (p *clProc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd == nil || !p.running() {
		return fmt.Errorf("%s is not running", p.name)
	}
	return cmd.Process.Signal(sig)
}

// log is what this incarnation has written so far.
func (p *clProc) log() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return ""
	}
	p.mu.Lock()
	off := p.logOff
	p.mu.Unlock()
	if off > int64(len(b)) {
		off = 0
	}
	return string(b[off:])
}

// tail is the last n lines of this incarnation's log, for error messages.
func (p *clProc) tail(n int) string {
	lines := strings.Split(strings.TrimRight(p.log(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitLog waits until this incarnation's log contains s.
func (p *clProc) waitLog(ctx context.Context, s string, d time.Duration) error {
	return clPoll(ctx, d, 20*time.Millisecond, func() (bool, error) {
		if strings.Contains(p.log(), s) {
			return true, nil
		}
		if !p.running() {
			// Nothing more will come: stop now, not at the deadline.
			return false, fmt.Errorf("%w: %s exited before logging %q; log tail:\n%s", errStopPolling, p.name, s, p.tail(20))
		}
		return false, nil
	}, fmt.Sprintf("%s to log %q", p.name, s))
}

// errStopPolling ends clPoll at once with the condition's error.
var errStopPolling = errors.New("stop polling")

// clPoll calls cond every interval until it returns true, returns an
// error wrapping errStopPolling (returned as is), or d passes.
func clPoll(ctx context.Context, d, interval time.Duration, cond func() (bool, error), what string) error {
	deadline := time.Now().Add(d)
	var last error
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if err != nil && errors.Is(err, errStopPolling) {
			return err
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %s (last error: %v)", d, what, last)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(interval):
		}
	}
}

// clFreeAddrs returns n distinct 127.0.0.1 addresses whose ports were
// free a moment ago (all listeners are held until every port is picked,
// so the n differ).
func clFreeAddrs(n int) ([]string, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	var out []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		out = append(out, l.Addr().String())
	}
	return out, nil
}

// clEnsurePeers installs the Debian packages of the peers whose binaries
// are not on PATH: apt-get install, and apt-get update first if that
// fails. What it does goes to out (as # lines) and apt's output to stderr.
func clEnsurePeers(out io.Writer, want map[string]bool) error {
	bins := []struct{ peer, bin, pkg string }{
		{"etcd", "etcd", "etcd-server"},
		{"redis", "redis-server", "redis-server"},
	}
	var pkgs []string
	for _, b := range bins {
		if !want[b.peer] {
			continue
		}
		if path, err := exec.LookPath(b.bin); err == nil {
			fmt.Fprintf(out, "# %s: %s\n", b.peer, path)
			continue
		}
		pkgs = append(pkgs, b.pkg)
	}
	if len(pkgs) == 0 {
		return nil
	}
	prefix := []string{}
	if os.Geteuid() != 0 {
		if _, err := exec.LookPath("sudo"); err != nil {
			return fmt.Errorf("%s not installed and not root (no sudo): install them with apt-get install %s", strings.Join(pkgs, ", "), strings.Join(pkgs, " "))
		}
		prefix = []string{"sudo", "-n"}
	}
	apt := func(args ...string) error {
		argv := append(append(append([]string(nil), prefix...), "apt-get"), args...)
		fmt.Fprintf(out, "# running: %s\n", strings.Join(argv, " "))
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		var buf bytes.Buffer
		cmd.Stdout = io.MultiWriter(os.Stderr, &buf)
		cmd.Stderr = io.MultiWriter(os.Stderr, &buf)
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s: %w", strings.Join(argv, " "), err)
		}
		return nil
	}
	install := append([]string{"install", "-y"}, pkgs...)
	if err := apt(install...); err != nil {
		fmt.Fprintf(out, "# install failed (%v); updating the package lists first\n", err)
		if err := apt("update"); err != nil {
			return err
		}
		if err := apt(install...); err != nil {
			return err
		}
	}
	for _, b := range bins {
		if want[b.peer] {
			if _, err := exec.LookPath(b.bin); err != nil {
				return fmt.Errorf("%s still not on PATH after installing %s", b.bin, b.pkg)
			}
		}
	}
	return nil
}
