package tableserver

import (
	"errors"
	"fmt"
	"time"

	"github.com/tabuladb/tabula/replication/partition"
)

// The commit log is truncated from its front: each replica reports the
// applied LSN its engine has made durable (flushed) and the log extent
// holding the record after it, the first it would read after a crash; the
// master deletes the extents before the earliest of those over the
// partition's replicas. A replica that finds the log starting past its
// applied LSN (it fell behind while the master trimmed without it, or
// restarted empty) copies a snapshot instead (copy.go).

// errLogTruncated: the log no longer holds the records after this
// replica's applied LSN.
var errLogTruncated = errors.New("the commit log was truncated past this replica's applied LSN")

// syncer is the capability of engines that can make their writes durable
// on demand (the point engine's disk store).
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

// flush makes the engine durable and records the applied LSN it covers.
// Engines that cannot (memory) leave flushed at 0: their log is kept.
func (l *logReplica) flush() error {
	sy, ok := l.engine.(syncer)
	if !ok || !l.durable {
		return nil
	}
	l.mu.Lock()
	applied := l.core.Applied()
	copying := l.needCopy
	reopening := l.reopening != nil
	inc := l.incarnation
	l.mu.Unlock()
	if copying || reopening || applied == 0 {
		return nil
	}
	if err := sy.Sync(); err != nil {
		return err
	}
	l.mu.Lock()
	if l.incarnation == inc {
		// Not if the engine was reopened meanwhile: the Sync covered the
		// new engine, which may hold less than applied.
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
