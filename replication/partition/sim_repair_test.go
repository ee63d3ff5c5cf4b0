package partition_test

// The replication simulation (sim_test.go) extended with the repairs of
// the product: replacement by copy, moves with data and log truncation,
// each modelled on the product's steps:
//
//   - An engine is a small key-value state with an applied LSN written
//     atomically with each record, flushed (synced) now and then: a crash
//     keeps the last flush plus any prefix of the writes after it (a
//     write-ahead log persists in order), so a replica recovers at its
//     flushed LSN or later (tableserver/truncate.go flush).
//   - A replica whose engine has applied nothing (a new one, or one the log
//     no longer covers) copies a snapshot from the primary: it empties its
//     engine, the source reads its applied LSN L and streams its keys in
//     chunks read while writes go on (a fuzzy snapshot), the copy writes L
//     last, then tails the log from L+1; it reports COPYING, CATCHING_UP,
//     then IN_SYNC (tableserver/copy.go).
//   - A dead server's replicas are kept, out of the log, for replaceAfter;
//     then dropped and placed again on a spare, which copies
//     (tablemaster OpServerDown Keep/Replace).
//   - A move adds the target to the set (the log's next extent includes
//     it), waits until it reports IN_SYNC, then removes the source, handing
//     the primary role to the target at a new epoch if the source had it
//     (tablemaster/move.go).
//   - Replicas report their flushed LSN and the extent holding the record
//     after it; the master deletes the extents below the earliest over the
//     set, leaving out replicas more than maxLag behind, which copy when
//     they find the log trimmed past them (tablemaster/truncate.go).
//
// A step-indexed fault schedule crashes a participant (the replica doing
// the step, the other end, the primary, the master, another server) at
// the k-th time a scenario reaches a given step, so every step of a copy,
// a move and a truncation is hit across the seed range. Checks on top of
// the replication sim's: an acknowledged write is never lost across
// copies, moves and truncations; a trim never deletes a record a replica
// needs to recover from its flushed state (unless it reported itself
// lagging by more than maxLag and is not the primary: it copies); a
// replica's state is the log prefix it claims (a copy's once it applied
// past the snapshot's fuzzy end); two replicas never apply different
// records at one LSN; after the faults stop, the set is back to
// replFactor replicas, all in sync.

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/tabuladb/tabula/replication/partition"
)

var simBug = flag.String("sim.bug", "", "repair simulation: model a bug to show the checks catch it: trim-max (trim below the most advanced replica, not the least), old-logkeep (tablemaster logKeep before the fix: an unflushed replica, or the primary, left out as lagging), old-tail (tableserver: a tail extent trimmed away stalls the tailer, catchUp serves without reading), promote-copying (tablemaster: a copying replica promoted, the last replica with data replaced)")

// rstate is a replica's state as it reports it (api.ReplicaState).
type rstate uint8

const (
	rsCatchingUp rstate = iota
	rsCopying
	rsInSync
)

func (r rstate) String() string {
	return [...]string{"catching-up", "copying", "in-sync"}[r]
}

// report is a replica's status in a heartbeat (api.ReplicaStatus).
type report struct {
	state    rstate
	applied  uint64
	flushed  uint64
	keepFrom int // the extent holding the record after flushed; 0: unknown
}

const nKeys = 6

// kvState is an engine's content: a few keys, the applied LSN (a reserved
// key, sorted before the others) and, for the checks only, the LSN the
// state was copied at and the fuzzy end of that copy.
type kvState struct {
	applied, base, horizon uint64
	vals                   [nKeys]string
}

type kvOp func(*kvState)

type extStart struct {
	ext   int
	first uint64
}

// copyIn is a copy in progress on the target (tableserver copyIn).
type copyIn struct {
	id, src int
	lsn     uint64
	next    int // the chunk expected
	got     int // keys received
	lastAt  int64
	early   map[int]mCopyChunk // chunks ahead of next (the stream is ordered; the network is not)
}

// copyOut is a copy stream on the source (tableserver CopyReplica).
type copyOut struct {
	id   int
	lsn  uint64
	next int
	sent int
}

type (
	mCopyReq   struct{ id int }
	mCopyChunk struct {
		id, idx int
		lsn     uint64
		keys    []int
		vals    []string
		done    bool
		sent    int
		refuse  bool
		horizon uint64 // checks only: the source's state may hold records up to it
	}
)

// replState is a server's replica beyond its core: the engine and what
// the product's logReplica keeps.
type replState struct {
	eng, durable kvState
	pending      [][]kvOp // batches since the last flush
	want         partition.Role
	wantEpoch    uint64
	source       int // the primary the map names (-1: none or itself)
	needCopy     bool
	cp           *copyIn
	outs         map[int]*copyOut
	synced       bool
	flushed      uint64
	starts       []extStart
	tailPos      int // the extent the tail reads; 0: the log's start
	flushPhase   int64
	// primaryPending: a new primary still reading the sealed log (retried
	// every tick, as the product's tailer does).
	primaryPending *mAssign
	stuck          string // why it cannot go on; the product retries forever
}

func newReplState() *replState {
	return &replState{source: -1, needCopy: true, outs: map[int]*copyOut{}}
}

type simMove struct {
	from, to int
	since    int64
}

type repairCfg struct {
	replaceAfter int64
	maxLag       uint64
	extentRecs   int
	flushEvery   int64
	truncEvery   int64
	moveEvery    int64
	bug          string
}

// Steps of the fault schedule.
const (
	stCopyEmpty = iota
	stCopyRequest
	stCopyServe
	stCopySend
	stCopyChunk
	stCopyDone
	stCopyTail
	stMoveStart
	stMoveInSync
	stMoveDone
	stReplace
	stFlush
	stTrim
	stTrimDone
	stTruncated
	stPrimaryEmpty
	nSteps
)

