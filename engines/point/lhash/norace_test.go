//go:build !race

package lhash

const raceEnabled = false
