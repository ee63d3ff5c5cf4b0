package partition

import (
	"errors"
	"fmt"
)

// Role is what a replica does for its partition.
type Role uint8

// Roles. The values are not persisted.
const (
	// RoleNone: not (or no longer) a replica of the partition; everything
	// is refused.
	RoleNone Role = iota
	// RolePrimary orders writes: it numbers them, appends them to the log
	// and applies them once durable.
	RolePrimary
	// RoleSecondary applies the log up to the commit point and serves
	// eventual reads.
	RoleSecondary
)

func (r Role) String() string {
	switch r {
	case RolePrimary:
		return "primary"
	case RoleSecondary:
		return "secondary"
	}
	return "none"
}

// Errors of Propose. Each tells the owner what to answer the client.
var (
	// ErrNotPrimary: this replica does not take writes (wrong server or
	// role); the client refreshes its map.
	ErrNotPrimary = errors.New("partition: not the primary")
	// ErrStaleEpoch: the request was routed with an older epoch.
	ErrStaleEpoch = errors.New("partition: stale epoch")
	// ErrEpochAhead: the request names an epoch this replica has not
	// reached yet (its map is behind); retry.
	ErrEpochAhead = errors.New("partition: epoch not reached yet")
	// ErrCatchingUp: a new primary is still applying the log it inherited;
	// retry shortly.
	ErrCatchingUp = errors.New("partition: new primary still applying the log")
	// ErrBusy: too many writes await durability; retry after a pause.
	ErrBusy = errors.New("partition: too many writes in flight")
	// ErrOutcomeUnknown: the write was appended to the log but this
	// replica stopped being its primary before learning whether the log
	// kept it. A retry with the same request id returns the outcome.
	ErrOutcomeUnknown = errors.New("partition: write outcome unknown (primary changed); retry with the same request id")
)

// Config configures a Replica. The zero value works.
type Config struct {
	// MaxInFlight bounds the writes proposed but not yet applied.
	// Default 4096.
	MaxInFlight int
}

// Proposal is a write the primary was asked to make: its outcome is
// decided already (the owner evaluated a CAS against the state including
// every write proposed before it), so applying it is deterministic.
type Proposal struct {
	// Epoch is the epoch the request was routed with.
	Epoch uint64
	// RequestID identifies the client's request ("" for none): a second
	// proposal with the id of one in flight joins it instead of being
	// appended again.
	RequestID string
	// Body is the encoded write (ops and outcome); the core does not look
	// inside.
	Body []byte
	// Token is the owner's handle for the waiting caller, returned in the
	// Ack or Fail of this proposal.
	Token uint64
}

// Record is one entry of the partition's log.
type Record struct {
	LSN       uint64
	Epoch     uint64
	RequestID string
	Body      []byte
}

// Ack tells the owner that the write of Token is applied at LSN: answer
// the caller with its outcome.
type Ack struct {
	Token uint64
	LSN   uint64
}

// Fail tells the owner that the write of Token will not be acknowledged
// by this replica, and why (ErrOutcomeUnknown, ErrNotPrimary).
type Fail struct {
	Token uint64
	Err   error
}

// Ready is the work the owner must do, in this order: append Append to
// the log (after any earlier batch), apply Apply to the engine in LSN
// order, answer Acks and Fails. Then it calls Advance with this Ready.
type Ready struct {
	Append []Record
	Apply  []Record
	Acks   []Ack
	Fails  []Fail
}

// Empty reports whether rd holds no work.
func (rd Ready) Empty() bool {
	return len(rd.Append) == 0 && len(rd.Apply) == 0 && len(rd.Acks) == 0 && len(rd.Fails) == 0
}

type pending struct {
	rec    Record
	tokens []uint64
	sent   bool // handed out in a Ready's Append since the last (re)start of the log
}

