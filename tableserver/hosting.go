package tableserver

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/coproc"
	"github.com/tabuladb/tabula/engines"
)

// replica is one partition this server hosts: as primary, or (tables
// replicated through a commit log) as secondary. It is immutable once
// published; a map change makes a new one sharing the engine and log.
type replica struct {
	table  *api.Table
	part   *api.Partition
	engine engines.Engine
	// log is the partition's replication (nil for tables without a commit
	// log: bulk); writes go through it and reads check its role.
	log *logReplica
	// writer and batch are the engine's capabilities, nil when absent.
	writer engines.Writer
	batch  engines.BatchGetter
	// bulk is the engine of a bulk partition (nil otherwise);
	// bulkRetained the versions this copy holds by the map (what it
	// loads, fetches and serves), bulkServes the one it serves, and
	// bulkPublished every version the map lists for its table (what an
	// upload may name).
	bulk          *bulkPart
	bulkRetained  []uint64
	bulkServes    uint64
	bulkPublished []uint64
	// cpart is the partition as coprocessors see it.
	cpart coproc.Partition
	// logger logs for the partition (the server's, with its id).
	logger *slog.Logger
	// load counts the engine time this replica used here (partload.go);
	// copies of the struct share it.
	load *partLoad
	// order orders writes: plain writes hold it shared (the engine orders
	// them among themselves); a coprocessor's commit holds it exclusively,
	// so its read check and its batch are atomic against every writer.
	order *sync.RWMutex
}

// hosting is an immutable snapshot of what the server hosts and what it
// knows of the cluster map, swapped atomically on every map change.
type hosting struct {
	version uint64
	// replicas are the partitions hosted here, by partition id.
	replicas map[uint64]*replica
	// failed are partitions assigned here whose engine did not open, and
	// failedTables their tables' keys: every map change retries them.
	failed       map[uint64]error
	failedTables map[string]bool
	// tables maps "tenant/table" to its map, to route keys sent to the
	// wrong partition.
	tables map[string]*api.PartitionMap

	// parts is every partition in the cluster, for NOT_OWNER answers: see
	// part. Set when the hosting is made, or by partsOnce on first use.
	partsOnce sync.Once
	parts     map[uint64]*api.Partition
}

// part returns partition id of the cluster map (nil if none). The index
// is built on the first call for a map version (O(cluster)), not on every
// map change: most versions never answer a NOT_OWNER with it.
func (h *hosting) part(id uint64) *api.Partition {
	h.partsOnce.Do(func() {
		if h.parts != nil {
			return
		}
		n := 0
		for _, m := range h.tables {
			n += len(m.GetPartitions())
		}
		parts := make(map[uint64]*api.Partition, n)
		for _, m := range h.tables {
			for _, p := range m.GetPartitions() {
				parts[p.GetId()] = p
			}
		}
		h.parts = parts
	})
	return h.parts[id]
}

func tableKey(tenant, table string) string { return tenant + "/" + table }

func primaryOf(p *api.Partition) *api.Replica {
	for _, r := range p.GetReplicas() {
		if r.GetRole() == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
			return r
		}
	}
	return nil
}

