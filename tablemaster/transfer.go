package tablemaster

import (
	"slices"

	"github.com/tabuladb/tabula/api"
)

// Primary transfers. The balancer (tablemaster/balance, rebalance.go)
// evens out primaries — and the reads and engine time they carry — by
// handing a partition's primary role to one of its in-sync secondaries:
// nothing is copied. It is a primary change like the end of a move
// (OpMoveDone): the roles swap, the epoch is bumped once, and the log is
// reconfigured so its next extent has the new primary first; the old
// primary is alive, so State.apply fences the new term until it
// acknowledges its demotion or its lease runs out (handoff.go). Writes in
// flight at the old primary fail and are retried by their clients (with
// their request ids) at the new one.

// OpTransferPrimary moves partition PartitionID's primary role from
// ServerID to To, a secondary of it. The string is written to the command
// log: never change or reuse it.
const OpTransferPrimary Op = "transfer_primary"

// TransferPrimary hands a partition's primary role to a secondary
// (OpTransferPrimary).
type TransferPrimary struct {
	PartitionID uint64 `json:"partition_id,omitempty"`
	// ServerID is the current primary's server (the transfer's source).
	ServerID string `json:"server_id,omitempty"`
	To       string `json:"to,omitempty"`
}

// Op returns OpTransferPrimary.
func (TransferPrimary) Op() Op { return OpTransferPrimary }

// transferPrimary applies OpTransferPrimary. Proposed (chk), it refuses
// what does not fit with a reason; logged, a command the state moved past
// (the primary changed, the target left, a move or split began) changes
// nothing.
func (s *State) transferPrimary(cmd *TransferPrimary, chk bool) (Result, error) {
	t, p := s.partition(cmd.PartitionID)
	if p == nil {
		if chk {
			return Result{}, errInvalid("partition_id", "partition_not_found", 0, "no partition %d", cmd.PartitionID)
		}
		return Result{}, nil
	}
	if err := s.checkTransfer(t, p, cmd); err != nil {
		if chk {
			return Result{}, err
		}
		return Result{}, nil
	}
	t = s.mutTable(t)
	p = &t.Partitions[p.Index]
	k := slices.IndexFunc(p.Replicas, func(r Replica) bool { return r.ServerID == cmd.ServerID })
	j := slices.IndexFunc(p.Replicas, func(r Replica) bool { return r.ServerID == cmd.To })
	p.Replicas[k].Role = api.ReplicaRole_REPLICA_ROLE_SECONDARY
	p.Replicas[j].Role = api.ReplicaRole_REPLICA_ROLE_PRIMARY
	p.Replicas[0], p.Replicas[j] = p.Replicas[j], p.Replicas[0] // the primary first, as everywhere
	p.Epoch++
	p.resetLog() // the next extent has the new primary first
	return Result{Changed: true, Moved: []uint64{p.ID}}, nil
}

// checkTransfer says why cmd cannot be applied to p of t now (nil: it can).
// The state knows a replica is not in sync when it is a move's target
// (still copying) or on a dead or draining server; the proposer checks the
// replicas' reports besides (rebalance.go).
func (s *State) checkTransfer(t *Table, p *Partition, cmd *TransferPrimary) error {
	unavailable := func(reason, format string, args ...any) error {
		return errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_UNAVAILABLE, reason, format, args...)
	}
	switch {
	case !t.replicatesByLog() || p.Log == nil:
		return errInvalid("partition_id", "not_replicated", 0, "partition %d is not replicated through a commit log: it has no secondaries to take its primary role", p.ID)
	case cmd.To == cmd.ServerID:
		return errInvalid("to", "same_server", 0, "server %s is partition %d's primary already", cmd.To, p.ID)
	case primaryID(p) != cmd.ServerID:
		return errInvalid("server_id", "not_primary", 0, "server %s is not partition %d's primary (%q is)", cmd.ServerID, p.ID, primaryID(p))
	case !hostsReplica(p, cmd.To):
		return errInvalid("to", "not_secondary", 0, "server %s holds no replica of partition %d", cmd.To, p.ID)
	case p.Move != nil:
		return unavailable("move_in_progress", "partition %d is moving from %s to %s", p.ID, p.Move.From, p.Move.To)
	case p.Split != nil:
		return unavailable("split_in_progress", "partition %d is splitting", p.ID)
	case p.Handoff != nil:
		return unavailable("handoff_pending", "partition %d's primary took over from %s and may not serve yet", p.ID, p.Handoff.From)
	}
	srv := s.Servers[cmd.To]
	switch {
	case srv == nil || !srv.Alive:
		return unavailable("not_in_sync", "server %s is dead: its replica of partition %d is not in sync", cmd.To, p.ID)
	case srv.Draining:
		return errInvalid("to", "server_unavailable", 0, "server %s is draining", cmd.To)
	}
	return nil
}
