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
// GOMAXPROCS.
func serverProcs() {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	if runtime.GOMAXPROCS(0) < minServerProcs {
		runtime.GOMAXPROCS(minServerProcs)
	}
}
