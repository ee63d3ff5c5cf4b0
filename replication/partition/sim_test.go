package partition_test

// A deterministic simulation of one partition's replication: replica cores
// (the real Replica), the master's failover steps (lease wait, seal at the
// length the reachable replicas agree on, promotion, seal-and-continue on a
// failed secondary, rejoin of returning servers) and the commit-log extents
// (all-replica acknowledgement, freeze, seal) over an in-memory network
// and clock that crash, pause, cut, drop, delay and reorder. Every step is
// checked: at most one primary per epoch, no acknowledged write lost, no
// replica applied beyond the commit point (what any replica applied is a
// prefix of the final log), no stale read from a primary. A failure prints
// its seed; rerun one with -sim.seed.

import (
	"bytes"
	"cmp"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tabuladb/tabula/replication/partition"
)

var (
	simSeed      = flag.Uint64("sim.seed", 0, "run only this simulation seed")
	simScenarios = flag.Int("sim.scenarios", 0, "number of simulated scenarios (default 2000; 100 with -short or -race)")
	simRandom    = flag.Bool("sim.random", false, "start at a random seed instead of the fixed range CI runs")
)

const (
	nServers   = 5
	replFactor = 3
	master     = -1

	heartbeatEvery = 20
	leaseTicks     = 100
	deadAfter      = 150 // > leaseTicks: a silent server's lease has run out
	replTimeout    = 40
	freezeWait     = 30
)

type msg struct {
	at       int64
	seq      int
	from, to int
	body     any
}

type (
	mReplicate struct {
		ext    int
		from   int // index of recs[0] in the extent; -1: commit point only
		recs   []partition.Record
		commit uint64
		inc    int // sender's incarnation
	}
	mReplicateAck struct {
		ext, n int
		ok     bool
	}
	mHeartbeat struct {
		inc     int
		sent    int64
		applied uint64
		rep     *report // the replica's status (repair simulation only)
	}
	// mHeartbeatAck renews the lease and carries the server's current
	// assignment (the map), so a server never renews its lease on a map
	// older than the master's: a deposed primary learns it in the same
	// message that would have renewed it.
	mHeartbeatAck struct {
		sent   int64
		assign mAssign
	}
	mFreeze    struct{ ext, round int }
	mFreezeAck struct {
		ext, round, n int
		inc           int
		recs          []partition.Record
		applied       uint64
		copying       bool // repair simulation: its engine holds no copy yet
	}
	mSeal   struct{ ext, n int }
	mAssign struct {
		ver      int
		epoch    uint64
		role     partition.Role
		ext      int
		replicas []int // primary first
		logEnd   uint64
	}
	mReseal struct{ ext int }
)

type extReplica struct {
	recs     []partition.Record
	frozen   bool
	sealed   bool
	commit   uint64
	primary  bool
	replicas []int
	// primary side: what each secondary acknowledged, and when the oldest
	// unacknowledged batch was sent.
	acked   map[int]int
	sentAt  int64
	waiting bool
	broken  bool
}

type server struct {
	id, inc  int
	alive    bool
	paused   bool
	core     *partition.Replica
	engine   []partition.Record // applied, persisted synchronously
	exts     map[int]*extReplica
	cur      int // the open extent this server writes to or tails
	leaseEnd int64
	lastBeat int64
	cfgVer   int
	// tokens maps a proposal token to the client write it carries.
	tokens map[uint64]int
	// rr is the replica's repair state (engine with a flush point,
	// copies, truncation reports); nil outside the repair simulation.
	rr *replState
}

type extent struct {
	id       int
	replicas []int
	sealed   bool
	recs     []partition.Record // once sealed
	// trimmed: deleted by log truncation; recs stay for the checks only.
	trimmed bool
}

type sim struct {
	t    *testing.T
	seed uint64
	rng  *rand.Rand
	now  int64
	seq  int
	q    []msg
	srv  []*server
	cut  map[[2]int]int64 // link -> healed at
	drop float64
	// quorum: appends are durable on a majority of the extent's replicas
	// and a seal takes the longest of a majority (the stream layer's
	// AckQuorum); otherwise on every replica, sealed at the shortest of
	// any that answer (AckAll). Odd seeds run quorum.
	quorum bool

	// master state
	epoch     uint64
	primary   int
	set       []int
	exts      []*extent
	lastHeard map[int]int64
	heardInc  map[int]int
	applied   map[int]uint64
	dead      map[int]bool
	reconf    *reconfig
	freezeRnd int
	cfgVer    int
	assigns   map[int]mAssign
	ackedAt   map[int]int64 // last lease renewal sent to each server
	holdAcks  map[int]bool  // servers whose lease is being waited out

	// checks
	primaries map[uint64]int // epoch -> server that served as primary
	writes    []cwrite
	nextTok   uint64
	acked     map[uint64][]byte // LSN -> body acknowledged to a client
	maxAcked  uint64            // highest LSN acknowledged before now
	ackCount  int

	// rp is the repair simulation's state (sim_repair_test.go); nil in
	// TestSimulation.
	rp *repair
}

