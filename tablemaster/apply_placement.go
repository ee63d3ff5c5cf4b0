package tablemaster

import (
	"cmp"
	"maps"
	"slices"

	"github.com/tabuladb/tabula/api"
)

// The placement and partitions sub-machine: OpPlace, OpClearDataLoss,
// the partition logs (OpPartitionLog, OpPartitionLogReset) and the live
// handoffs (OpHandoffDone). The replica moves' commands (OpMoveReplica,
// OpMoveDone, OpReplicaFailed) are in move.go beside the loop that
// proposes them.

// place places every partition short of replicas (OpPlace).
func (s *State) place() Result {
	moved := s.placeShort(s.candidates())
	return Result{Changed: len(moved) > 0, Moved: moved}
}

// tablesByID returns every table in id order, the deterministic order
// placement walks them in.

func (s *State) tablesByID() []*Table {
	ts := slices.Collect(maps.Values(s.Tables))
	slices.SortFunc(ts, func(a, b *Table) int { return cmp.Compare(a.ID, b.ID) })
	return ts
}

// candidates is the placement view of every server, sorted by id.
func (s *State) candidates() []Candidate {
	counts := s.ReplicaCounts()
	cands := make([]Candidate, 0, len(s.Servers))
	for _, id := range s.ServerIDs() {
		srv := s.Servers[id]
		cands = append(cands, Candidate{
			ID: id, FaultDomain: srv.FaultDomain, Replicas: counts[id],
			Available: srv.Alive && !srv.Draining,
		})
	}
	return cands
}

// placeable reports whether some partition is short of replicas and an
// available server could take one.
func (s *State) placeable() bool {
	var cands []Candidate
	for _, t := range s.tablesByID() {
		for i := range t.Partitions {
			if staying(&t.Partitions[i]) >= int(t.Options.Replication) {
				continue
			}
			if cands == nil {
				cands = s.candidates()
			}
			if Place(cands, serversOf(&t.Partitions[i]), int(t.Options.Replication)-staying(&t.Partitions[i])) != nil {
				return true
			}
		}
	}
	return false
}

// placeShort fills every partition short of replicas, in table id and index
// order. Existing replicas never move.
func (s *State) placeShort(cands []Candidate) []uint64 {
	var moved []uint64
	for _, t := range s.tablesByID() {
		for i := range t.Partitions {
			if staying(&t.Partitions[i]) >= int(t.Options.Replication) {
				continue
			}
			if Place(cands, serversOf(&t.Partitions[i]), int(t.Options.Replication)-staying(&t.Partitions[i])) == nil {
				continue // nowhere to put it: copy nothing
			}
			t = s.mutTable(t)
			if s.fill(t, i, cands) {
				moved = append(moved, t.Partitions[i].ID)
			}
		}
	}
	return moved
}

// fill places replicas of partition i of t until it has the table's
// replication factor or no server qualifies, updating cands' counts. A
// partition without a primary gets its first new replica as primary and a
// bumped epoch. It reports whether any replica was added.
func (s *State) fill(t *Table, i int, cands []Candidate) bool {
	p := &t.Partitions[i]
	hosts := make([]string, len(p.Replicas))
	hasPrimary := false
	for k, r := range p.Replicas {
		hosts[k] = r.ServerID
		hasPrimary = hasPrimary || r.Role == api.ReplicaRole_REPLICA_ROLE_PRIMARY
	}
	// A bulk copy leaving (a rollout's replaced row) does not count.
	picks := Place(cands, hosts, int(t.Options.Replication)-staying(p))
	if len(picks) > 0 {
		p.resetLog() // the next extent includes the new replicas
	}
	if !hasPrimary && len(picks) > 1 {
		// The primary orders and applies first, and serves the strong
		// reads: it goes to the pick holding the fewest primaries, so a
		// table's primaries spread over its servers (ties: placement's
		// order).
		if s.primaries == nil {
			s.primaries = s.primaryCounts()
		}
		n := s.primaries
		best := 0
		for k, id := range picks {
			if n[id] < n[picks[best]] {
				best = k
			}
		}
		picks[0], picks[best] = picks[best], picks[0]
	}
	for _, id := range picks {
		srv := s.Servers[id]
		role := api.ReplicaRole_REPLICA_ROLE_SECONDARY
		if !hasPrimary {
			role, hasPrimary = api.ReplicaRole_REPLICA_ROLE_PRIMARY, true
			p.Epoch++
			if s.primaries != nil {
				s.primaries[id]++
			}
		}
		p.Replicas = append(p.Replicas, Replica{ServerID: id, Addr: srv.Addr, Role: role, FaultDomain: srv.FaultDomain})
		for k := range cands {
			if cands[k].ID == id {
				cands[k].Replicas++
			}
		}
	}
	return len(picks) > 0
}

