package point

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/diskstore"
	"github.com/tabuladb/tabula/engines/enginetest"
	"github.com/tabuladb/tabula/engines/vfs"
)

// TestSnapshot: a snapshot's scan yields exactly the records live when it
// was taken — each once — while writers overwrite, delete and insert keys
// and the collector runs to completion beside it (it collects the pinned
// segments too; their files stay until the scan has passed them).
func TestSnapshot(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	mem := vfs.NewMem()
	clock := enginetest.NewClock()
	e, err := openMemOpts(t, mem, clock, diskstore.Options{SegmentSize: 64 << 10, CacheBytes: -1, Durability: diskstore.DurabilityLazy, GCInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	const n = 3000
	model := map[string]string{}
	for i := range n {
		k, v := fmt.Sprintf("k%05d", i), fmt.Sprintf("v%d-%d", i, rng.IntN(1000))
		m := engines.Mutation{Key: []byte(k), Value: []byte(v)}
		if i%10 == 3 {
			m.ExpiresAt = clock.Now() + 1000 // expired before the snapshot
		}
		if err := e.Apply([]engines.Mutation{m}); err != nil {
			t.Fatal(err)
		}
		if i%10 != 3 {
			model[k] = v
		}
	}
	// Garbage for the collector: every live key once more.
	for k := range model {
		v := model[k] + strings.Repeat("x", 200)
		if err := e.Apply([]engines.Mutation{{Key: []byte(k), Value: []byte(v)}}); err != nil {
			t.Fatal(err)
		}
		model[k] = v
	}
	for i := 0; i < n; i += 7 {
		k := fmt.Sprintf("k%05d", i)
		if _, err := e.Delete([]byte(k)); err != nil {
			t.Fatal(err)
		}
		delete(model, k)
	}
	clock.Advance(2000)

	st, _ := e.DiskStats()
	freedBefore := st.GCSegmentsFreed
	if st.SpaceAmp <= 1.15 {
		t.Fatalf("space amplification %.2f before the snapshot: the collector would have nothing to do", st.SpaceAmp)
	}
	sn, err := e.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	// Writers and the collector run while the snapshot is read.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var writes atomic.Int64
	wg.Go(func() {
		r := rand.New(rand.NewPCG(seed, 8))
		for {
			select {
			case <-stop:
				return
			default:
			}
			k := fmt.Sprintf("k%05d", r.IntN(n+500))
			var err error
			if r.IntN(4) == 0 {
				_, err = e.Delete([]byte(k))
			} else {
				err = e.Apply([]engines.Mutation{{Key: []byte(k), Value: []byte("changed")}})
			}
			if err != nil {
				t.Error(err)
				return
			}
			writes.Add(1)
		}
	})
	gcDone := make(chan error, 1)
	go func() { _, err := e.GC(); gcDone <- err }()

	got := map[string]string{}
	var obsoleteMid int
	err = sn.Scan(func(r engines.Record) error {
		k := string(r.Key)
		if _, dup := got[k]; dup {
			return fmt.Errorf("key %s yielded twice", k)
		}
		got[k] = string(r.Value)
		if len(got) == 1 {
			// The collector is not held off by the open snapshot: it
			// finishes its pass while the scan is at its first record.
			select {
			case err := <-gcDone:
				if err != nil {
					return fmt.Errorf("collector during the snapshot: %w", err)
				}
			case <-time.After(20 * time.Second):
				return errors.New("the collector did not finish while the snapshot was open")
			}
			st, _ := e.DiskStats()
			if st.GCSegmentsFreed == freedBefore {
				return errors.New("the collector freed nothing while the snapshot was open")
			}
			obsoleteMid = st.ObsoleteSegments
		}
		if len(got)%100 == 0 {
			// Let the writer in: wait until it has done a few more writes.
			for w := writes.Load(); writes.Load() < w+5; {
				runtime.Gosched()
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if obsoleteMid == 0 {
		t.Fatal("no segment was collected under the snapshot's pins")
	}
	// The scan released every segment as it passed it.
	if st, _ := e.DiskStats(); st.ObsoleteSegments != 0 || st.Snapshots != 0 || st.PinnedSegments != 0 {
		t.Fatalf("after the scan: %d obsolete segments, %d snapshots, %d pinned segments; want none",
			st.ObsoleteSegments, st.Snapshots, st.PinnedSegments)
	}
	if err := sn.Scan(func(engines.Record) error { return nil }); !errors.Is(err, diskstore.ErrSnapshotScanned) {
		t.Fatalf("second scan: %v, want ErrSnapshotScanned", err)
	}
	if err := sn.Close(); err != nil {
		t.Fatal(err)
	}
	sn.Close() // idempotent
	close(stop)
	wg.Wait()
	t.Logf("%d records in the snapshot, %d writes during the scan", len(got), writes.Load())
	if len(got) != len(model) {
		t.Errorf("snapshot has %d records, want %d", len(got), len(model))
	}
	for k, v := range model {
		if got[k] != v {
			t.Fatalf("snapshot %s = %q, want %q", k, got[k], v)
		}
	}
	if writes.Load() == 0 {
		t.Fatal("no write ran during the scan")
	}

	m, err := Open(engines.Options{Storage: StorageMemory})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.Snapshot(); !errors.Is(err, ErrSnapshotUnsupported) {
		t.Fatalf("memory snapshot: %v", err)
	}
}
