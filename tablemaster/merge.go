package tablemaster

import (
	"bytes"
	"context"
	"slices"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/replication/stream"
)

// Merges: the inverse of a split (split.go). Two adjacent partitions of a
// point or ordered table become one while they serve:
//
//  1. OpMergePartitions marks both with a pending Merge naming the child
//     (its id allocated now).
//  2. Alignment: the merge needs both partitions' replicas on the same
//     servers with the same primary (each server merges the two engines
//     it holds). If they are elsewhere, the leader's log loop (mergeLoop)
//     moves the right partition's replicas onto the left's servers one
//     at a time (OpMoveReplica / OpMoveDone, the move path's own checks
//     apply) and transfers its primary role to the left's primary's
//     server (OpTransferPrimary).
//  3. Aligned, each primary appends one merge record to its log and
//     refuses writes from then on (UNAVAILABLE partition_merging). Every
//     replica server, once it applied both records, merges its two
//     engines into the child's directory (engines.Merger) and reports
//     both records' LSNs.
//  4. OpMergeDone, once every live replica server reported them (or
//     Options.SplitAllWait after the primary did, the primary alone: a
//     replica that had not merged copies the child), replaces the two by
//     the child: the union of their ranges, the same replica servers and
//     roles, the larger epoch plus one, a log (log/<child id>) whose LSNs
//     continue after the larger merge LSN, and the parents' ids, so each
//     server opens the child from the merge output. The parents' logs are
//     deleted.

// Merge commands. The strings are written to the command log: never
// change or reuse one.
const (
	// OpMergePartitions starts merging partition PartitionID with the
	// next partition of its table. The child's id is the next partition
	// id.
	OpMergePartitions Op = "merge_partitions"
	// OpMergeDone replaces partition PartitionID, merged by the record at
	// LSN of its log, and the next partition, merged by the record at
	// RightLSN of its log, by their child.
	OpMergeDone Op = "merge_done"
)

// Merge is a merge in progress, set on both partitions. A Merge is never
// modified once set (clones share it).
type Merge struct {
	Left    uint64 `json:"left"`
	Right   uint64 `json:"right"`
	Child   uint64 `json:"child"`
	SinceMs int64  `json:"since_ms"`
}

// sameServers reports whether a and b have replicas on the same servers.
func sameServers(a, b *Partition) bool {
	if len(a.Replicas) != len(b.Replicas) {
		return false
	}
	for _, r := range a.Replicas {
		if !hostsReplica(b, r.ServerID) {
			return false
		}
	}
	return true
}

// mergeAligned reports whether the partitions of a merge can write their
// merge records: the same replica servers and primary, no move.
func mergeAligned(l, r *Partition) bool {
	return l.Move == nil && r.Move == nil && sameServers(l, r) && primaryID(l) != "" && primaryID(l) == primaryID(r)
}

// mergePartner returns the other partition of p's merge in t (nil: none).
func mergePartner(t *Table, p *Partition) *Partition {
	if p.Merge == nil {
		return nil
	}
	k := int(p.Index) + 1
	if p.ID == p.Merge.Right {
		k = int(p.Index) - 1
	}
	if k < 0 || k >= len(t.Partitions) || t.Partitions[k].Merge != p.Merge && (t.Partitions[k].Merge == nil || *t.Partitions[k].Merge != *p.Merge) {
		return nil
	}
	return &t.Partitions[k]
}