// reconcile builds the hosting for a new cluster map (a full one, or a
// delta from old's version: api.ErrMapGap if it does not apply), reusing the engines of partitions still
// hosted, opening new ones, and returning the replicas to close (no longer
// hosted) once the new hosting is published. A delta touches only the
// tables it names (and those with partitions that failed to open): its
// work is proportional to the change, not to the cluster. Only the watch
// goroutine calls it.
func (s *Server) reconcile(old *hosting, resp *api.WatchPartitionMapResponse) (*hosting, []*replica, error) {
	h := &hosting{
		version:      resp.GetVersion(),
		replicas:     make(map[uint64]*replica, len(old.replicas)),
		failed:       make(map[uint64]error),
		failedTables: make(map[string]bool),
	}
	id := s.id()
	if !resp.GetDelta() {
		h.tables = make(map[string]*api.PartitionMap, len(resp.GetMaps()))
		for _, m := range resp.GetMaps() {
			t := m.GetTable()
			h.tables[tableKey(t.GetTenant(), t.GetName())] = m
			s.hostTable(old, h, id, m)
		}
	} else {
		if resp.GetFromVersion() != old.version {
			return nil, nil, fmt.Errorf("%w: delta from %d to %d, held %d", api.ErrMapGap, resp.GetFromVersion(), resp.GetVersion(), old.version)
		}
		h.tables = maps.Clone(old.tables)
		if h.tables == nil {
			h.tables = map[string]*api.PartitionMap{}
		}
		touched := maps.Clone(old.failedTables)
		if touched == nil {
			touched = map[string]bool{}
		}
		for _, t := range resp.GetRemoved() {
			k := tableKey(t.GetTenant(), t.GetName())
			if cur := h.tables[k]; cur != nil && cur.GetTable().GetId() == t.GetId() {
				delete(h.tables, k)
				touched[k] = true
			}
		}
		for _, m := range resp.GetMaps() {
			k := tableKey(m.GetTable().GetTenant(), m.GetTable().GetName())
			h.tables[k] = m
			touched[k] = true
		}
		for _, pm := range resp.GetPatches() {
			k := tableKey(pm.GetTable().GetTenant(), pm.GetTable().GetName())
			m, err := api.PatchMap(h.tables[k], pm)
			if err != nil {
				return nil, nil, err
			}
			h.tables[k] = m
			touched[k] = true
		}
		for pid, r := range old.replicas {
			if !touched[tableKey(r.table.GetTenant(), r.table.GetName())] {
				h.replicas[pid] = r
			}
		}
		for _, k := range slices.Sorted(maps.Keys(touched)) {
			if m := h.tables[k]; m != nil {
				s.hostTable(old, h, id, m)
			}
		}
	}
	var gone []*replica
	for pid, r := range old.replicas {
		if h.replicas[pid] == nil {
			gone = append(gone, r)
		}
	}
	return h, gone, nil
}

// hostTable puts the partitions of table map m that server id hosts into
// h, reusing old's replicas.
func (s *Server) hostTable(old, h *hosting, id string, m *api.PartitionMap) {
	t := m.GetTable()
	for _, p := range m.GetPartitions() {
		if !hostedHere(p, id) {
			continue
		}
		if prev := old.replicas[p.GetId()]; prev != nil && prev.table.GetId() == t.GetId() {
			if prev.log != nil {
				prev.log.update(p, id)
				prev.log.setMerge(p.GetMerge(), mergeAligned(m, p))
			}
			if durable(t) && prev.log == nil && prev.part.GetEpoch() != p.GetEpoch() {
				// Still ours at a new epoch: record it, so a restart
				// reopens this data rather than moving it aside. The
				// engine is open on the directory: recording an epoch
				// must never move it.
				if err := s.recordEpoch(p.GetId(), p.GetEpoch()); err != nil {
					s.log.Error("record new partition epoch", "partition", p.GetId(), "err", err)
				}
			}
			r := *prev
			r.part, r.table = p, t
			if r.bulk != nil {
				r.setBulkView(m, p, id)
			}
			h.replicas[p.GetId()] = &r
			continue
		}
		var kid engines.Engine
		if par := old.replicas[p.GetSplitFrom()]; p.GetSplitFrom() != 0 && par != nil && par.log != nil {
			// A split's child: the parent's replica here stops, and hands
			// over the child's engine (memory) or left it in the child's
			// directory (split.go).
			kid, _ = par.log.takeChild(p.GetId())
		}
		if par := old.replicas[p.GetMergeLeft()]; p.GetMergeLeft() != 0 && par != nil && par.log != nil {
			// A merge's child: the left parent's replica here stops and
			// hands over the merged engine (merge.go).
			kid = par.log.takeMerged()
		}
		r, err := s.openReplica(t, p, kid)
		if err != nil {
			s.log.Error("open partition failed", "table", tableKey(t.GetTenant(), t.GetName()), "partition", p.GetId(), "err", err)
			h.failed[p.GetId()] = err
			h.failedTables[tableKey(t.GetTenant(), t.GetName())] = true
			continue
		}
		if r.bulk != nil {
			r.setBulkView(m, p, id)
		}
		if r.log != nil {
			r.log.setMerge(p.GetMerge(), mergeAligned(m, p))
		}
		s.log.Info("serving partition", "table", tableKey(t.GetTenant(), t.GetName()), "partition", p.GetId(), "index", p.GetIndex(), "epoch", p.GetEpoch())
		h.replicas[p.GetId()] = r
	}
}

// hostedHere reports whether server id hosts p: as any of its replicas
// (a partition replicated through a commit log, or a serving copy of a
// bulk partition: every copy loads the versions and answers reads).
func hostedHere(p *api.Partition, id string) bool {
	for _, r := range p.GetReplicas() {
		if r.GetServerId() == id {
			return true
		}
	}
	return false
}

