package raftnode

import (
	"context"
	crand "crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tabuladb/tabula/engines/vfs"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

var (
	simScenarios = flag.Int("sim.scenarios", 0, "scenarios per group size in TestSimulation (default 120; 15 with -race or -short)")
	simSeed      = flag.Uint64("sim.seed", 0, "run only the scenario with this seed")
	simFirst     = flag.Int("sim.first", 0, "number of the first scenario (seeds are members×10⁶ + number)")
	simVerbose   = flag.Bool("sim.v", false, "print every scenario's trace")
)

// listSM is the state machine of the simulation: the list of applied
// (index, data) pairs. It checks, through the sim, that every member
// applies the same data at every index.
type listSM struct {
	s     *sim
	id    uint64
	items []smItem
}

type smItem struct {
	Index uint64
	Data  string
}

func (m *listSM) Apply(index uint64, data []byte) any {
	if n := len(m.items); n > 0 && index <= m.items[n-1].Index {
		m.s.failf("member %d applied index %d after %d", m.id, index, m.items[n-1].Index)
	}
	m.s.noteApplied(m.id, index, string(data))
	m.items = append(m.items, smItem{index, string(data)})
	return len(m.items)
}

func (m *listSM) Snapshot() ([]byte, error) { return json.Marshal(m.items) }

func (m *listSM) Restore(data []byte) error {
	m.s.stats.snapshotsReceived++
	m.items = nil
	return json.Unmarshal(data, &m.items)
}

func (m *listSM) lastIndex() uint64 {
	if len(m.items) == 0 {
		return 0
	}
	return m.items[len(m.items)-1].Index
}

type simNode struct {
	id      uint64
	fs      *vfs.MemFS
	c       *core // nil while down
	sm      *listSM
	removed bool
	snaps   []raftpb.Snapshot // taken, file not written yet
}

// sim drives a group of cores from one goroutine over a Network, on
// virtual time, with faults drawn from one seed.
type sim struct {
	t        testing.TB
	seed     uint64
	rng      *rand.Rand
	net      *Network
	nodes    map[uint64]*simNode
	founders []uint64
	spares   []uint64
	applied  map[uint64]string // index → data, as first applied anywhere
	acked    map[uint64]string // index → data, acknowledged to a proposer
	maxAcked uint64
	leaders  map[uint64]uint64 // term → the member that led it
	trace    []string
	failed   bool
	proposed int
	reads    int
	stats    simStats
	faults   bool // in the fault phase
}

type simStats struct {
	crashes, diskFaults, snapshotsTaken, snapshotsReceived, confChanges, transfers int
}

func (s *sim) failf(format string, args ...any) {
	if !s.failed {
		s.failed = true
		s.t.Errorf("seed %d (rerun: go test -run TestSimulation -sim.seed=%d): %s\ntrace (last 40):\n%s",
			s.seed, s.seed, fmt.Sprintf(format, args...), strings.Join(s.trace[max(0, len(s.trace)-40):], "\n"))
	}
}

func (s *sim) logf(format string, args ...any) {
	s.trace = append(s.trace, fmt.Sprintf("%8v ", s.net.Now())+fmt.Sprintf(format, args...))
}

func (s *sim) noteApplied(id, index uint64, data string) {
	if prev, ok := s.applied[index]; ok && prev != data {
		s.failf("member %d applied %q at %d, another member applied %q", id, data, index, prev)
	}
	s.applied[index] = data
}

// seededReader stands in for crypto/rand.Reader during a scenario: etcd
// raft draws its randomised election timeouts from it, and the simulation
// must replay exactly from its seed.
type seededReader struct {
	mu  sync.Mutex
	rng *rand.Rand
}

func (r *seededReader) Read(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range p {
		p[i] = byte(r.rng.Uint32())
	}
	return len(p), nil
}

// withSeededCryptoRand runs f with crypto/rand.Reader drawing from seed.
// Tests of this package do not run in parallel, so nothing else reads it
// meanwhile.
func withSeededCryptoRand(seed uint64, f func()) {
	saved := crand.Reader
	crand.Reader = &seededReader{rng: rand.New(rand.NewPCG(seed, 11))}
	defer func() { crand.Reader = saved }()
	f()
}

func newSim(t testing.TB, seed uint64, members int) *sim {
	s := &sim{
		t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, 7)), net: NewNetwork(seed),
		nodes: map[uint64]*simNode{}, applied: map[uint64]string{}, acked: map[uint64]string{},
		leaders: map[uint64]uint64{},
	}
	peers := map[uint64]string{}
	for id := uint64(1); id <= uint64(members); id++ {
		s.founders = append(s.founders, id)
		peers[id] = fmt.Sprintf("n%d", id)
	}
	s.spares = []uint64{uint64(members) + 1, uint64(members) + 2}
	for _, id := range s.founders {
		s.nodes[id] = &simNode{id: id, fs: vfs.NewMem()}
		s.start(s.nodes[id], peers)
	}
	return s
}

