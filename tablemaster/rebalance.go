package tablemaster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/tablemaster/balance"
)

// Rebalancing. The leader carries out the balancer's plan
// (tablemaster/balance) in rounds: each builds the plan from the current
// map and the load view exactly as BalancePlan shows it, and starts its
// actions through the paths every other change takes — OpTransferPrimary
// for a primary transfer (transfer.go), OpMoveReplica for a replica move
// (move.go, whose loop finishes it once the target is in sync). The plan
// itself respects the limits: moves under way count against the cluster
// and per-server bounds, so a round started while earlier moves still copy
// starts only what fits. Rounds run every Options.RebalanceInterval and as
// soon as the set of live servers changes (a server joined) when
// Options.Rebalance is set, and on demand (BalancePlan with apply, `tabula
// cluster balance`). The automatic rounds start an action only once the
// plans asked for its kind between its two servers for
// Options.RebalanceSustain (every round since), so a few seconds' noise
// in the rates moves nothing. The servers a partition's replicas left are
// remembered for rebalanceCooldown and fed to the planner (Snapshot.Left),
// so a move is not undone by the next round's view of noisy load, and the
// partitions whose primary it transferred for transferSettle
// (Partition.Settling). That memory is the leader's only: a new leader
// starts without it, at worst moving a replica back once. The planner
// sees each partition's load by its replicas' roles now (load.go,
// byRole), not by their lagging reports.

// EventTransfer: a partition's primary role was transferred by the
// balancer.
const EventTransfer EventKind = "transfer"

// rebalanceCooldown is how long a partition is kept off a server one of
// its replicas left.
const rebalanceCooldown = 10 * time.Minute

// rebalancer is the leader's balancing state. The zero value is ready.
// Safe for concurrent use.
type rebalancer struct {
	// round serializes rounds: two planned on the same map would both
	// count the same room under the move limits.
	round sync.Mutex
	mu    sync.Mutex
	// Guarded by mu: the servers each partition left, and when; the
	// partitions whose primary role the balancer transferred, and when.
	left        map[uint64][]leftAt
	transferred map[uint64]time.Time
	// wanted: since when the automatic rounds' plans have asked, every
	// round, for an action of its kind between its two servers.
	wanted map[wantKey]time.Time
}

type wantKey struct {
	kind     balance.Kind
	from, to string
}

// sustained reports, for each of plan's actions, whether the plans have
// asked for its kind between its servers for at least sustain (now
// included); what the plan no longer asks for is forgotten.
func (r *rebalancer) sustained(acts []balance.Action, draining func(string) bool, now time.Time, sustain time.Duration) []bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	next := map[wantKey]time.Time{}
	out := make([]bool, len(acts))
	for i, a := range acts {
		k := wantKey{a.Kind, a.From, a.To}
		since, ok := r.wanted[k]
		if !ok {
			since = now
		}
		next[k] = since
		out[i] = sustain <= 0 || now.Sub(since) >= sustain || draining(a.From)
	}
	r.wanted = next
	return out
}

type leftAt struct {
	server string
	at     time.Time
}

// recentLeft is the planner's Left: the servers partitions left within
// the cooldown (older entries are forgotten).
func (r *rebalancer) recentLeft(now time.Time) map[uint64][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[uint64][]string{}
	for pid, ls := range r.left {
		ls = slices.DeleteFunc(ls, func(l leftAt) bool { return now.Sub(l.at) > rebalanceCooldown })
		if len(ls) == 0 {
			delete(r.left, pid)
			continue
		}
		r.left[pid] = ls
		for _, l := range ls {
			out[pid] = append(out[pid], l.server)
		}
	}
	return out
}

// transferSettle is how long a partition whose primary role the balancer
// transferred stays as it is (balance.Partition.Settling): long enough
// for the servers' smoothed reports to follow the role.
const transferSettle = time.Minute

