package tableserver

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// sweep deletes what this server keeps on disk that the cluster no longer
// needs, once it has applied a map at least as new as the one the master
// had when it registered (so the map is current, not one from before the
// server was away):
//
//   - partitions/<id> of a partition not hosted here: its table was dropped
//     (the partition is in no table), or it is replicated through a commit
//     log and has other replicas (they, and the log, hold its data). A
//     single-copy durable partition's directory is moved to orphaned/
//     instead (its data may be the only copy left of something);
//   - orphaned/<id>-... of a partition whose table was dropped, or of a
//     replicated partition: their data is elsewhere. Those of single-copy
//     partitions stay, for an operator.
//
// It runs once per process, after the first current map.
func (s *Server) sweep(h *hosting) {
	if h.version < s.lease.MinMapVersion() || !s.swept.CompareAndSwap(false, true) {
		return
	}
	ents, err := os.ReadDir(filepath.Join(s.opts.DataDir, partitionsDir))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Warn("sweep: list partitions", "err", err)
	}
	// The children of pending splits and merges are not in the map yet,
	// but their directories may hold the split's or merge's output.
	coming := map[uint64]bool{}
	for _, m := range h.tables {
		for _, p := range m.GetPartitions() {
			if sp := p.GetSplit(); sp != nil {
				coming[sp.GetLeftId()], coming[sp.GetRightId()] = true, true
			}
			if mg := p.GetMerge(); mg != nil {
				coming[mg.GetChildId()] = true
			}
		}
	}
	for _, e := range ents {
		id, err := strconv.ParseUint(e.Name(), 10, 64)
		if err != nil || !e.IsDir() || h.replicas[id] != nil || h.failed[id] != nil || coming[id] {
			continue
		}
		p := h.part(id)
		switch {
		case p == nil:
			s.log.Info("sweep: deleting the data of a partition of a dropped table", "partition", id)
			err = s.removePartitionDir(id)
		case p.GetLog() != nil && len(p.GetReplicas()) > 0:
			s.log.Info("sweep: deleting a replica that moved to other servers while this one was away", "partition", id)
			err = s.removePartitionDir(id)
		default:
			err = s.orphan(id, 0, "the partition is hosted by another server")
		}
		if err != nil {
			s.log.Warn("sweep", "partition", id, "err", err)
		}
	}
	orphans, err := os.ReadDir(filepath.Join(s.opts.DataDir, orphanedDir))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Warn("sweep: list orphaned", "err", err)
	}
	for _, e := range orphans {
		first, _, _ := strings.Cut(e.Name(), "-")
		id, err := strconv.ParseUint(first, 10, 64)
		if err != nil {
			continue
		}
		if p := h.part(id); p != nil && p.GetLog() == nil {
			continue // a single copy's data: an operator's to delete
		}
		s.log.Info("sweep: deleting moved-aside data the cluster no longer needs", "dir", e.Name())
		if err := os.RemoveAll(filepath.Join(s.opts.DataDir, orphanedDir, e.Name())); err != nil {
			s.log.Warn("sweep", "dir", e.Name(), "err", err)
		}
	}
}