var stepNames = [nSteps]string{"copy.empty", "copy.request", "copy.serve", "copy.send", "copy.chunk", "copy.done", "copy.tail",
	"move.start", "move.in-sync", "move.done", "replace", "flush", "trim", "trim.done", "truncated", "primary.empty"}

const (
	vSelf  = iota // the replica (or server) doing the step
	vOther        // the other end: a copy's source or target, a move's other end
	vPrimary
	vMaster
	vAny // another live server
	nVictims
)

var victimNames = [nVictims]string{"self", "other", "primary", "master", "any"}

type faultPlan struct {
	step, victim, occurrence int
	fired                    bool
}

type repair struct {
	cfg         repairCfg
	plan        faultPlan
	reports     map[int]report
	deadSince   map[int]int64
	move        *simMove
	downUntil   int64 // the master is down (a leader crash) until then
	rejoin      bool
	healing     bool
	nextCopy    int
	hits        [nSteps]int
	restartAt   map[int]int64
	lsnBody     map[uint64][]byte
	prefix      []kvState // prefix[n]: the state after the log's first n records
	copies      int
	moves       int
	trims       int
	truncations int
	replaced    int
}

// repairStats sums a run's scenarios.
type repairStats struct {
	mu                                             sync.Mutex
	fired                                          [nSteps][nVictims]int
	hits                                           [nSteps]int
	copies, moves, trims, truncations, replacement int
}

func newRepair(seed uint64) *repair {
	r := rand.New(rand.NewPCG(seed^0x51ed, seed))
	k := seed - 1
	rp := &repair{
		cfg: repairCfg{
			replaceAfter: []int64{0, 150, 400}[r.IntN(3)],
			maxLag:       []uint64{0, 15, 40}[r.IntN(3)],
			extentRecs:   4 + r.IntN(12),
			flushEvery:   []int64{10, 40, 120}[r.IntN(3)],
			truncEvery:   20 + r.Int64N(60),
			moveEvery:    []int64{150, 300, 600}[r.IntN(3)],
			bug:          *simBug,
		},
		plan:      faultPlan{step: int(k % nSteps), victim: int(k / nSteps % nVictims), occurrence: 1 + int(k/(nSteps*nVictims)%3)},
		reports:   map[int]report{},
		deadSince: map[int]int64{},
		restartAt: map[int]int64{},
		lsnBody:   map[uint64][]byte{},
		prefix:    []kvState{{}},
	}
	return rp
}

// step marks that the scenario reached step; actors are the replica doing
// it and the other end (-1: none). The fault schedule crashes its victim
// at the planned occurrence. It reports whether self is still up.
func (s *sim) step(st int, self, other int) bool {
	rp := s.rp
	rp.hits[st]++
	if rp.healing || rp.plan.fired || rp.plan.step != st || rp.hits[st] != rp.plan.occurrence {
		return self < 0 || s.srv[self].alive
	}
	rp.plan.fired = true
	victim := -2
	switch rp.plan.victim {
	case vSelf:
		victim = self
	case vOther:
		victim = other
	case vPrimary:
		victim = s.primary
	case vMaster:
		victim = master
	case vAny:
		var live []int
		for _, sv := range s.srv {
			if sv.alive && sv.id != self && sv.id != other {
				live = append(live, sv.id)
			}
		}
		if len(live) > 0 {
			victim = live[s.rng.IntN(len(live))]
		}
	}
	if victim == -2 || (victim == -1 && rp.plan.victim != vMaster) {
		victim = self
	}
	if victim >= 0 && s.othersDown(victim) {
		// One failure at a time: the one already under way ends first.
		for _, sv := range s.srv {
			if sv.id != victim && (!sv.alive || sv.paused) {
				s.restartOrResume(sv)
				delete(rp.restartAt, sv.id)
			}
		}
		for k := range s.cut {
			delete(s.cut, k)
		}
	}
	s.logf("fault schedule: crash %d at %s (victim %s)", victim, stepNames[st], victimNames[rp.plan.victim])
	s.crash(victim)
	return self < 0 || s.srv[self].alive
}

// crash kills server id (or the master: its leader dies and another takes
// over after a while, with what the command log holds).
func (s *sim) crash(id int) {
	if id == master {
		if s.masterDown() {
			return
		}
		s.rp.downUntil = s.now + 20 + s.rng.Int64N(100)
		s.logf("master crash: down until %d", s.rp.downUntil)
		// Volatile: replica reports and the reconfiguration in flight (a
		// new leader redoes it: the map says what the set is). Leases
		// granted stay granted (ackedAt is what servers hold).
		clear(s.rp.reports)
		for id := range nServers {
			// The new leader hears from every server afresh.
			s.lastHeard[id] = max(s.lastHeard[id], s.rp.downUntil)
		}
		if r := s.reconf; r != nil {
			s.reconf = nil
			clear(s.holdAcks)
			s.rp.rejoin = true
		}
		return
	}
	sv := s.srv[id]
	if !sv.alive {
		return
	}
	sv.alive = false
	s.q = slices.DeleteFunc(s.q, func(m msg) bool { return m.to == id })
	if s.rng.IntN(3) != 0 {
		s.rp.restartAt[id] = s.now + 30 + s.rng.Int64N(300)
	}
}

// othersDown reports whether a server other than id is down, stopped or
// cut off.
func (s *sim) othersDown(id int) bool {
	for _, sv := range s.srv {
		if sv.id != id && (!sv.alive || sv.paused) {
			return true
		}
	}
	for k, until := range s.cut {
		if until > s.now && k[0] != id && k[1] != id {
			return true
		}
	}
	return false
}