// settling is the planner's Settling: the partitions transferred within
// transferSettle (older entries are forgotten).
func (r *rebalancer) settling(now time.Time) map[uint64]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[uint64]bool{}
	for pid, at := range r.transferred {
		if now.Sub(at) > transferSettle {
			delete(r.transferred, pid)
			continue
		}
		out[pid] = true
	}
	return out
}

func (r *rebalancer) noteTransferred(pid uint64, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.transferred == nil {
		r.transferred = map[uint64]time.Time{}
	}
	r.transferred[pid] = now
}

func (r *rebalancer) noteLeft(pid uint64, server string, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.left == nil {
		r.left = map[uint64][]leftAt{}
	}
	r.left[pid] = append(r.left[pid], leftAt{server, now})
}

// roundResult is one round: the plan, and per action whether it started
// (nil error) or why not.
type roundResult struct {
	plan    balance.Result
	refs    map[uint64]partRef
	errs    []error
	version uint64 // the map version planned from
	warm    bool
}

// errNotSustained: an automatic round's action the plans have not asked
// for long enough yet (Options.RebalanceSustain).
var errNotSustained = errors.New("rebalance: not asked for long enough yet")

// rebalanceRound plans from the current state and starts the plan's
// actions: all of them on demand, and in the automatic rounds (auto)
// those sustained. It returns the plan even when it started nothing.
func (m *Master) rebalanceRound(ctx context.Context, auto bool) roundResult {
	m.rebal.round.Lock()
	defer m.rebal.round.Unlock()
	st := m.State()
	now := m.opts.Now()
	res, refs := m.plan(st, now)
	out := roundResult{plan: res, refs: refs, version: st.Version, warm: m.load.warm(st)}
	ok := make([]bool, len(res.Actions))
	if auto {
		draining := func(id string) bool { srv := st.Servers[id]; return srv != nil && srv.Draining }
		ok = m.rebal.sustained(res.Actions, draining, now, m.opts.RebalanceSustain)
	}
	for i, a := range res.Actions {
		switch {
		case ctx.Err() != nil:
			out.errs = append(out.errs, ctx.Err())
		case auto && !ok[i]:
			out.errs = append(out.errs, errNotSustained)
		default:
			out.errs = append(out.errs, m.startAction(a, now))
		}
	}
	return out
}

// plan is the balancer's plan of st: the load view's snapshot, with the
// servers partitions left recently (hysteresis). If that plan is stuck
// outside the band with nothing to do, and hysteresis may be why, it is
// planned again without it: a server every partition left once (after
// an overshoot: a server declared dead and replaced, say) would
// otherwise stay out of the band for the whole cooldown. Noise cannot
// make that ping-pong: it happens only when nothing else improves.
func (m *Master) plan(st *State, now time.Time) (balance.Result, map[uint64]partRef) {
	snap, refs := m.load.snapshot(st)
	snap.Left = m.rebal.recentLeft(now)
	settling := m.rebal.settling(now)
	for i := range snap.Partitions {
		snap.Partitions[i].Settling = settling[snap.Partitions[i].ID]
	}
	res := balance.Plan(snap, m.opts.Balance)
	if len(res.Actions) == 0 && len(snap.Left) > 0 && !strings.HasPrefix(res.Note, "balanced") {
		snap.Left = nil
		if again := balance.Plan(snap, m.opts.Balance); len(again.Actions) > 0 {
			again.Note += " (planned without the recent moves' hysteresis: with it nothing improved)"
			return again, refs
		}
	}
	return res, refs
}

