package ordered

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/enginetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	enginetest.Run(t, func(t *testing.T, opts engines.Options) engines.Engine {
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
		opts.Dir, opts.Replayable = t.TempDir(), true
		e, err := engines.Open(engines.KindOrdered, opts)
		if err != nil {
			t.Fatal(err)
		}
		return e
	})
}
