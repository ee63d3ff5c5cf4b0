package tablemaster

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
)

// handoffState has servers a-d in their own fault domains and point table
// default/t with one partition of 3 replicas, its log allocated.
func handoffState(t *testing.T) (*State, uint64) {
	t.Helper()
	s := NewState()
	mustApply(t, s,
		Command{Payload: CreateTenant{Tenant: "default"}},
		register("a", "a:1", "fa"), register("b", "b:1", "fb"), register("c", "c:1", "fc"), register("d", "d:1", "fd"),
		Command{UnixMs: 1, Payload: CreateTable{Tenant: "default", Table: "t", Kind: point, Options: &TableOptions{Partitions: 1, Replication: 3, Storage: StorageMemory}}},
	)
	p := s.Tables["default/t"].Partitions[0]
	mustApply(t, s, Command{Payload: PartitionLogAllocated{PartitionID: p.ID, Epoch: p.Epoch, Servers: serversOf(&p), Extent: 7}})
	return s, p.ID
}

func partOf(s *State, pid uint64) Partition {
	_, p := s.partition(pid)
	return *p
}

func spare(p Partition) string {
	for _, id := range []string{"a", "b", "c", "d"} {
		if !hostsReplica(&p, id) {
			return id
		}
	}
	return ""
}

// TestHandoffFencesLivePrimaryChanges: every path that moves a primary off
// a live server fences the new term with the old primary and the demoting
// map version (one mechanism: State.apply's comparison); a death does not,
// nor a change that keeps the primary.
func TestHandoffFencesLivePrimaryChanges(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cmds  func(p Partition) []Command
		fence bool
	}{
		{"drain (tabula server drain)", func(p Partition) []Command {
			return []Command{{Payload: ServerDown{ServerID: primaryID(&p), Draining: true, Keep: true}}}
		}, true},
		{"SIGTERM: a draining heartbeat, replicas dropped (no ReplaceAfter)", func(p Partition) []Command {
			return []Command{{Payload: ServerDown{ServerID: primaryID(&p), Draining: true}}}
		}, true},
		{"move of the primary done", func(p Partition) []Command {
			to := spare(p)
			return []Command{{Payload: MoveReplica{PartitionID: p.ID, ServerID: primaryID(&p), To: to}}, {Payload: MoveDone{PartitionID: p.ID, ServerID: primaryID(&p), To: to}}}
		}, true},
		{"placement after the primary's engine failed", func(p Partition) []Command {
			return []Command{{Payload: ReplicaFailed{PartitionID: p.ID, ServerID: primaryID(&p)}}}
		}, true},
		{"death (after DeadAfter), kept replicas", func(p Partition) []Command {
			return []Command{{Payload: ServerDown{ServerID: primaryID(&p), Keep: true}}}
		}, false},
		{"death, replicas dropped", func(p Partition) []Command {
			return []Command{{Payload: ServerDown{ServerID: primaryID(&p)}}}
		}, false},
		{"a secondary drains", func(p Partition) []Command {
			return []Command{{Payload: ServerDown{ServerID: p.Replicas[1].ServerID, Draining: true, Keep: true}}}
		}, false},
		{"move of a secondary done", func(p Partition) []Command {
			to := spare(p)
			return []Command{{Payload: MoveReplica{PartitionID: p.ID, ServerID: p.Replicas[1].ServerID, To: to}}, {Payload: MoveDone{PartitionID: p.ID, ServerID: p.Replicas[1].ServerID, To: to}}}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, pid := handoffState(t)
			before := partOf(s, pid)
			old := primaryID(&before)
			// Proposed (copy on write) and replayed (in place) must agree.
			replay := s.Clone()
			cur := s
			for _, c := range tc.cmds(before) {
				next, _, logged, err := successor(cur, c)
				if err != nil {
					t.Fatalf("%s: %v", c.Op(), err)
				}
				if _, err := replay.ApplyLogged(logged); err != nil {
					t.Fatalf("replay %s: %v", c.Op(), err)
				}
				cur = next
			}
			p := partOf(cur, pid)
			if a, b := mustJSON(t, p), mustJSON(t, partOf(replay, pid)); a != b {
				t.Fatalf("proposal and replay differ:\n%s\n%s", a, b)
			}
			switch {
			case !tc.fence && p.Handoff != nil:
				t.Fatalf("fenced: %+v", p.Handoff)
			case !tc.fence:
				return
			case p.Handoff == nil:
				t.Fatalf("primary %s -> %s (epoch %d -> %d) unfenced", old, primaryID(&p), before.Epoch, p.Epoch)
			case p.Handoff.From != old || p.Handoff.Version != cur.Version:
				t.Fatalf("handoff %+v, want from %s at version %d", p.Handoff, old, cur.Version)
			case p.Epoch != before.Epoch+1 || primaryID(&p) == old:
				t.Fatalf("primary %s epoch %d after, want a new primary at epoch %d", primaryID(&p), p.Epoch, before.Epoch+1)
			}
			if got := p.Proto().GetHandoffFrom(); got != old {
				t.Fatalf("wire handoff_from %q, want %q", got, old)
			}
			// Clearing: only the handoff named (by version) goes.
			v := cur.Version
			if res := mustApply(t, cur.Clone(), Command{Payload: HandoffDone{Handoffs: map[uint64]uint64{pid: p.Handoff.Version - 1}}}); res.Changed {
				t.Fatal("OpHandoffDone for another version changed the state")
			}
			next, res, _, err := successor(cur, Command{Payload: HandoffDone{Handoffs: map[uint64]uint64{pid: p.Handoff.Version}}})
			if err != nil || !res.Changed || partOf(next, pid).Handoff != nil || next.Version != v+1 {
				t.Fatalf("OpHandoffDone: %v, changed %v, handoff %+v, version %d (want %d)", err, res.Changed, partOf(next, pid).Handoff, next.Version, v+1)
			}
			if partOf(cur, pid).Handoff == nil {
				t.Fatal("OpHandoffDone modified the published state")
			}
		})
	}
}