type simHandler struct {
	s *sim
	n *simNode
}

func (h simHandler) Step(_ context.Context, m raftpb.Message) error {
	if h.n.c == nil {
		return ErrStopped
	}
	h.n.c.step(m)
	h.s.ready(h.n)
	return nil
}

func (h simHandler) ReportUnreachable(id uint64) {
	if h.n.c != nil {
		h.n.c.rn.ReportUnreachable(id)
		h.s.ready(h.n)
	}
}

func (h simHandler) ReportSnapshot(id uint64, failed bool) {
	if h.n.c != nil {
		st := raft.SnapshotFinish
		if failed {
			st = raft.SnapshotFailure
		}
		h.n.c.rn.ReportSnapshot(id, st)
		h.s.ready(h.n)
	}
}

func (s *sim) start(n *simNode, peers map[uint64]string) {
	st, err := OpenStorage(n.fs, "/raft", nil)
	if err != nil {
		s.failf("member %d: open storage: %v", n.id, err)
		return
	}
	n.sm = &listSM{s: s, id: n.id}
	ep := s.net.Endpoint(n.id)
	cfg := coreConfig{
		id: n.id, electionTick: 10, heartbeatTick: 1,
		snapshotEvery: 5 + s.rng.Uint64N(30), keepEntries: s.rng.Uint64N(10), promoteMaxLag: 5,
		incarnation: s.rng.Uint32(), logger: slog.New(slog.DiscardHandler),
		send: ep.Send, setPeer: ep.SetPeer, removePeer: ep.RemovePeer,
		takeSnapshot: func(snap raftpb.Snapshot) { n.snaps = append(n.snaps, snap) },
		onLeaderChange: func(lc LeaderChange) {
			s.logf("member %d: term %d leader %d", n.id, lc.Term, lc.Leader)
			if !lc.IsLeader {
				return
			}
			if prev, ok := s.leaders[lc.Term]; ok && prev != n.id {
				s.failf("two leaders in term %d: %d and %d", lc.Term, prev, n.id)
			}
			s.leaders[lc.Term] = n.id
		},
	}
	c, err := newCore(cfg, st, n.sm, peers)
	if err != nil {
		s.failf("member %d: start: %v", n.id, err)
		return
	}
	n.c, n.snaps = c, nil
	ep.Attach(simHandler{s, n})
	s.logf("member %d: started, applied %d", n.id, c.applied)
	s.ready(n)
}

func (s *sim) ready(n *simNode) {
	if n.c == nil {
		return
	}
	err := n.c.handleReady()
	n.c.answerPublished() // no Status here: conf changes are answered at once
	if err != nil {
		s.storageFailed(n, err)
		return
	}
	if n.c.removed {
		s.logf("member %d: removed; stops", n.id)
		s.stop(n)
		n.removed = true
	}
}

// storageFailed handles a core's storage error: an injected disk fault
// kills the member (a crash follows); anything else is a failure.
func (s *sim) storageFailed(n *simNode, err error) {
	if !errors.Is(err, vfs.ErrInjected) {
		s.failf("member %d: %v", n.id, err)
		return
	}
	s.logf("member %d: disk fault: %v", n.id, err)
	s.stats.diskFaults++
	s.crash(n)
}

