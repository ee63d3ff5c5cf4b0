package raftnode_test

// The lease simulation: 3 or 5 master members (the real raftnode core,
// through export_test.go, on the in-memory Network) replicate a map of
// partition assignments (primary server and epoch per partition); table
// servers heartbeat to whichever member they believe leads and serve a
// partition as primary only while their lease holds — the very
// tableserver.Lease the binary uses — and their map says they are its
// primary; the leader declares servers dead with the very
// tablemaster.LeaseGate the master uses and moves their partitions at a
// new epoch; the leader also hands primaries off live servers (drains,
// moves, placement: tablemaster's live handoffs), whose new terms stay
// fenced until the old primary reported the demoting map or the gate says
// its lease ran out (LeaseGate.HandoffOver), while servers' heartbeats and
// map watches are slowed. Every node runs on its own skewed clock (rate within ±1%, an
// offset); members crash (losing what was not fsynced) and restart,
// pause (a SIGSTOP: no ticks, messages held) and resume, transfer
// leadership; servers crash and restart; the network partitions, drops,
// delays and reorders. Everything is drawn from one seed.
//
// Checked at every simulated millisecond: at most one server serves each
// partition as primary, and no epoch of a partition is ever served by two
// servers. At the end (faults healed, every member caught up): every
// member applied the same sequence (checked at every apply, by index, as
// it happens), and every command a client saw committed is in it.
//
// It lives in package raftnode_test because it imports tablemaster and
// tableserver, and tablemaster imports raftnode: export_test.go lends it
// the package's deterministic core. Times are the product's defaults
// divided by timeScale, so the margins between them are the product's.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tabuladb/tabula/engines/vfs"
	"github.com/tabuladb/tabula/tablemaster"
	"github.com/tabuladb/tabula/tablemaster/raftnode"
	"github.com/tabuladb/tabula/tableserver"
	"go.etcd.io/raft/v3/raftpb"
)

var (
	leaseScenarios = flag.Int("leasesim.scenarios", 0, "scenarios per group size in TestLeaseSimulation (default 1000; 60 with -short, 25 with -race)")
	leaseSeed      = flag.Uint64("leasesim.seed", 0, "run only the TestLeaseSimulation scenario with this seed")
	leaseFirst     = flag.Int("leasesim.first", 0, "number of the first scenario (seeds are members×10⁶ + number)")
	leaseVerbose   = flag.Bool("leasesim.v", false, "print every scenario's trace")
)

// The product's timing (tablemaster defaults), scaled down.
const (
	timeScale     = 5
	raftTick      = 50 * time.Millisecond / timeScale
	electionTicks = 10
	leaseDur      = tablemaster.DefaultLeaseDuration / timeScale
	deadAfter     = tablemaster.DefaultDeadAfter / timeScale
	beatInterval  = tablemaster.DefaultHeartbeatInterval / timeScale
	maxDriftPPM   = 10_000 // ±1%
	numServers    = 4
	numParts      = 4
	faultSteps    = 2000 // ms of faults per scenario: 20 election timeouts
)

var epoch0 = time.Unix(1_700_000_000, 0)

// clock is a node's clock: offset + global time × (1 + ppm/10⁶).
type clock struct {
	offset time.Duration
	ppm    int64
}

func (c clock) at(now time.Duration) time.Duration {
	return c.offset + now + time.Duration(int64(now)*c.ppm/1_000_000)
}

// ---- the replicated state machine ----

type assignment struct {
	Primary int // server index; -1: none
	Epoch   uint64
	// Fence is 1 + the old primary of a live handoff pending (0: none),
	// FenceV the map version that demoted it (tablemaster.Handoff): the
	// primary serves only once it is lifted.
	Fence  int    `json:",omitempty"`
	FenceV uint64 `json:",omitempty"`
}

type logItem struct {
	Index uint64
	Data  string
}

type mapState struct {
	Version uint64
	Alive   []bool
	Parts   []assignment
	Log     []logItem // every command applied, in order
}

func initialState() mapState {
	st := mapState{Version: 1, Alive: make([]bool, numServers), Parts: make([]assignment, numParts)}
	for i := range st.Alive {
		st.Alive[i] = true
	}
	for p := range st.Parts {
		st.Parts[p] = assignment{Primary: p % numServers, Epoch: 1}
	}
	return st
}

func (st *mapState) clone() mapState {
	return mapState{Version: st.Version, Alive: slices.Clone(st.Alive), Parts: slices.Clone(st.Parts)}
}

// newTerm gives partition p to server next (-1: none) at a new epoch,
// fenced as tablemaster's State.fenceTerm fences it: a primary moved off a
// live server waits; a fence pending stays (the primary in between never
// served) unless the role goes back to its old primary.
func (st *mapState) newTerm(p, next int, noFence bool) {
	a := st.Parts[p]
	from := a.Primary
	a.Primary, a.Epoch = next, a.Epoch+1
	switch {
	case a.Fence != 0:
		if next == a.Fence-1 {
			a.Fence, a.FenceV = 0, 0
		}
	case from >= 0 && st.Alive[from] && !noFence:
		a.Fence, a.FenceV = from+1, st.Version+1 // the version this command makes
	}
	st.Parts[p] = a
}

// nextLive is the first live server after s (cyclically) other than s.
func (st *mapState) nextLive(s int) int {
	for k := 1; k < numServers; k++ {
		if c := (s + k) % numServers; st.Alive[c] {
			return c
		}
	}
	return -1
}

