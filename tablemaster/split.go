package tablemaster

import (
	"bytes"
	"context"
	"slices"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/replication/stream"
)

// Splits. A partition of a point or ordered table splits in two while it
// serves, in two commands:
//
//  1. OpSplitPartition marks it with a pending Split: the split point and
//     the children's ids (allocated now, so the record every replica
//     applies names them). Its primary, seeing the mark in the map, appends
//     one split record to the partition's log and refuses writes from then
//     on (UNAVAILABLE partition_splitting: the SDK retries on the next
//     map). Every replica, on applying that record, splits its engine into
//     the children's directories (sharing files, copying no record) and
//     reports the record's LSN.
//  2. OpSplitDone, once the primary and every live replica reported it (or
//     Options.SplitAllWait after the start, the primary alone: a replica that had
//     not split copies its child), replaces the partition by its children
//     in the table: same replica servers and roles, the parent's epoch
//     plus one, a log each (log/<child id>, whose LSNs continue after the
//     split record's), and the parent's id and split LSN, so each server
//     opens its children from the split output. The parent's log is
//     deleted: the children's data is in their engines.
//
// Indexes shift: Partition.Index is the position in the table.

// Split commands. The strings are written to the command log: never
// change or reuse one.
const (
	// OpSplitPartition starts splitting partition PartitionID at Hash
	// (point tables; 0: the midpoint of its range) or Key (ordered
	// tables). The children's ids are the next two partition ids.
	OpSplitPartition Op = "split_partition"
	// OpSplitDone replaces partition PartitionID, split by the record at
	// LSN of its log, by its children.
	OpSplitDone Op = "split_done"
)

// Split is a partition's split in progress. A Split is never modified once
// set (clones share it).
type Split struct {
	Left  uint64 `json:"left"`
	Right uint64 `json:"right"`
	// Hash is the right child's first hash (point tables); Key its first
	// key (ordered tables).
	Hash    uint64 `json:"hash,omitempty"`
	Key     []byte `json:"key,omitempty"`
	SinceMs int64  `json:"since_ms"`
	// Reason is why (splitpolicy.ByLoad, BySize; empty: an operator's
	// split); the children keep it.
	Reason string `json:"reason,omitempty"`
}

// SplitStep names a step of a split on the master (Options.OnSplitStep).
type SplitStep string

// The master's steps of a split.
const (
	// SplitMarked: OpSplitPartition committed (the primary appends the
	// record once its map shows it).
	SplitMarked SplitStep = "marked"
	// SplitReady: the replicas reported the split; OpSplitDone is next.
	SplitReady SplitStep = "ready"
	// SplitFinished: OpSplitDone committed; the children's logs are next.
	SplitFinished SplitStep = "finished"
)

// splitStep runs Options.OnSplitStep and reports whether the master
// closed meanwhile (the split goes no further here).
func (m *Master) splitStep(step SplitStep, pid uint64) bool {
	if f := m.opts.OnSplitStep; f != nil {
		f(m.streamCtx, step, pid)
	}
	return m.streamCtx.Err() != nil
}

// midpoint is the default split point of hash range [start, end].
func midpoint(start, end uint64) uint64 { return start + (end-start)/2 + 1 }