// TestHandoffChains: a primary fenced and moved again keeps the first old
// primary's fence (the one in between never served); moving back to the
// old primary lifts it.
func TestHandoffChains(t *testing.T) {
	s, pid := handoffState(t)
	p := partOf(s, pid)
	a := primaryID(&p)
	mustApply(t, s, Command{Payload: ServerDown{ServerID: a, Draining: true, Keep: true}})
	p = partOf(s, pid)
	first := *p.Handoff
	b := primaryID(&p)
	to := spare(p)
	mustApply(t, s, Command{Payload: MoveReplica{PartitionID: pid, ServerID: b, To: to}}, Command{Payload: MoveDone{PartitionID: pid, ServerID: b, To: to}})
	p = partOf(s, pid)
	if primaryID(&p) != to || p.Handoff == nil || *p.Handoff != first {
		t.Fatalf("after a second handoff %s -> %s: primary %s, handoff %+v, want %+v", b, to, primaryID(&p), p.Handoff, first)
	}
	// a comes back and takes the role again: nobody else served.
	mustApply(t, s, register(a, a+":1", "f"+a))
	if !hostsReplica(new(partOf(s, pid)), a) {
		t.Fatalf("the drained %s kept no replica", a)
	}
	mustApply(t, s, Command{Payload: ServerDown{ServerID: to, Draining: true, Keep: true, Promote: map[uint64]string{pid: a}}})
	if p = partOf(s, pid); primaryID(&p) != a || p.Handoff != nil {
		t.Fatalf("back on %s: primary %s, handoff %+v, want none", a, primaryID(&p), p.Handoff)
	}
}

// TestHandoffOldStatesReplay: a snapshot or command from before handoffs
// decodes with no fence, and a state's JSON round-trips its fence.
func TestHandoffOldStatesReplay(t *testing.T) {
	var p Partition
	if err := json.Unmarshal([]byte(`{"id":1,"epoch":3,"replicas":[{"server_id":"a","role":1}]}`), &p); err != nil || p.Handoff != nil {
		t.Fatalf("old partition: %+v, %v", p.Handoff, err)
	}
	s, pid := handoffState(t)
	mustApply(t, s, Command{Payload: ServerDown{ServerID: primaryID(new(partOf(s, pid))), Draining: true, Keep: true}})
	var back State
	if err := json.Unmarshal([]byte(mustJSON(t, s)), &back); err != nil {
		t.Fatal(err)
	}
	if h := partOf(&back, pid).Handoff; h == nil || *h != *partOf(s, pid).Handoff {
		t.Fatalf("handoff after a JSON round trip: %+v", h)
	}
}

