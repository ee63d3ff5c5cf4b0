package main

import (
	"os"
	"runtime"
)

// minServerProcs is the fewest Go processors a process hosting table
// servers runs with. A table server blocks threads in fsync all the time
// (commit logs, the journal): on a 2-core machine a processor held by a
// thread in fsync sits idle until the runtime hands it off, and replicated
// appends measured 4,600/s with 2 processors and 6,100/s with 4 (see
// RATIONALE.md, Partition replication).
const minServerProcs = 4

// serverProcs raises GOMAXPROCS to minServerProcs unless the operator set
// GOMAXPROCS or the process runs under a CPU quota (see serverProcsFor).
func serverProcs() {
	n := serverProcsFor(os.Getenv("GOMAXPROCS") != "", runtime.GOMAXPROCS(0), runtime.NumCPU())
	if n != runtime.GOMAXPROCS(0) {
		runtime.GOMAXPROCS(n)
	}
}

// serverProcsFor is the GOMAXPROCS a server process runs with, given
// whether the operator set GOMAXPROCS, the runtime's value and the
// machine's cores. The runtime's value below the cores means a cgroup CPU
// limit (Go sizes GOMAXPROCS to it): servers sharing a machine under
// quotas, where more processors than the quota only spin in the scheduler
// (five servers on two cores spent a quarter of their CPU there at 4
// each; see RATIONALE.md), so it stays.
func serverProcsFor(envSet bool, cur, cores int) int {
	if envSet || cur < cores || cur >= minServerProcs {
		return cur
	}
	return minServerProcs
}