// apply applies a logged command: "dS" (down) declares server S dead and
// moves each partition it leads to the next live server at a new epoch;
// "uS" (up) brings S back and gives it the partitions without a primary;
// "mP" (move) hands partition P's primary role to the next live server,
// and "rS" (drain) every primary role of S (live handoffs: fenced);
// "kP:V" lifts P's fence if it is the one of map version V; "cN" is a
// client's command.
func (st *mapState) apply(index uint64, cmd string, noFence bool) {
	st.Log = append(st.Log, logItem{index, cmd})
	if len(cmd) > 2 && cmd[0] == 'k' {
		var p int
		var v uint64
		if _, err := fmt.Sscanf(cmd, "k%d:%d", &p, &v); err == nil && st.Parts[p].Fence != 0 && st.Parts[p].FenceV == v {
			st.Parts[p].Fence, st.Parts[p].FenceV = 0, 0
			st.Version++
		}
		return
	}
	if len(cmd) != 2 {
		return
	}
	s := int(cmd[1] - '0')
	switch cmd[0] {
	case 'm':
		if a := st.Parts[s]; a.Primary >= 0 && st.Alive[a.Primary] {
			if next := st.nextLive(a.Primary); next >= 0 {
				st.newTerm(s, next, noFence)
				st.Version++
			}
		}
	case 'r':
		if !st.Alive[s] {
			return
		}
		moved := false
		for p, a := range st.Parts {
			if a.Primary == s {
				if next := st.nextLive(s); next >= 0 {
					st.newTerm(p, next, noFence)
					moved = true
				}
			}
		}
		if moved {
			st.Version++
		}
	case 'd':
		if !st.Alive[s] {
			return
		}
		st.Alive[s] = false
		for p, a := range st.Parts {
			if a.Primary == s {
				st.newTerm(p, st.nextLive(s), noFence)
			}
		}
		st.Version++
	case 'u':
		if st.Alive[s] {
			return
		}
		st.Alive[s] = true
		for p, a := range st.Parts {
			if a.Primary < 0 {
				st.newTerm(p, s, noFence)
			}
		}
		st.Version++
	}
}

type assignSM struct {
	s  *leaseSim
	id uint64
	st mapState
}

func (m *assignSM) Apply(index uint64, data []byte) any {
	if n := len(m.st.Log); n > 0 && index <= m.st.Log[n-1].Index {
		m.s.failf("member %d applied index %d after %d", m.id, index, m.st.Log[n-1].Index)
	}
	if prev, ok := m.s.applied[index]; ok && prev != string(data) {
		m.s.failf("member %d applied %q at %d; another member applied %q there", m.id, data, index, prev)
	}
	m.s.applied[index] = string(data)
	m.st.apply(index, string(data), m.s.noFence)
	return m.st.Version
}

func (m *assignSM) Snapshot() ([]byte, error) { return json.Marshal(m.st) }

func (m *assignSM) Restore(data []byte) error {
	m.st = mapState{}
	return json.Unmarshal(data, &m.st)
}

// ---- members ----

type member struct {
	id     uint64
	fs     *vfs.MemFS
	c      *raftnode.SimCore // nil while down
	sm     *assignSM
	clk    clock
	paused time.Duration // global time it resumes; 0: running
	held   []func()      // deliveries held while paused

	nextTick, nextCheck time.Duration // local
	// The master's leader side (tablemaster/raft.go, master.go).
	leading  bool // caught up as the leader of leadTerm
	leadTerm uint64
	// confirmed: when (local) a quorum last confirmed this leadership
	// (LeaseGate.MayGrant); one asked at confirmAsked is in flight while
	// confirmBusy (confirmGen tells a late answer from the current one).
	confirmed    time.Time
	confirmAsked time.Time
	confirmBusy  bool
	confirmGen   uint64
	nextConfirm  time.Duration
	heard        []time.Time
	dead         []bool
	// Live handoffs (tablemaster/handoff.go): the map version each server
	// last reported, when this leader first saw each fence (by partition
	// and version), the floor none counts from (its takeover), and the
	// lifts proposed.
	reported   []uint64
	fenceSeen  map[[2]uint64]time.Time
	fenceFloor time.Time
	liftBusy   map[[2]uint64]bool
	downBusy   []bool
	actions    []func() // to run after the current Ready
	// liveQ runs liveness decisions (declare dead, register) one at a
	// time, each validated against the state when it runs, as the
	// master's proposeMu serialises its proposals.
	liveQ    []func(done func())
	liveBusy bool
}

func (m *member) local(now time.Duration) time.Time { return epoch0.Add(m.clk.at(now)) }

// ---- table servers ----

type server struct {
	idx       int
	clk       clock
	up        bool
	paused    time.Duration
	lease     *tableserver.Lease
	mapV      uint64
	parts     []assignment
	master    uint64 // the member it asks first
	grantedBy uint64 // the member that last renewed its lease
	// slowUntil: its heartbeats and map watch take slowBy longer each
	// way until then (global time).
	slowUntil, slowBy time.Duration

	register        bool // its next beat is a registration
	beating         bool
	beatSent        time.Duration // local: the lease runs from here
	beatDeadline    time.Duration
	attempt         uint64
	attemptDeadline time.Duration
	nextBeat        time.Duration
	nextWatch       time.Duration
}

