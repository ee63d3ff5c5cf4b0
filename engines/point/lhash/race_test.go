//go:build race

package lhash

// raceEnabled shrinks the big tests: the race detector slows atomics ~10x.
const raceEnabled = true