func (s *sim) stop(n *simNode) {
	if n.c == nil {
		return
	}
	_ = n.c.storage.Close()
	n.c = nil
	s.net.Endpoint(n.id).Attach(nil)
}

func (s *sim) crash(n *simNode) {
	s.stop(n)
	if s.rng.IntN(2) == 0 {
		n.fs.Crash()
		s.logf("member %d: crash", n.id)
		s.stats.crashes++
	} else {
		n.fs.CrashKeepingPrefix(s.rng)
		s.logf("member %d: crash keeping torn tails", n.id)
		s.stats.crashes++
	}
}

func (s *sim) up() []*simNode {
	var up []*simNode
	for _, id := range s.ids() {
		if n := s.nodes[id]; n.c != nil {
			up = append(up, n)
		}
	}
	return up
}

func (s *sim) ids() []uint64 {
	ids := make([]uint64, 0, len(s.nodes))
	for id := range s.nodes {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func (s *sim) leader() *simNode {
	var best *simNode
	for _, n := range s.up() {
		if n.c.leading && (best == nil || n.c.term > best.c.term) {
			best = n
		}
	}
	return best
}

func (s *sim) propose(n *simNode) {
	s.proposed++
	data := fmt.Sprintf("p%d", s.proposed)
	wasLeader := n.c.leading
	n.c.propose([]byte(data), func(index uint64, _ any, err error) {
		if err != nil {
			if wasLeader {
				s.logf("member %d: proposal %s failed: %v", n.id, data, err)
			}
			return
		}
		s.logf("member %d: acked %s at %d", n.id, data, index)
		if prev, ok := s.acked[index]; ok {
			s.failf("index %d acknowledged twice: %q and %q", index, prev, data)
		}
		s.acked[index] = data
		s.maxAcked = max(s.maxAcked, index)
	})
	s.ready(n)
}

func (s *sim) readIndex(n *simNode) {
	need := s.maxAcked
	s.reads++
	n.c.readIndex(func(index uint64, _ any, err error) {
		if err != nil || n.c == nil {
			return
		}
		if got := n.sm.lastIndex(); index < need || n.c.applied < need {
			s.failf("member %d: read index %d (applied %d, state at %d) misses index %d acknowledged before the read", n.id, index, n.c.applied, got, need)
		}
	})
	s.ready(n)
}

func (s *sim) runSnapshots(n *simNode) {
	for len(n.snaps) > 0 && n.c != nil {
		snap := n.snaps[0]
		n.snaps = n.snaps[1:]
		err := n.c.storage.WriteSnapshotFile(snap)
		s.stats.snapshotsTaken++
		if s.faults && s.rng.IntN(10) == 0 {
			s.logf("member %d: crash after writing snapshot %d", n.id, snap.Metadata.Index)
			s.crash(n)
			return
		}
		if err := n.c.snapshotWritten(snap, err); err != nil {
			s.storageFailed(n, err)
			return
		}
		s.ready(n)
	}
}

// changeMembership adds a spare as a learner, promotes a learner, or
// removes a voter, through the leader.
func (s *sim) changeMembership(l *simNode) {
	voters := l.c.confState.Voters
	learners := l.c.confState.Learners
	logResult := func(what string) done {
		return func(_ uint64, _ any, err error) {
			s.logf("member %d: %s: %v", l.id, what, err)
			if err == nil {
				s.stats.confChanges++
			}
		}
	}
	switch {
	case len(learners) > 0:
		id := learners[0]
		if err := l.c.learnerCaughtUp(id); err != nil {
			s.logf("member %d: promote %d: %v", l.id, id, err)
			return
		}
		l.c.proposeConfChange(raftpb.ConfChange{Type: raftpb.ConfChangeAddNode, NodeID: id}, logResult(fmt.Sprintf("promote %d", id)))
	case len(voters) > len(s.founders) || (len(voters) == len(s.founders) && s.rng.IntN(2) == 0):
		id := voters[s.rng.IntN(len(voters))]
		l.c.proposeConfChange(raftpb.ConfChange{Type: raftpb.ConfChangeRemoveNode, NodeID: id}, logResult(fmt.Sprintf("remove %d", id)))
	default:
		for _, id := range s.spares {
			if _, ok := s.nodes[id]; ok {
				continue
			}
			n := &simNode{id: id, fs: vfs.NewMem()}
			s.nodes[id] = n
			s.start(n, nil)
			l.c.proposeConfChange(raftpb.ConfChange{Type: raftpb.ConfChangeAddLearnerNode, NodeID: id, Context: []byte(fmt.Sprintf("n%d", id))}, logResult(fmt.Sprintf("add learner %d", id)))
			break
		}
	}
	s.ready(l)
}

// step advances virtual time by one millisecond: ticks every 10 ms,
// deliveries, and, in the fault phase, one random event.
func (s *sim) step(i int, faults bool) {
	s.faults = faults
	if i%10 == 0 {
		for _, n := range s.up() {
			n.c.tick()
			s.ready(n)
		}
	}
	s.net.Advance(time.Millisecond)
	for _, n := range s.up() {
		if len(n.snaps) > 0 && s.rng.IntN(20) == 0 {
			s.runSnapshots(n)
		}
	}
	if up := s.up(); len(up) > 0 && s.rng.IntN(8) == 0 {
		n := up[s.rng.IntN(len(up))]
		if l := s.leader(); l != nil && s.rng.IntN(4) > 0 {
			n = l
		}
		s.propose(n)
	}
	if up := s.up(); len(up) > 0 && s.rng.IntN(40) == 0 {
		s.readIndex(up[s.rng.IntN(len(up))])
	}
	if !faults {
		return
	}
	switch r := s.rng.IntN(1000); {
	case r < 2:
		if up := s.up(); len(up) > 0 {
			s.crash(up[s.rng.IntN(len(up))])
		}
	case r < 6:
		for _, id := range s.ids() {
			if n := s.nodes[id]; n.c == nil && !n.removed {
				s.start(n, nil)
				break
			}
		}
	case r < 8:
		ids := s.ids()
		s.rng.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		k := 1 + s.rng.IntN(len(ids)-1)
		s.net.Partition(ids[:k], ids[k:])
		s.logf("partition %v | %v", ids[:k], ids[k:])
	case r < 11:
		s.net.Heal()
		s.logf("heal")
	case r < 12:
		if l := s.leader(); l != nil {
			to := l.c.confState.Voters[s.rng.IntN(len(l.c.confState.Voters))]
			s.logf("member %d: transfer leadership to %d", l.id, to)
			l.c.rn.TransferLeader(to)
			s.stats.transfers++
			s.ready(l)
		}
	case r < 14:
		if l := s.leader(); l != nil {
			s.changeMembership(l)
		}
	case r < 17:
		if up := s.up(); len(up) > 0 {
			n := up[s.rng.IntN(len(up))]
			k := s.rng.IntN(40)
			s.logf("member %d: disk fails after %d more writes", n.id, k)
			n.fs.InjectAfter(k, vfs.OpCreate|vfs.OpWrite|vfs.OpSync|vfs.OpSyncDir|vfs.OpRename, nil)
		}
	case r < 18:
		drop := s.rng.Float64() * 0.2
		maxDelay := time.Duration(1+s.rng.IntN(30)) * time.Millisecond
		s.net.SetFaults(NetworkFaults{DropRate: drop, MaxDelay: maxDelay})
		s.logf("network drop %.2f delay ≤%v", drop, maxDelay)
	}
}

// run plays the fault phase, then heals everything and waits for every
// member to converge, and checks the outcome.
func (s *sim) run(steps int) {
	defer func() {
		if r := recover(); r != nil {
			s.failf("panic: %v\n%s", r, debug.Stack())
		}
	}()
	s.net.SetFaults(NetworkFaults{DropRate: 0.02, MaxDelay: 5 * time.Millisecond})
	for i := 0; i < steps && !s.failed; i++ {
		s.step(i, true)
	}
	s.net.Heal()
	s.net.SetFaults(NetworkFaults{MaxDelay: 2 * time.Millisecond})
	for _, id := range s.ids() {
		n := s.nodes[id]
		n.fs.ClearFaults()
		if n.c == nil && !n.removed {
			s.start(n, nil)
		}
	}
	s.logf("healed; converging")
	for i := 0; i < 60000 && !s.failed; i++ {
		s.step(i, false)
		if i%100 == 0 && s.converged() {
			s.check()
			return
		}
	}
	s.failf("did not converge: %s", s.describe())
}

// converged: a leader is known and every member of its configuration is
// up and has applied everything the leader applied, including every
// acknowledged proposal.
func (s *sim) converged() bool {
	l := s.leader()
	if l == nil || l.c.applied < s.maxAcked {
		return false
	}
	for _, id := range append(slices.Clone(l.c.confState.Voters), l.c.confState.Learners...) {
		n := s.nodes[id]
		if n == nil || n.c == nil || n.c.applied != l.c.applied || len(n.snaps) > 0 {
			return false
		}
	}
	return true
}

func (s *sim) describe() string {
	var b strings.Builder
	for _, n := range s.nodes {
		if n.c == nil {
			fmt.Fprintf(&b, "[%d down removed=%v] ", n.id, n.removed)
			continue
		}
		fmt.Fprintf(&b, "[%d term %d lead %d applied %d conf %v] ", n.id, n.c.term, n.c.lead, n.c.applied, n.c.confState)
	}
	return fmt.Sprintf("%s; max acked %d", b.String(), s.maxAcked)
}

func (s *sim) check() {
	l := s.leader()
	want := l.sm.items
	for _, id := range append(slices.Clone(l.c.confState.Voters), l.c.confState.Learners...) {
		if got := s.nodes[id].sm.items; !slices.Equal(got, want) {
			s.failf("member %d's state (%d items) differs from the leader %d's (%d items)", id, len(got), l.id, len(want))
		}
	}
	have := map[uint64]string{}
	for _, it := range want {
		have[it.Index] = it.Data
	}
	indexes := make([]uint64, 0, len(s.acked))
	for i := range s.acked {
		indexes = append(indexes, i)
	}
	sort.Slice(indexes, func(i, j int) bool { return indexes[i] < indexes[j] })
	for _, i := range indexes {
		if have[i] != s.acked[i] {
			s.failf("acknowledged %q at %d lost: the state has %q there", s.acked[i], i, have[i])
		}
	}
}

func TestSimulation(t *testing.T) {
	scenarios := *simScenarios
	if scenarios == 0 {
		scenarios = 120
		if raceEnabled || testing.Short() {
			scenarios = 15
		}
	}
	for _, members := range []int{3, 5} {
		t.Run(fmt.Sprintf("members=%d", members), func(t *testing.T) {
			var acked, proposed, reads int
			var st simStats
			for k := range scenarios {
				seed := uint64(members)*1_000_000 + uint64(*simFirst+k)
				if *simSeed != 0 {
					if *simSeed/1_000_000 != uint64(members) {
						return
					}
					seed = *simSeed
				}
				var s *sim
				withSeededCryptoRand(seed, func() {
					s = newSim(t, seed, members)
					s.run(3000)
				})
				acked += len(s.acked)
				proposed += s.proposed
				reads += s.reads
				st.crashes += s.stats.crashes
				st.diskFaults += s.stats.diskFaults
				st.snapshotsTaken += s.stats.snapshotsTaken
				st.snapshotsReceived += s.stats.snapshotsReceived
				st.confChanges += s.stats.confChanges
				st.transfers += s.stats.transfers
				if *simVerbose {
					t.Logf("seed %d:\n%s", seed, strings.Join(s.trace, "\n"))
				}
				if s.failed || *simSeed != 0 {
					break
				}
			}
			t.Logf("%d proposals, %d acknowledged, %d reads; %+v", proposed, acked, reads, st)
		})
	}
}