type cwrite struct {
	body []byte
}

type reconfig struct {
	ext      int
	round    int
	deadline int64
	replies  map[int]mFreezeAck
	replace  bool // the primary changes
	promote  int  // the new primary if replace and it answers (a move's target); -1: the most caught-up
}

func newSim(t *testing.T, seed uint64, rp *repair) *sim {
	s := &sim{t: t, seed: seed, rp: rp, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		cut: map[[2]int]int64{}, lastHeard: map[int]int64{}, heardInc: map[int]int{}, applied: map[int]uint64{},
		dead: map[int]bool{}, primaries: map[uint64]int{}, acked: map[uint64][]byte{},
		assigns: map[int]mAssign{}, ackedAt: map[int]int64{}, holdAcks: map[int]bool{}}
	s.drop = []float64{0, 0, 0.01, 0.05}[s.rng.IntN(4)]
	s.quorum = seed%2 == 1
	for i := range nServers {
		s.srv = append(s.srv, &server{id: i, inc: 1, alive: true, exts: map[int]*extReplica{}, tokens: map[uint64]int{},
			core: partition.New(partition.Config{MaxInFlight: 64}, 0)})
		s.heardInc[i] = 1
		if rp != nil {
			s.srv[i].rr = newReplState()
		}
	}
	// Bootstrap: servers 0..2 hold the partition, 0 is primary at epoch 1,
	// extent 1 on all three.
	s.epoch, s.primary, s.set = 1, 0, []int{0, 1, 2}
	s.exts = []*extent{{id: 1, replicas: []int{0, 1, 2}}}
	s.cfgVer = 1
	for _, id := range s.set {
		s.assigns[id] = mAssign{ver: 1, epoch: 1, role: roleFor(id, 0), ext: 1, replicas: []int{0, 1, 2}}
		s.deliverAssign(s.srv[id], s.assigns[id])
		s.srv[id].leaseEnd = leaseTicks
		s.ackedAt[id] = 0
	}
	return s
}

func roleFor(id, primary int) partition.Role {
	if id == primary {
		return partition.RolePrimary
	}
	return partition.RoleSecondary
}

func (s *sim) fatalf(format string, args ...any) {
	s.t.Helper()
	test := "TestSimulation$"
	if s.rp != nil {
		test = "TestSimulationRepair"
	}
	if s.rp != nil && s.rp.cfg.bug != "" {
		test += " -sim.bug " + s.rp.cfg.bug
	}
	s.t.Fatalf("seed %d, t=%d: %s (rerun: go test ./replication/partition -run %s -sim.seed %d -v)", s.seed, s.now, fmt.Sprintf(format, args...), test, s.seed)
}

func (s *sim) logf(format string, args ...any) {
	if *simSeed != 0 {
		s.t.Logf("t=%d "+format, append([]any{s.now}, args...)...)
	}
}

func (s *sim) send(from, to int, body any) {
	if s.cutBetween(from, to) || s.rng.Float64() < s.drop {
		return
	}
	delay := 1 + s.rng.Int64N(4)
	if s.rng.IntN(20) == 0 {
		delay += s.rng.Int64N(30) // a slow message: reordered behind later ones
	}
	s.seq++
	s.push(msg{at: s.now + delay, seq: s.seq, from: from, to: to, body: body})
}

// push inserts m in (time, send order) order.
func (s *sim) push(m msg) {
	i, _ := slices.BinarySearchFunc(s.q, m, func(a, b msg) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.seq, b.seq)) })
	s.q = slices.Insert(s.q, i, m)
}

func (s *sim) cutBetween(a, b int) bool {
	if a > b {
		a, b = b, a
	}
	return s.cut[[2]int{a, b}] > s.now
}

// run advances the simulation by ticks, with faults when faults is true.
func (s *sim) run(ticks int64, faults bool, writeProb float64) {
	end := s.now + ticks
	for s.now < end {
		s.now++
		if faults {
			s.inject()
		}
		s.heal()
		// Deliver due messages in (time, send order) order; the queue is
		// kept sorted.
		k := 0
		for k < len(s.q) && s.q[k].at <= s.now {
			k++
		}
		due := slices.Clone(s.q[:k])
		s.q = s.q[k:]
		for _, m := range due {
			if m.to != master && m.from != master && s.cutBetween(m.from, m.to) {
				continue
			}
			s.deliver(m)
		}
		for _, sv := range s.srv {
			if sv.alive && !sv.paused {
				s.tick(sv)
			}
		}
		s.masterTick()
		if s.rng.Float64() < writeProb {
			s.clientWrite()
		}
		if s.rng.IntN(10) == 0 {
			s.clientRead()
		}
		s.check()
	}
}