func (s *State) splitPartition(cmd *SplitPartition, unixMs int64, chk bool) (Result, error) {
	t, p := s.partition(cmd.PartitionID)
	if p == nil {
		return Result{}, errInvalid("partition_id", "partition_not_found", 0, "no partition %d", cmd.PartitionID)
	}
	ordered := t.Kind == api.TableKind_TABLE_KIND_ORDERED
	if chk {
		switch {
		case t.Kind == api.TableKind_TABLE_KIND_BULK:
			return Result{}, errInvalid("table", "bulk_table", 0, "table %s is a bulk table: its partitions are its published files and do not split", t.Name)
		case !t.replicatesByLog() || p.Log == nil:
			return Result{}, errInvalid("partition_id", "not_replicated", 0, "partition %d has no commit log: only those split", p.ID)
		case p.Split != nil:
			return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_UNAVAILABLE, "split_in_progress", "partition %d is splitting already (into %d and %d)", p.ID, p.Split.Left, p.Split.Right)
		case p.Move != nil:
			return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_UNAVAILABLE, "move_in_progress", "partition %d is moving a replica from %s to %s: split it once the move is done", p.ID, p.Move.From, p.Move.To)
		case p.Merge != nil:
			return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_UNAVAILABLE, "merge_in_progress", "partition %d is merging (into %d)", p.ID, p.Merge.Child)
		case primaryID(p) == "":
			return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_UNAVAILABLE, "no_primary", "partition %d has no primary to split it", p.ID)
		}
		if ordered {
			switch {
			case len(cmd.Key) == 0:
				return Result{}, errInvalid("key", "split_key_missing", 0, "table %s is ordered: give the key to split partition %d at (--at KEY)", t.Name, p.Index)
			case bytes.Compare(cmd.Key, p.KeyStart) <= 0 || len(p.KeyEnd) > 0 && bytes.Compare(cmd.Key, p.KeyEnd) >= 0:
				return Result{}, errInvalid("key", "split_point_out_of_range", 0, "key %q is not inside partition %d's range (%q, %q): both children must hold keys", cmd.Key, p.Index, p.KeyStart, p.KeyEnd)
			}
			cmd.Hash = 0
		} else {
			if cmd.Hash == 0 && len(cmd.Key) > 0 {
				return Result{}, errInvalid("hash", "split_point_not_hash", 0, "table %s is a point table: its partitions split at a hash (a number in the partition's range), not at key %q", t.Name, cmd.Key)
			}
			if cmd.Hash == 0 {
				if p.Start == p.End {
					return Result{}, errInvalid("hash", "split_point_out_of_range", 0, "partition %d holds a single hash (%#x): it cannot split", p.Index, p.Start)
				}
				cmd.Hash = midpoint(p.Start, p.End)
			}
			if cmd.Hash <= p.Start || cmd.Hash > p.End {
				return Result{}, errInvalid("hash", "split_point_out_of_range", 0, "hash %#x is not inside partition %d's range (%#x, %#x]: both children must hold hashes", cmd.Hash, p.Index, p.Start, p.End)
			}
			cmd.Key = nil
		}
	}
	if p.Split != nil || p.Merge != nil || p.Log == nil {
		return Result{}, nil
	}
	t = s.mutTable(t)
	p = &t.Partitions[p.Index]
	p.Split = &Split{Left: s.NextPartitionID, Right: s.NextPartitionID + 1, Hash: cmd.Hash, Key: cmd.Key, SinceMs: unixMs, Reason: cmd.Reason}
	s.NextPartitionID += 2
	return Result{Changed: true, Moved: []uint64{p.ID}}, nil
}

func (s *State) splitDone(cmd *SplitDone, unixMs int64) (Result, error) {
	t, p := s.partition(cmd.PartitionID)
	if p == nil || p.Split == nil {
		return Result{}, nil // done already
	}
	t = s.mutTable(t)
	i := int(p.Index)
	parent := t.Partitions[i]
	sp := parent.Split
	kids := [2]Partition{}
	for k, id := range []uint64{sp.Left, sp.Right} {
		c := Partition{ID: id, Start: parent.Start, End: parent.End, KeyStart: parent.KeyStart, KeyEnd: parent.KeyEnd,
			Epoch: parent.Epoch + 1, Replicas: slices.Clone(parent.Replicas), Log: &PartitionLog{Stream: LogStreamName(id)},
			DataLost: parent.DataLost, Handoff: parent.Handoff, SplitFrom: parent.ID, SplitLSN: cmd.LSN,
			SplitReason: sp.Reason, SplitUnixMs: unixMs}
		if t.Kind == api.TableKind_TABLE_KIND_ORDERED {
			if k == 0 {
				c.KeyEnd = sp.Key
			} else {
				c.KeyStart = sp.Key
			}
		} else if k == 0 {
			c.End = sp.Hash - 1
		} else {
			c.Start = sp.Hash
		}
		kids[k] = c
	}
	t.Partitions = slices.Insert(slices.Delete(t.Partitions, i, i+1), i, kids[0], kids[1])
	for k := range t.Partitions {
		t.Partitions[k].Index = uint32(k)
	}
	t.Options.Partitions = uint32(len(t.Partitions))
	t.Resplit = true
	if t.Kind == api.TableKind_TABLE_KIND_ORDERED {
		pts := slices.Clone(t.Options.SplitPoints)
		k, _ := slices.BinarySearchFunc(pts, sp.Key, bytes.Compare)
		t.Options.SplitPoints = slices.Insert(pts, k, sp.Key)
	}
	if parent.Log != nil {
		// The children's data is in their engines (split at the record):
		// the parent's log serves nobody now.
		_, _ = s.streams().Apply(stream.Command{Op: stream.OpDeleteStream, Stream: parent.Log.Stream})
	}
	return Result{Changed: true, Moved: []uint64{sp.Left, sp.Right}}, nil
}

// splitReports is called with a server's heartbeat statuses: a report of
// a split applied wakes the log loop, which finishes the split at once.
func (m *Master) splitReports(statuses []*api.ReplicaStatus) {
	for _, r := range statuses {
		if r.GetSplitLsn() != 0 {
			m.kickLogs()
			return
		}
	}
}