func (s *sim) masterDown() bool { return s.rp != nil && s.now < s.rp.downUntil }

// repairRestart is a server's new process: the engine keeps its last
// flush and a prefix of the writes after it.
func (s *sim) repairRestart(sv *server) {
	rr := sv.rr
	st := rr.durable
	if len(rr.pending) > 0 && s.rng.IntN(2) == 0 {
		for _, b := range rr.pending[:s.rng.IntN(len(rr.pending)+1)] {
			for _, op := range b {
				op(&st)
			}
		}
	}
	rr.eng, rr.durable, rr.pending = st, st, nil
	s.checkState(sv, "recovered after a crash")
	sv.core = partition.New(partition.Config{MaxInFlight: 64}, st.applied)
	*rr = replState{eng: st, durable: st, source: -1, needCopy: st.applied == 0, outs: map[int]*copyOut{}, flushPhase: rr.flushPhase}
}

// batch applies ops to the engine atomically (not yet durable).
func (rr *replState) batch(ops ...kvOp) {
	for _, op := range ops {
		op(&rr.eng)
	}
	rr.pending = append(rr.pending, ops)
}

func writeOf(body []byte) (key int, val string) {
	w, err := strconv.Atoi(strings.TrimPrefix(string(body), "w"))
	if err != nil {
		panic(err)
	}
	if w%5 == 4 {
		return w % nKeys, "" // a delete
	}
	return w % nKeys, string(body)
}

// engineApply applies a committed record with its LSN, as the product's
// apply does.
func (s *sim) engineApply(sv *server, r partition.Record) {
	rr := sv.rr
	if r.LSN != rr.eng.applied+1 {
		s.fatalf("server %d applies LSN %d over an engine that applied %d", sv.id, r.LSN, rr.eng.applied)
	}
	if prev, ok := s.rp.lsnBody[r.LSN]; ok && string(prev) != string(r.Body) {
		s.fatalf("server %d applies %q at LSN %d, another replica applied %q", sv.id, r.Body, r.LSN, prev)
	}
	s.rp.lsnBody[r.LSN] = r.Body
	for uint64(len(s.rp.prefix)) <= r.LSN {
		n := uint64(len(s.rp.prefix))
		b, ok := s.rp.lsnBody[n]
		if !ok {
			break
		}
		st := s.rp.prefix[n-1]
		k, v := writeOf(b)
		st.vals[k], st.applied = v, n
		s.rp.prefix = append(s.rp.prefix, st)
	}
	k, v := writeOf(r.Body)
	lsn := r.LSN
	rr.batch(func(st *kvState) { st.vals[k], st.applied = v, lsn })
	s.checkState(sv, "applied")
}

// checkState: an engine past its copy's fuzzy end holds exactly the log
// prefix its applied LSN claims.
func (s *sim) checkState(sv *server, what string) {
	st := sv.rr.eng
	if st.applied == 0 || st.applied < st.horizon || st.applied >= uint64(len(s.rp.prefix)) {
		return
	}
	if want := s.rp.prefix[st.applied]; st.vals != want.vals {
		s.fatalf("server %d (%s): engine at LSN %d (copied at %d, fuzzy to %d) holds %q, the log's prefix is %q", sv.id, what, st.applied, st.base, st.horizon, st.vals, want.vals)
	}
}

// engineEmpty deletes every key, the applied LSN first (it sorts first),
// one batch each: a crash in between leaves applied 0, copied again.
func (s *sim) engineEmpty(sv *server) {
	rr := sv.rr
	if rr.eng.applied != 0 || rr.eng.base != 0 {
		rr.batch(func(st *kvState) { st.applied, st.base, st.horizon = 0, 0, 0 })
	}
	for k := range nKeys {
		if rr.eng.vals[k] != "" {
			rr.batch(func(st *kvState) { st.vals[k] = "" })
		}
	}
}

// flush syncs the engine (tableserver flush): not while copying, nor
// before anything is applied.
func (s *sim) flush(sv *server) {
	rr := sv.rr
	if rr.needCopy || rr.cp != nil || sv.core.Applied() == 0 {
		return
	}
	if !s.step(stFlush, sv.id, -1) {
		return
	}
	applied := sv.core.Applied()
	rr.durable, rr.pending = rr.eng, nil
	rr.flushed = max(rr.flushed, applied)
}

var (
	errTruncated = errors.New("the log was truncated past this replica's applied LSN")
	errGone      = errors.New("the extent the tail reads is gone from the stream")
)

// noteExtent is the product's noteExtentLocked: the first extent read
// since the replica started must continue from its applied LSN.
func (s *sim) noteExtent(sv *server, ext int, first uint64) error {
	rr := sv.rr
	if n := len(rr.starts); n > 0 && rr.starts[n-1].ext == ext {
		return nil
	}
	if len(rr.starts) == 0 && first > sv.core.Applied()+1 {
		return fmt.Errorf("extent %d starts at LSN %d, the replica applied %d: %w", ext, first, sv.core.Applied(), errTruncated)
	}
	rr.starts = append(rr.starts, extStart{ext, first})
	return nil
}

// keepFrom is the product's keepFromLocked.
func keepFrom(rr *replState) int {
	if rr.flushed == 0 {
		return 0
	}
	keep, k := 0, 0
	for i, st := range rr.starts {
		if st.first > rr.flushed+1 {
			break
		}
		keep, k = st.ext, i
	}
	rr.starts = rr.starts[k:]
	return keep
}

