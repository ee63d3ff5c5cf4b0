//go:build race

package coproc_test

const raceEnabled = true
