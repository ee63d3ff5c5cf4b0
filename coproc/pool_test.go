package coproc_test

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tabuladb/tabula/coproc"
)

// TestInstancesNotShared: each (tenant, table, module, version) has its own
// instances; the guest's instance-local counter tells them apart.
func TestInstancesNotShared(t *testing.T) {
	r := newRuntime(t, coproc.Options{PoolSize: 1})
	keys := []coproc.ModuleKey{
		{Tenant: "a", Table: "t1", Name: "m", Version: 1},
		{Tenant: "a", Table: "t2", Name: "m", Version: 1},
		{Tenant: "b", Table: "t1", Name: "m", Version: 1},
		{Tenant: "a", Table: "t1", Name: "m", Version: 2},
	}
	for _, k := range keys {
		compile(t, r, k, abiTest)
	}
	p := primary(newEngine(t))
	for round := uint64(1); round <= 3; round++ {
		for _, k := range keys {
			res, err := r.Call(context.Background(), k, "seq", coproc.CallRequest{Partition: p})
			if err != nil {
				t.Fatal(err)
			}
			if got := binary.LittleEndian.Uint64(res.Output); got != round {
				t.Fatalf("%v round %d: instance counter %d (shared instance?)", k, round, got)
			}
		}
	}
}

func TestBusy(t *testing.T) {
	r := newRuntime(t, coproc.Options{PoolSize: 1, MaxWaiters: 1, MaxConcurrency: 2})
	k := key("hostile")
	compile(t, r, k, hostile)
	p := primary(newEngine(t))
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = r.Call(ctx, k, "spin", coproc.CallRequest{Partition: p, Deadline: time.Now().Add(300 * time.Millisecond)})
		}()
		time.Sleep(20 * time.Millisecond) // stagger: the first runs, the second waits
	}
	wg.Wait()
	busy := 0
	for _, err := range errs {
		switch {
		case errors.Is(err, coproc.ErrBusy):
			busy++
		case !errors.Is(err, coproc.ErrDeadline):
			t.Fatalf("%v", err)
		}
	}
	if busy == 0 {
		t.Fatalf("no call was refused as busy: %v", errs)
	}
}

// TestCompilationCache: a second runtime over the same cache directory
// compiles from the cache.
func TestCompilationCache(t *testing.T) {
	dir := t.TempDir()
	wasm := module(t, counterAdd)
	if raceEnabled {
		// A cold compile of a Go guest takes ~25 s under the race detector.
		wasm = wasmModule(nil, []fn{abiFn, reserveFn, okFn, loopFn})
	}
	ctx := context.Background()
	var took [2]time.Duration
	for i := range took {
		r := newRuntime(t, coproc.Options{CacheDir: dir})
		start := time.Now()
		if _, err := r.Compile(ctx, key("counter"), wasm); err != nil {
			t.Fatal(err)
		}
		took[i] = time.Since(start)
		if err := r.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	entries, _ := os.ReadDir(dir)
	t.Logf("compile: %v cold, %v from the cache (%d entries in %s)", took[0], took[1], len(entries), filepath.Base(dir))
	if took[1] > took[0] && !raceEnabled {
		t.Errorf("cached compile %v slower than cold %v", took[1], took[0])
	}
}

func TestWarm(t *testing.T) {
	r := newRuntime(t, coproc.Options{PoolSize: 3})
	k := key("bench")
	compile(t, r, k, benchModule)
	before := r.Stats().InstancesCreated
	n, err := r.Warm(context.Background(), k, 10)
	if err != nil {
		t.Fatal(err)
	}
	// Compile left one instance; the pool holds three.
	if n != 2 || r.Stats().InstancesCreated != before+2 {
		t.Fatalf("Warm started %d (created %d -> %d), want 2", n, before, r.Stats().InstancesCreated)
	}
	if n, err := r.Warm(context.Background(), k, 3); n != 0 || err != nil {
		t.Fatalf("Warm of a full pool: %d, %v", n, err)
	}
	if _, err := r.Warm(context.Background(), key("absent"), 1); !errors.Is(err, coproc.ErrModuleNotFound) {
		t.Fatalf("Warm of an absent module: %v", err)
	}
}
