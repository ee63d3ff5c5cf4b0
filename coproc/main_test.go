package coproc_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/tabuladb/tabula/coproc"
	"github.com/tabuladb/tabula/coproc/coproctest"
	"github.com/tabuladb/tabula/engines"
	_ "github.com/tabuladb/tabula/engines/point"
)

// Every test binary builds the guest modules once (the go build cache makes
// that cheap after the first run) and shares one compilation cache, so each
// module is compiled to machine code once per binary.
var (
	modules  *coproctest.Modules
	cacheDir string
)

const (
	counterAdd      = "examples/counter_add"
	scoreCandidates = "examples/score_candidates"
	filterScan      = "examples/filter_scan"
	hostile         = "examples/hostile"
	abiTest         = "testdata/abitest"
	benchModule     = "testdata/bench"
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "coproc-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	modules = coproctest.NewModules(dir)
	all := []string{abiTest, counterAdd, scoreCandidates, filterScan, hostile, benchModule}
	modules.Start(all...)
	// The compilation cache outlives the test binary, like the go build
	// cache: compiling a Go guest takes ~1.5 s, ~25 s under -race.
	cacheDir = os.Getenv("TABULA_COPROC_TEST_CACHE")
	if cacheDir == "" {
		if uc, err := os.UserCacheDir(); err == nil {
			cacheDir = filepath.Join(uc, "tabula", "coproc-test-wazero")
		} else {
			cacheDir = filepath.Join(dir, "cache")
		}
	}
	precompile(all)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func module(t testing.TB, dir string) []byte {
	t.Helper()
	wasm, err := modules.Get(dir)
	if err != nil {
		t.Fatal(err)
	}
	return wasm
}

func newRuntime(t testing.TB, opts coproc.Options) *coproc.Runtime {
	t.Helper()
	if opts.CacheDir == "" {
		opts.CacheDir = cacheDir
	}
	r, err := coproc.New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return r
}

// compileOnce serialises first compilations per module so that parallel
// tests wait for the cache instead of compiling the same module twice.
var compileMu sync.Map

func compile(t testing.TB, r *coproc.Runtime, key coproc.ModuleKey, dir string) coproc.Manifest {
	t.Helper()
	mu, _ := compileMu.LoadOrStore(dir, new(sync.Mutex))
	mu.(*sync.Mutex).Lock()
	defer mu.(*sync.Mutex).Unlock()
	man, err := r.Compile(context.Background(), key, module(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	return man
}

func newEngine(t testing.TB) engines.Engine {
	t.Helper()
	e, err := engines.Open(engines.KindPoint, engines.Options{Storage: "memory"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func primary(e engines.Engine) *coproc.EnginePartition {
	return coproc.PartitionFromEngine(e, coproc.PartitionInfo{ID: 1, Index: 0, Count: 1, HashStart: 0, HashEnd: ^uint64(0), Primary: true}, nil)
}

func key(name string) coproc.ModuleKey {
	return coproc.ModuleKey{Tenant: "acme", Table: "t1", Name: name, Version: 1}
}

// precompile fills the compilation cache, two modules at a time.
func precompile(dirs []string) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 2)
	for _, d := range dirs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			wasm, err := modules.Get(d)
			if err != nil {
				return // the tests report it
			}
			ctx := context.Background()
			r, err := coproc.New(ctx, coproc.Options{CacheDir: cacheDir})
			if err != nil {
				return
			}
			defer r.Close(ctx)
			r.Compile(ctx, coproc.ModuleKey{Tenant: "pre", Table: "pre", Name: "pre"}, wasm)
		}()
	}
	wg.Wait()
}