// Replica is one replica's protocol state: role, epoch, the log positions
// (assigned, durable, applied) and the writes in flight. It is a pure,
// synchronous state machine in the manner of etcd raft's RawNode: no
// goroutines, clock, network or disk inside; its owner feeds it events
// (Propose, Durable, Observe, role changes) and does the I/O that Ready
// lists. Not safe for concurrent use: the owner serialises calls.
//
// Invariants it keeps (and Check verifies):
//   - applied <= durable <= last;
//   - nothing is applied beyond the durable (commit) point;
//   - records are applied exactly once, in LSN order, with no gap;
//   - a primary proposes only at its own epoch, and only once it has
//     applied every record of the log it inherited.
type Replica struct {
	cfg  Config
	role Role
	// epoch is the partition epoch this replica serves at.
	epoch uint64
	// last is the highest LSN assigned (primary) or observed (secondary).
	last uint64
	// durable is the commit point: every record up to it is in the log
	// for good.
	durable uint64
	// applied is the highest LSN applied to the engine (Advance moves it).
	applied uint64
	// catchUp is the log end a new primary must apply before it proposes.
	catchUp uint64
	// logEpoch is the epoch of the last record observed: along the log,
	// epochs never decrease (an older primary's records end where the
	// seal that deposed it cut the log).
	logEpoch uint64
	// appendBlocked: the log refused an append (its extent failed or was
	// sealed); nothing more is sent until LogRestarted.
	appendBlocked bool

	// inflight are the primary's proposals from durable+1 to last, in
	// LSN order.
	inflight []*pending
	byReq    map[string]*pending
	// unapplied are durable records not yet handed out for apply.
	unapplied []Record
	// handed is the highest LSN handed out for apply in a Ready not yet
	// advanced.
	handed uint64
	acks   []Ack
	fails  []Fail
}

// New returns a replica with no role whose engine has applied the log up
// to applied (its persisted position; 0 for an empty engine).
func New(cfg Config, applied uint64) *Replica {
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 4096
	}
	return &Replica{cfg: cfg, last: applied, durable: applied, applied: applied, handed: applied, byReq: map[string]*pending{}}
}

// Role is the replica's role.
func (r *Replica) Role() Role { return r.role }

// Epoch is the epoch the replica serves at.
func (r *Replica) Epoch() uint64 { return r.epoch }

// Applied is the highest LSN applied to the engine: reads reflect it.
func (r *Replica) Applied() uint64 { return r.applied }

// CommitPoint is the highest LSN known durable in the log.
func (r *Replica) CommitPoint() uint64 { return r.durable }

// Last is the highest LSN assigned or observed.
func (r *Replica) Last() uint64 { return r.last }

// Serving reports whether a primary takes writes now (it has applied the
// log it inherited and its log accepts appends).
func (r *Replica) Serving() bool {
	return r.role == RolePrimary && r.applied >= r.catchUp
}

// BecomePrimary makes the replica the primary at epoch. logEnd is the last
// LSN of the log as sealed when the previous primary was deposed (every
// record up to it is committed): the replica applies up to it (Observe)
// before it proposes. Becoming primary at the epoch it is primary at
// already changes nothing. A primary at a lower epoch starts a new term:
// another primary may have written the log meanwhile, so its in-flight
// writes fail with ErrOutcomeUnknown and it catches up like any new
// primary (seal-and-continue within one epoch is LogRestarted).
func (r *Replica) BecomePrimary(epoch, logEnd uint64) error {
	if epoch < r.epoch {
		return fmt.Errorf("%w: become primary at %d, replica at %d", ErrStaleEpoch, epoch, r.epoch)
	}
	if r.role == RolePrimary && epoch == r.epoch {
		return nil
	}
	r.depose(ErrOutcomeUnknown)
	if logEnd < r.last {
		// The log was sealed before records this replica saw: they were
		// never committed. A secondary only sees committed records, so
		// this is a broken invariant of the caller.
		return fmt.Errorf("partition: become primary with log end %d below observed %d", logEnd, r.last)
	}
	r.role, r.epoch, r.catchUp = RolePrimary, epoch, logEnd
	r.appendBlocked = false
	return nil
}