// reply is a member's answer to a heartbeat or registration.
type reply struct {
	notLeader  bool
	hint       uint64
	reregister bool
	mapVersion uint64
	lease      time.Duration
}

// ---- the simulation ----

type event struct {
	at  time.Duration
	seq uint64
	to  int // member id, or 100 + server index
	fn  func()
}

type leaseSim struct {
	t       testing.TB
	seed    uint64
	rng     *rand.Rand
	net     *raftnode.Network
	now     time.Duration
	faults  raftnode.NetworkFaults
	group   map[int]int // node → partition group
	events  []*event
	seq     uint64
	members []*member // by id - 1
	servers []*server
	gate    tablemaster.LeaseGate

	applied  map[uint64]string // index → data, as first applied anywhere
	acked    map[uint64]string
	proposed int
	// serving: (partition, epoch) → the server that served it.
	served   map[[2]uint64]int
	servings int // server-milliseconds of primary service
	trace    []string
	failed   bool
	stats    leaseStats
	// noFence: live handoffs are not fenced (the bug the fence fixes;
	// TestLeaseSimulationCatchesUnfencedHandoffs).
	noFence bool
}

type leaseStats struct {
	crashes, pauses, serverCrashes, partitions, transfers, declaredDead, epochs, leaderTerms int
	handoffs, fencesLifted, slowServers                                                      int
}

func (s *leaseSim) failf(format string, args ...any) {
	if !s.failed {
		s.failed = true
		s.t.Errorf("seed %d (rerun: go test ./tablemaster/raftnode -run TestLeaseSimulation -leasesim.seed=%d -leasesim.v): %s\ntrace (last 60):\n%s",
			s.seed, s.seed, fmt.Sprintf(format, args...), strings.Join(s.trace[max(0, len(s.trace)-60):], "\n"))
	}
}

func (s *leaseSim) logf(format string, args ...any) {
	s.trace = append(s.trace, fmt.Sprintf("%8v ", s.now)+fmt.Sprintf(format, args...))
}

func newLeaseSim(t testing.TB, seed uint64, members int, noFence bool) *leaseSim {
	s := &leaseSim{
		t: t, seed: seed, noFence: noFence, rng: rand.New(rand.NewPCG(seed, 17)), net: raftnode.NewNetwork(seed),
		group: map[int]int{}, applied: map[uint64]string{}, acked: map[uint64]string{}, served: map[[2]uint64]int{},
		gate: tablemaster.RaftLeaseGate(deadAfter, electionTicks*raftTick),
	}
	if err := s.gate.Check(leaseDur); err != nil {
		t.Fatal(err)
	}
	drift := func() clock {
		return clock{offset: time.Duration(s.rng.Int64N(int64(time.Hour))), ppm: s.rng.Int64N(2*maxDriftPPM+1) - maxDriftPPM}
	}
	peers := map[uint64]string{}
	for id := uint64(1); id <= uint64(members); id++ {
		peers[id] = fmt.Sprintf("m%d", id)
	}
	for id := uint64(1); id <= uint64(members); id++ {
		m := &member{id: id, fs: vfs.NewMem(), clk: drift()}
		s.members = append(s.members, m)
		s.startMember(m, peers)
	}
	for i := range numServers {
		v := &server{idx: i, clk: drift(), master: 1 + uint64(s.rng.IntN(members))}
		s.servers = append(s.servers, v)
		s.startServer(v, false)
	}
	return s
}

// memberHandler receives the Network's deliveries for one member.
type memberHandler struct {
	s *leaseSim
	m *member
}

func (h memberHandler) Step(_ context.Context, msg raftpb.Message) error {
	if h.m.c == nil {
		return raftnode.ErrStopped
	}
	h.s.deliver(h.m, func() { h.m.c.Step(msg) })
	return nil
}

func (h memberHandler) ReportUnreachable(id uint64) {
	h.s.deliver(h.m, func() { h.m.c.ReportUnreachable(id) })
}

func (h memberHandler) ReportSnapshot(id uint64, failed bool) {
	h.s.deliver(h.m, func() { h.m.c.ReportSnapshot(id, failed) })
}

// deliver runs f on member m now, or when it resumes if it is paused.
func (s *leaseSim) deliver(m *member, f func()) {
	if m.c == nil {
		return
	}
	if m.paused != 0 {
		m.held = append(m.held, f)
		return
	}
	f()
	s.ready(m)
}

func (s *leaseSim) startMember(m *member, peers map[uint64]string) {
	st, err := raftnode.OpenStorage(m.fs, "/raft", nil)
	if err != nil {
		s.failf("member %d: open storage: %v", m.id, err)
		return
	}
	m.sm = &assignSM{s: s, id: m.id, st: initialState()}
	m.fenceSeen, m.liftBusy = nil, nil
	ep := s.net.Endpoint(m.id)
	c, err := raftnode.NewSimCore(raftnode.SimCoreConfig{
		ID: m.id, ElectionTicks: electionTicks, SnapshotEvery: 20 + s.rng.Uint64N(40), KeepEntries: s.rng.Uint64N(10),
		Incarnation: s.rng.Uint32(), Transport: ep,
		OnLeaderChange: func(lc raftnode.LeaderChange) { s.onLeaderChange(m, lc) },
	}, st, m.sm, peers)
	if err != nil {
		s.failf("member %d: start: %v", m.id, err)
		return
	}
	m.c, m.paused, m.held, m.leading, m.actions = c, 0, nil, false, nil
	m.confirmed, m.confirmBusy, m.liveQ, m.liveBusy = time.Time{}, false, nil, false
	m.nextTick, m.nextCheck = m.clk.at(s.now), m.clk.at(s.now)
	ep.Attach(memberHandler{s, m})
	s.logf("member %d: started, applied %d", m.id, c.Applied())
	s.ready(m)
}