func (s *sim) extentByID(id int) *extent {
	if id < 1 || id > len(s.exts) {
		return nil
	}
	return s.exts[id-1]
}

// readLog reads the sealed extents from the tail position (the product's
// follow and catchUp), observing records up to logEnd.
func (s *sim) readLog(sv *server, logEnd uint64) error {
	rr := sv.rr
	if rr.tailPos != 0 {
		if x := s.extentByID(rr.tailPos); x == nil || x.trimmed {
			if s.rp.cfg.bug == "old-tail" {
				// tableserver follow: "extent gone from the stream",
				// retried forever; catchUp reads nothing and serves.
				return fmt.Errorf("extent %d: %w", rr.tailPos, errGone)
			}
			// The tail extent was trimmed: read from the log's start
			// again, checking it still continues from the applied LSN.
			rr.tailPos, rr.starts = 0, nil
		}
	}
	// Extent ids are their index in s.exts plus one.
	from := max(rr.tailPos-1, 0)
	for from < len(s.exts) && s.exts[from].trimmed {
		from++
	}
	for _, x := range s.exts[from:] {
		if !x.sealed {
			break
		}
		if len(x.recs) > 0 {
			if err := s.noteExtent(sv, x.id, x.recs[0].LSN); err != nil {
				return err
			}
		}
		for _, r := range x.recs {
			if r.LSN > sv.core.Last() && r.LSN <= logEnd {
				if err := sv.core.Observe(r); err != nil {
					s.fatalf("server %d: %v", sv.id, err)
				}
			}
		}
		rr.tailPos = x.id
	}
	return nil
}

// repairReport is the replica's status (tableserver progress and
// truncation); nil when it holds no replica.
func (s *sim) repairReport(sv *server) *report {
	rr := sv.rr
	if rr == nil || rr.want == partition.RoleNone {
		return nil
	}
	rep := &report{state: rsCatchingUp, applied: sv.core.Applied(), flushed: rr.flushed, keepFrom: keepFrom(rr)}
	switch {
	case rr.needCopy && rr.want == partition.RoleSecondary:
		rep.state = rsCopying
	case rr.want == partition.RolePrimary && rr.primaryPending == nil && sv.core.Serving(),
		rr.want == partition.RoleSecondary && rr.synced:
		rep.state = rsInSync
	}
	return rep
}

// repairAssign is deliverAssign with copies and truncation.
func (s *sim) repairAssign(sv *server, a mAssign) {
	rr := sv.rr
	rr.want, rr.wantEpoch, rr.primaryPending, rr.stuck = a.role, a.epoch, nil, ""
	rr.source = -1
	if len(a.replicas) > 0 && a.replicas[0] != sv.id {
		rr.source = a.replicas[0]
	}
	wasPrimary := sv.core.Role() == partition.RolePrimary
	switch a.role {
	case partition.RoleNone:
		sv.core.Close()
		sv.cur = 0
		s.drain(sv)
		// The server closes the replica (its engine stays, or its sweep
		// deletes it): a later placement here starts a new one.
		eng, durable, pending := rr.eng, rr.durable, rr.pending
		if s.rng.IntN(2) == 0 {
			eng, durable, pending = kvState{}, kvState{}, nil
		}
		*rr = replState{eng: eng, durable: durable, pending: pending, source: -1, needCopy: eng.applied == 0, outs: map[int]*copyOut{}, flushPhase: rr.flushPhase}
		sv.core = partition.New(partition.Config{MaxInFlight: 64}, eng.applied)
		sv.core.Close()
		return
	case partition.RolePrimary:
		if wasPrimary && a.epoch == sv.core.Epoch() {
			if err := sv.core.LogRestarted(a.logEnd); err != nil {
				s.fatalf("server %d: %v", sv.id, err)
			}
		} else {
			if wasPrimary {
				if err := sv.core.BecomeSecondary(a.epoch); err != nil {
					s.fatalf("server %d: %v", sv.id, err)
				}
			}
			rr.primaryPending = &a
			s.catchUpPrimary(sv)
			if !sv.alive {
				return
			}
		}
	case partition.RoleSecondary:
		if sv.core.Role() != partition.RoleSecondary || sv.core.Epoch() != a.epoch {
			if err := sv.core.BecomeSecondary(a.epoch); err != nil {
				s.fatalf("server %d: %v", sv.id, err)
			}
			rr.synced = false
		}
	}
	if a.ext != 0 {
		if sv.exts[a.ext] == nil {
			sv.exts[a.ext] = &extReplica{}
		}
		e := sv.exts[a.ext]
		e.primary = a.role == partition.RolePrimary
		e.replicas = a.replicas
		if e.primary {
			e.acked = map[int]int{}
		}
	}
	sv.cur = a.ext
	if a.role == partition.RoleSecondary && !rr.needCopy {
		s.follow(sv)
	}
	s.drain(sv)
}

// catchUpPrimary: a new primary empties an engine that never finished a
// copy, reads the sealed log, then takes writes once it applied it.
func (s *sim) catchUpPrimary(sv *server) {
	rr := sv.rr
	a := rr.primaryPending
	if rr.needCopy {
		if !s.step(stPrimaryEmpty, sv.id, -1) {
			return
		}
		s.engineEmpty(sv)
		rr.needCopy, rr.cp = false, nil
	}
	end := a.logEnd
	if err := s.readLog(sv, a.logEnd); errors.Is(err, errGone) {
		// The product's catchUp skips every extent when its tail extent
		// is gone, and serves from what it has.
		end = sv.core.Last()
	} else if err != nil {
		if rr.stuck == "" {
			s.logf("server %d: new primary cannot read the log: %v", sv.id, err)
		}
		rr.stuck = "primary: " + err.Error()
		return
	}
	// The product becomes primary at the end of what it read (its map
	// may be older than the stream: the tailer read further).
	if err := sv.core.BecomePrimary(a.epoch, max(end, sv.core.Last())); err != nil {
		s.fatalf("server %d: %v", sv.id, err)
	}
	rr.primaryPending, rr.stuck = nil, ""
	rr.tailPos = a.ext
}

