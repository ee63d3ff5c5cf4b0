package ordered

import (
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/enginetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// skipUnderRace skips the suite's Model test (60 000 random operations)
// under the race detector, where pebble's invariant checks make it take
// 40 s per configuration; it runs without -race, and the suite's
// concurrent tests still run under it.
func skipUnderRace(t *testing.T) {
	if raceEnabled && strings.HasSuffix(t.Name(), "/Model") {
		t.Skip("Model runs without -race only (pebble's race build checks invariants: 40 s)")
	}
}

func TestConformance(t *testing.T) {
	enginetest.Run(t, func(t *testing.T, opts engines.Options) engines.Engine {
		skipUnderRace(t)
		e, err := engines.Open(engines.KindOrdered, opts)
		if err != nil {
			t.Fatal(err)
		}
		return e
	})
}

// TestConformanceDisk runs the suite over pebble files in a temporary
// directory with the WAL on. Durability is lazy: the suite's model test
// makes 60 000 writes, 17 s of fsyncs on this machine when each is synced
// (TestRestartSync covers sync durability).
func TestConformanceDisk(t *testing.T) {
	enginetest.Run(t, func(t *testing.T, opts engines.Options) engines.Engine {
		skipUnderRace(t)
		opts.Dir, opts.Durability = t.TempDir(), "lazy"
		e, err := engines.Open(engines.KindOrdered, opts)
		if err != nil {
			t.Fatal(err)
		}
		return e
	})
}

// TestConformanceReplayable runs the suite with pebble's WAL off.
func TestConformanceReplayable(t *testing.T) {
	enginetest.Run(t, func(t *testing.T, opts engines.Options) engines.Engine {
		skipUnderRace(t)
		opts.Dir, opts.Replayable = t.TempDir(), true
		e, err := engines.Open(engines.KindOrdered, opts)
		if err != nil {
			t.Fatal(err)
		}
		return e
	})
}