func (s *sim) inject() {
	if s.rng.IntN(150) != 0 {
		return
	}
	id := s.rng.IntN(nServers)
	sv := s.srv[id]
	kind := s.rng.IntN(4)
	if s.rp != nil && kind != 3 && s.othersDown(id) {
		// The repair simulation keeps to the fault model three
		// copies promise: one server failed (down, stopped or cut off
		// from the master) at a time.
		return
	}
	switch kind {
	case 0: // kill -9 and restart later
		if sv.alive {
			s.logf("crash %d", id)
			sv.alive = false
			s.q = slices.DeleteFunc(s.q, func(m msg) bool { return m.to == id })
		}
	case 1: // SIGSTOP
		if sv.alive && !sv.paused {
			s.logf("pause %d", id)
			sv.paused = true
		}
	case 2: // cut a link (server-server or server-master) for a while
		other := s.rng.IntN(nServers+1) - 1
		if other != id {
			a, b := min(id, other), max(id, other)
			s.cut[[2]int{a, b}] = s.now + 50 + s.rng.Int64N(400)
			s.logf("cut %d-%d until %d", a, b, s.cut[[2]int{a, b}])
		}
	case 3:
		s.restartOrResume(sv)
	}
}

func (s *sim) restartOrResume(sv *server) {
	switch {
	case !sv.alive:
		s.logf("restart %d", sv.id)
		sv.alive, sv.paused = true, false
		sv.inc++
		// Volatile state is gone; the engine and the synced extent
		// replicas survive (replicas sync before they acknowledge).
		sv.core = partition.New(partition.Config{MaxInFlight: 64}, uint64(len(sv.engine)))
		if s.rp != nil {
			s.repairRestart(sv)
		}
		sv.tokens = map[uint64]int{}
		sv.cur = 0
		sv.leaseEnd = 0
		for _, e := range sv.exts {
			e.acked, e.waiting, e.broken, e.commit = nil, false, false, 0
			e.primary = false
		}
	case sv.paused:
		s.logf("resume %d", sv.id)
		sv.paused = false
	}
}

func (s *sim) heal() {
	for k, until := range s.cut {
		if until <= s.now {
			delete(s.cut, k)
		}
	}
}

func (s *sim) deliver(m msg) {
	if m.to == master {
		s.masterReceive(m)
		return
	}
	sv := s.srv[m.to]
	if !sv.alive {
		return
	}
	if sv.paused {
		// A stopped process reads nothing; its socket buffers hold the
		// message until it resumes.
		m.at = s.now + 1
		s.push(m)
		return
	}
	switch b := m.body.(type) {
	case mReplicate:
		s.onReplicate(sv, m.from, b)
	case mReplicateAck:
		e := sv.exts[b.ext]
		if e == nil || !e.primary || e.broken {
			return
		}
		if !b.ok {
			s.breakExtent(sv, b.ext)
			return
		}
		e.acked[m.from] = max(e.acked[m.from], b.n)
	case mHeartbeatAck:
		if b.assign.ver > sv.cfgVer {
			s.deliverAssign(sv, b.assign)
		}
		sv.leaseEnd = max(sv.leaseEnd, b.sent+leaseTicks)
	case mFreeze:
		e := sv.exts[b.ext]
		if e == nil {
			// Its creation never arrived: it holds nothing, so nothing
			// was acknowledged on the extent (every append needs every
			// replica). It answers with length 0.
			e = &extReplica{}
			sv.exts[b.ext] = e
		}
		e.frozen = true
		s.send(sv.id, master, mFreezeAck{ext: b.ext, round: b.round, n: len(e.recs), inc: sv.inc, recs: slices.Clone(e.recs), applied: sv.core.Applied(),
			copying: sv.rr != nil && sv.rr.needCopy})
	case mSeal:
		e := sv.exts[b.ext]
		if e == nil || e.sealed {
			return
		}
		if len(e.recs) < b.n {
			// Quorum: a shorter replica copies the tail from a longer
			// one (the stream manager's repair); sealed extents are
			// immutable, so the master's copy is the truth.
			for _, x := range s.exts {
				if x.id == b.ext {
					e.recs = slices.Clone(x.recs)
				}
			}
		}
		e.recs, e.sealed, e.frozen = e.recs[:b.n], true, true
	case mAssign:
		s.deliverAssign(sv, b)
	default:
		s.repairDeliver(sv, m)
	}
}

