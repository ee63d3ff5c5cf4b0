//go:build !race

package tablemaster

const esimRace = false
