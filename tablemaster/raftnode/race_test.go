//go:build race

package raftnode

// raceEnabled: the race detector slows the single-threaded simulation
// about tenfold, so it runs fewer scenarios by default.
const raceEnabled = true