func TestHandoffWait(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	g := LeaseGate{DeadAfter: DefaultDeadAfter}
	lease := DefaultLeaseDuration
	w := HandoffWait(lease)
	// A lease counted on a clock 1% slow, from before since, ends before a
	// master clock 1% fast reads since+w.
	if real := float64(lease) / (1 - MaxClockRateError); float64(w)/(1+MaxClockRateError) <= real {
		t.Fatalf("HandoffWait(%v) = %v: a lease may run %v of true time, the wait only %v", lease, w, time.Duration(real), time.Duration(float64(w)/(1+MaxClockRateError)))
	}
	if w > lease*103/100 {
		t.Fatalf("HandoffWait(%v) = %v: more margin than the clocks need", lease, w)
	}
	if g.HandoffOver(t0, t0.Add(w), lease) || !g.HandoffOver(t0, t0.Add(w+time.Millisecond), lease) {
		t.Fatal("HandoffOver is not now-since > HandoffWait")
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestHandoffLifted: the leader's liveness loop lifts a live handoff's
// fence once the old primary reports the demoting map, says it shuts
// down, or its lease has provably run out — and not before.
func TestHandoffLifted(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		sigterm bool
		lift    func(t *testing.T, m *Master, clock *fakeClock, ids []string, old string, p Partition)
	}{
		{"the old primary reports the demoting map", false, func(t *testing.T, m *Master, _ *fakeClock, _ []string, old string, p Partition) {
			report(t, m, old, p, api.ReplicaState_REPLICA_STATE_IN_SYNC, m.State().Version)
		}},
		{"the old primary's lease runs out", false, func(t *testing.T, m *Master, clock *fakeClock, ids []string, _ string, p Partition) {
			clock.Advance(HandoffWait(m.opts.LeaseDuration))
			m.checkLiveness()
			if partOf(m.State(), p.ID).Handoff == nil {
				t.Fatal("lifted at HandoffWait, before the old lease provably ran out")
			}
			clock.Advance(time.Millisecond)
		}},
		{"the old primary shuts down (SIGTERM)", true, func(*testing.T, *Master, *fakeClock, []string, string, Partition) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, ids, clock := healCluster(t, Options{})
			p := healPartition(t, m)
			old := primaryID(&p)
			v0 := m.State().Version
			for _, id := range ids {
				report(t, m, id, p, api.ReplicaState_REPLICA_STATE_IN_SYNC, v0) // every server on the map before the handoff
			}
			if tc.sigterm {
				if _, err := m.Heartbeat(ctx, &api.HeartbeatRequest{ServerId: old, Draining: true, ReplicasOmitted: true}); err != nil {
					t.Fatal(err)
				}
			} else if _, err := m.DrainServer(ctx, &api.DrainServerRequest{ServerId: old}); err != nil {
				t.Fatal(err)
			}
			h := partOf(m.State(), p.ID).Handoff
			if h == nil || h.From != old {
				t.Fatalf("after the drain: handoff %+v, want from %s", h, old)
			}
			if !tc.sigterm {
				// A report from before the demoting map is no ack.
				report(t, m, old, p, api.ReplicaState_REPLICA_STATE_IN_SYNC, h.Version-1)
				m.checkLiveness()
				if partOf(m.State(), p.ID).Handoff == nil {
					t.Fatal("lifted with no ack and the old lease still running")
				}
			}
			tc.lift(t, m, clock, ids, old, p)
			m.checkLiveness()
			q := partOf(m.State(), p.ID)
			if q.Handoff != nil {
				t.Fatalf("still fenced: %+v", q.Handoff)
			}
			if primaryID(&q) == old || q.Epoch != p.Epoch+1 {
				t.Fatalf("primary %s at epoch %d after, want another at epoch %d", primaryID(&q), q.Epoch, p.Epoch+1)
			}
		})
	}
}

// TestMoveTargetIsNeverTheSource: a move with no target named picks a
// server that holds no replica of the partition, whichever replica moves
// (the source, holding the fewest replicas, used to be picked and the move
// refused has_replica).
func TestMoveTargetIsNeverTheSource(t *testing.T) {
	s, pid := handoffState(t)
	// Another table piles onto d and two of a, b, c: the third of them
	// then ties d for the fewest replicas and sorts before it.
	mustApply(t, s, Command{UnixMs: 1, Payload: CreateTable{Tenant: "default", Table: "u", Kind: point, Options: &TableOptions{Partitions: 1, Replication: 3, Storage: StorageMemory}}})
	p := partOf(s, pid)
	for _, r := range p.Replicas {
		next := s.Clone()
		res, err := next.Apply(Command{Payload: MoveReplica{PartitionID: pid, ServerID: r.ServerID}})
		if err != nil {
			t.Fatalf("move from %s with no target: %v", r.ServerID, err)
		}
		np := partOf(next, pid)
		if !res.Changed || np.Move == nil || np.Move.To != spare(p) {
			t.Fatalf("move from %s: changed %v, move %+v, want a move to %s", r.ServerID, res.Changed, np.Move, spare(p))
		}
	}
}
