package tableserver

import (
	"runtime"
	"sync/atomic"
	"time"

	"github.com/tabuladb/tabula/api"
)

// partLoad is what one hosted replica has cost this server, for the
// master's load-aware placement (ReplicaStatus.busy_ns). The replica
// struct is copied on every map change (hostTable), so it holds a
// pointer to one partLoad for the replica's life here. Safe for
// concurrent use.
//
// Busy time is wall time inside the engine: reads (Get, BatchGet, bulk
// gets) and writes applied (the log's apply path, unlogged writes). Not
// thread CPU time: reading it (clock_gettime of the thread's CPU clock) is
// a system call per read, where the monotonic clock read twice here is
// the vDSO's; engine calls rarely block. Measured on the 2-core dev VM:
// 197 ns per timed call (two clock reads and an atomic add), ~2% of a
// Get's ~10 µs through gRPC; sampling one call in N is the next step if
// that shows. Scans are not timed: their wall time is mostly the client
// taking the stream.
type partLoad struct {
	busyNS atomic.Uint64
}

// since adds the time from start to now; a nil partLoad (a replica built
// by a test) counts nothing.
func (p *partLoad) since(start time.Time) {
	if p != nil {
		p.busyNS.Add(uint64(time.Since(start)))
	}
}

func (p *partLoad) busy() uint64 {
	if p == nil {
		return 0
	}
	return p.busyNS.Load()
}

// capacity is what this server has to give (HeartbeatRequest.capacity):
// the data directory's file system, the machine's memory, the bulk
// capacity, the cores and the process's CPU time so far.
func (s *Server) capacity() *api.ServerCapacity {
	c := &api.ServerCapacity{
		MemoryBytes:       memTotal(),
		BulkCapacityBytes: s.bulkCapacity(),
		Cpus:              uint32(runtime.GOMAXPROCS(0)),
		ProcessCpuNs:      processCPU(),
	}
	c.DiskBytes, c.DiskFreeBytes = diskSpace(s.opts.DataDir)
	return c
}
