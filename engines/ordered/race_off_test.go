//go:build !race

package ordered

const raceEnabled = false