// follow is a secondary's tailer: the sealed log, then its replica of the
// open extent up to the commit point.
func (s *sim) follow(sv *server) {
	rr := sv.rr
	err := s.readLog(sv, math.MaxUint64)
	if err == nil && sv.cur != 0 {
		if e := sv.exts[sv.cur]; e != nil {
			if len(e.recs) > 0 {
				err = s.noteExtent(sv, sv.cur, e.recs[0].LSN)
			}
			if err == nil {
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
				rr.tailPos = sv.cur
				rr.synced = true
			}
		}
	}
	switch {
	case err == nil:
		rr.stuck = ""
	case errors.Is(err, errTruncated):
		// The log no longer holds what it needs: it copies a snapshot.
		s.rp.truncations++
		s.logf("server %d: %v; copying", sv.id, err)
		if !s.step(stTruncated, sv.id, rr.source) {
			return
		}
		rr.needCopy, rr.starts = true, nil
	default:
		rr.stuck = err.Error()
	}
}

// repairTick: flush, copy streams out, the tailer.
func (s *sim) repairTick(sv *server) {
	rr := sv.rr
	if (s.now+rr.flushPhase)%s.rp.cfg.flushEvery == 0 {
		s.flush(sv)
		if !sv.alive {
			return
		}
	}
	if len(rr.outs) > 0 {
		for _, to := range slices.Sorted(maps.Keys(rr.outs)) {
			s.copySend(sv, to)
			if !sv.alive {
				return
			}
		}
	}
	switch {
	case rr.want == partition.RolePrimary && rr.primaryPending != nil:
		s.catchUpPrimary(sv)
	case rr.want == partition.RoleSecondary && rr.needCopy:
		s.copyTick(sv)
	case rr.want == partition.RoleSecondary:
		s.follow(sv)
	}
}

const (
	copyTimeout   = 60
	copyChunkKeys = 2
)

// copyTick is the target's side of a copy: empty, ask the primary, and
// give up on a stream that went silent (a broken connection).
func (s *sim) copyTick(sv *server) {
	rr := sv.rr
	if rr.cp != nil {
		if s.now-rr.cp.lastAt > copyTimeout {
			s.logf("server %d: copy %d from %d broke off", sv.id, rr.cp.id, rr.cp.src)
			rr.cp = nil
		}
		return
	}
	if rr.source < 0 {
		return // no primary yet: the map will name one
	}
	if !s.step(stCopyEmpty, sv.id, rr.source) {
		return
	}
	s.engineEmpty(sv)
	s.rp.nextCopy++
	rr.cp = &copyIn{id: s.rp.nextCopy, src: rr.source, lastAt: s.now}
	if !s.step(stCopyRequest, sv.id, rr.source) {
		return
	}
	s.logf("server %d: copy %d from %d", sv.id, rr.cp.id, rr.source)
	s.send(sv.id, rr.source, mCopyReq{id: rr.cp.id})
}

// copySend sends the next chunk of a copy stream, read from the engine
// as it is now.
func (s *sim) copySend(sv *server, to int) {
	rr := sv.rr
	o := rr.outs[to]
	if !s.step(stCopySend, sv.id, to) {
		return
	}
	c := mCopyChunk{id: o.id, idx: o.next, lsn: o.lsn}
	for k := o.next * copyChunkKeys; k < min(nKeys, (o.next+1)*copyChunkKeys); k++ {
		if v := rr.eng.vals[k]; v != "" {
			c.keys, c.vals = append(c.keys, k), append(c.vals, v)
		}
	}
	o.next++
	o.sent += len(c.keys)
	if o.next*copyChunkKeys >= nKeys {
		c.done, c.sent = true, o.sent
		c.horizon = max(rr.eng.applied, rr.eng.horizon)
		delete(rr.outs, to)
	}
	s.send(sv.id, to, c)
}

func (s *sim) repairDeliver(sv *server, m msg) {
	rr := sv.rr
	switch b := m.body.(type) {
	case mCopyReq:
		if rr.want == partition.RoleNone || (rr.needCopy && rr.want == partition.RoleSecondary) || rr.cp != nil {
			s.send(sv.id, m.from, mCopyChunk{id: b.id, refuse: true})
			return
		}
		if !s.step(stCopyServe, sv.id, m.from) {
			return
		}
		rr.outs[m.from] = &copyOut{id: b.id, lsn: rr.eng.applied}
	case mCopyChunk:
		s.copyChunk(sv, m.from, b)
	}
}

// copyChunk is the target applying a chunk; the last one writes the
// snapshot's LSN and restarts the core there.
func (s *sim) copyChunk(sv *server, from int, b mCopyChunk) {
	rr := sv.rr
	cp := rr.cp
	if cp == nil || b.id != cp.id || rr.want != partition.RoleSecondary {
		return
	}
	if !b.refuse && b.idx > cp.next {
		if cp.early == nil {
			cp.early = map[int]mCopyChunk{}
		}
		cp.early[b.idx] = b
		return
	}
	s.copyChunkInOrder(sv, from, b)
	for rr.cp == cp && sv.alive && cp.early[cp.next].id == cp.id {
		c := cp.early[cp.next]
		delete(cp.early, cp.next)
		s.copyChunkInOrder(sv, from, c)
	}
}