// BecomeSecondary makes the replica a secondary at epoch. A primary that
// is deposed fails its in-flight writes with ErrOutcomeUnknown: the log
// may have kept them, and the new primary knows (retry by request id).
func (r *Replica) BecomeSecondary(epoch uint64) error {
	if epoch < r.epoch {
		return fmt.Errorf("%w: become secondary at %d, replica at %d", ErrStaleEpoch, epoch, r.epoch)
	}
	r.depose(ErrOutcomeUnknown)
	r.role, r.epoch = RoleSecondary, epoch
	return nil
}

// Close takes the replica out of service: in-flight writes fail with
// ErrOutcomeUnknown.
func (r *Replica) Close() {
	r.depose(ErrOutcomeUnknown)
	r.role = RoleNone
}

func (r *Replica) depose(err error) {
	if r.role != RolePrimary {
		return
	}
	for _, p := range r.inflight {
		for _, t := range p.tokens {
			r.fails = append(r.fails, Fail{Token: t, Err: err})
		}
	}
	// Records beyond the commit point are not this replica's any more:
	// the log decides whether they survive, and a secondary learns them
	// by Observe.
	r.inflight = nil
	clear(r.byReq)
	r.last = r.durable
	r.catchUp = 0
}

// Propose numbers a write and queues it for the log. It returns the LSN
// and whether the proposal joined one in flight with the same request id.
func (r *Replica) Propose(p Proposal) (lsn uint64, joined bool, err error) {
	switch {
	case r.role != RolePrimary:
		return 0, false, ErrNotPrimary
	case p.Epoch < r.epoch:
		return 0, false, ErrStaleEpoch
	case p.Epoch > r.epoch:
		return 0, false, ErrEpochAhead
	case r.applied < r.catchUp:
		return 0, false, ErrCatchingUp
	}
	if p.RequestID != "" {
		if q := r.byReq[p.RequestID]; q != nil {
			q.tokens = append(q.tokens, p.Token)
			return q.rec.LSN, true, nil
		}
	}
	if len(r.inflight) >= r.cfg.MaxInFlight {
		return 0, false, ErrBusy
	}
	r.last++
	q := &pending{rec: Record{LSN: r.last, Epoch: r.epoch, RequestID: p.RequestID, Body: p.Body}, tokens: []uint64{p.Token}}
	r.inflight = append(r.inflight, q)
	if p.RequestID != "" {
		r.byReq[p.RequestID] = q
	}
	return q.rec.LSN, false, nil
}

// Durable tells a primary that the log holds every record up to lsn for
// good (the append was acknowledged).
func (r *Replica) Durable(lsn uint64) {
	if r.role != RolePrimary || lsn <= r.durable {
		return
	}
	lsn = min(lsn, r.last)
	for len(r.inflight) > 0 && r.inflight[0].rec.LSN <= lsn {
		p := r.inflight[0]
		r.inflight = r.inflight[1:]
		r.unapplied = append(r.unapplied, p.rec)
		for _, t := range p.tokens {
			r.acks = append(r.acks, Ack{Token: t, LSN: p.rec.LSN})
		}
		if p.rec.RequestID != "" && r.byReq[p.rec.RequestID] == p {
			delete(r.byReq, p.rec.RequestID)
		}
	}
	r.durable = lsn
}

// AppendFailed tells a primary that its log refused an append (a replica
// failed; the extent is being sealed). Nothing more is sent until
// LogRestarted; proposals still queue.
func (r *Replica) AppendFailed() { r.appendBlocked = true }