func (s *sim) onReplicate(sv *server, from int, b mReplicate) {
	e := sv.exts[b.ext]
	if e == nil || e.primary {
		s.send(sv.id, from, mReplicateAck{ext: b.ext, ok: false})
		return
	}
	if b.from >= 0 {
		switch {
		case e.frozen || e.sealed:
			s.send(sv.id, from, mReplicateAck{ext: b.ext, ok: false})
			return
		case b.from > len(e.recs):
			s.send(sv.id, from, mReplicateAck{ext: b.ext, ok: false})
			return
		}
		for i, r := range b.recs {
			at := b.from + i
			if at < len(e.recs) {
				if e.recs[at].LSN != r.LSN || !bytes.Equal(e.recs[at].Body, r.Body) {
					s.fatalf("server %d extent %d: record %d differs from the primary's", sv.id, b.ext, at)
				}
				continue
			}
			e.recs = append(e.recs, r)
		}
		s.send(sv.id, from, mReplicateAck{ext: b.ext, n: len(e.recs), ok: true})
	}
	if !e.sealed {
		e.commit = max(e.commit, b.commit)
	}
}

func (s *sim) breakExtent(sv *server, ext int) {
	e := sv.exts[ext]
	if e.broken || ext != sv.cur {
		// A late failure of an extent the log has moved past says
		// nothing about the current one.
		return
	}
	s.logf("server %d: extent %d broken", sv.id, ext)
	e.broken = true
	sv.core.AppendFailed()
	s.send(sv.id, master, mReseal{ext: ext})
}

func (s *sim) deliverAssign(sv *server, a mAssign) {
	if a.ver <= sv.cfgVer || a.epoch < sv.core.Epoch() {
		return
	}
	sv.cfgVer = a.ver
	s.logf("server %d assigned %v at epoch %d on extent %d %v (log end %d)", sv.id, a.role, a.epoch, a.ext, a.replicas, a.logEnd)
	if s.rp != nil {
		s.repairAssign(sv, a)
		return
	}
	wasPrimary := sv.core.Role() == partition.RolePrimary
	switch a.role {
	case partition.RoleNone:
		sv.core.Close()
		sv.cur = 0
		s.drain(sv)
		return
	case partition.RolePrimary:
		if wasPrimary && a.epoch == sv.core.Epoch() {
			// Seal-and-continue within its term: the records the seal
			// cut are sent again.
			if err := sv.core.LogRestarted(a.logEnd); err != nil {
				s.fatalf("server %d: %v", sv.id, err)
			}
		} else {
			// Catch up on the sealed log first (observe), then serve.
			s.tailSealed(sv, a.logEnd)
			if err := sv.core.BecomePrimary(a.epoch, a.logEnd); err != nil {
				s.fatalf("server %d: %v", sv.id, err)
			}
			s.tailSealed(sv, a.logEnd)
		}
	case partition.RoleSecondary:
		if err := sv.core.BecomeSecondary(a.epoch); err != nil {
			s.fatalf("server %d: %v", sv.id, err)
		}
		s.tailSealed(sv, a.logEnd)
	}
	if sv.exts[a.ext] == nil {
		sv.exts[a.ext] = &extReplica{}
	}
	e := sv.exts[a.ext]
	e.primary = a.role == partition.RolePrimary
	e.replicas = a.replicas
	if e.primary {
		e.acked = map[int]int{}
	}
	sv.cur = a.ext
	s.drain(sv)
}

// tailSealed observes the records of every sealed extent up to logEnd: a
// replica reads them from its own extent replica or, for extents it never
// held, from another (sealed extents are immutable).
func (s *sim) tailSealed(sv *server, logEnd uint64) {
	for _, x := range s.exts {
		if !x.sealed {
			break
		}
		for _, r := range x.recs {
			if r.LSN > sv.core.Last() && r.LSN <= logEnd {
				if err := sv.core.Observe(r); err != nil {
					s.fatalf("server %d: %v", sv.id, err)
				}
			}
		}
	}
}