func (s *sim) copyChunkInOrder(sv *server, from int, b mCopyChunk) {
	rr := sv.rr
	cp := rr.cp
	if b.refuse || b.idx != cp.next {
		s.logf("server %d: copy %d from %d refused or broken (chunk %d, want %d)", sv.id, cp.id, from, b.idx, cp.next)
		rr.cp = nil
		return
	}
	if !s.step(stCopyChunk, sv.id, from) {
		return
	}
	if b.idx == 0 {
		cp.lsn = b.lsn
	}
	var ops []kvOp
	for i, k := range b.keys {
		v := b.vals[i]
		ops = append(ops, func(st *kvState) { st.vals[k] = v })
	}
	if len(ops) > 0 {
		rr.batch(ops...)
	}
	cp.got += len(b.keys)
	cp.next++
	cp.lastAt = s.now
	if !b.done {
		return
	}
	if b.sent != cp.got {
		rr.cp = nil // the product: ErrCorrupt; the next attempt starts over
		return
	}
	if !s.step(stCopyDone, sv.id, from) {
		return
	}
	lsn, horizon := cp.lsn, b.horizon
	// The product writes the applied LSN only when it is not 0; the
	// copy's fuzzy end is the checks' bookkeeping.
	rr.batch(func(st *kvState) { st.applied, st.base, st.horizon = lsn, lsn, horizon })
	sv.core.Close()
	sv.core = partition.New(partition.Config{MaxInFlight: 64}, lsn)
	if err := sv.core.BecomeSecondary(rr.wantEpoch); err != nil {
		s.fatalf("server %d: %v", sv.id, err)
	}
	rr.needCopy, rr.cp = false, nil
	rr.tailPos, rr.starts, rr.flushed = 0, nil, 0
	s.rp.copies++
	s.logf("server %d: copied %d keys from %d at LSN %d (fuzzy to %d)", sv.id, cp.got, from, lsn, horizon)
	if !s.step(stCopyTail, sv.id, from) {
		return
	}
	s.follow(sv)
	s.drain(sv)
}

// declareDead: the master's OpServerDown (its reports go).
func (s *sim) declareDead(id int) {
	s.dead[id] = true
	if s.rp != nil {
		s.rp.deadSince[id] = s.now
		delete(s.rp.reports, id)
	}
}

// keptBack: a kept replica's server is back: it rejoins the log at the
// next reconfiguration (OpRegisterServer resets the log).
func (s *sim) keptBack(id int) bool {
	if s.rp == nil || s.reconf != nil || slices.Contains(s.curExt().replicas, id) {
		return false
	}
	s.logf("master: kept replica %d back", id)
	delete(s.dead, id)
	delete(s.rp.deadSince, id)
	s.rp.rejoin = true
	return true
}

func (s *sim) repairMasterReceive(msg) {}

// unpromotable: a replica still copying holds no data and, once the log
// is trimmed, cannot catch up; the fixed master does not promote it (the product's
// promotions and demoteReplica do: -sim.bug promote-copying).
func (s *sim) unpromotable(rep mFreezeAck) bool {
	return s.rp != nil && rep.copying && s.rp.cfg.bug != "promote-copying" && s.trimmed()
}

// trimmed reports whether the log no longer starts at its first record: a
// replica with no data can only rebuild from another replica.
func (s *sim) trimmed() bool { return s.exts[0].trimmed }

// holderBesides reports whether a live member other than id holds the
// partition's data (it does not report itself copying): the fixed master
// never drops the last replica holding it, however long it is away.
func (s *sim) holderBesides(id int) bool {
	if s.rp.cfg.bug == "promote-copying" || !s.trimmed() {
		return true
	}
	for _, m := range s.set {
		if rep, ok := s.rp.reports[m]; m != id && ok && !s.dead[m] && rep.state != rsCopying {
			return true
		}
	}
	return false
}

type fate uint8

const (
	fateDrop fate = iota
	fateRejoin
	fateKeep
)

// memberFate decides what a reconfiguration does with a member that did
// not answer the freeze: one not in the sealed extent (a move's target,
// a kept replica back) and alive joins the next; a dead one is kept until
// replaceAfter; others leave (the product's OpPartitionLogReset).
func (s *sim) memberFate(id int, x *extent) fate {
	switch {
	case s.rp == nil:
		return fateDrop
	case !slices.Contains(x.replicas, id) && !s.dead[id] && s.now-s.lastHeard[id] < deadAfter:
		return fateRejoin
	case s.dead[id] && s.now-s.rp.deadSince[id] < s.rp.cfg.replaceAfter, !s.holderBesides(id):
		return fateKeep
	}
	return fateDrop
}

// repairShort starts a reconfiguration when the set is short (and a spare
// can fill it) or a member is alive but out of the log.
func (s *sim) repairShort() {
	rejoin := s.rp.rejoin
	for _, id := range s.set {
		in := slices.Contains(s.curExt().replicas, id)
		if !s.dead[id] && !in && s.now-s.lastHeard[id] < deadAfter {
			rejoin = true // alive, out of the log
		}
		if s.dead[id] && in {
			rejoin = true // dead, still in the log (a reconfiguration found no replica to promote)
		}
	}
	if rejoin || (len(s.set) < replFactor && s.spares() > 0) {
		s.rp.rejoin = false
		s.startReconfig(s.dead[s.primary])
	}
}

// removeMember takes id out of the set (a replacement, a move's end).
func (s *sim) removeMember(id int) {
	s.set = slices.DeleteFunc(slices.Clone(s.set), func(x int) bool { return x == id })
	s.cfgVer++
	s.assigns[id] = mAssign{ver: s.cfgVer, epoch: s.epoch, role: partition.RoleNone}
	s.send(master, id, s.assigns[id])
}