func (s *leaseSim) ready(m *member) {
	for m.c != nil {
		if err := m.c.Ready(); err != nil {
			s.failf("member %d: %v", m.id, err)
			return
		}
		if len(m.actions) == 0 {
			return
		}
		acts := m.actions
		m.actions = nil
		for _, a := range acts {
			a()
		}
	}
}

func (s *leaseSim) crashMember(m *member) {
	if m.c == nil {
		return
	}
	_ = m.c.Close()
	m.c, m.leading, m.held, m.paused = nil, false, nil, 0
	s.net.Endpoint(m.id).Attach(nil)
	m.fs.Crash()
	s.stats.crashes++
	s.logf("member %d: crash", m.id)
}

// onLeaderChange is tablemaster's onLeaderChange and becomeLeader: a new
// leader first applies everything earlier leaders committed (ReadIndex),
// then counts every live server as heard at TakeoverHeard.
func (s *leaseSim) onLeaderChange(m *member, lc raftnode.LeaderChange) {
	s.logf("member %d: term %d leader %d", m.id, lc.Term, lc.Leader)
	if !lc.IsLeader {
		m.leading, m.confirmed = false, time.Time{}
		return
	}
	term := lc.Term
	m.actions = append(m.actions, func() {
		asked := m.local(s.now)
		m.c.ReadIndex(func(_ uint64, _ any, err error) {
			if err != nil || m.c == nil || !m.c.Leading() || m.c.Term() != term {
				return
			}
			m.confirmed = asked
			now := m.local(s.now)
			heard := s.gate.TakeoverHeard(now)
			m.heard, m.dead, m.downBusy = make([]time.Time, numServers), make([]bool, numServers), make([]bool, numServers)
			for i, alive := range m.sm.st.Alive {
				if alive {
					m.heard[i] = heard
				}
			}
			// becomeLeader's resetHandoffClocks: fences count from the
			// takeover; no server has reported to this leader yet.
			m.reported, m.fenceSeen, m.fenceFloor, m.liftBusy = make([]uint64, numServers), map[[2]uint64]time.Time{}, heard, map[[2]uint64]bool{}
			m.leading, m.leadTerm, m.nextConfirm = true, term, m.clk.at(s.now)
			s.stats.leaderTerms++
			s.logf("member %d: leading term %d at map version %d", m.id, term, m.sm.st.Version)
		})
	})
}

// checkLiveness is tablemaster's checkLiveness: every live server silent
// past DeadAfter is marked dead (its heartbeats renew nothing from then)
// and declared dead through the log.
func (s *leaseSim) checkLiveness(m *member) {
	now := m.local(s.now)
	for i, alive := range m.sm.st.Alive {
		if !alive || m.downBusy[i] || (!m.dead[i] && !s.gate.Dead(m.heard[i], now)) {
			continue
		}
		m.downBusy[i] = true
		s.serialise(m, func(done func()) {
			// stillSilent: checked again when its turn comes.
			if !m.leading || !m.sm.st.Alive[i] || (!m.dead[i] && !s.gate.Dead(m.heard[i], now)) {
				m.downBusy[i] = false
				done()
				return
			}
			m.dead[i] = true
			s.logf("member %d: declares server %d dead (heard %v ago)", m.id, i, now.Sub(m.heard[i]))
			m.c.Propose([]byte{'d', byte('0' + i)}, func(_ uint64, _ any, err error) {
				m.downBusy[i] = false
				if err == nil {
					s.stats.declaredDead++
				}
				done()
			})
		})
	}
}

// liftFences is tablemaster's clearHandoffs: the leader lifts a live
// handoff's fence once its old primary reported a map at least as new as
// the demoting one, is dead, or its lease has provably run out
// (LeaseGate.HandoffOver, counted from when this leader first saw the
// fence, or its takeover if later).
func (s *leaseSim) liftFences(m *member) {
	now := m.local(s.now)
	st := &m.sm.st
	for p, a := range st.Parts {
		if a.Fence == 0 {
			continue
		}
		k := [2]uint64{uint64(p), a.FenceV}
		since, ok := m.fenceSeen[k]
		if !ok {
			since = now
			m.fenceSeen[k] = now
		}
		if m.fenceFloor.After(since) {
			since = m.fenceFloor
		}
		from := a.Fence - 1
		acked := !m.dead[from] && m.reported[from] >= a.FenceV
		if m.liftBusy[k] || !(!st.Alive[from] || acked || s.gate.HandoffOver(since, now, leaseDur)) {
			continue
		}
		m.liftBusy[k] = true
		s.logf("member %d: lifts partition %d's fence v%d (old primary %d: alive %v, reported v%d, seen %v ago)", m.id, p, a.FenceV, from, st.Alive[from], m.reported[from], now.Sub(since))
		c := m.c
		m.c.Propose(fmt.Appendf(nil, "k%d:%d", p, a.FenceV), func(_ uint64, _ any, err error) {
			if m.c == c {
				delete(m.liftBusy, k)
			}
			if err == nil {
				s.stats.fencesLifted++
			}
		})
	}
}

