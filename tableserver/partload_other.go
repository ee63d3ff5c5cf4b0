//go:build !linux

package tableserver

// diskSpace is not measured here (0: not known to the master).
func diskSpace(string) (total, free uint64) { return 0, 0 }

// processCPU is not measured here.
func processCPU() uint64 { return 0 }