func (s *sim) repairMasterTick() {
	rp := s.rp
	// Replace replicas kept past replaceAfter.
	for _, id := range s.set {
		if s.dead[id] && s.now-rp.deadSince[id] >= rp.cfg.replaceAfter && s.holderBesides(id) && len(s.set) > 1 {
			if s.step(stReplace, id, -1); s.masterDown() {
				return
			}
			s.logf("master: replica %d dead past replace-after; placing a new one", id)
			rp.replaced++
			wasPrimary := id == s.primary
			s.removeMember(id)
			s.startReconfig(wasPrimary)
			return
		}
	}
	if mv := rp.move; mv != nil {
		switch rep, ok := rp.reports[mv.to]; {
		case !slices.Contains(s.set, mv.to):
			s.logf("master: move %d->%d dropped (target gone)", mv.from, mv.to)
			rp.move = nil
		case ok && rep.state == rsInSync && !s.dead[mv.to]:
			if s.step(stMoveInSync, mv.to, mv.from); s.masterDown() {
				return
			}
			rp.move = nil
			if !slices.Contains(s.set, mv.from) {
				return
			}
			s.logf("master: move %d->%d done", mv.from, mv.to)
			rp.moves++
			wasPrimary := mv.from == s.primary
			s.removeMember(mv.from)
			s.startReconfig(wasPrimary)
			if wasPrimary {
				s.reconf.promote = mv.to
			}
			s.step(stMoveDone, mv.to, mv.from)
			return
		}
	}
	if rp.move == nil && !rp.healing && s.now%rp.cfg.moveEvery == 0 && len(s.set) == replFactor {
		var spares []int
		for id := range nServers {
			if !slices.Contains(s.set, id) && !s.dead[id] && s.now-s.lastHeard[id] < deadAfter {
				spares = append(spares, id)
			}
		}
		healthy := true
		for _, id := range s.set {
			healthy = healthy && !s.dead[id]
		}
		if healthy && len(spares) > 0 {
			mv := &simMove{from: s.set[s.rng.IntN(len(s.set))], to: spares[s.rng.IntN(len(spares))], since: s.now}
			if s.step(stMoveStart, mv.from, mv.to); s.masterDown() {
				return
			}
			s.logf("master: move %d->%d starts", mv.from, mv.to)
			rp.move = mv
			s.set = append(slices.Clone(s.set), mv.to)
			s.startReconfig(false)
			return
		}
	}
	if s.now%rp.cfg.truncEvery == 0 {
		s.truncate()
	}
}

// truncate is the product's truncateLogs and logKeep over the set.
func (s *sim) truncate() {
	rp := s.rp
	var exts []*extent
	for _, x := range s.exts {
		if !x.trimmed {
			exts = append(exts, x)
		}
	}
	if len(exts) < 2 {
		return
	}
	var best uint64
	for _, id := range s.set {
		if rep, ok := rp.reports[id]; ok {
			best = max(best, rep.flushed)
		}
	}
	keep := len(exts) - 1 // never the open extent
	if rp.cfg.bug == "trim-max" {
		keep = 0
	}
	lagging := map[int]bool{}
	old := rp.cfg.bug == "old-logkeep"
	for _, id := range s.set {
		rep, ok := rp.reports[id]
		switch {
		case !ok || rep.state == rsCopying:
			return // not reported yet, or its copy needs the log from its LSN
		case !old && (rep.flushed == 0 || rep.keepFrom == 0):
			return // not flushed since it started: it recovers from an LSN it has not said
		case rp.cfg.maxLag > 0 && rep.flushed+rp.cfg.maxLag < best && (old || id != s.primary):
			lagging[id] = true
			continue // too far behind: it copies a snapshot instead (a primary never copies)
		case rep.keepFrom == 0:
			return
		}
		k := slices.IndexFunc(exts, func(x *extent) bool { return x.id == rep.keepFrom })
		if k < 0 {
			return
		}
		if rp.cfg.bug == "trim-max" {
			keep = max(keep, min(k, len(exts)-1))
		} else {
			keep = min(keep, k)
		}
	}
	if keep <= 0 {
		return
	}
	if s.step(stTrim, -1, -1); s.masterDown() {
		return
	}
	// Check: no member needs a record being deleted to recover from its
	// flushed state, unless it reported itself lagging and is not the
	// primary (it copies a snapshot; a primary never does).
	var trimEnd uint64 // the last LSN in the extents deleted
	for _, x := range exts[:keep] {
		for _, r := range x.recs {
			trimEnd = max(trimEnd, r.LSN)
		}
	}
	for _, id := range s.set {
		d := s.srv[id].rr.durable.applied
		if d >= trimEnd || (lagging[id] && id != s.primary) || (d == 0 && id != s.primary) {
			// A secondary whose disk holds nothing copies a snapshot
			// after a crash whatever the log holds.
			continue
		}
		rep := rp.reports[id]
		s.fatalf("trim of extents %d..%d (records to %d) deletes LSN %d, which replica %d (primary %v, flushed %d on disk; reported %s flushed %d keep-from %d; best %d, max lag %d) needs to recover",
			exts[0].id, exts[keep-1].id, trimEnd, d+1, id, id == s.primary, d, rep.state, rep.flushed, rep.keepFrom, best, rp.cfg.maxLag)
	}
	for _, x := range exts[:keep] {
		x.trimmed = true
	}
	rp.trims++
	s.logf("master: trimmed extents %d..%d (records to %d)", exts[0].id, exts[keep-1].id, trimEnd)
	s.step(stTrimDone, -1, -1)
}