// serialise runs job after the liveness jobs queued before it.
func (s *leaseSim) serialise(m *member, job func(done func())) {
	m.liveQ = append(m.liveQ, job)
	s.pump(m)
}

func (s *leaseSim) pump(m *member) {
	if m.liveBusy || len(m.liveQ) == 0 || m.c == nil {
		return
	}
	job := m.liveQ[0]
	m.liveQ = m.liveQ[1:]
	m.liveBusy = true
	c := m.c
	job(func() {
		if m.c != c {
			return // the member restarted meanwhile
		}
		m.liveBusy = false
		m.actions = append(m.actions, func() { s.pump(m) })
	})
}

// confirmLeadership is tablemaster's confirmLeadership: a ReadIndex every
// quarter of the gate's Confirm window (one in flight; given up after
// the window), recording when it was asked.
func (s *leaseSim) confirmLeadership(m *member) {
	local := m.clk.at(s.now)
	if local < m.nextConfirm {
		return
	}
	m.nextConfirm = local + s.gate.Confirm/4
	now := m.local(s.now)
	if m.confirmBusy && now.Sub(m.confirmAsked) <= s.gate.Confirm {
		return
	}
	m.confirmGen++
	gen, asked, term := m.confirmGen, now, m.leadTerm
	m.confirmBusy, m.confirmAsked = true, asked
	m.c.ReadIndex(func(_ uint64, _ any, err error) {
		if m.confirmGen != gen {
			return
		}
		m.confirmBusy = false
		if err == nil && m.c != nil && m.leading && m.c.Leading() && m.c.Term() == term {
			m.confirmed = asked
		}
	})
}

// refuseLease is tablemaster's mayGrantLease: a leader whose leadership is
// not freshly confirmed renews no lease (UNAVAILABLE: the server tries the
// next member).
func (s *leaseSim) refuseLease(m *member, answer func(reply)) bool {
	if !m.leading {
		answer(reply{notLeader: true, hint: m.c.Lead()})
		return true
	}
	if !s.gate.MayGrant(m.confirmed, m.local(s.now)) {
		answer(reply{notLeader: true})
		return true
	}
	return false
}

// heartbeat is tablemaster's Heartbeat on member m; mapV is the map
// version the server built it from (HeartbeatRequest.map_version).
func (s *leaseSim) heartbeat(m *member, srv int, mapV uint64, answer func(reply)) {
	if s.refuseLease(m, answer) {
		return
	}
	st := &m.sm.st
	if !st.Alive[srv] || m.dead[srv] {
		answer(reply{reregister: true, mapVersion: st.Version})
		return
	}
	m.heard[srv] = m.local(s.now)
	m.reported[srv] = mapV
	answer(reply{mapVersion: st.Version, lease: leaseDur})
}

// registerServer is tablemaster's RegisterServer on member m: a dead
// server comes back through the log; the answer carries the map version
// after it.
func (s *leaseSim) registerServer(m *member, srv int, answer func(reply)) {
	if s.refuseLease(m, answer) {
		return
	}
	term := m.leadTerm
	s.serialise(m, func(done func()) {
		switch {
		case !m.leading || m.leadTerm != term:
			answer(reply{notLeader: true, hint: m.c.Lead()})
			done()
			return
		case m.sm.st.Alive[srv] && !m.dead[srv]:
			m.heard[srv] = m.local(s.now)
			answer(reply{mapVersion: m.sm.st.Version, lease: leaseDur})
			done()
			return
		}
		m.c.Propose([]byte{'u', byte('0' + srv)}, func(_ uint64, v any, err error) {
			defer done()
			if err != nil || !m.leading || m.leadTerm != term {
				return
			}
			m.dead[srv] = false
			m.heard[srv] = m.local(s.now)
			answer(reply{mapVersion: v.(uint64), lease: leaseDur})
		})
	})
}

// ---- the network between servers and members ----

func (s *leaseSim) send(from, to int, fn func()) {
	if s.group[from] != s.group[to] || (s.faults.DropRate > 0 && s.rng.Float64() < s.faults.DropRate) {
		return
	}
	delay := s.faults.MinDelay
	if s.faults.MaxDelay > s.faults.MinDelay {
		delay += time.Duration(s.rng.Int64N(int64(s.faults.MaxDelay - s.faults.MinDelay)))
	}
	for _, n := range []int{from, to} {
		if v := n - 100; v >= 0 && s.now < s.servers[v].slowUntil {
			delay += s.servers[v].slowBy
		}
	}
	s.seq++
	e := &event{at: s.now + delay, seq: s.seq, to: to, fn: fn}
	i, _ := slices.BinarySearchFunc(s.events, e, func(a, b *event) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		return int(a.seq) - int(b.seq)
	})
	s.events = slices.Insert(s.events, i, e)
}

func (s *leaseSim) deliverEvents() {
	for len(s.events) > 0 && s.events[0].at <= s.now {
		e := s.events[0]
		s.events = s.events[1:]
		if e.to >= 100 {
			if v := s.servers[e.to-100]; v.up && v.paused == 0 {
				e.fn()
			}
			continue
		}
		m := s.members[e.to-1]
		s.deliver(m, e.fn)
	}
}

// ---- server behaviour (tableserver's heartbeatLoop, register, watch) ----