func (s *State) mergePartitions(cmd *MergePartitions, unixMs int64, chk bool) (Result, error) {
	t, l := s.partition(cmd.PartitionID)
	if l == nil {
		return Result{}, errInvalid("partition_id", "partition_not_found", 0, "no partition %d", cmd.PartitionID)
	}
	if int(l.Index)+1 >= len(t.Partitions) {
		return Result{}, errInvalid("partition_id", "not_adjacent", 0, "partition %d is the last of table %s (index %d): there is no partition after it to merge with", l.ID, t.Name, l.Index)
	}
	r := &t.Partitions[l.Index+1]
	if chk {
		unavailable := func(reason, format string, args ...any) (Result, error) {
			return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_UNAVAILABLE, reason, format, args...)
		}
		for _, p := range []*Partition{l, r} {
			switch {
			case t.Kind == api.TableKind_TABLE_KIND_BULK:
				return Result{}, errInvalid("table", "bulk_table", 0, "table %s is a bulk table: its partitions are its published files and do not merge", t.Name)
			case !t.replicatesByLog() || p.Log == nil:
				return Result{}, errInvalid("partition_id", "not_replicated", 0, "partition %d has no commit log: only those merge", p.ID)
			case p.Merge != nil:
				return unavailable("merge_in_progress", "partition %d is merging already (into %d)", p.ID, p.Merge.Child)
			case p.Split != nil:
				return unavailable("split_in_progress", "partition %d is splitting (into %d and %d)", p.ID, p.Split.Left, p.Split.Right)
			case p.Move != nil:
				return unavailable("move_in_progress", "partition %d is moving a replica from %s to %s: merge it once the move is done", p.ID, p.Move.From, p.Move.To)
			case primaryID(p) == "":
				return unavailable("no_primary", "partition %d has no primary to merge it", p.ID)
			}
		}
		if minParts := t.Options.MinPartitions; minParts > 0 {
			merging := 0
			for i := range t.Partitions {
				if t.Partitions[i].Merge != nil {
					merging++
				}
			}
			// Each merge under way marks two partitions and removes one.
			if after := len(t.Partitions) - merging/2 - 1; after < int(minParts) {
				return Result{}, errInvalid("partition_id", "min_partitions", uint64(minParts), "table %s keeps at least %d partitions (tabula table alter --min-partitions); this merge would leave %d", t.Name, minParts, after)
			}
		}
		if len(l.Replicas) != len(r.Replicas) {
			return unavailable("replicas_differ", "partitions %d and %d have %d and %d replicas: each replica of one merges with one of the other (wait until the missing ones are placed again)", l.Index, r.Index, len(l.Replicas), len(r.Replicas))
		}
	}
	if l.Merge != nil || r.Merge != nil || l.Log == nil || r.Log == nil {
		return Result{}, nil
	}
	t = s.mutTable(t)
	mg := &Merge{Left: l.ID, Right: r.ID, Child: s.NextPartitionID, SinceMs: unixMs}
	s.NextPartitionID++
	t.Partitions[l.Index].Merge = mg
	t.Partitions[l.Index+1].Merge = mg
	return Result{Changed: true, Moved: []uint64{l.ID, r.ID}}, nil
}

func (s *State) mergeDone(cmd *MergeDone) (Result, error) {
	t, l := s.partition(cmd.PartitionID)
	if l == nil || l.Merge == nil || l.Merge.Left != l.ID {
		return Result{}, nil // done already
	}
	r := mergePartner(t, l)
	if r == nil {
		return Result{}, nil
	}
	t = s.mutTable(t)
	i := int(l.Index)
	left, right := t.Partitions[i], t.Partitions[i+1]
	mg := left.Merge
	c := Partition{ID: mg.Child, Start: left.Start, End: right.End, KeyStart: left.KeyStart, KeyEnd: right.KeyEnd,
		Epoch: max(left.Epoch, right.Epoch) + 1, Replicas: slices.Clone(left.Replicas), Log: &PartitionLog{Stream: LogStreamName(mg.Child)},
		DataLost: left.DataLost, Handoff: left.Handoff,
		MergeLeft: left.ID, MergeRight: right.ID, MergeLSN: max(cmd.LSN, cmd.RightLSN)}
	if c.DataLost == nil {
		c.DataLost = right.DataLost
	}
	if c.Handoff == nil {
		c.Handoff = right.Handoff
	}
	t.Partitions = slices.Insert(slices.Delete(t.Partitions, i, i+2), i, c)
	for k := range t.Partitions {
		t.Partitions[k].Index = uint32(k)
	}
	t.Options.Partitions = uint32(len(t.Partitions))
	t.Resplit = true
	if t.Kind == api.TableKind_TABLE_KIND_ORDERED {
		t.Options.SplitPoints = slices.DeleteFunc(slices.Clone(t.Options.SplitPoints), func(k []byte) bool { return bytes.Equal(k, right.KeyStart) })
	}
	for _, p := range []Partition{left, right} {
		if p.Log != nil {
			// The child's data is in its engines (merged at the records):
			// the parents' logs serve nobody now.
			_, _ = s.streams().Apply(stream.Command{Op: stream.OpDeleteStream, Stream: p.Log.Stream})
		}
	}
	return Result{Changed: true, Moved: []uint64{mg.Child}}, nil
}