// repairHealthy checks, after the faults stopped and the partition had
// time to heal, that the set is back to replFactor replicas, all alive,
// in the log and in sync.
func (s *sim) repairHealthy() {
	if len(s.set) != replFactor {
		s.fatalf("replication not restored: set %v (dead %v)", s.set, s.dead)
	}
	p := s.srv[s.primary]
	for _, id := range s.set {
		sv := s.srv[id]
		rr := sv.rr
		switch {
		case !sv.alive:
			s.fatalf("replication not restored: replica %d is down", id)
		case rr.stuck != "":
			s.fatalf("replication not restored: replica %d is stuck: %s", id, rr.stuck)
		case !slices.Contains(s.curExt().replicas, id):
			s.fatalf("replication not restored: replica %d is not in the log's extent %v", id, s.curExt().replicas)
		case id == s.primary && !sv.core.Serving():
			s.fatalf("replication not restored: primary %d is not serving (stuck %q, pending %v, set %v, dead %v, extent %v, reconf %v, epoch %d)", id, rr.stuck, rr.primaryPending != nil, s.set, s.dead, s.curExt().replicas, s.reconf != nil, s.epoch)
		case id != s.primary && (rr.needCopy || !rr.synced || sv.core.Applied()+20 < p.core.Applied()):
			s.fatalf("replication not restored: secondary %d not in sync (copying %v, synced %v, applied %d, primary %d)", id, rr.needCopy, rr.synced, sv.core.Applied(), p.core.Applied())
		}
	}
	for _, sv := range s.srv {
		s.checkState(sv, "at the end")
	}
}

func runRepairScenario(t *testing.T, seed uint64, stats *repairStats) {
	rp := newRepair(seed)
	s := newSim(t, seed, rp)
	for _, sv := range s.srv {
		sv.rr.flushPhase = s.rng.Int64N(1000)
	}
	phase := func(ticks int64, faults bool, writeProb float64) {
		end := s.now + ticks
		for s.now < end && !t.Failed() {
			for id, at := range rp.restartAt {
				if at <= s.now {
					delete(rp.restartAt, id)
					s.restartOrResume(s.srv[id])
				}
			}
			s.run(1, faults, writeProb)
			if s.rp.downUntil == s.now && s.reconf == nil {
				s.rp.rejoin = true
			}
			s.rollOver()
		}
	}
	phase(1800, true, 0.3)
	if t.Failed() {
		return
	}
	rp.healing = true
	for _, sv := range s.srv {
		s.restartOrResume(sv)
	}
	clear(rp.restartAt)
	clear(s.cut)
	s.drop = 0
	rp.downUntil = 0
	before := s.ackCount
	phase(1500, false, 0.2)
	if t.Failed() {
		return
	}
	s.finalCheck()
	s.repairHealthy()
	if s.ackCount == before {
		s.fatalf("no write was acknowledged after healing (epoch %d, primary %d, set %v)", s.epoch, s.primary, s.set)
	}
	stats.mu.Lock()
	defer stats.mu.Unlock()
	if rp.plan.fired {
		stats.fired[rp.plan.step][rp.plan.victim]++
	}
	for i, n := range rp.hits {
		stats.hits[i] += n
	}
	stats.copies += rp.copies
	stats.moves += rp.moves
	stats.trims += rp.trims
	stats.truncations += rp.truncations
	stats.replacement += rp.replaced
}

// rollOver: a primary whose open extent holds extentRecs records asks the
// master to seal it and continue on the next (the product's roll-over at
// LogExtentBytes), so truncation has whole extents to delete.
func (s *sim) rollOver() {
	p := s.srv[s.primary]
	if !p.alive || p.paused || s.reconf != nil || s.masterDown() {
		return
	}
	// Only acknowledged appends count, as in the product (a roll-over
	// after every re-sent backlog would seal the log round and round).
	if e := p.exts[p.cur]; e != nil && e.primary && !e.broken && len(e.recs) >= s.rp.cfg.extentRecs && p.cur == s.curExt().id &&
		e.recs[s.rp.cfg.extentRecs-1].LSN <= p.core.CommitPoint() {
		s.startReconfig(false)
	}
}

func TestSimulationRepair(t *testing.T) {
	stats := &repairStats{}
	if *simSeed != 0 {
		runRepairScenario(t, *simSeed, stats)
		t.Logf("copies %d, moves %d, trims %d, truncations found %d, replacements %d", stats.copies, stats.moves, stats.trims, stats.truncations, stats.replacement)
		return
	}
	n := *simScenarios
	if n == 0 {
		n = 1500
		if testing.Short() || raceEnabled {
			n = 160
		}
	}
	base := uint64(1)
	if *simRandom {
		base = rand.Uint64()
	}
	t.Logf("scenarios %d, seeds %d..%d", n, base, base+uint64(n)-1)
	for i := range n {
		runRepairScenario(t, base+uint64(i), stats)
		if t.Failed() {
			return
		}
	}
	t.Logf("copies %d, moves %d, trims %d, truncations found %d, replacements %d", stats.copies, stats.moves, stats.trims, stats.truncations, stats.replacement)
	var never []string
	for st := range nSteps {
		fired := 0
		for v := range nVictims {
			fired += stats.fired[st][v]
		}
		t.Logf("step %-14s reached %7d times, crash fired in %4d scenarios", stepNames[st], stats.hits[st], fired)
		if fired == 0 {
			never = append(never, stepNames[st])
		}
	}
	if n >= nSteps*nVictims*3 && len(never) > 0 {
		t.Errorf("the fault schedule never crashed anything at %v: the scenarios do not reach those steps", never)
	}
}
