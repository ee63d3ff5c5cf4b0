package tableserver

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"testing"

	pebblevfs "github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/ordered"
	"github.com/tabuladb/tabula/engines/point"
	"github.com/tabuladb/tabula/engines/vfs"
	"github.com/tabuladb/tabula/replication/partition"
)

// flushRig is one engine kind that runs under a commit log: how to open
// it, and how to crash it (what a power loss leaves) and open what is
// left. durable engines must report only what survives the crash.
type flushRig struct {
	name    string
	durable bool
	// open opens the engine; crash cuts power under the running one and
	// opens what is left (nil for memory engines: nothing is left).
	open  func(t *testing.T) engines.Engine
	crash func(t *testing.T) engines.Engine
}

func flushRigs() []flushRig {
	logger := slog.New(slog.DiscardHandler)
	var pfs *vfs.MemFS
	popts := func() engines.Options {
		return engines.Options{Dir: "/p", FS: pfs, Storage: point.StorageSSD, Replayable: true, Logger: logger}
	}
	var ofs *pebblevfs.MemFS
	oopts := engines.Options{Dir: "db", Replayable: true, Logger: logger}
	return []flushRig{{
		name: "point ssd", durable: true,
		open: func(t *testing.T) engines.Engine {
			pfs = vfs.NewMem()
			return mustOpen(t)(point.Open(popts()))
		},
		crash: func(t *testing.T) engines.Engine {
			pfs.Crash()
			return mustOpen(t)(point.Open(popts()))
		},
	}, {
		name: "ordered ssd", durable: true,
		open: func(t *testing.T) engines.Engine {
			ofs = pebblevfs.NewCrashableMem()
			return mustOpen(t)(ordered.OpenFS(oopts, ofs))
		},
		crash: func(t *testing.T) engines.Engine {
			// Nothing unsynced survives.
			return mustOpen(t)(ordered.OpenFS(oopts, ofs.CrashClone(pebblevfs.CrashCloneCfg{})))
		},
	}, {
		name: "point memory",
		open: func(t *testing.T) engines.Engine {
			return mustOpen(t)(point.Open(engines.Options{Storage: point.StorageMemory, Replayable: true, Logger: logger}))
		},
	}, {
		name: "ordered memory",
		open: func(t *testing.T) engines.Engine {
			return mustOpen(t)(ordered.Open(engines.Options{Storage: ordered.StorageMemory, Replayable: true, Logger: logger}))
		},
	}}
}

func mustOpen(t *testing.T) func(engines.Engine, error) engines.Engine {
	return func(e engines.Engine, err error) engines.Engine {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
}

// applyRecords applies records 1..n to e as the pump does: each record's
// keys and the applied LSN in one batch.
func applyRecords(t *testing.T, w engines.Writer, n uint64) {
	t.Helper()
	for lsn := uint64(1); lsn <= n; lsn++ {
		if err := w.Apply([]engines.Mutation{
			{Key: fmt.Appendf(nil, "k%04d", lsn), Value: fmt.Appendf(nil, "v%d", lsn)},
			{Key: appliedLSNKey, Value: binary.LittleEndian.AppendUint64(nil, lsn)},
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// flushReplica is a log replica reduced to what flush and truncation
// read: the engine, whether it keeps files, and a core at applied.
func flushReplica(e engines.Engine, durable bool, applied uint64) *logReplica {
	return &logReplica{engine: e, durable: durable, core: partition.New(partition.Config{}, applied)}
}

// TestFlushReportsOnlyDurable: for every engine kind that runs under a
// commit log, the flushed LSN a replica reports (which the master trims
// the log below) is held by the engine after a crash. The ordered engine
// reported every applied LSN flushed while its writes sat in pebble's
// memtable, and a crash then lost them for good ("reported flushed_lsn
// 100 … after a crash its engine holds only LSN 0"). A memory engine
// reports its applied LSN: it holds it while it lives and copies after a
// crash (truncate.go).
func TestFlushReportsOnlyDurable(t *testing.T) {
	const n = 100
	for _, rig := range flushRigs() {
		t.Run(rig.name, func(t *testing.T) {
			var e engines.Engine = rig.open(t)
			if rig.durable {
				e = newReopenable(e, func() (engines.Engine, error) { return nil, errors.New("no reopen in this test") })
			}
			applyRecords(t, e.(engines.Writer), n)
			l := flushReplica(e, rig.durable, n)
			if err := l.flush(); err != nil {
				t.Fatal(err)
			}
			flushed, _ := l.truncation()
			if flushed != n {
				t.Fatalf("flushed LSN %d after a flush at applied %d", flushed, n)
			}
			if !rig.durable {
				_ = e.Close()
				return
			}
			c := rig.crash(t)
			defer func() { _ = c.Close() }()
			_ = e.Close() // its files are gone under it
			got, err := readAppliedLSN(c)
			if err != nil {
				t.Fatal(err)
			}
			if got < flushed {
				t.Fatalf("reported flushed_lsn %d; after a crash its engine holds only LSN %d", flushed, got)
			}
			for lsn := uint64(1); lsn <= flushed; lsn++ {
				if v, _, err := c.Get(fmt.Appendf(nil, "k%04d", lsn)); err != nil || string(v) != fmt.Sprintf("v%d", lsn) {
					t.Fatalf("after a crash, record %d of %d flushed: %q, %v", lsn, flushed, v, err)
				}
			}
		})
	}
}

// noSync is an engine with files but no Sync.
type noSync struct{ engines.Engine }

func (n noSync) Apply(b []engines.Mutation) error { return n.Engine.(engines.Writer).Apply(b) }
func (n noSync) Delete(k []byte) (bool, error)    { return n.Engine.(engines.Writer).Delete(k) }
func (n noSync) CompareAndSwap(c engines.CAS) (engines.CASResult, error) {
	return n.Engine.(engines.Writer).CompareAndSwap(c)
}

// TestFlushWithoutSync: an engine with files that cannot sync on demand
// reports nothing flushed, behind a reopenable or not, so its log is
// kept whole; the flush says why.
func TestFlushWithoutSync(t *testing.T) {
	inner := mustOpen(t)(ordered.OpenFS(engines.Options{Dir: "db", Replayable: true, Logger: slog.New(slog.DiscardHandler)}, pebblevfs.NewCrashableMem()))
	e := noSync{inner}
	defer func() { _ = e.Close() }()
	applyRecords(t, e, 10)
	for _, eng := range []engines.Engine{e, newReopenable(e, nil).inner()} {
		l := flushReplica(eng, true, 10)
		if err := l.flush(); !errors.Is(err, errNoSync) {
			t.Fatalf("flush of %T without Sync: %v, want errNoSync", eng, err)
		}
		if flushed, keep := l.truncation(); flushed != 0 || keep != 0 {
			t.Fatalf("an engine without Sync reported flushed %d, keep from extent %d", flushed, keep)
		}
	}
}
