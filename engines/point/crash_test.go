package point

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/diskstore"
	"github.com/tabuladb/tabula/engines/enginetest"
	"github.com/tabuladb/tabula/engines/vfs"
)

var quiet = slog.New(slog.DiscardHandler)

// crashDir is where crash tests keep the store on a MemFS.
const crashDir = "/data/p1"

func openMem(t *testing.T, fs vfs.FS, clock *enginetest.Clock, seg int64) (*Engine, error) {
	t.Helper()
	return OpenDisk(engines.Options{Dir: crashDir, Now: clock.Now, Logger: quiet},
		diskstore.Options{FS: fs, SegmentSize: seg, GCInterval: 1e6 /* 1 ms */, MaxSpaceAmp: 1.3, GCDutyCycle: 1,
			// A delta index block every half segment, so crashes also hit
			// block writes and reopens load chains with collections after
			// their last block.
			IndexBlockBytes: seg / 2})
}

// keyState is what a crash may leave for one key: its acknowledged value
// ("" with !present for absent) and, if a write of it was in flight at the
// crash, that write's outcome as a second possibility.
type keyState struct {
	present, inflight bool
	value             string
	inflightPresent   bool
	inflightValue     string
}

// TestCrashConcurrentWriters crashes the file system (keeping a random
// prefix of every unsynced tail) while writers put, delete, batch and CAS on
// disjoint keys with the collector running on small segments and delta
// index blocks written every half segment, then reopens
// and checks that every acknowledged write is there, each in-flight one is
// either there or not, and nothing else.
func TestCrashConcurrentWriters(t *testing.T) {
	seed := enginetest.Seed(t)
	rounds := 40
	if testing.Short() {
		rounds = 10
	}
	for round := range rounds {
		rng := rand.New(rand.NewPCG(seed, uint64(round)))
		crashRound(t, rng, round)
	}
}

func crashRound(t *testing.T, rng *rand.Rand, round int) {
	fs := vfs.NewMem()
	clock := enginetest.NewClock()
	seg := int64(4096 << rng.IntN(3))
	const writers, keysPer = 4, 24
	states := make([][]keyState, writers)
	for w := range states {
		states[w] = make([]keyState, keysPer)
	}
	// Several generations: crash, reopen, write more, crash again.
	for gen := range 3 {
		kfs := &killableFS{FS: fs}
		e, err := openMem(t, kfs, clock, seg)
		if err != nil {
			t.Fatalf("round %d gen %d: reopen: %v", round, gen, err)
		}
		checkStates(t, e, states, fmt.Sprintf("round %d gen %d", round, gen))
		crashAfter := int64(20 + rng.IntN(200))
		var acked atomic.Int64
		var stop atomic.Bool // the process "dies" with the crash
		var wg sync.WaitGroup
		// Time passes while they write (10 ms a write), so blocks are
		// also cut by IndexBlockInterval.
		for w := range writers {
			wrng := rand.New(rand.NewPCG(rng.Uint64(), uint64(w)))
			wg.Add(1)
			go func() {
				defer wg.Done()
				writeUntilCrash(e, wrng, w, states[w], &acked, &stop, func() { clock.Advance(10) })
			}()
		}
		for acked.Load() < crashAfter {
			if ok := waitAcked(&acked, crashAfter); !ok {
				break
			}
		}
		stop.Store(true)
		kfs.dead.Store(true) // the process dies: nothing it does from now on lands
		fs.CrashKeepingPrefix(rng)
		wg.Wait()
		_ = e.Close() // fails: the process is dead
	}
	e, err := openMem(t, fs, clock, seg)
	if err != nil {
		t.Fatalf("round %d: final reopen: %v", round, err)
	}
	checkStates(t, e, states, fmt.Sprintf("round %d final", round))
	if err := e.Close(); err != nil {
		t.Fatalf("round %d: close: %v", round, err)
	}
}

// waitAcked yields until acked reaches n (the writers run meanwhile).
func waitAcked(acked *atomic.Int64, n int64) bool {
	for range 1 << 20 {
		if acked.Load() >= n {
			return true
		}
		runtimeGosched()
	}
	return false
}