// startAction proposes a: its command, logged, events and all.
func (m *Master) startAction(a balance.Action, now time.Time) error {
	if _, pp := m.State().partition(a.Partition); pp != nil && pp.Merge != nil {
		return fmt.Errorf("rebalance: %v: partition %d is merging (its replicas align with its neighbour's)", a, a.Partition)
	}
	var p Payload
	switch a.Kind {
	case balance.TransferPrimary:
		p = TransferPrimary{PartitionID: a.Partition, ServerID: a.From, To: a.To}
	case balance.MoveReplica:
		p = MoveReplica{PartitionID: a.Partition, ServerID: a.From, To: a.To}
	default:
		return fmt.Errorf("rebalance: unknown action %v", a)
	}
	res, _, err := m.propose(Command{UnixMs: now.UnixMilli(), Payload: p}, nil, nil)
	if err != nil {
		return fmt.Errorf("rebalance: start %v: %w", a, err)
	}
	if !res.Changed {
		return fmt.Errorf("rebalance: %v changed nothing", a)
	}
	switch a.Kind {
	case balance.TransferPrimary:
		m.rebal.noteTransferred(a.Partition, now)
		m.logger.Info("tablemaster: balancing: primary transferred", "partition", a.Partition, "from", a.From, "to", a.To, "reason", a.Reason)
		m.event(EventTransfer, a.From, a.Partition, "partition %d: primary transferred %s -> %s (%s)", a.Partition, a.From, a.To, a.Reason)
	case balance.MoveReplica:
		m.rebal.noteLeft(a.Partition, a.From, now)
		m.logger.Info("tablemaster: balancing: moving a replica", "partition", a.Partition, "from", a.From, "to", a.To, "reason", a.Reason)
		m.event(EventMove, a.From, a.Partition, "partition %d: moving a replica %s -> %s to balance (%s)", a.Partition, a.From, a.To, a.Reason)
	}
	m.kickLogs()
	return nil
}

// rebalanceLoop runs balancing rounds while this master leads and
// Options.Rebalance is set: every RebalanceInterval, and at once when the
// live servers change. A replica its server has not reported yet keeps
// its partition where it is (load.go), so a round needs no warm-up.
func (m *Master) rebalanceLoop() {
	defer m.wg.Done()
	if !m.opts.Rebalance {
		return
	}
	t := time.NewTicker(m.opts.HeartbeatInterval)
	defer t.Stop()
	var last time.Time
	var servers string
	for {
		select {
		case <-m.closing:
			return
		case <-t.C:
		}
		if !m.leads() {
			servers = ""
			continue
		}
		st := m.State()
		now := m.opts.Now()
		ids := liveServerSet(st)
		if ids == servers && now.Sub(last) < m.opts.RebalanceInterval {
			continue
		}
		servers, last = ids, now
		r := m.rebalanceRound(m.streamCtx, true)
		for i, err := range r.errs {
			if err != nil && !errors.Is(err, ErrClosed) && !errors.Is(err, errNotSustained) && m.streamCtx.Err() == nil {
				m.logger.Debug("tablemaster: balancing: an action did not start", "action", r.plan.Actions[i].String(), "err", err)
			}
		}
	}
}

// liveServerSet names the live servers, for noticing a change.
func liveServerSet(st *State) string {
	var b strings.Builder
	for _, id := range st.ServerIDs() {
		if srv := st.Servers[id]; srv.Alive && !srv.Draining {
			b.WriteString(id)
			b.WriteByte(0)
		}
	}
	return b.String()
}

// balanceActionsProto converts a round's (or a plan's) actions; errs, when
// not nil, says which started.
func balanceActionsProto(acts []balance.Action, refs map[uint64]partRef, errs []error) []*api.BalanceAction {
	var out []*api.BalanceAction
	for i, a := range acts {
		ref := refs[a.Partition]
		kind := api.BalanceActionKind_BALANCE_ACTION_KIND_MOVE_REPLICA
		if a.Kind == balance.TransferPrimary {
			kind = api.BalanceActionKind_BALANCE_ACTION_KIND_TRANSFER_PRIMARY
		}
		ba := &api.BalanceAction{Kind: kind, PartitionId: a.Partition, Tenant: ref.tenant, Table: ref.table,
			Index: ref.index, From: a.From, To: a.To, Reason: a.Reason}
		if errs != nil {
			if errs[i] == nil {
				ba.Started = true
			} else {
				ba.Refused = errs[i].Error()
			}
		}
		out = append(out, ba)
	}
	return out
}