// splitLoop, run by the log loop on the leader: finishes the splits whose
// replicas reported the split record applied (see the top of the file).
// It reports whether it finished any (the children need their logs).
func (m *Master) splitLoop() (finished bool) {
	if !m.leads() {
		return false
	}
	st := m.State()
	var pending []*Partition
	for _, t := range st.tablesByID() {
		if !t.replicatesByLog() {
			continue
		}
		for i := range t.Partitions {
			if t.Partitions[i].Split != nil {
				pending = append(pending, &t.Partitions[i])
			}
		}
	}
	if len(pending) == 0 {
		return false
	}
	reported := m.reportedLSNs((*api.ReplicaStatus).GetSplitLsn) // partition -> server -> split LSN
	now := m.opts.Now().UnixMilli()
	for _, p := range pending {
		lsn, ok := reported[p.ID][primaryID(p)]
		if !ok {
			continue
		}
		all := true
		for _, id := range st.liveServersOf(p) {
			if _, ok := reported[p.ID][id]; !ok {
				all = false
			}
		}
		if !all && now-p.Split.SinceMs < m.opts.SplitAllWait.Milliseconds() {
			continue // the others apply it within milliseconds, as a rule
		}
		if m.splitStep(SplitReady, p.ID) {
			return finished
		}
		res, _, err := m.propose(Command{UnixMs: now, Payload: SplitDone{PartitionID: p.ID, LSN: lsn}}, nil, nil)
		if err == nil && res.Changed && m.splitStep(SplitFinished, p.ID) {
			return finished
		}
		if err == nil && res.Changed {
			m.logger.Info("tablemaster: partition split", "partition", p.ID, "lsn", lsn, "left", p.Split.Left, "right", p.Split.Right, "all_replicas", all)
			m.event(EventSplitDone, primaryID(p), p.ID, "partition %d split at LSN %d into %d and %d", p.ID, lsn, p.Split.Left, p.Split.Right)
			finished = true // the caller allocates the children's logs
		}
	}
	return finished
}

// reportedLSNs is, per partition and live server, the non-zero LSN lsn
// reads from the server's last report of the replica: where a split or
// a merge record applied there.
func (m *Master) reportedLSNs(lsn func(*api.ReplicaStatus) uint64) map[uint64]map[string]uint64 {
	out := map[uint64]map[string]uint64{}
	m.liveMu.Lock()
	defer m.liveMu.Unlock()
	for id, l := range m.live {
		if l.dead {
			continue
		}
		for _, r := range l.statuses {
			if v := lsn(r); v != 0 {
				if out[r.GetPartitionId()] == nil {
					out[r.GetPartitionId()] = map[string]uint64{}
				}
				out[r.GetPartitionId()][id] = v
			}
		}
	}
	return out
}

// Split event kinds (dashboard JSON: never change or reuse).
const (
	EventSplit     EventKind = "split"      // a partition split started
	EventSplitDone EventKind = "split_done" // ... and its children replaced it
)

// SplitPartition implements api.MasterServer.
func (m *Master) SplitPartition(ctx context.Context, req *api.SplitPartitionRequest) (*api.SplitPartitionResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	st := m.State()
	t, err := lookup(st, "tenant", req.GetTenant(), "table", req.GetTable())
	if err != nil {
		return nil, err
	}
	if int(req.GetIndex()) >= len(t.Partitions) {
		return nil, api.InvalidArgument("index", "partition_not_found", uint64(len(t.Partitions)), "table %s has %d partitions; there is no index %d", t.Name, len(t.Partitions), req.GetIndex())
	}
	p := t.Partitions[req.GetIndex()]
	cmd := Command{UnixMs: m.opts.Now().UnixMilli(), Payload: SplitPartition{PartitionID: p.ID, Hash: req.GetHash(), Key: req.GetKey()}}
	_, next, err := m.propose(cmd, nil, nil)
	if err != nil {
		return nil, rpcError("split partition", err)
	}
	_, np := next.partition(p.ID)
	if np == nil || np.Split == nil {
		return nil, rpcError("split partition", errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_UNAVAILABLE, "split_in_progress", "partition %d changed meanwhile", p.ID))
	}
	sp := *np.Split
	if m.splitStep(SplitMarked, p.ID) {
		return nil, rpcError("split partition", ErrClosed)
	}
	m.logger.Info("tablemaster: splitting a partition", "partition", p.ID, "left", sp.Left, "right", sp.Right, "hash", sp.Hash, "key", sp.Key)
	m.event(EventSplit, primaryID(np), p.ID, "partition %d splitting into %d and %d", p.ID, sp.Left, sp.Right)
	out := &api.SplitPartitionResponse{ParentId: p.ID, MapVersion: next.Version, Left: &api.Partition{Id: sp.Left}, Right: &api.Partition{Id: sp.Right}}
	for {
		v := m.view.Load()
		_, l := v.state.partition(sp.Left)
		_, r := v.state.partition(sp.Right)
		if l != nil && r != nil {
			out.Left, out.Right, out.MapVersion = l.Proto(), r.Proto(), v.state.Version
			out.Done = l.Log != nil && l.Log.Extent != 0 && r.Log != nil && r.Log.Extent != 0
		}
		if !req.GetWait() || out.Done {
			return out, nil
		}
		select {
		case <-v.changed:
		case <-ctx.Done():
			return out, nil // the split goes on; describe shows it
		case <-m.closing:
			return nil, rpcError("split partition", ErrClosed)
		}
	}
}