// roleOf is server id's role in p.
func roleOf(p *api.Partition, id string) api.ReplicaRole {
	for _, r := range p.GetReplicas() {
		if r.GetServerId() == id {
			return r.GetRole()
		}
	}
	return api.ReplicaRole_REPLICA_ROLE_UNSPECIFIED
}

// durable reports whether t's partitions keep files on this server.
func durable(t *api.Table) bool {
	st := t.GetOptions().GetStorage()
	return st != "" && st != "memory"
}

// bulkRetained lists the versions a bulk table's map retains.
func bulkRetained(m *api.PartitionMap) []uint64 {
	vs := m.GetBulk().GetVersions()
	out := make([]uint64, len(vs))
	for i, v := range vs {
		out[i] = v.GetVersion()
	}
	return out
}

// setBulkView makes bulk replica r (partition p of map m, on server id)
// hold the versions the map gives its copy and serve the one it names.
// Only the watch goroutine calls it, on a replica not yet published.
func (r *replica) setBulkView(m *api.PartitionMap, p *api.Partition, id string) {
	r.bulkPublished = bulkRetained(m)
	r.bulkRetained, r.bulkServes = r.bulkPublished, m.GetBulk().GetCurrent()
	for _, c := range p.GetReplicas() {
		if c.GetServerId() == id && (len(c.GetBulkHolds()) > 0 || c.GetBulkServes() != 0 || m.GetBulk().GetRollout() != nil) {
			// A master with copies of their own: what this copy holds.
			r.bulkRetained, r.bulkServes = slices.Clone(c.GetBulkHolds()), c.GetBulkServes()
		}
	}
	r.bulk.sync(r.bulkRetained, r.bulkServes)
}

// openReplica opens partition p of table t here. kid, if not nil, is the
// engine a split made for p (split.go), used instead of opening one.
func (s *Server) openReplica(t *api.Table, p *api.Partition, kid engines.Engine) (*replica, error) {
	kind := engines.Kind(api.KindName(t.GetKind()))
	var dir string
	switch {
	case durable(t) && p.GetLog() != nil:
		// The data is a prefix of the partition's log whatever the
		// epoch: the replica continues from its applied LSN.
		var err error
		if p.GetSplitFrom() != 0 {
			if err := s.prepareChild(p); err != nil {
				return nil, err
			}
		}
		if p.GetMergeLeft() != 0 {
			if err := s.prepareMergeChild(p); err != nil {
				return nil, err
			}
		}
		if dir, err = s.prepareLogPartitionDir(p.GetId()); err != nil {
			return nil, err
		}
		left, right, done, err := engines.SplitDone(s.opts.EngineFS, dir)
		if err != nil {
			return nil, fmt.Errorf("partition %d: read its split marker: %w", p.GetId(), err)
		}
		if done {
			// Its files are the children's now (hard links): opening it
			// could write into them. The split finished here before a
			// restart: report it from the children (split.go).
			if kid, err = s.openSplitParent(t, p, left, right); err != nil {
				return nil, err
			}
		}
		merged, err := s.mergedHere(p)
		if err != nil {
			return nil, err
		}
		if merged {
			// Likewise for the left parent of a merge that finished here
			// (merge.go).
			if kid, err = s.openMergeParent(t, p); err != nil {
				return nil, err
			}
		}
	case durable(t):
		var err error
		if dir, err = s.preparePartitionDir(p.GetId(), p.GetEpoch()); err != nil {
			return nil, err
		}
	}
	info := coproc.PartitionInfo{ID: p.GetId(), Epoch: p.GetEpoch(), Index: int(p.GetIndex()), Count: int(t.GetOptions().GetPartitions()),
		HashStart: p.GetStart(), HashEnd: p.GetEnd(), Primary: true}
	if t.GetKind() == api.TableKind_TABLE_KIND_BULK {
		b, err := s.openBulkPart(t, p, dir)
		if err != nil {
			return nil, err
		}
		order := new(sync.RWMutex)
		return &replica{table: t, part: p, engine: b.Engine, batch: b.Engine, bulk: b, cpart: coproc.PartitionFromEngine(b.Engine, info, order), order: order,
			logger: s.log.With("partition", p.GetId()), load: newPartLoad(t)}, nil
	}
	e, err := kid, error(nil)
	_, mgone := kid.(*mergeGone)
	if _, gone := kid.(*splitGone); !gone && !mgone && kid != nil && p.GetLog() != nil && durable(t) {
		opts := s.engineOptions(t, p.GetId(), dir, true)
		e = newReopenable(kid, func() (engines.Engine, error) { return engines.Open(kind, opts) })
	}
	if e == nil {
		e, err = openEngine(p.GetLog() != nil && durable(t), kind, s.engineOptions(t, p.GetId(), dir, p.GetLog() != nil))
	}
	if err != nil {
		return nil, fmt.Errorf("open %s engine for partition %d: %w", kind, p.GetId(), err)
	}
	order := new(sync.RWMutex)
	r := &replica{table: t, part: p, engine: e, cpart: coproc.PartitionFromEngine(e, info, order), order: order,
		logger: s.log.With("partition", p.GetId()), load: newPartLoad(t)}
	r.writer, _ = e.(engines.Writer)
	r.batch, _ = e.(engines.BatchGetter)
	if lg := p.GetLog(); lg != nil {
		l, err := newLogReplica(s, t, p.GetId(), lg.GetStream(), e)
		if err != nil {
			return nil, errors.Join(err, e.Close())
		}
		l.update(p, s.id())
		l.load = r.load
		r.log = l
		info.Primary = roleOf(p, s.id()) == api.ReplicaRole_REPLICA_ROLE_PRIMARY
		r.cpart = &logCoprocPartition{EnginePartition: coproc.PartitionFromEngine(e, info, order), l: l}
	}
	return r, nil
}

