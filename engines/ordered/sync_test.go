package ordered

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	pebblevfs "github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/enginetest"
)

// TestSyncCrashReplayable: with pebble's WAL off, what a Sync returned for
// survives a power cut that drops every unsynced byte. The batches fit in
// one memtable (pebble's default 4 MiB), so without the Sync the crash
// loses them all: the control crash taken before it must come back empty,
// or the test proves nothing.
func TestSyncCrashReplayable(t *testing.T) {
	fs := pebblevfs.NewCrashableMem()
	opts := engines.Options{Dir: "db", Replayable: true, Now: enginetest.NewClock().Now}
	e, err := openFS(opts, fs, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Close() }()
	pad := strings.Repeat("p", 100)
	const synced, after = 100, 40
	for lsn := uint64(1); lsn <= synced; lsn++ {
		if err := applyLSN(e, lsn, pad); err != nil {
			t.Fatal(err)
		}
	}
	unsynced := fs.CrashClone(pebblevfs.CrashCloneCfg{})
	if err := e.Sync(); err != nil {
		t.Fatal(err)
	}
	// Writes after the Sync may be lost, but only as a suffix.
	for lsn := uint64(synced + 1); lsn <= synced+after; lsn++ {
		if err := applyLSN(e, lsn, pad); err != nil {
			t.Fatal(err)
		}
	}
	crashed := fs.CrashClone(pebblevfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rand.New(rand.NewPCG(1, 2))})

	c, err := openFS(opts, unsynced, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := checkPrefix(t, c); got != 0 {
		t.Fatalf("a crash before any Sync recovered applied LSN %d; the control expects the memtable lost (0)", got)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c, err = openFS(opts, crashed, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	if got := checkPrefix(t, c); got < synced || got > synced+after {
		t.Fatalf("a crash after Sync at applied LSN %d recovered applied LSN %d", synced, got)
	}
}

// TestSyncRandomCrashes interleaves writes, Syncs and crash clones at
// random points (keeping a random share of unsynced data, with memtables
// small enough to flush by themselves too): every crash recovers at least
// the applied LSN of the last Sync before it, and a consistent prefix.
func TestSyncRandomCrashes(t *testing.T) {
	seed := enginetest.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 0x5c))
	fs := pebblevfs.NewCrashableMem()
	opts := engines.Options{Dir: "db", Replayable: true, Now: enginetest.NewClock().Now}
	e, err := openFS(opts, fs, smallMemtable)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Close() }()
	pad := strings.Repeat("p", 200)
	batches := uint64(600)
	if raceEnabled {
		batches = 200
	}
	type crash struct {
		fs           *pebblevfs.MemFS
		at, syncedAt uint64
	}
	var crashes []crash
	var syncedAt uint64
	for lsn := uint64(1); lsn <= batches; lsn++ {
		if err := applyLSN(e, lsn, pad); err != nil {
			t.Fatal(err)
		}
		if rng.IntN(40) == 0 {
			if err := e.Sync(); err != nil {
				t.Fatal(err)
			}
			syncedAt = lsn
		}
		if rng.IntN(100) == 0 {
			pct := []int{0, 50, 100}[rng.IntN(3)]
			crashes = append(crashes, crash{fs.CrashClone(pebblevfs.CrashCloneCfg{UnsyncedDataPercent: pct, RNG: rand.New(rand.NewPCG(rng.Uint64(), 0))}), lsn, syncedAt})
		}
	}
	for i, c := range crashes {
		r, err := openFS(opts, c.fs, smallMemtable)
		if err != nil {
			t.Fatalf("reopen after crash %d: %v", i, err)
		}
		got := checkPrefix(t, r)
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		if got < c.syncedAt || got > c.at {
			t.Fatalf("crash at LSN %d after a Sync at %d recovered applied LSN %d", c.at, c.syncedAt, got)
		}
	}
}

// TestSyncModes: Sync in every mode; an idle Sync does no work; a memory
// engine refuses (it cannot make anything durable); a closed one too.
func TestSyncModes(t *testing.T) {
	for _, mode := range []struct {
		name       string
		durability string
		replayable bool
	}{{"sync", "sync", false}, {"lazy", "lazy", false}, {"replayable", "", true}} {
		t.Run(mode.name, func(t *testing.T) {
			e, err := Open(engines.Options{Dir: t.TempDir(), Durability: mode.durability, Replayable: mode.replayable})
			if err != nil {
				t.Fatal(err)
			}
			if err := e.Apply([]engines.Mutation{{Key: []byte("k"), Value: []byte("v")}}); err != nil {
				t.Fatal(err)
			}
			if err := e.Sync(); err != nil {
				t.Fatal(err)
			}
			n := e.Stats().Syncs
			if err := e.Sync(); err != nil {
				t.Fatal(err)
			}
			if got := e.Stats().Syncs; got != n {
				t.Fatalf("an idle Sync synced: %d syncs, was %d", got, n)
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			if err := e.Sync(); !errors.Is(err, engines.ErrClosed) {
				t.Fatalf("Sync of a closed engine: %v, want ErrClosed", err)
			}
		})
	}
	e, err := Open(engines.Options{Storage: StorageMemory, Replayable: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Close() }()
	if err := e.Sync(); !errors.Is(err, ErrNotDurable) {
		t.Fatalf("Sync of a memory engine: %v, want ErrNotDurable", err)
	}
}

// BenchmarkSync measures one Sync under Replayable (a memtable flush)
// after n puts of 100 bytes, the writes of a partition between two of the
// owner's Syncs (every 5 s: 500 puts is 100 puts/s). ns/op is the Sync
// alone; the writes are not timed.
func BenchmarkSync(b *testing.B) {
	for _, n := range []int{0, 500, 5000, 50000} {
		b.Run(fmt.Sprintf("puts=%d", n), func(b *testing.B) {
			e := openBenchEngine(b)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				b.StopTimer()
				for range n {
					if err := e.Apply([]engines.Mutation{{Key: benchKey(i), Value: benchValue}}); err != nil {
						b.Fatal(err)
					}
					i++
				}
				b.StartTimer()
				if err := e.Sync(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
