package tablemaster

import (
	"context"
	"errors"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/tablemaster/balance"
	"github.com/tabuladb/tabula/tablemaster/splitpolicy"
)

// Automatic splits. The leader decides, every Options.AutoSplitInterval
// (1 s: the sustain window is 10 s, and a round walks the map), which
// partitions of point and ordered tables to split (splitpolicy.Decide, a
// pure function of the map, the load view and the split hints the
// primaries report with their heartbeats), and starts each split through
// OpSplitPartition exactly as `tabula partition split` does (split.go),
// with the reason recorded: the children keep it and the time their
// split finished (Partition.SplitReason, SplitUnixMs), for the cooldown
// and for merges. The sustain window's memory (since when a partition's
// load has been over) is the leader's only: a new leader starts it again,
// at worst splitting one window later. On by default; off with
// Options.DisableAutoSplit (`tabula master --auto-split=false`).

// OpAlterTable replaces a table's split settings. Never change or reuse
// the string.
const OpAlterTable Op = "alter_table"

// EventAutoSplit: the leader started a split by itself.
const EventAutoSplit EventKind = "auto_split"

// SplitSettings are a table's automatic split settings (0: the
// cluster's; see TableOptions).
type SplitSettings struct {
	MinPartitions  uint32 `json:"min_partitions,omitempty"`
	MaxPartitions  uint32 `json:"max_partitions,omitempty"`
	SplitSizeBytes uint64 `json:"split_size_bytes,omitempty"`
	SplitQPS       uint64 `json:"split_qps,omitempty"`
}

func (o *TableOptions) splitSettings() SplitSettings {
	return SplitSettings{MinPartitions: o.MinPartitions, MaxPartitions: o.MaxPartitions, SplitSizeBytes: o.SplitSizeBytes, SplitQPS: o.SplitQPS}
}

func (o *TableOptions) setSplitSettings(s SplitSettings) {
	o.MinPartitions, o.MaxPartitions, o.SplitSizeBytes, o.SplitQPS = s.MinPartitions, s.MaxPartitions, s.SplitSizeBytes, s.SplitQPS
}

// checkSplitSettings refuses settings that cannot hold for a table of
// kind.
func checkSplitSettings(kind api.TableKind, s SplitSettings) error {
	switch {
	case s == SplitSettings{}:
		return nil
	case kind == api.TableKind_TABLE_KIND_BULK:
		return errInvalid("options", "bulk_table", 0, "bulk tables do not split or merge: min/max partitions and split thresholds do not apply (a bulk table's partitions are its published files)")
	case s.MaxPartitions > api.MaxPartitions:
		return errInvalid("options.max_partitions", "too_many_partitions", api.MaxPartitions, "options.max_partitions is %d; the limit is %d", s.MaxPartitions, api.MaxPartitions)
	case s.MinPartitions > api.MaxPartitions:
		return errInvalid("options.min_partitions", "too_many_partitions", api.MaxPartitions, "options.min_partitions is %d; the limit is %d", s.MinPartitions, api.MaxPartitions)
	case s.MaxPartitions > 0 && s.MinPartitions > s.MaxPartitions:
		return errInvalid("options.min_partitions", "min_above_max", uint64(s.MaxPartitions), "options.min_partitions %d is above options.max_partitions %d", s.MinPartitions, s.MaxPartitions)
	}
	return nil
}

func (s *State) alterTable(cmd *AlterTable, chk bool) (Result, error) {
	if err := checkName(chk, "tenant", cmd.Tenant); err != nil {
		return Result{}, err
	}
	if err := checkName(chk, "name", cmd.Table); err != nil {
		return Result{}, err
	}
	t, err := s.Table(cmd.Tenant, cmd.Table)
	if err != nil {
		return Result{}, err
	}
	var set SplitSettings
	if cmd.Settings != nil {
		set = *cmd.Settings
	}
	if chk {
		if err := checkSplitSettings(t.Kind, set); err != nil {
			return Result{}, err
		}
	}
	if t.Options.splitSettings() == set {
		return Result{}, nil
	}
	t = s.mutTable(t)
	t.Options.setSplitSettings(set)
	return Result{Changed: true}, nil
}

// AlterTable implements api.MasterServer.
func (m *Master) AlterTable(ctx context.Context, req *api.AlterTableRequest) (*api.AlterTableResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	t, err := lookup(m.State(), "tenant", req.GetTenant(), "table", req.GetTable())
	if err != nil {
		return nil, err
	}
	set := t.Options.splitSettings()
	if req.MinPartitions != nil {
		set.MinPartitions = req.GetMinPartitions()
	}
	if req.MaxPartitions != nil {
		set.MaxPartitions = req.GetMaxPartitions()
	}
	if req.SplitSizeBytes != nil {
		set.SplitSizeBytes = req.GetSplitSizeBytes()
	}
	if req.SplitQps != nil {
		set.SplitQPS = req.GetSplitQps()
	}
	_, next, err := m.propose(Command{UnixMs: m.opts.Now().UnixMilli(), Payload: AlterTable{Tenant: t.Tenant, Table: t.Name, Settings: &set}}, nil, nil)
	if err != nil {
		return nil, rpcError("alter table", err)
	}
	nt, err := next.Table(t.Tenant, t.Name)
	if err != nil {
		return nil, rpcError("alter table", err)
	}
	m.logger.Info("tablemaster: table altered", "tenant", t.Tenant, "table", t.Name, "min_partitions", set.MinPartitions,
		"max_partitions", set.MaxPartitions, "split_size_bytes", set.SplitSizeBytes, "split_qps", set.SplitQPS)
	return &api.AlterTableResponse{Table: nt.Proto(), MapVersion: next.Version}, nil
}

