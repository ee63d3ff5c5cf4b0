//go:build race

package ordered

// raceEnabled: the race detector is on, which also builds pebble with its
// invariant checks (internal/invariants: "invariants || race"), ~25x
// slower per operation; the heaviest tests shrink under it.
const raceEnabled = true