// mergeReports is called with a server's heartbeat statuses: a report of
// a merge applied wakes the log loop, which finishes the merge at once.
func (m *Master) mergeReports(statuses []*api.ReplicaStatus) {
	for _, r := range statuses {
		if r.GetMergeLsn() != 0 {
			m.kickLogs()
			return
		}
	}
}

// mergeLoop, run by the log loop on the leader: aligns the partitions of
// pending merges and finishes the merges whose replicas reported both
// records applied (see the top of the file). It reports whether it
// finished any (the children need their logs).
func (m *Master) mergeLoop(ctx context.Context) (finished bool) {
	if !m.leads() {
		return false
	}
	st := m.State()
	type pair struct {
		t    *Table
		l, r *Partition
	}
	var pending []pair
	for _, t := range st.tablesByID() {
		if !t.replicatesByLog() {
			continue
		}
		for i := range t.Partitions {
			l := &t.Partitions[i]
			if l.Merge == nil || l.Merge.Left != l.ID {
				continue
			}
			if r := mergePartner(t, l); r != nil {
				pending = append(pending, pair{t, l, r})
			}
		}
	}
	if len(pending) == 0 {
		m.mergeMu.Lock()
		clear(m.mergeSeen)
		m.mergeMu.Unlock()
		return false
	}
	reported := m.reportedLSNs((*api.ReplicaStatus).GetMergeLsn) // partition -> server -> merge LSN
	now := m.opts.Now()
	for _, pr := range pending {
		l, r := pr.l, pr.r
		if !mergeAligned(l, r) {
			m.alignMerge(ctx, st, l, r)
			continue
		}
		prim := primaryID(l)
		ll, okl := reported[l.ID][prim]
		rl, okr := reported[r.ID][prim]
		if !okl || !okr {
			continue
		}
		all := true
		for _, id := range st.liveServersOf(l) {
			if _, ok := reported[l.ID][id]; !ok {
				all = false
			}
			if _, ok := reported[r.ID][id]; !ok {
				all = false
			}
		}
		if !all {
			// The others merge within milliseconds of the primary, as a
			// rule; wait for them up to SplitAllWait from its report.
			m.mergeMu.Lock()
			seen, ok := m.mergeSeen[l.Merge.Child]
			if !ok {
				seen = now
				if m.mergeSeen == nil {
					m.mergeSeen = map[uint64]time.Time{}
				}
				m.mergeSeen[l.Merge.Child] = now
			}
			m.mergeMu.Unlock()
			if now.Sub(seen) < m.opts.SplitAllWait {
				continue
			}
		}
		res, _, err := m.propose(Command{UnixMs: now.UnixMilli(), Payload: MergeDone{PartitionID: l.ID, LSN: ll, RightLSN: rl}}, nil, nil)
		if err == nil && res.Changed {
			m.logger.Info("tablemaster: partitions merged", "left", l.ID, "right", r.ID, "child", l.Merge.Child, "left_lsn", ll, "right_lsn", rl, "all_replicas", all)
			m.event(EventMergeDone, prim, l.Merge.Child, "partitions %d and %d merged into %d (LSNs %d and %d)", l.ID, r.ID, l.Merge.Child, ll, rl)
			m.mergeMu.Lock()
			delete(m.mergeSeen, l.Merge.Child)
			m.mergeMu.Unlock()
			finished = true // the caller allocates the child's log
		}
	}
	return finished
}