// tick is a server's loop turn: heartbeat, the replica's Ready, tailing,
// replication timeouts.
func (s *sim) tick(sv *server) {
	if s.now-sv.lastBeat >= heartbeatEvery {
		sv.lastBeat = s.now
		s.send(sv.id, master, mHeartbeat{inc: sv.inc, sent: s.now, applied: sv.core.Applied(), rep: s.repairReport(sv)})
	}
	if s.rp != nil {
		s.repairTick(sv)
	}
	e := sv.exts[sv.cur]
	if e == nil {
		return
	}
	if e.primary && e.broken && s.now%heartbeatEvery == 0 {
		// Ask again until the master seals and continues the log: the
		// request may have been lost.
		s.send(sv.id, master, mReseal{ext: sv.cur})
	}
	if e.primary {
		// Durable: acknowledged by every secondary (quorum: by enough
		// to make a majority with the primary's own synced copy).
		if !e.broken && len(e.recs) > 0 {
			n := len(e.recs)
			if s.quorum {
				counts := []int{len(e.recs)}
				for _, r := range e.replicas[1:] {
					counts = append(counts, min(len(e.recs), e.acked[r]))
				}
				slices.Sort(counts)
				slices.Reverse(counts)
				n = counts[len(counts)/2]
			} else {
				for _, r := range e.replicas[1:] {
					n = min(n, e.acked[r])
				}
			}
			if n > 0 {
				sv.core.Durable(e.recs[n-1].LSN)
			}
			if n < len(e.recs) && e.waiting && s.now-e.sentAt > replTimeout {
				s.breakExtent(sv, sv.cur)
			}
			if n == len(e.recs) {
				e.waiting = false
			}
		}
		// Tell secondaries the commit point while idle.
		if s.now%5 == 0 && !e.broken {
			for _, r := range e.replicas[1:] {
				s.send(sv.id, r, mReplicate{ext: sv.cur, from: -1, commit: sv.core.CommitPoint(), inc: sv.inc})
			}
		}
	} else if sv.core.Role() == partition.RoleSecondary && s.rp == nil {
		// Tail the local replica up to the commit point it was told.
		for _, r := range e.recs {
			if r.LSN > e.commit {
				break
			}
			if r.LSN > sv.core.Last() {
				if err := sv.core.Observe(r); err != nil {
					s.fatalf("server %d: %v", sv.id, err)
				}
			}
		}
	}
	s.drain(sv)
}

// drain does the work the replica's Ready lists.
func (s *sim) drain(sv *server) {
	for {
		rd := sv.core.Ready()
		if rd.Empty() {
			return
		}
		if len(rd.Append) > 0 {
			e := sv.exts[sv.cur]
			if e == nil || !e.primary {
				s.fatalf("server %d: append with no extent it is primary of", sv.id)
			}
			if e.broken || e.frozen || e.sealed {
				// The node refuses the append (the master froze the
				// extent to seal it): the records are sent again after
				// the log restarts.
				s.breakExtent(sv, sv.cur)
			} else {
				from := len(e.recs)
				if from == 0 && s.rp != nil {
					s.noteExtent(sv, sv.cur, rd.Append[0].LSN) // cannot fail: a primary appends after all it applied
				}
				e.recs = append(e.recs, rd.Append...)
				if !e.waiting {
					e.waiting, e.sentAt = true, s.now
				}
				for _, r := range e.replicas[1:] {
					s.send(sv.id, r, mReplicate{ext: sv.cur, from: from, recs: slices.Clone(rd.Append), commit: sv.core.CommitPoint(), inc: sv.inc})
				}
			}
		}
		for _, r := range rd.Apply {
			if s.rp != nil {
				s.engineApply(sv, r)
				continue
			}
			if r.LSN != uint64(len(sv.engine))+1 {
				s.fatalf("server %d applies LSN %d after %d", sv.id, r.LSN, len(sv.engine))
			}
			sv.engine = append(sv.engine, r)
		}
		for _, a := range rd.Acks {
			w, ok := sv.tokens[a.Token]
			if !ok {
				continue
			}
			delete(sv.tokens, a.Token)
			if prev, dup := s.acked[a.LSN]; dup && !bytes.Equal(prev, s.writes[w].body) {
				s.fatalf("LSN %d acknowledged for two writes (now by server %d at epoch %d: %q, before: %q)", a.LSN, sv.id, sv.core.Epoch(), s.writes[w].body, prev)
			}
			s.acked[a.LSN] = s.writes[w].body
			s.maxAcked = max(s.maxAcked, a.LSN)
			s.ackCount++
		}
		for _, f := range rd.Fails {
			delete(sv.tokens, f.Token)
		}
		sv.core.Advance(rd)
	}
}

func (s *sim) clientWrite() {
	// The client routes by the master's map.
	sv := s.srv[s.primary]
	if !sv.alive || sv.paused || s.now >= sv.leaseEnd {
		return
	}
	w := len(s.writes)
	s.writes = append(s.writes, cwrite{body: fmt.Appendf(nil, "w%d", w)})
	s.nextTok++
	_, _, err := sv.core.Propose(partition.Proposal{Epoch: s.epoch, Body: s.writes[w].body, Token: s.nextTok, RequestID: fmt.Sprint(w)})
	if err == nil {
		sv.tokens[s.nextTok] = w
		s.drain(sv)
	}
}

