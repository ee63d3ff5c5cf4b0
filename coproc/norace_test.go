//go:build !race

package coproc_test

const raceEnabled = false