// clearDataLoss clears the DataLost record of one partition of a table, or
// of all of them; see OpClearDataLoss. Clearing what is not lost changes
// nothing.
func (s *State) clearDataLoss(cmd *ClearDataLoss, chk bool) (Result, error) {
	if err := checkName(chk, "tenant", cmd.Tenant); err != nil {
		return Result{}, err
	}
	if err := checkName(chk, "table", cmd.Table); err != nil {
		return Result{}, err
	}
	t, err := s.Table(cmd.Tenant, cmd.Table)
	if err != nil {
		return Result{}, err
	}
	if cmd.PartitionID != 0 && !slices.ContainsFunc(t.Partitions, func(p Partition) bool { return p.ID == cmd.PartitionID }) {
		return Result{}, errInvalid("partition_id", "partition_not_in_table", 0, "partition %d is not in %s/%s", cmd.PartitionID, t.Tenant, t.Name)
	}
	var cleared []uint64
	for i := range t.Partitions {
		p := &t.Partitions[i]
		if p.DataLost == nil || cmd.PartitionID != 0 && p.ID != cmd.PartitionID {
			continue
		}
		if cleared == nil {
			t = s.mutTable(t)
			p = &t.Partitions[i]
		}
		p.DataLost = nil
		cleared = append(cleared, p.ID)
	}
	return Result{Changed: len(cleared) > 0, Lost: cleared, Table: t}, nil
}

func (s *State) partitionLog(cmd *PartitionLogAllocated) (Result, error) {
	_, p := s.partition(cmd.PartitionID)
	switch {
	case p == nil || p.Log == nil:
		return Result{}, errInvalid("partition_id", "no_log", 0, "partition %d has no commit log", cmd.PartitionID)
	case p.Epoch != cmd.Epoch || !slices.Equal(s.liveServersOf(p), cmd.Servers) || p.Log.Extent != 0:
		return Result{}, nil // moved on meanwhile; the loop decides again
	}
	_, p = s.mutPartition(cmd.PartitionID)
	p.Log.Extent, p.Log.Last = cmd.Extent, cmd.Extent
	return Result{Changed: true, Moved: []uint64{p.ID}}, nil
}

func (s *State) partitionLogReset(cmd *PartitionLogReset) (Result, error) {
	_, p := s.partition(cmd.PartitionID)
	if p == nil || p.Log == nil {
		return Result{}, errInvalid("partition_id", "no_log", 0, "partition %d has no commit log", cmd.PartitionID)
	}
	if p.Epoch != cmd.Epoch || (cmd.Extent != 0 && p.Log.Extent != cmd.Extent) {
		return Result{}, nil // already reconfigured
	}
	t, p := s.mutPartition(cmd.PartitionID)
	changed := p.Log.Extent != 0
	p.Log.Extent = 0
	dropped := false
	for _, id := range cmd.Servers {
		k := slices.IndexFunc(p.Replicas, func(r Replica) bool { return r.ServerID == id })
		if k < 0 || p.Replicas[k].Role == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
			continue
		}
		p.Replicas = slices.Delete(p.Replicas, k, k+1)
		changed, dropped = true, true
	}
	if dropped {
		// The replication factor is restored at once, on servers other
		// than the ones just dropped (they did not answer; a later
		// placement may pick them again, and they copy a snapshot then).
		cands := s.candidates()
		for k := range cands {
			if slices.Contains(cmd.Servers, cands[k].ID) {
				cands[k].Available = false
			}
		}
		s.fill(t, int(p.Index), cands)
	}
	return Result{Changed: changed, Moved: []uint64{p.ID}}, nil
}

// handoffDone applies OpHandoffDone.
func (s *State) handoffDone(cmd *HandoffDone) (Result, error) {
	var res Result
	for pid, v := range cmd.Handoffs {
		_, p := s.partition(pid)
		if p == nil || p.Handoff == nil || p.Handoff.Version != v {
			continue // cleared, or fenced again since
		}
		_, p = s.mutPartition(pid)
		p.Handoff = nil
		res.Changed = true
	}
	return res, nil
}