// clientRead reads at whichever server believes it is the primary and
// holds a lease: it must reflect every write acknowledged before.
func (s *sim) clientRead() {
	for _, sv := range s.srv {
		if !sv.alive || sv.paused || s.now >= sv.leaseEnd || !sv.core.Serving() {
			continue
		}
		if sv.core.Applied() < s.maxAcked {
			s.fatalf("stale read: server %d (primary at epoch %d, lease to %d) has applied %d, %d was acknowledged", sv.id, sv.core.Epoch(), sv.leaseEnd, sv.core.Applied(), s.maxAcked)
		}
	}
}

func (s *sim) masterReceive(m msg) {
	if s.cutBetween(m.from, master) || s.masterDown() {
		return
	}
	switch b := m.body.(type) {
	case mHeartbeat:
		if b.inc != s.heardInc[m.from] {
			// A new incarnation: the old process is gone; treat it as
			// a failure of that replica now.
			s.heardInc[m.from] = b.inc
			s.logf("master: server %d restarted (incarnation %d)", m.from, b.inc)
			s.declareDead(m.from)
			s.lastHeard[m.from] = s.now
			s.onFailure(m.from)
			return
		}
		if s.dead[m.from] && slices.Contains(s.set, m.from) && !s.keptBack(m.from) {
			return // declared dead: it is removed from the set at the next reconfiguration
		}
		if s.dead[m.from] {
			s.logf("master: server %d back", m.from)
			delete(s.dead, m.from)
		}
		s.lastHeard[m.from] = s.now
		s.applied[m.from] = b.applied
		if s.rp != nil {
			if b.rep != nil {
				s.rp.reports[m.from] = *b.rep
			} else {
				delete(s.rp.reports, m.from)
			}
		}
		if s.holdAcks[m.from] {
			return // its lease is being waited out
		}
		s.ackedAt[m.from] = s.now
		a, ok := s.assigns[m.from]
		if !ok {
			a = mAssign{role: partition.RoleNone}
		}
		s.send(master, m.from, mHeartbeatAck{sent: b.sent, assign: a})
	case mFreezeAck:
		if r := s.reconf; r != nil && r.ext == b.ext && r.round == b.round {
			r.replies[m.from] = b
		}
	case mReseal:
		if s.reconf == nil && b.ext == s.curExt().id && m.from == s.primary {
			s.startReconfig(false)
		}
	default:
		s.repairMasterReceive(m)
	}
}

func (s *sim) curExt() *extent { return s.exts[len(s.exts)-1] }

func (s *sim) onFailure(id int) {
	if !slices.Contains(s.set, id) {
		return
	}
	if s.reconf != nil {
		s.reconf.replace = s.reconf.replace || id == s.primary
		return
	}
	s.startReconfig(id == s.primary)
}

func (s *sim) startReconfig(replace bool) {
	s.freezeRnd++
	x := s.curExt()
	wait := int64(freezeWait)
	if s.rp != nil {
		// Roll-overs make reconfigurations frequent: a slow answer must
		// not drop a replica each time (the product drops those the seal
		// cannot reach at all).
		wait *= 3
	}
	s.reconf = &reconfig{ext: x.id, round: s.freezeRnd, deadline: s.now + wait, replies: map[int]mFreezeAck{}, replace: replace, promote: -1}
	s.logf("master: reconfigure (replace primary: %v), freezing extent %d", replace, x.id)
	for _, id := range x.replicas {
		s.send(master, id, mFreeze{ext: x.id, round: s.freezeRnd})
	}
}

