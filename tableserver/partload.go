package tableserver

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/engines"
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
	// keys samples the requests' keys for a split point by load
	// (splitsample.go).
	keys     splitSampler
	sampling bool
	// size caches an ordered engine's size median (splitHints).
	sizeMu   sync.Mutex
	sizeAt   time.Time
	sizeHint *api.SplitHint
}

// newPartLoad is the load record of a replica of t.
func newPartLoad(t *api.Table) *partLoad {
	p := new(partLoad)
	p.keys.ordered = t.GetKind() == api.TableKind_TABLE_KIND_ORDERED
	p.sampling = t.GetKind() != api.TableKind_TABLE_KIND_BULK // bulk tables do not split
	return p
}

// sample counts a request on key (hash: its routing hash, point tables).
func (p *partLoad) sample(hash uint64, key []byte) {
	if p != nil && p.sampling {
		p.keys.observe(hash, key, time.Now)
	}
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

// sizeHintEvery bounds how often a replica's size median is estimated
// (~0.2 ms for 100 sstables, engines/ordered BenchmarkSizeMedian): on
// heartbeats, never on a request.
const sizeHintEvery = 10 * time.Second

// splitHints are the split points a primary of a point or ordered table
// reports (ReplicaStatus.load_split, size_split): nil where it has none.
func (r *replica) splitHints(now time.Time) (load, size *api.SplitHint) {
	if r.load == nil || r.log == nil || r.bulk != nil {
		return nil, nil
	}
	if h, ok := r.load.keys.hint(r.part.GetStart(), r.part.GetKeyStart(), now); ok {
		load = &api.SplitHint{Hash: h.hash, Key: h.key, Samples: uint32(h.samples), LeftShare: h.left}
	}
	sm, ok := r.engine.(engines.SizeMedianer)
	if !ok || r.table.GetKind() != api.TableKind_TABLE_KIND_ORDERED {
		return load, nil
	}
	p := r.load
	p.sizeMu.Lock()
	defer p.sizeMu.Unlock()
	if p.sizeAt.IsZero() || now.Sub(p.sizeAt) >= sizeHintEvery {
		p.sizeAt, p.sizeHint = now, nil
		lo := r.part.GetKeyStart()
		if lo == nil {
			lo = []byte{}
		}
		var hi []byte
		if len(r.part.GetKeyEnd()) > 0 {
			hi = r.part.GetKeyEnd()
		}
		if k, share, files, err := sm.SizeMedian(lo, hi); err == nil && k != nil {
			p.sizeHint = &api.SplitHint{Key: k, Samples: uint32(files), LeftShare: share}
		}
	}
	return load, p.sizeHint
}