// writeUntilCrash writes keys of writer w until a write fails (the crash),
// recording acknowledged states and the in-flight one.
func writeUntilCrash(e *Engine, rng *rand.Rand, w int, st []keyState, acked *atomic.Int64, stop *atomic.Bool, tick func()) {
	for i := 0; !stop.Load(); i++ {
		tick()
		k := rng.IntN(len(st))
		k2 := -1 // the batch's second key
		key := fmt.Sprintf("w%d-k%02d", w, k)
		val := fmt.Sprintf("w%d-k%02d-v%d-%s", w, k, i, pad(rng.IntN(300)))
		var err error
		switch op := rng.IntN(10); {
		case op < 5:
			st[k].inflight, st[k].inflightPresent, st[k].inflightValue = true, true, val
			err = e.Apply([]engines.Mutation{{Key: []byte(key), Value: []byte(val)}})
		case op < 7:
			st[k].inflight, st[k].inflightPresent = true, false
			_, err = e.Delete([]byte(key))
		case op < 8:
			st[k].inflight, st[k].inflightPresent, st[k].inflightValue = true, true, val
			var res engines.CASResult
			res, err = e.CompareAndSwap(engines.CAS{Key: []byte(key), ExpectExists: st[k].present,
				ExpectedValue: []byte(st[k].value), New: engines.Mutation{Value: []byte(val)}})
			if err == nil && !res.Swapped {
				panic(fmt.Sprintf("CAS on %s did not swap: model out of step", key))
			}
		default:
			// A batch over two keys: both or neither survive a crash.
			k2 = (k + 1) % len(st)
			key2 := fmt.Sprintf("w%d-k%02d", w, k2)
			if k2 == k {
				continue
			}
			st[k].inflight, st[k].inflightPresent, st[k].inflightValue = true, true, val
			st[k2].inflight, st[k2].inflightPresent = true, false
			err = e.Apply([]engines.Mutation{{Key: []byte(key), Value: []byte(val)}, {Key: []byte(key2), Delete: true}})
		}
		// A write that returns after the crash began is not acknowledged:
		// its sync may have run after the crash dropped unsynced data (a
		// dead process acknowledges nothing). One that returned before stop
		// was set synced before the crash.
		if err != nil || stop.Load() {
			return // the crash; the write stays in flight
		}
		if k2 >= 0 {
			st[k2].present, st[k2].inflight = false, false
		}
		st[k].present, st[k].value = st[k].inflightPresent, st[k].inflightValue
		st[k].inflight = false
		acked.Add(1)
	}
}

func pad(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = 'a' + byte(i%26)
	}
	return string(b)
}

// checkStates checks e against the model and resolves in-flight writes to
// what the store kept.
func checkStates(t *testing.T, e *Engine, states [][]keyState, where string) {
	t.Helper()
	seen := map[string]bool{}
	for w := range states {
		for k := range states[w] {
			s := &states[w][k]
			key := fmt.Sprintf("w%d-k%02d", w, k)
			v, _, err := e.Get([]byte(key))
			present := err == nil
			if err != nil && !errors.Is(err, engines.ErrNotFound) {
				t.Fatalf("%s: get %s: %v", where, key, err)
			}
			ok := present == s.present && (!present || string(v) == s.value)
			if !ok && s.inflight {
				ok = present == s.inflightPresent && (!present || string(v) == s.inflightValue)
			}
			if !ok {
				t.Fatalf("%s: %s = %q (present %v); acknowledged %q (present %v), in flight %v %q (present %v)",
					where, key, v, present, s.value, s.present, s.inflight, s.inflightValue, s.inflightPresent)
			}
			s.present, s.value, s.inflight = present, string(v), false
			if present {
				seen[key] = true
			}
		}
	}
	n := 0
	if err := e.Scan(func(r engines.Record) error {
		if !seen[string(r.Key)] {
			return fmt.Errorf("scan found %q, not in the model", r.Key)
		}
		n++
		return nil
	}); err != nil {
		t.Fatalf("%s: scan: %v", where, err)
	}
	if n != len(seen) {
		t.Fatalf("%s: scan saw %d records, want %d", where, n, len(seen))
	}
}

func runtimeGosched() { runtime.Gosched() }