func (s *sim) masterTick() {
	if s.masterDown() {
		return
	}
	// Declare silent servers dead (after their lease ran out).
	for id := range nServers {
		if !s.dead[id] && s.now-s.lastHeard[id] > deadAfter {
			s.logf("master: server %d dead", id)
			s.declareDead(id)
			s.onFailure(id)
		}
	}
	// A server back from the dead, or a set short of replicas, rejoins at
	// the next reconfiguration.
	if s.reconf == nil && s.now%50 == 0 {
		if s.rp != nil {
			s.repairShort()
		} else {
			short := len(s.set) < replFactor
			for _, id := range s.set {
				short = short || s.dead[id]
			}
			if short && s.spares() > 0 {
				s.startReconfig(s.dead[s.primary])
			}
		}
	}
	if s.rp != nil && s.reconf == nil {
		s.repairMasterTick()
	}
	r := s.reconf
	if r == nil {
		return
	}
	x := s.curExt()
	alive := 0
	for _, id := range x.replicas {
		if _, ok := r.replies[id]; ok {
			alive++
		}
	}
	if alive < len(x.replicas) && s.now < r.deadline {
		return
	}
	// The seal must hear from enough replicas to meet every set that could
	// have acknowledged an append: n - required + 1 (1 under all-replica
	// acks; under quorum 2 of 3, and 1 of 2, where an append needed both).
	need := 1
	if s.quorum {
		n := len(x.replicas)
		need = n - (n/2 + 1) + 1
	}
	if alive < need {
		// Too few replicas of the open extent answer to know what was
		// acknowledged: nothing can be sealed safely; try again.
		s.startReconfig(r.replace)
		s.reconf.replace, s.reconf.promote = r.replace, r.promote
		return
	}
	// A primary that is replaced may still hold a lease: renew it no more
	// and wait it out before anyone else is promoted.
	if old := s.primary; r.replace || !answered(r, old) {
		if s.now <= s.ackedAt[old]+leaseTicks {
			s.holdAcks[old] = true
			return
		}
	}
	// Seal at the smallest length among the replies (every acknowledged
	// append is on every replica), or with quorum at the longest among a
	// majority (every acknowledged append is on a majority, which meets
	// every other majority).
	n := -1
	var from mFreezeAck
	for _, id := range x.replicas {
		rep, ok := r.replies[id]
		if ok && (n < 0 || (!s.quorum && rep.n < n) || (s.quorum && rep.n > n)) {
			n, from = rep.n, rep
		}
	}
	for _, id := range x.replicas {
		if rep, ok := r.replies[id]; ok {
			s.logf("master: extent %d freeze reply from %d: %d records", x.id, id, rep.n)
		}
	}
	if x.sealed {
		// Sealed by an earlier round that then found no replica to
		// promote: a sealed extent never changes length.
		n = len(x.recs)
	} else {
		x.sealed, x.recs = true, from.recs[:n]
	}
	for _, id := range x.replicas {
		if _, ok := r.replies[id]; ok {
			s.send(master, id, mSeal{ext: x.id, n: n})
		}
	}
	logEnd := uint64(0)
	for _, y := range s.exts {
		if len(y.recs) > 0 {
			logEnd = y.recs[len(y.recs)-1].LSN
		}
	}
	// The new set: replicas that answered (as the incarnation the master
	// knows: a process that restarted after a crash keeps its synced
	// replica and its engine, and rejoins), then spares.
	var next, kept []int
	for _, id := range s.set {
		if rep, ok := r.replies[id]; ok && rep.inc == s.heardInc[id] {
			next = append(next, id)
			// Its answer is news of it: it is not dead, and not silent
			// (else the next tick declares it dead again, and around).
			delete(s.dead, id)
			s.lastHeard[id] = s.now
			continue
		}
		switch s.memberFate(id, x) {
		case fateRejoin:
			next = append(next, id)
		case fateKeep:
			kept = append(kept, id)
		}
	}
	replace := r.replace || !slices.Contains(next, s.primary)
	if replace {
		// Promote the most caught-up replica that answered (a move's
		// target if it hands the primary role over and answered).
		best, bestApplied := -1, uint64(0)
		for _, id := range next {
			rep, ok := r.replies[id]
			if !ok && s.rp != nil {
				// A replica rejoining the log (it held no extent to
				// freeze) is a candidate too, by its last report.
				if st, has := s.rp.reports[id]; has {
					rep, ok = mFreezeAck{applied: st.applied, copying: st.state == rsCopying}, true
				}
			}
			if ok && !s.unpromotable(rep) && (best < 0 || rep.applied > bestApplied) {
				best, bestApplied = id, rep.applied
			}
		}
		if rep, ok := r.replies[r.promote]; ok && !s.unpromotable(rep) && slices.Contains(next, r.promote) {
			best = r.promote
		}
		if best < 0 {
			s.logf("master: no replica to promote; retrying")
			s.reconf = nil
			return
		}
		s.primary = best
		s.epoch++
	}
	next = slices.DeleteFunc(next, func(id int) bool { return id == s.primary })
	next = append([]int{s.primary}, next...)
	for id := range nServers {
		if len(next)+len(kept) >= replFactor {
			break
		}
		if _, answered := r.replies[id]; slices.Contains(x.replicas, id) && !answered {
			continue // it did not answer the freeze: not trusted to be up
		}
		if !slices.Contains(next, id) && !s.dead[id] && s.now-s.lastHeard[id] < deadAfter {
			next = append(next, id)
		}
	}
	old := s.set
	// Kept replicas stay in the set, out of the log, until they return
	// or are replaced.
	s.set = append(slices.Clone(next), kept...)
	nx := &extent{id: x.id + 1, replicas: next}
	s.exts = append(s.exts, nx)
	s.reconf = nil
	clear(s.holdAcks)
	s.cfgVer++
	s.logf("master: sealed extent %d at %d records (log end %d); epoch %d primary %d set %v", x.id, n, logEnd, s.epoch, s.primary, next)
	for _, id := range next {
		s.assigns[id] = mAssign{ver: s.cfgVer, epoch: s.epoch, role: roleFor(id, s.primary), ext: nx.id, replicas: next, logEnd: logEnd}
		s.send(master, id, s.assigns[id])
	}
	for _, id := range old {
		if !slices.Contains(s.set, id) {
			s.assigns[id] = mAssign{ver: s.cfgVer, epoch: s.epoch, role: partition.RoleNone, logEnd: logEnd}
			s.send(master, id, s.assigns[id])
		}
	}
	for _, id := range kept {
		// A kept replica is a secondary of the new epoch that holds no
		// extent of the log: back, it reads the sealed log until the
		// next reconfiguration takes it in.
		s.assigns[id] = mAssign{ver: s.cfgVer, epoch: s.epoch, role: partition.RoleSecondary, replicas: next, logEnd: logEnd}
		s.send(master, id, s.assigns[id])
	}
}