func (s *leaseSim) startServer(v *server, restart bool) {
	v.up, v.paused = true, 0
	v.lease = new(tableserver.Lease)
	v.lease.SetDuration(time.Second / timeScale)
	v.beating, v.register = false, restart
	if restart {
		v.mapV, v.parts = 0, nil
	}
	v.nextBeat, v.nextWatch = v.clk.at(s.now), v.clk.at(s.now)
}

// startAttempt sends the beat (or registration) to v.master; each member
// gets a third of the lease, as withMasterEach gives.
func (s *leaseSim) startAttempt(v *server, local time.Duration) {
	v.attempt++
	attempt, reg, to, mapV := v.attempt, v.register, v.master, v.mapV
	v.attemptDeadline = local + v.lease.Duration()/3
	s.send(100+v.idx, int(to), func() {
		m := s.members[to-1]
		answer := func(r reply) {
			s.send(int(to), 100+v.idx, func() { s.beatAnswered(v, attempt, r) })
		}
		if reg {
			s.registerServer(m, v.idx, answer)
		} else {
			s.heartbeat(m, v.idx, mapV, answer)
		}
	})
}

func (s *leaseSim) nextMaster(v *server, hint uint64) {
	if hint != 0 {
		v.master = hint
	} else {
		v.master = v.master%uint64(len(s.members)) + 1
	}
}

func (s *leaseSim) beatAnswered(v *server, attempt uint64, r reply) {
	if !v.beating || attempt != v.attempt {
		return
	}
	local := v.clk.at(s.now)
	switch {
	case r.notLeader:
		s.nextMaster(v, r.hint)
		if local < v.beatDeadline {
			s.startAttempt(v, local)
			return
		}
		v.beating, v.nextBeat = false, local+beatInterval
	case r.reregister:
		v.lease.RaiseMinMapVersion(r.mapVersion)
		v.beating, v.register, v.nextBeat = false, true, local
	default:
		// tableserver: beat's answer (Answered), then heartbeatLoop's Renew
		// from the send time; a registration does both at once (Renewed).
		if v.master != v.grantedBy {
			s.logf("server %d: lease from member %d (its map v%d, ours v%d)", v.idx, v.master, r.mapVersion, v.mapV)
			v.grantedBy = v.master
		}
		v.lease.Renewed(v.beatSent, r.lease, r.mapVersion)
		v.beating, v.register, v.nextBeat = false, false, local+beatInterval
	}
}

func (s *leaseSim) stepServer(v *server) {
	if !v.up || v.paused != 0 {
		return
	}
	local := v.clk.at(s.now)
	switch {
	case !v.beating && local >= v.nextBeat:
		v.beating, v.beatSent, v.beatDeadline = true, local, local+v.lease.Duration()
		s.startAttempt(v, local)
	case v.beating && local >= v.attemptDeadline:
		s.nextMaster(v, 0)
		if local < v.beatDeadline {
			s.startAttempt(v, local)
		} else {
			v.beating, v.nextBeat = false, local+beatInterval
		}
	}
	if local >= v.nextWatch {
		// The map watch: any member serves it from the state it applied
		// (a follower's may be behind); the server takes a newer map.
		v.nextWatch = local + beatInterval
		to := v.master
		if s.rng.IntN(3) == 0 {
			to = 1 + uint64(s.rng.IntN(len(s.members)))
		}
		s.send(100+v.idx, int(to), func() {
			m := s.members[to-1]
			st := m.sm.st.clone()
			s.send(int(to), 100+v.idx, func() {
				if st.Version > v.mapV {
					s.logf("server %d: map v%d from member %d: %v", v.idx, st.Version, to, st.Parts)
					v.mapV, v.parts = st.Version, st.Parts
				}
			})
		})
	}
}

// checkServing: at most one server serves a partition as primary at any
// instant, and each epoch of a partition has one server.
func (s *leaseSim) checkServing() {
	var by [numParts][]int
	for _, v := range s.servers {
		if !v.up || v.paused != 0 || v.parts == nil || !v.lease.Serves(v.clk.at(s.now), v.mapV) {
			continue
		}
		for p, a := range v.parts {
			if a.Primary != v.idx || a.Fence != 0 {
				continue // not its primary, or fenced by a live handoff
			}
			by[p] = append(by[p], v.idx)
			s.servings++
			key := [2]uint64{uint64(p), a.Epoch}
			if prev, ok := s.served[key]; !ok {
				s.served[key] = v.idx
				s.stats.epochs++
			} else if prev != v.idx {
				s.failf("partition %d epoch %d served by server %d and by server %d", p, a.Epoch, prev, v.idx)
			}
		}
	}
	for p, srvs := range by {
		if len(srvs) > 1 {
			var b strings.Builder
			for _, i := range srvs {
				v := s.servers[i]
				fmt.Fprintf(&b, " [server %d: epoch %d, map v%d, min v%d, lease ends in %v]", i, v.parts[p].Epoch, v.mapV,
					v.lease.MinMapVersion(), v.lease.End()-v.clk.at(s.now))
			}
			s.failf("partition %d has %d primaries serving:%s", p, len(srvs), b.String())
		}
	}
}

// ---- the step and the faults ----

func (s *leaseSim) leader() *member {
	var best *member
	for _, m := range s.members {
		if m.c != nil && m.paused == 0 && m.leading && (best == nil || m.leadTerm > best.leadTerm) {
			best = m
		}
	}
	return best
}

