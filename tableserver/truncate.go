package tableserver

import (
	"errors"
	"fmt"
	"time"

	"github.com/tabuladb/tabula/replication/partition"
)

// The commit log is truncated from its front: each replica reports the
// applied LSN it holds whatever happens to this server short of losing
// the replica (flushed) and the log extent holding the record after it,
// the first it would read after a crash; the master deletes the extents
// before the earliest of those over the partition's replicas. A replica
// that finds the log starting past its applied LSN (it fell behind while
// the master trimmed without it, or restarted empty) copies a snapshot
// instead (copy.go).
//
// What "holds" means depends on the engine:
//
//   - An engine that keeps files holds what its last Sync made durable:
//     flushed is the applied LSN read before a Sync that returned
//     without error. An engine that cannot sync on demand never reports
//     anything flushed (errNoSync), so its log is kept whole: reporting
//     an LSN that sits only in a memtable let the master trim writes a
//     crash then lost (the ordered engine before it had a Sync).
//   - A memory engine holds its applied LSN while it lives, and nothing
//     after a crash, when it copies a snapshot from a live replica (which
//     needs the log only from the source's applied LSN on). So it reports
//     its applied LSN: the log is trimmed below the least a live replica
//     applied, every trimmed record is in every replica, and the log stays
//     bounded under load. Losing every replica at once loses the table, as
//     "memory" says; the log is no longer its durable copy.

// errLogTruncated: the log no longer holds the records after this
// replica's applied LSN.
var errLogTruncated = errors.New("the commit log was truncated past this replica's applied LSN")

// errNoSync: the engine keeps files but cannot make its writes durable on
// demand, so no applied LSN can be reported durable.
var errNoSync = errors.New("the engine cannot make its writes durable on demand")

// syncer is the capability of engines that can make their writes durable
// on demand (the point engine's disk store, the ordered engine). Sync
// returns nil only once every write that returned before it is durable.
type syncer interface{ Sync() error }

// extentStart is where one extent of the log starts: its first record.
type extentStart struct {
	extent uint64
	first  uint64
}

// noteExtentLocked records that extent's first record is first, read (or
// appended) from the extent's start. The first extent noted since the
// replica started must continue from its applied LSN: a later one means
// the log was trimmed past it.
func (l *logReplica) noteExtentLocked(extent, first uint64) error {
	if n := len(l.starts); n > 0 && l.starts[n-1].extent == extent {
		return nil
	}
	if len(l.starts) == 0 && first > l.core.Applied()+1 {
		return fmt.Errorf("extent %d starts at LSN %d, the replica applied %d: %w", extent, first, l.core.Applied(), errLogTruncated)
	}
	l.starts = append(l.starts, extentStart{extent, first})
	return nil
}

// noteRead notes the start of an extent read from offset 0.
func (l *logReplica) noteRead(extent uint64, from int64, recs []partition.Record) error {
	if from != 0 || len(recs) == 0 {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.noteExtentLocked(extent, recs[0].LSN)
}

// keepFrom is the extent holding the record after the flushed LSN: the
// last noted start at or before it. 0: not known (nothing flushed, or the
// extent's start never read).
func (l *logReplica) keepFromLocked() uint64 {
	if l.flushed == 0 {
		return 0
	}
	var keep uint64
	k := 0
	for i, st := range l.starts {
		if st.first > l.flushed+1 {
			break
		}
		keep, k = st.extent, i
	}
	// Starts before the kept one are of no more use.
	l.starts = l.starts[k:]
	return keep
}

// flush records the applied LSN the replica holds (see above): for an
// engine with files, after a Sync that covers it; for a memory engine, its
// applied LSN. An engine with files that cannot sync is an error, and
// leaves flushed where it was.
func (l *logReplica) flush() error {
	l.mu.Lock()
	applied := l.core.Applied()
	copying := l.needCopy
	reopening := l.reopening != nil
	inc := l.incarnation
	split := l.split.lsn != 0 || l.merge.applied != 0 // the engine is closed (or merging): the children flush
	l.mu.Unlock()
	if copying || reopening || split || applied == 0 {
		return nil
	}
	if l.durable {
		sy, ok := l.engine.(syncer)
		if !ok {
			return fmt.Errorf("report a flushed LSN: engine %T: %w", l.engine, errNoSync)
		}
		// applied was read first: every record up to it is in the
		// engine, so the Sync covers it.
		if err := sy.Sync(); err != nil {
			return fmt.Errorf("sync the engine at applied LSN %d: %w", applied, err)
		}
	}
	l.mu.Lock()
	if l.incarnation == inc && !l.needCopy {
		// Not if the engine was reopened meanwhile (the Sync covered the
		// new engine, which may hold less than applied), nor while it
		// copies (its engine is being replaced).
		l.flushed = max(l.flushed, applied)
	}
	l.mu.Unlock()
	return nil
}

// truncation is the replica's report for the master's log truncation.
func (l *logReplica) truncation() (flushed, keepFrom uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.flushed, l.keepFromLocked()
}

// flushLoop flushes every replicated partition's engine every
// Options.LogFlushInterval.
func (s *Server) flushLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.LogFlushInterval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		for pid, r := range s.hosting.Load().replicas {
			if r.log == nil {
				continue
			}
			if err := r.log.flush(); err != nil {
				s.log.Warn("flush a replica's engine", "partition", pid, "err", err)
			}
		}
	}
}