func answered(r *reconfig, id int) bool {
	_, ok := r.replies[id]
	return ok
}

func (s *sim) spares() int {
	n := 0
	for id := range nServers {
		if !slices.Contains(s.set, id) && !s.dead[id] && s.now-s.lastHeard[id] < deadAfter {
			n++
		}
	}
	return n
}

// check runs after every step.
func (s *sim) check() {
	for _, sv := range s.srv {
		if !sv.alive {
			continue
		}
		if err := sv.core.Check(); err != nil {
			s.fatalf("server %d: %v", sv.id, err)
		}
		if sv.core.Role() == partition.RolePrimary {
			if p, ok := s.primaries[sv.core.Epoch()]; ok && p != sv.id {
				s.fatalf("two primaries at epoch %d: %d and %d", sv.core.Epoch(), p, sv.id)
			}
			s.primaries[sv.core.Epoch()] = sv.id
		}
	}
}

// finalLog is the log as sealed so far plus the open extent up to the
// primary's commit point.
func (s *sim) finalLog() []partition.Record {
	var out []partition.Record
	for _, x := range s.exts {
		if x.sealed {
			out = append(out, x.recs...)
			continue
		}
		p := s.srv[s.primary]
		if e := p.exts[x.id]; e != nil && e.primary {
			for _, r := range e.recs {
				if r.LSN <= p.core.CommitPoint() {
					out = append(out, r)
				}
			}
		}
	}
	return out
}

func (s *sim) finalCheck() {
	log := s.finalLog()
	for i, r := range log {
		if r.LSN != uint64(i)+1 {
			s.fatalf("final log: record %d has LSN %d", i, r.LSN)
		}
	}
	for lsn, body := range s.acked {
		if lsn > uint64(len(log)) || !bytes.Equal(log[lsn-1].Body, body) {
			s.fatalf("acknowledged write at LSN %d (%q) lost (log has %d records)", lsn, body, len(log))
		}
	}
	for _, sv := range s.srv {
		if len(sv.engine) > len(log) {
			s.fatalf("server %d applied %d records, beyond the committed log's %d", sv.id, len(sv.engine), len(log))
		}
		for i, r := range sv.engine {
			if r.LSN != log[i].LSN || !bytes.Equal(r.Body, log[i].Body) {
				s.fatalf("server %d applied LSN %d = %q, the log has %q", sv.id, r.LSN, r.Body, log[i].Body)
			}
		}
	}
}

func runScenario(t *testing.T, seed uint64) {
	s := newSim(t, seed, nil)
	s.run(2000, true, 0.3)
	// Heal everything and let the partition recover.
	for _, sv := range s.srv {
		s.restartOrResume(sv)
	}
	clear(s.cut)
	s.drop = 0
	before := s.ackCount
	s.run(1200, false, 0.2)
	s.finalCheck()
	if s.ackCount == before {
		s.fatalf("no write was acknowledged after healing (epoch %d, primary %d, set %v)", s.epoch, s.primary, s.set)
	}
}

func TestSimulation(t *testing.T) {
	if *simSeed != 0 {
		runScenario(t, *simSeed)
		return
	}
	n := *simScenarios
	if n == 0 {
		n = 2000
		if testing.Short() || raceEnabled {
			n = 100
		}
	}
	// CI runs a fixed range of seeds, so a run is repeatable; -sim.random
	// explores new ones (a failure prints its seed either way).
	base := uint64(1)
	if *simRandom {
		base = rand.Uint64()
	}
	t.Logf("scenarios %d, seeds %d..%d", n, base, base+uint64(n)-1)
	for i := range n {
		runScenario(t, base+uint64(i))
		if t.Failed() {
			return
		}
	}
}
