package ordered

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	pebblevfs "github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/enginetest"
	"github.com/tabuladb/tabula/engines/vfs"
)

// appliedKey stands for the owner's applied-LSN key (tableserver's
// appliedLSNKey), written in the same batch as the record it applies.
var appliedKey = []byte("\xff/log/applied")

const perBatch = 8

func batchKey(lsn uint64, j int) []byte { return []byte(fmt.Sprintf("b%06d/%d", lsn, j)) }

// smallMemtable makes pebble flush every ~64 KiB of writes, so a short
// test crosses many flushes.
func smallMemtable(o *pebble.Options) { o.MemTableSize = 64 << 10 }

// applyLSN applies the batch of lsn as logreplica.apply does: its
// mutations (perBatch new keys, an overwrite of "last" and a delete of a
// key of batch lsn-1) and the applied LSN, as one Apply.
func applyLSN(e *Engine, lsn uint64, pad string) error {
	batch := make([]engines.Mutation, 0, perBatch+3)
	for j := range perBatch {
		batch = append(batch, engines.Mutation{Key: batchKey(lsn, j), Value: []byte(fmt.Sprintf("%d|%s", lsn, pad))})
	}
	batch = append(batch, engines.Mutation{Key: []byte("last"), Value: binary.LittleEndian.AppendUint64(nil, lsn)})
	if lsn > 1 {
		batch = append(batch, engines.Mutation{Key: batchKey(lsn-1, 0), Delete: true})
	}
	batch = append(batch, engines.Mutation{Key: appliedKey, Value: binary.LittleEndian.AppendUint64(nil, lsn)})
	return e.Apply(batch)
}

