package point

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/enginetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	enginetest.Run(t, func(t *testing.T, opts engines.Options) engines.Engine {
		e, err := engines.Open(engines.KindPoint, opts)
		if err != nil {
			t.Fatal(err)
		}
		return e
	})
}

// TestConformanceSSD runs the suite over the disk store in a temporary
// directory (the entry point the bench suite and the server use).
func TestConformanceSSD(t *testing.T) {
	enginetest.Run(t, func(t *testing.T, opts engines.Options) engines.Engine {
		opts.Dir, opts.Storage = t.TempDir(), StorageSSD
		e, err := engines.Open(engines.KindPoint, opts)
		if err != nil {
			t.Fatal(err)
		}
		return e
	})
}

// TestConformanceSSDCompressed runs the suite over the disk store with s2
// compression.
func TestConformanceSSDCompressed(t *testing.T) {
	enginetest.Run(t, func(t *testing.T, opts engines.Options) engines.Engine {
		opts.Dir, opts.Storage, opts.Compression = t.TempDir(), StorageSSD, "s2"
		e, err := engines.Open(engines.KindPoint, opts)
		if err != nil {
			t.Fatal(err)
		}
		return e
	})
}

func TestStorageUnavailable(t *testing.T) {
	_, err := engines.Open(engines.KindPoint, engines.Options{Storage: "tape"})
	if !errors.Is(err, ErrStorageUnavailable) {
		t.Fatalf("open with storage tape: %v, want ErrStorageUnavailable", err)
	}
	t.Log(err)
	if _, err := engines.Open(engines.KindPoint, engines.Options{Storage: StorageSSD}); !errors.Is(err, ErrNoDir) {
		t.Fatalf("open with storage ssd and no Dir: %v, want ErrNoDir", err)
	}
	for _, s := range []string{"", StorageMemory} {
		e, err := Open(engines.Options{Storage: s})
		if err != nil {
			t.Fatalf("open with storage %q: %v", s, err)
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestEmptyKeyRejected(t *testing.T) {
	e, _ := Open(engines.Options{})
	defer e.Close()
	if err := e.Apply([]engines.Mutation{{Key: nil, Value: []byte("v")}}); !errors.Is(err, ErrEmptyKey) {
		t.Fatalf("apply with an empty key: %v, want ErrEmptyKey", err)
	}
	if _, _, err := e.Get(nil); !errors.Is(err, engines.ErrNotFound) {
		t.Fatalf("get of the empty key: %v, want ErrNotFound", err)
	}
}

// TestExpiredFreed checks that a Get finding an expired record drops it from
// the index and frees its bytes.
func TestExpiredFreed(t *testing.T) {
	clock := enginetest.NewClock()
	e, _ := Open(engines.Options{Now: clock.Now})
	defer e.Close()
	if err := e.Apply([]engines.Mutation{{Key: []byte("k"), Value: []byte("v"), ExpiresAt: clock.Now() + 1}}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(1)
	if _, _, err := e.Get([]byte("k")); !errors.Is(err, engines.ErrNotFound) {
		t.Fatalf("get of an expired key: %v", err)
	}
	if s := e.Stats(); s.Keys != 0 || s.Bytes != 0 {
		t.Fatalf("stats after the expired key was read: %+v; want it dropped", s)
	}
}

// TestIndexGrows fills an engine past many splits and reads everything back.
func TestIndexGrows(t *testing.T) {
	e, _ := Open(engines.Options{})
	defer e.Close()
	const n = 50_000
	for i := range n {
		k := []byte(fmt.Sprintf("key-%d", i))
		if err := e.Apply([]engines.Mutation{{Key: k, Value: k}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		k := fmt.Sprintf("key-%d", i)
		v, _, err := e.Get([]byte(k))
		if err != nil || string(v) != k {
			t.Fatalf("get %q = %q, %v", k, v, err)
		}
	}
	s := e.Stats()
	if s.Keys != n || s.IndexBytes == 0 {
		t.Fatalf("stats %+v", s)
	}
	t.Logf("%d keys: index %d bytes (%.1f per key)", n, s.IndexBytes, float64(s.IndexBytes)/n)
}

func BenchmarkGet(b *testing.B) {
	e, _ := Open(engines.Options{})
	defer e.Close()
	const n = 1 << 16
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("key-%08d", i))
		if err := e.Apply([]engines.Mutation{{Key: keys[i], Value: keys[i]}}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, _, err := e.Get(keys[i&(n-1)]); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPut(b *testing.B) {
	e, _ := Open(engines.Options{})
	defer e.Close()
	const n = 1 << 16
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("key-%08d", i))
	}
	batch := make([]engines.Mutation, 1)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		batch[0] = engines.Mutation{Key: keys[i&(n-1)], Value: keys[i&(n-1)]}
		if err := e.Apply(batch); err != nil {
			b.Fatal(err)
		}
	}
}

// TestConcurrentGrowth has writers insert and then delete many keys (so the
// index splits and merges under them, re-hashing keys through the store)
// while readers get a set of stable keys, which must never go missing.
func TestConcurrentGrowth(t *testing.T) {
	e, _ := Open(engines.Options{})
	defer e.Close()
	const stable, churn = 1000, 20_000
	for i := range stable {
		k := []byte(fmt.Sprintf("stable-%d", i))
		if err := e.Apply([]engines.Mutation{{Key: k, Value: k}}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	var stop atomic.Bool
	errs := make(chan error, 4)
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < churn; i += 2 {
				k := []byte(fmt.Sprintf("churn-%d", i))
				if err := e.Apply([]engines.Mutation{{Key: k, Value: k}}); err != nil {
					errs <- err
					return
				}
			}
			for i := w; i < churn; i += 2 {
				if _, err := e.Delete([]byte(fmt.Sprintf("churn-%d", i))); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var readers sync.WaitGroup
	for r := range 2 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for i := r; !stop.Load(); i++ {
				k := fmt.Sprintf("stable-%d", i%stable)
				v, _, err := e.Get([]byte(k))
				if err != nil || string(v) != k {
					errs <- fmt.Errorf("get %q = %q, %v", k, v, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	stop.Store(true)
	readers.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if s := e.Stats(); s.Keys != stable {
		t.Fatalf("%d keys after the churn, want %d", s.Keys, stable)
	}
}