func (s *leaseSim) step(faults bool) {
	s.now += time.Millisecond
	for _, m := range s.members {
		if m.c == nil {
			continue
		}
		if m.paused != 0 {
			if s.now < m.paused {
				continue
			}
			s.logf("member %d: resumes (%d deliveries held)", m.id, len(m.held))
			// A stopped process's ticker kept one tick; held messages
			// arrive in order.
			m.paused, m.nextTick = 0, m.clk.at(s.now)
			held := m.held
			m.held = nil
			for _, f := range held {
				if m.c == nil {
					break
				}
				f()
				s.ready(m)
			}
			if m.c == nil {
				continue
			}
		}
		local := m.clk.at(s.now)
		for local >= m.nextTick && m.c != nil {
			m.nextTick += raftTick
			m.c.Tick()
			s.ready(m)
		}
		if m.c != nil && m.leading {
			s.confirmLeadership(m)
			if local >= m.nextCheck {
				m.nextCheck = local + beatInterval/2
				s.checkLiveness(m)
				s.liftFences(m)
			}
			s.ready(m)
		}
	}
	s.net.Advance(time.Millisecond)
	s.deliverEvents()
	for _, v := range s.servers {
		if v.paused != 0 && s.now >= v.paused {
			v.paused = 0
		}
		s.stepServer(v)
	}
	if l := s.leader(); l != nil && s.rng.IntN(25) == 0 {
		s.proposed++
		data := fmt.Sprintf("c%d", s.proposed)
		l.c.Propose([]byte(data), func(index uint64, _ any, err error) {
			if err == nil {
				if prev, ok := s.acked[index]; ok {
					s.failf("index %d acknowledged twice: %q and %q", index, prev, data)
				}
				s.acked[index] = data
			}
		})
		s.ready(l)
	}
	if l := s.leader(); l != nil && faults && s.rng.IntN(150) == 0 {
		// A live handoff: a move (or placement) of one partition's
		// primary, or a drain of a server.
		cmd := fmt.Sprintf("m%d", s.rng.IntN(numParts))
		if s.rng.IntN(3) == 0 {
			cmd = fmt.Sprintf("r%d", s.rng.IntN(numServers))
		}
		s.stats.handoffs++
		s.logf("member %d: proposes live handoff %s", l.id, cmd)
		l.c.Propose([]byte(cmd), func(uint64, any, error) {})
		s.ready(l)
	}
	if faults {
		s.fault()
	}
	s.checkServing()
}

func (s *leaseSim) fault() {
	switch r := s.rng.IntN(10000); {
	case r < 10:
		if m := s.members[s.rng.IntN(len(s.members))]; m.c != nil {
			s.crashMember(m)
		}
	case r < 60:
		for _, m := range s.members {
			if m.c == nil {
				s.startMember(m, nil)
				break
			}
		}
	case r < 65:
		if m := s.members[s.rng.IntN(len(s.members))]; m.c != nil && m.paused == 0 {
			d := time.Duration(1+s.rng.IntN(6*electionTicks)) * raftTick
			m.paused = s.now + d
			s.stats.pauses++
			s.logf("member %d: paused for %v", m.id, d)
		}
	case r < 70:
		if v := s.servers[s.rng.IntN(len(s.servers))]; v.up {
			v.up = false
			s.stats.serverCrashes++
			s.logf("server %d: crash", v.idx)
		}
	case r < 110:
		for _, v := range s.servers {
			if !v.up {
				s.startServer(v, true)
				s.logf("server %d: restarts", v.idx)
				break
			}
		}
	case r < 115:
		if v := s.servers[s.rng.IntN(len(s.servers))]; v.up && v.paused == 0 {
			d := time.Duration(1+s.rng.IntN(4*electionTicks)) * raftTick
			v.paused = s.now + d
			s.logf("server %d: paused for %v", v.idx, d)
		}
	case r < 135:
		var nodes []int
		for _, m := range s.members {
			nodes = append(nodes, int(m.id))
		}
		for _, v := range s.servers {
			nodes = append(nodes, 100+v.idx)
		}
		var a, b []uint64
		for _, n := range nodes {
			g := s.rng.IntN(2)
			s.group[n] = g
			if n < 100 {
				if g == 0 {
					a = append(a, uint64(n))
				} else {
					b = append(b, uint64(n))
				}
			}
		}
		s.net.Heal()
		s.net.Partition(a, b)
		s.stats.partitions++
		s.logf("partition %v", s.group)
	case r < 165:
		clear(s.group)
		s.net.Heal()
		s.logf("heal")
	case r < 175:
		s.faults = raftnode.NetworkFaults{DropRate: s.rng.Float64() * 0.2, MaxDelay: time.Duration(1+s.rng.IntN(20)) * time.Millisecond}
		s.net.SetFaults(s.faults)
		s.logf("network drop %.2f delay ≤%v", s.faults.DropRate, s.faults.MaxDelay)
	case r < 195:
		// A server whose heartbeats and map watch crawl: the old primary
		// of a live handoff that hears of it late.
		if v := s.servers[s.rng.IntN(len(s.servers))]; v.up {
			v.slowBy = time.Duration(10+s.rng.IntN(int(leaseDur/time.Millisecond))) * time.Millisecond
			v.slowUntil = s.now + time.Duration(1+s.rng.IntN(8*electionTicks))*raftTick
			s.stats.slowServers++
			s.logf("server %d: heartbeats and watch slowed by %v until %v", v.idx, v.slowBy, v.slowUntil)
		}
	case r < 200:
		if l := s.leader(); l != nil {
			vs := l.c.Voters()
			to := vs[s.rng.IntN(len(vs))]
			s.logf("member %d: transfer leadership to %d", l.id, to)
			l.c.TransferLeader(to)
			s.stats.transfers++
			s.ready(l)
		}
	}
}