// checkPrefix checks that e holds exactly the batches 1..applied (its
// applied-LSN key), each whole, and nothing of a later one. It returns
// applied.
func checkPrefix(t *testing.T, e *Engine) uint64 {
	t.Helper()
	var applied uint64
	switch v, _, err := e.Get(appliedKey); {
	case errors.Is(err, engines.ErrNotFound):
	case err != nil:
		t.Fatal(err)
	default:
		applied = binary.LittleEndian.Uint64(v)
	}
	want := map[string]string{}
	if applied > 0 {
		want["last"] = string(binary.LittleEndian.AppendUint64(nil, applied))
		want[string(appliedKey)] = want["last"]
	}
	for lsn := uint64(1); lsn <= applied; lsn++ {
		for j := range perBatch {
			if j == 0 && lsn < applied {
				continue // deleted by batch lsn+1
			}
			want[string(batchKey(lsn, j))] = fmt.Sprint(lsn)
		}
	}
	got := 0
	err := e.Scan(func(r engines.Record) error {
		got++
		w, ok := want[string(r.Key)]
		v := string(r.Value)
		if i := strings.IndexByte(v, '|'); i >= 0 && r.Key[0] == 'b' {
			v = v[:i]
		}
		if !ok || v != w {
			return fmt.Errorf("after a crash at applied LSN %d: key %q = %q, want %q (present %v)", applied, r.Key, v, w, ok)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got != len(want) {
		t.Fatalf("after a crash at applied LSN %d: %d records, want %d", applied, got, len(want))
	}
	if s := e.Stats(); s.Keys != uint64(len(want)) {
		t.Fatalf("after a crash: Stats.Keys %d, want %d", s.Keys, len(want))
	}
	return applied
}

// TestCrashReplayable: with pebble's WAL off, a power cut loses the
// memtables, so the engine goes back to an earlier state. That state must
// be a prefix of the applied batches that agrees with the applied-LSN key
// in it: every batch up to it whole, nothing after it. Crashes are cut at
// random points of a stream of batches, keeping a random share of the
// unsynced writes (pebble's CrashClone).
func TestCrashReplayable(t *testing.T) {
	seed := enginetest.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 0x0d))
	fs := pebblevfs.NewCrashableMem()
	clock := enginetest.NewClock()
	opts := engines.Options{Dir: "db", Replayable: true, Now: clock.Now}
	e, err := openFS(opts, fs, smallMemtable)
	if err != nil {
		t.Fatal(err)
	}
	pad := strings.Repeat("p", 200)
	batches, crashes := uint64(1500), uint64(6)
	if raceEnabled {
		batches, crashes = 400, 3
	}
	var clones []*pebblevfs.MemFS
	var cutAt []uint64
	for lsn := uint64(1); lsn <= batches; lsn++ {
		if err := applyLSN(e, lsn, pad); err != nil {
			t.Fatal(err)
		}
		if rng.Uint64N(batches/crashes) == 0 {
			pct := []int{0, 50, 100}[rng.IntN(3)]
			clones = append(clones, fs.CrashClone(pebblevfs.CrashCloneCfg{UnsyncedDataPercent: pct, RNG: rand.New(rand.NewPCG(rng.Uint64(), 0))}))
			cutAt = append(cutAt, lsn)
		}
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	clones = append(clones, fs.CrashClone(pebblevfs.CrashCloneCfg{}))
	cutAt = append(cutAt, batches)
	var maxApplied uint64
	for i, c := range clones {
		e, err := openFS(opts, c, smallMemtable)
		if err != nil {
			t.Fatalf("reopen after crash %d (at LSN %d): %v", i, cutAt[i], err)
		}
		applied := checkPrefix(t, e)
		t.Logf("crash at LSN %d: recovered applied LSN %d", cutAt[i], applied)
		if applied > cutAt[i] {
			t.Fatalf("crash at LSN %d recovered applied LSN %d", cutAt[i], applied)
		}
		maxApplied = max(maxApplied, applied)
		// The owner replays from applied+1; the engine takes it.
		for lsn := applied + 1; lsn <= applied+3; lsn++ {
			if err := applyLSN(e, lsn, pad); err != nil {
				t.Fatal(err)
			}
		}
		if got := checkPrefix(t, e); got != applied+3 {
			t.Fatalf("after replaying 3 batches from %d: applied %d", applied, got)
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// The last clone was taken after a clean Close, which flushes: it
	// holds everything.
	if maxApplied != batches {
		t.Fatalf("after a clean close the applied LSN is %d, want %d", maxApplied, batches)
	}
}

// TestRestartSync: with the default (sync) durability every acknowledged
// write survives a power cut that drops everything unsynced.
func TestRestartSync(t *testing.T) {
	fs := pebblevfs.NewCrashableMem()
	opts := engines.Options{Dir: "db", Now: enginetest.NewClock().Now}
	e, err := openFS(opts, fs, smallMemtable)
	if err != nil {
		t.Fatal(err)
	}
	pad := strings.Repeat("p", 200)
	const batches = 300
	for lsn := uint64(1); lsn <= batches; lsn++ {
		if err := applyLSN(e, lsn, pad); err != nil {
			t.Fatal(err)
		}
	}
	crashed := fs.CrashClone(pebblevfs.CrashCloneCfg{}) // unsynced data: none kept
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e, err = openFS(opts, crashed, smallMemtable)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if got := checkPrefix(t, e); got != batches {
		t.Fatalf("after a crash with sync durability: applied %d, want %d", got, batches)
	}
}

// TestRestartDisk reopens engines on the OS file system in each mode and
// finds every record, with its expiry, and the counters.
func TestRestartDisk(t *testing.T) {
	for _, mode := range []struct {
		name       string
		durability string
		replayable bool
	}{{"sync", "sync", false}, {"lazy", "lazy", false}, {"replayable", "", true}} {
		t.Run(mode.name, func(t *testing.T) {
			clock := enginetest.NewClock()
			opts := engines.Options{Dir: t.TempDir(), Durability: mode.durability, Replayable: mode.replayable, Now: clock.Now}
			e, err := Open(opts)
			if err != nil {
				t.Fatal(err)
			}
			for lsn := uint64(1); lsn <= 50; lsn++ {
				if err := applyLSN(e, lsn, "x"); err != nil {
					t.Fatal(err)
				}
			}
			if err := e.Apply([]engines.Mutation{{Key: []byte("ttl"), Value: []byte("t"), ExpiresAt: clock.Now() + 1000}}); err != nil {
				t.Fatal(err)
			}
			before := e.Stats()
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			e, err = Open(opts)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if v, exp, err := e.Get([]byte("ttl")); err != nil || string(v) != "t" || exp != clock.Now()+1000 {
				t.Fatalf("get ttl after reopen = %q, %d, %v", v, exp, err)
			}
			if _, err := e.Delete([]byte("ttl")); err != nil {
				t.Fatal(err)
			}
			if got := checkPrefix(t, e); got != 50 {
				t.Fatalf("after reopen: applied %d, want 50", got)
			}
			if after := e.Stats(); after.Keys+1 != before.Keys || after.Bytes+4 != before.Bytes {
				t.Fatalf("stats before close %+v, after reopen and a delete %+v", before, after)
			}
		})
	}
}

func TestOptionsRefused(t *testing.T) {
	for _, o := range []engines.Options{
		{Storage: "tape"},
		{Storage: StorageSSD},
		{Durability: "sometimes", Dir: t.TempDir()},
		{Compression: "lz77"},
		{FS: vfsMem()},
	} {
		if e, err := Open(o); !errors.Is(err, ErrOptions) {
			if err == nil {
				e.Close()
			}
			t.Errorf("open with %+v: %v; want ErrOptions", o, err)
		}
	}
}

func vfsMem() *vfs.MemFS { return vfs.NewMem() }
