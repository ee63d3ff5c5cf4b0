//go:build race

package tablemaster

// esimRace: the race detector slows the single-threaded elastic
// simulation about tenfold, so it runs fewer scenarios by default.
const esimRace = true