// run plays the fault phase, heals everything, waits for every member to
// apply the same sequence, and checks it.
func (s *leaseSim) run() {
	defer func() {
		if r := recover(); r != nil {
			s.failf("panic: %v\n%s", r, debug.Stack())
		}
	}()
	s.faults = raftnode.NetworkFaults{DropRate: 0.02, MaxDelay: 5 * time.Millisecond}
	s.net.SetFaults(s.faults)
	for i := 0; i < faultSteps && !s.failed; i++ {
		s.step(true)
	}
	s.faults = raftnode.NetworkFaults{MaxDelay: 2 * time.Millisecond}
	s.net.SetFaults(s.faults)
	clear(s.group)
	s.net.Heal()
	for _, m := range s.members {
		if m.c == nil {
			s.startMember(m, nil)
		}
	}
	for _, v := range s.servers {
		if !v.up {
			s.startServer(v, true)
		}
	}
	s.logf("healed; converging")
	for i := 0; i < 30000 && !s.failed; i++ {
		s.step(false)
		if i%50 == 0 && s.converged() {
			s.check()
			return
		}
	}
	s.failf("did not converge")
}

func (s *leaseSim) converged() bool {
	l := s.leader()
	if l == nil {
		return false
	}
	for idx := range s.acked {
		if idx > l.c.Applied() {
			return false
		}
	}
	for _, m := range s.members {
		if m.c == nil || m.paused != 0 || m.c.Applied() != l.c.Applied() {
			return false
		}
	}
	return true
}

func (s *leaseSim) check() {
	l := s.leader()
	want := l.sm.st.Log
	for _, m := range s.members {
		if got := m.sm.st.Log; !slices.Equal(got, want) {
			s.failf("member %d applied %d commands, unlike the leader %d's %d", m.id, len(got), l.id, len(want))
		}
	}
	have := map[uint64]string{}
	for _, it := range want {
		have[it.Index] = it.Data
	}
	for i, data := range s.acked {
		if have[i] != data {
			s.failf("committed %q at %d lost: the log has %q there", data, i, have[i])
		}
	}
}

func TestLeaseSimulation(t *testing.T) {
	scenarios := *leaseScenarios
	if scenarios == 0 {
		scenarios = 1000
		switch {
		case raftnode.RaceEnabled:
			scenarios = 25
		case testing.Short():
			scenarios = 60
		}
	}
	for _, members := range []int{3, 5} {
		t.Run(fmt.Sprintf("members=%d", members), func(t *testing.T) {
			var st leaseStats
			var acked, proposed, servings int
			ran := 0
			for k := range scenarios {
				seed := uint64(members)*1_000_000 + uint64(*leaseFirst+k)
				if *leaseSeed != 0 {
					if *leaseSeed/1_000_000 != uint64(members) {
						return
					}
					seed = *leaseSeed
				}
				var s *leaseSim
				raftnode.WithSeededCryptoRand(seed, func() {
					s = newLeaseSim(t, seed, members, false)
					s.run()
				})
				ran++
				acked += len(s.acked)
				proposed += s.proposed
				servings += s.servings
				st.crashes += s.stats.crashes
				st.pauses += s.stats.pauses
				st.serverCrashes += s.stats.serverCrashes
				st.partitions += s.stats.partitions
				st.transfers += s.stats.transfers
				st.declaredDead += s.stats.declaredDead
				st.epochs += s.stats.epochs
				st.leaderTerms += s.stats.leaderTerms
				st.handoffs += s.stats.handoffs
				st.fencesLifted += s.stats.fencesLifted
				st.slowServers += s.stats.slowServers
				if *leaseVerbose {
					t.Logf("seed %d:\n%s", seed, strings.Join(s.trace, "\n"))
				}
				if s.failed || *leaseSeed != 0 {
					break
				}
			}
			t.Logf("%d scenarios: %d commands proposed, %d committed; %d server-ms of primary service; %+v", ran, proposed, acked, servings, st)
		})
	}
}

// failRecorder is a testing.TB that records a failure instead of failing.
type failRecorder struct {
	testing.TB
	msg string
}

func (r *failRecorder) Errorf(format string, args ...any) {
	if r.msg == "" {
		r.msg = fmt.Sprintf(format, args...)
	}
}

// TestLeaseSimulationCatchesUnfencedHandoffs: the simulation is able to
// fail. Without the fence (a live handoff's new primary serving at once,
// as before tablemaster/handoff.go) some scenario has two primaries
// serving a partition at once.
func TestLeaseSimulationCatchesUnfencedHandoffs(t *testing.T) {
	for k := range 200 {
		seed := uint64(9_000_000 + k)
		r := &failRecorder{TB: t}
		var s *leaseSim
		raftnode.WithSeededCryptoRand(seed, func() {
			s = newLeaseSim(r, seed, 3, true)
			s.run()
		})
		if s.failed {
			t.Logf("without the fence, seed %d fails after %d scenarios: %.300s", seed, k+1, r.msg)
			return
		}
	}
	t.Fatal("200 scenarios with unfenced live handoffs found no two primaries serving at once: the simulation cannot see the bug the fence fixes")
}
