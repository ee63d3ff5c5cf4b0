// Package enginetest is the conformance suite every storage engine passes:
// the behaviour engines.Engine and engines.Writer promise, checked the same
// way for every kind.
//
// An engine's test calls Run with a function that opens a fresh, empty
// engine:
//
//	func TestConformance(t *testing.T) {
//		enginetest.Run(t, func(t *testing.T, opts engines.Options) engines.Engine {
//			e, err := point.Open(opts)
//			if err != nil {
//				t.Fatal(err)
//			}
//			return e
//		})
//	}
//
// The suite passes its own Options.Now (a fake clock it advances to test
// TTLs); the open function must keep it. Engines that are not
// engines.Writer get the read-only subset. The suite closes every engine it
// opens.
//
// A read-only engine (bulk) is filled through its own loading API:
// RunReadOnly takes a LoadFunc that installs a snapshot of records as all
// the engine serves, and runs the read checks over loaded data, reloads,
// reads racing loads, and a seeded model of successive snapshots:
//
//	enginetest.RunReadOnly(t, open, func(e engines.Engine, recs []engines.Record) error {
//		// build a version from recs, load it, make it current
//	})
//
// Randomised subtests log "seed N"; rerun one with TABULA_SEED=N. Run the
// suite under -race: its concurrent subtests exist for the race detector as
// much as for their own checks.
//
// This package imports "testing" and is meant to be linked only into tests.
package enginetest
