package coproctest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
)

// Examples are the example modules under coproc/examples.
var Examples = []string{"counter_add", "score_candidates", "filter_scan", "hostile"}

// CoprocDir is the coproc package's directory in the source tree.
func CoprocDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// Build builds the guest package in dir (relative to coproc/, e.g.
// "examples/counter_add") with GOOS=wasip1 GOARCH=wasm -buildmode=c-shared
// into outDir and returns the module. The go command's build cache makes
// a repeated build cheap.
func Build(ctx context.Context, dir, outDir string) ([]byte, error) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		goCmd = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out := filepath.Join(outDir, filepath.Base(dir)+".wasm")
	cmd := exec.CommandContext(ctx, goCmd, "build", "-buildmode=c-shared", "-o", out, "./"+filepath.ToSlash(dir))
	cmd.Dir = CoprocDir()
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("coproctest: build %s: %w\n%s", dir, err, stderr.Bytes())
	}
	return os.ReadFile(out)
}

// Modules builds a set of modules once per process, concurrently.
// Safe for concurrent use.
type Modules struct {
	outDir string
	mu     sync.Mutex
	// Guarded by mu.
	built map[string]*buildResult
}

type buildResult struct {
	done chan struct{}
	wasm []byte
	err  error
}

// NewModules builds into outDir.
func NewModules(outDir string) *Modules {
	return &Modules{outDir: outDir, built: make(map[string]*buildResult)}
}

// Start begins building dirs in the background (at most two at once).
func (m *Modules) Start(dirs ...string) {
	sem := make(chan struct{}, 2)
	for _, d := range dirs {
		r, fresh := m.entry(d)
		if !fresh {
			continue
		}
		go func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			r.wasm, r.err = Build(context.Background(), d, m.outDir)
			close(r.done)
		}()
	}
}

func (m *Modules) entry(dir string) (*buildResult, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r, ok := m.built[dir]; ok {
		return r, false
	}
	r := &buildResult{done: make(chan struct{})}
	m.built[dir] = r
	return r, true
}

// Get returns the module built from dir, building it if Start did not.
func (m *Modules) Get(dir string) ([]byte, error) {
	m.Start(dir)
	m.mu.Lock()
	r := m.built[dir]
	m.mu.Unlock()
	<-r.done
	return r.wasm, r.err
}