// engineOptions are the options of partition pid's engine in dir.
func (s *Server) engineOptions(t *api.Table, pid uint64, dir string, logged bool) engines.Options {
	return engines.Options{
		// The commit log is the durable record (a write is acknowledged
		// once a quorum of its replicas fsynced it): the engine flushes
		// in the background, and after a crash the log is replayed from
		// the LSN its files reached.
		Replayable:  logged && !s.opts.EngineSyncWrites,
		Dir:         dir,
		FS:          s.opts.EngineFS,
		Storage:     t.GetOptions().GetStorage(),
		Durability:  t.GetOptions().GetDurability(),
		Compression: t.GetOptions().GetCompression(),
		Logger:      s.log.With("partition", pid),
		CacheBudget: s.cacheBudget,
		Now:         s.nowMs,
	}
}

// status reports every hosted replica for a heartbeat.
func (h *hosting) status(serverID string) []*api.ReplicaStatus {
	out := make([]*api.ReplicaStatus, 0, len(h.replicas))
	now := time.Now()
	for pid, r := range h.replicas {
		st := r.engine.Stats()
		role := api.ReplicaRole_REPLICA_ROLE_PRIMARY
		var applied, commit, copied, total, flushed, keep uint64
		var state api.ReplicaState
		if r.log != nil {
			role = roleOf(r.part, serverID)
			applied, commit = r.log.positions()
			state, copied, total = r.log.progress()
			flushed, keep = r.log.truncation()
		}
		out = append(out, &api.ReplicaStatus{
			FlushedLsn:     flushed,
			KeepFromExtent: keep,
			State:          state,
			CopiedBytes:    copied,
			CopyTotalBytes: total,
			AppliedLsn:     applied,
			CommitLsn:      commit,
			PartitionId:    pid,
			Epoch:          r.part.GetEpoch(),
			Role:           role,
			Keys:           st.Keys - min(st.ReservedKeys, st.Keys), // the keys clients wrote
			Bytes:          st.Bytes,
			IndexBytes:     st.IndexBytes,
			ServerId:       serverID,
			Reads:          st.Reads,
			Writes:         st.Writes,
			LiveBytes:      st.LiveBytes,
			GarbageBytes:   st.GarbageBytes,
			Segments:       st.Segments,
			CacheHits:      st.CacheHits,
			CacheMisses:    st.CacheMisses,
			BusyNs:         r.load.busy(),
		})
		if r.bulk != nil {
			out[len(out)-1].BulkLoaded = r.bulk.loaded()
		}
		if r.log != nil {
			// The replica's own lag, and on a primary who is in its
			// log's ack set (instep.go): the master combines them.
			out[len(out)-1].LagMs = r.log.lagMs(now)
			out[len(out)-1].AckSet = r.log.ackSet()
			out[len(out)-1].SplitLsn = r.log.splitLSN()
			if role == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
				out[len(out)-1].LoadSplit, out[len(out)-1].SizeSplit = r.splitHints(now)
			}
			out[len(out)-1].MergeLsn = r.log.mergeLSN()
		}
	}
	return out
}