// alignMerge takes one step towards aligning a merge's partitions: the
// right's replicas move to the left's servers one at a time, then its
// primary role goes to the left's primary's server. A step under way (a
// move, a handoff) is waited for.
func (m *Master) alignMerge(ctx context.Context, st *State, l, r *Partition) {
	if l.Move != nil || r.Move != nil || r.Handoff != nil {
		return // the move loop finishes it; the next round goes on
	}
	now := m.opts.Now().UnixMilli()
	if !sameServers(l, r) {
		var from, to []string
		for _, x := range r.Replicas {
			if !hostsReplica(l, x.ServerID) {
				from = append(from, x.ServerID)
			}
		}
		for _, x := range l.Replicas {
			if !hostsReplica(r, x.ServerID) {
				to = append(to, x.ServerID)
			}
		}
		// A secondary first: the primary's move hands its role over.
		slices.SortStableFunc(from, func(a, b string) int {
			pa, pb := a == primaryID(r), b == primaryID(r)
			switch {
			case pa == pb:
				return 0
			case pb:
				return -1
			}
			return 1
		})
		for _, f := range from {
			for _, tgt := range to {
				res, _, err := m.propose(Command{UnixMs: now, Payload: MoveReplica{PartitionID: r.ID, ServerID: f, To: tgt}}, nil, nil)
				if err == nil && res.Changed {
					m.logger.Info("tablemaster: merge: moving a replica to align the partitions", "partition", r.ID, "from", f, "to", tgt, "child", r.Merge.Child)
					m.event(EventMove, f, r.ID, "partition %d: moving a replica %s -> %s to merge with partition %d", r.ID, f, tgt, l.ID)
					m.kickLogs()
					return
				}
				if err != nil && ctx.Err() == nil {
					m.logger.Debug("tablemaster: merge: cannot move a replica yet", "partition", r.ID, "from", f, "to", tgt, "err", err)
				}
			}
		}
		return
	}
	if lp, rp := primaryID(l), primaryID(r); lp != "" && rp != "" && lp != rp {
		res, _, err := m.propose(Command{UnixMs: now, Payload: TransferPrimary{PartitionID: r.ID, ServerID: rp, To: lp}}, nil, nil)
		if err == nil && res.Changed {
			m.logger.Info("tablemaster: merge: transferring a primary to align the partitions", "partition", r.ID, "from", rp, "to", lp, "child", r.Merge.Child)
			m.event(EventTransfer, rp, r.ID, "partition %d: primary transferred %s -> %s to merge with partition %d", r.ID, rp, lp, l.ID)
			m.kickLogs()
		} else if err != nil && ctx.Err() == nil {
			m.logger.Debug("tablemaster: merge: cannot transfer the primary yet", "partition", r.ID, "err", err)
		}
	}
}

// Merge event kinds (dashboard JSON: never change or reuse).
const (
	EventMerge     EventKind = "merge"      // a merge started
	EventMergeDone EventKind = "merge_done" // ... and its child replaced the partitions
)

// mergePhase says what a pending merge of l and r waits for.
func mergePhase(l, r *Partition) string {
	if !mergeAligned(l, r) {
		return "aligning"
	}
	return "records"
}

// MergePartitions implements api.MasterServer.
func (m *Master) MergePartitions(ctx context.Context, req *api.MergePartitionsRequest) (*api.MergePartitionsResponse, error) {
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
	if int(req.GetIndex())+1 >= len(t.Partitions) {
		return nil, api.InvalidArgument("index", "partition_not_found", uint64(len(t.Partitions)), "table %s has %d partitions; partition %d is the last, with none after it to merge with", t.Name, len(t.Partitions), req.GetIndex())
	}
	p := t.Partitions[req.GetIndex()]
	cmd := Command{UnixMs: m.opts.Now().UnixMilli(), Payload: MergePartitions{PartitionID: p.ID}}
	_, next, err := m.propose(cmd, nil, nil)
	if err != nil {
		return nil, rpcError("merge partitions", err)
	}
	_, np := next.partition(p.ID)
	if np == nil || np.Merge == nil {
		return nil, rpcError("merge partitions", errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_UNAVAILABLE, "merge_in_progress", "partition %d changed meanwhile", p.ID))
	}
	mg := *np.Merge
	m.logger.Info("tablemaster: merging partitions", "left", mg.Left, "right", mg.Right, "child", mg.Child)
	m.event(EventMerge, primaryID(np), mg.Left, "partitions %d and %d merging into %d", mg.Left, mg.Right, mg.Child)
	m.kickLogs()
	out := &api.MergePartitionsResponse{LeftId: mg.Left, RightId: mg.Right, ChildId: mg.Child, MapVersion: next.Version}
	for {
		v := m.view.Load()
		out.MapVersion = v.state.Version
		if vt, c := v.state.partition(mg.Child); c != nil {
			_ = vt
			out.Child = c.Proto()
			out.Done = c.Log != nil && c.Log.Extent != 0
			out.Phase = "log"
			if out.Done {
				out.Phase = ""
			}
		} else if vt, l := v.state.partition(mg.Left); l != nil {
			if r := mergePartner(vt, l); r != nil {
				out.Phase = mergePhase(l, r)
			}
		}
		if !req.GetWait() || out.Done {
			return out, nil
		}
		select {
		case <-v.changed:
		case <-ctx.Done():
			return out, nil // the merge goes on; describe shows it
		case <-m.closing:
			return nil, rpcError("merge partitions", ErrClosed)
		}
	}
}