// autoSplitLoop runs the split policy on the leader every
// Options.AutoSplitInterval unless Options.DisableAutoSplit.
func (m *Master) autoSplitLoop() {
	defer m.wg.Done()
	if m.opts.DisableAutoSplit {
		return
	}
	t := time.NewTicker(m.opts.AutoSplitInterval)
	defer t.Stop()
	var mem splitpolicy.Memory
	for {
		select {
		case <-m.closing:
			return
		case <-t.C:
		}
		if !m.leads() {
			mem = splitpolicy.Memory{}
			continue
		}
		m.autoSplitRound(&mem)
	}
}

// autoSplitRound decides once and starts the splits decided.
func (m *Master) autoSplitRound(mem *splitpolicy.Memory) splitpolicy.Decision {
	st := m.State()
	now := m.opts.Now()
	dec := splitpolicy.Decide(m.splitSnapshot(st, now), m.opts.AutoSplit, mem)
	for _, sp := range dec.Splits {
		cmd := Command{UnixMs: now.UnixMilli(), Payload: SplitPartition{PartitionID: sp.Partition, Hash: sp.Hash, Key: sp.Key, Reason: string(sp.Reason)}}
		_, next, err := m.propose(cmd, nil, nil)
		if err != nil {
			if !errors.Is(err, ErrClosed) {
				m.logger.Info("tablemaster: automatic split not started", "partition", sp.Partition, "why", sp.Why, "err", err)
			}
			continue
		}
		_, np := next.partition(sp.Partition)
		if np == nil || np.Split == nil {
			continue
		}
		m.logger.Info("tablemaster: splitting a partition automatically", "partition", sp.Partition, "reason", sp.Reason, "why", sp.Why,
			"hash", sp.Hash, "key", sp.Key, "left", np.Split.Left, "right", np.Split.Right)
		m.event(EventAutoSplit, primaryID(np), sp.Partition, "partition %d splitting by %s into %d and %d (%s)", sp.Partition, sp.Reason, np.Split.Left, np.Split.Right, sp.Why)
		m.kickLogs()
	}
	return dec
}

// splitSnapshot is the cluster as the split policy sees it: the
// partitions of point and ordered tables with their smoothed load (reads
// on every replica, writes on the primary) and bytes from the load view,
// and, for those over a threshold, the split hints their primary
// reported. The hints are looked up for those alone, so a round over a
// large map costs a pass over its partitions, not over every status.
func (m *Master) splitSnapshot(st *State, now time.Time) splitpolicy.Snapshot {
	snap := splitpolicy.Snapshot{NowMs: now.UnixMilli(), TotalPartitions: st.partitionCount(), MaxTotalPartitions: api.MaxClusterPartitions}
	def := m.opts.AutoSplit.WithDefaults()
	var over []int // indexes in snap.Partitions of those that want hints
	var primaries []string
	m.load.mu.Lock()
	for _, t := range st.tablesByID() {
		if !t.replicatesByLog() {
			continue
		}
		name := tableKey(t.Tenant, t.Name)
		snap.Tables = append(snap.Tables, splitpolicy.Table{Name: name, Ordered: t.Kind == api.TableKind_TABLE_KIND_ORDERED,
			Partitions: len(t.Partitions), MaxPartitions: int(t.Options.MaxPartitions), SizeBytes: t.Options.SplitSizeBytes, QPS: float64(t.Options.SplitQPS)})
		qps, size := def.QPS, def.SizeBytes
		if t.Options.SplitQPS > 0 {
			qps = float64(t.Options.SplitQPS)
		}
		if t.Options.SplitSizeBytes > 0 {
			size = t.Options.SplitSizeBytes
		}
		for i := range t.Partitions {
			p := &t.Partitions[i]
			if p.Split != nil {
				snap.Splitting++
			}
			prim := primaryID(p)
			sp := splitpolicy.Partition{ID: p.ID, Table: name, Start: p.Start, End: p.End, KeyStart: p.KeyStart, KeyEnd: p.KeyEnd,
				Busy:      p.Split != nil || p.Merge != nil || p.Move != nil || prim == "" || p.Log == nil || p.Log.Extent == 0,
				SplitAtMs: p.SplitUnixMs}
			for _, r := range p.Replicas {
				vec, _, ok := m.load.vecLocked(r.ServerID, p.ID)
				if !ok {
					continue
				}
				sp.QPS += vec[balance.DimReads]
				if r.ServerID == prim {
					sp.QPS += vec[balance.DimWrites]
					// A disk store's bytes on disk; a memory engine's in memory.
					sp.SizeBytes = uint64(vec[balance.DimDisk])
					if sp.SizeBytes == 0 {
						sp.SizeBytes = uint64(vec[balance.DimMemory])
					}
				}
			}
			snap.Partitions = append(snap.Partitions, sp)
			if sp.QPS >= qps || sp.SizeBytes >= size {
				over = append(over, len(snap.Partitions)-1)
				primaries = append(primaries, prim)
			}
		}
	}
	m.load.mu.Unlock()
	if len(over) == 0 {
		return snap
	}
	hint := func(h *api.SplitHint) *splitpolicy.Hint {
		if h == nil {
			return nil
		}
		return &splitpolicy.Hint{Hash: h.GetHash(), Key: h.GetKey()}
	}
	m.liveMu.Lock()
	defer m.liveMu.Unlock()
	for i, k := range over {
		sp := &snap.Partitions[k]
		l := m.live[primaries[i]]
		if l == nil || l.dead {
			continue
		}
		for _, r := range l.statuses {
			if r.GetPartitionId() == sp.ID && r.GetRole() == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
				sp.LoadHint, sp.SizeHint = hint(r.GetLoadSplit()), hint(r.GetSizeSplit())
			}
		}
	}
	return snap
}