// LogRestarted tells a primary that its log was sealed with every record
// up to durableThrough kept, and continues on a new extent: the records
// after it were cut and are sent again, in order, with the same LSNs
// (their outcomes were decided in this order, so the log stays the same
// history).
func (r *Replica) LogRestarted(durableThrough uint64) error {
	if r.role != RolePrimary {
		return ErrNotPrimary
	}
	if durableThrough > r.last {
		return fmt.Errorf("partition: log sealed through %d, beyond the last proposal %d", durableThrough, r.last)
	}
	if durableThrough < r.durable {
		return fmt.Errorf("partition: log sealed through %d, below the acknowledged %d: acknowledged writes were cut", durableThrough, r.durable)
	}
	r.Durable(durableThrough)
	for _, p := range r.inflight {
		p.sent = false
	}
	r.appendBlocked = false
	return nil
}

// Observe gives a secondary (or a new primary catching up) the next
// committed record of the log. Records at or below the last observed LSN
// are duplicates and ignored; a gap is an error.
func (r *Replica) Observe(rec Record) error {
	if r.role == RolePrimary && r.applied >= r.catchUp && r.catchUp != 0 {
		return fmt.Errorf("partition: primary observed record %d after catching up", rec.LSN)
	}
	if rec.LSN <= r.last {
		return nil
	}
	if rec.LSN != r.last+1 {
		return fmt.Errorf("partition: log gap: record %d after %d", rec.LSN, r.last)
	}
	if rec.Epoch < r.logEpoch {
		return fmt.Errorf("partition: record %d of epoch %d after one of epoch %d: a deposed primary's record in the log", rec.LSN, rec.Epoch, r.logEpoch)
	}
	r.logEpoch = rec.Epoch
	r.last, r.durable = rec.LSN, rec.LSN
	r.unapplied = append(r.unapplied, rec)
	return nil
}

// Ready returns the work due now. Calling it again before Advance returns
// the same Apply records only once: Advance(rd) must follow each Ready
// that is not Empty.
func (r *Replica) Ready() Ready {
	var rd Ready
	if r.role == RolePrimary && !r.appendBlocked {
		for _, p := range r.inflight {
			if !p.sent {
				rd.Append = append(rd.Append, p.rec)
				p.sent = true
			}
		}
	}
	for _, rec := range r.unapplied {
		if rec.LSN > r.handed {
			rd.Apply = append(rd.Apply, rec)
			r.handed = rec.LSN
		}
	}
	// Acks wait until their record is applied, so a caller that reads its
	// own write right after the answer sees it.
	k := 0
	for _, a := range r.acks {
		if a.LSN <= r.handed {
			rd.Acks = append(rd.Acks, a)
		} else {
			r.acks[k] = a
			k++
		}
	}
	r.acks = r.acks[:k]
	rd.Fails, r.fails = r.fails, nil
	return rd
}

// Advance tells the replica the owner did everything rd listed: its Apply
// records are applied.
func (r *Replica) Advance(rd Ready) {
	if n := len(rd.Apply); n > 0 {
		top := rd.Apply[n-1].LSN
		k := 0
		for k < len(r.unapplied) && r.unapplied[k].LSN <= top {
			k++
		}
		r.unapplied = r.unapplied[k:]
		r.applied = max(r.applied, top)
	}
}

// Check verifies the replica's invariants; a non-nil error is a bug.
func (r *Replica) Check() error {
	if !(r.applied <= r.durable && r.durable <= r.last) {
		return fmt.Errorf("partition: positions out of order: applied %d durable %d last %d", r.applied, r.durable, r.last)
	}
	if r.handed > r.durable {
		return fmt.Errorf("partition: handed out %d for apply beyond the commit point %d", r.handed, r.durable)
	}
	want := r.durable + 1
	for _, p := range r.inflight {
		if p.rec.LSN != want {
			return fmt.Errorf("partition: in-flight LSN %d, want %d", p.rec.LSN, want)
		}
		want++
	}
	if r.role == RolePrimary && len(r.inflight) > 0 && want-1 != r.last {
		return fmt.Errorf("partition: in-flight ends at %d, last is %d", want-1, r.last)
	}
	return nil
}
