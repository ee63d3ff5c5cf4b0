// Command bench runs Tabula's benchmark suites against peer libraries, side
// by side in one process, and prints ratios. It is its own module so the
// peers never enter the product's go.mod.
//
//	go run . <suite>
//
// Each suite is one file that registers itself from init.
package main
