package client

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/tabuladb/tabula/api"
)

// Pacing. A server that refuses a call over the tenant's read or write
// rate (SERVER_BUSY, reason tenant_read_rate or tenant_write_rate) names
// its share of the quota (ErrorDetail.limit, per second). From then on,
// for paceFor after the last such refusal, the client paces its calls of
// that class to that server to the share, in the client, instead of
// sending calls the server would refuse: an over-quota tenant then costs
// the servers about its admitted rate in requests, not its offered rate,
// so it cannot slow other tenants by the refusals alone. A call that
// could not be sent before its deadline fails SERVER_BUSY (reason
// client_paced) without reaching the server. (AWS SDKs' adaptive retry
// mode does the like.)
//
// Calls waiting for a slot are not promised a time: slots are handed out
// at the current rate, as they come due, to the calls still waiting, the
// newest first. So a change of rate applies to every waiting call at
// once, and a slot is never left unused while a call waits for one. (A
// limiter that promises each call its time, as golang.org/x/time/rate's
// reservations do, keeps the promised calls as a debt of slots: when a
// refusal then lowers the rate, that debt takes longer to pay than the
// calls waiting could wait, and for seconds every new call failed unsent
// while the server's bucket filled up unused: a paced tenant got about
// 0.8 of its quota.) The newest call first: under a sustained excess only
// some calls can go, and the newest has the most time left, so it is
// least likely to run out of time at the server after taking a token
// there. A waiting call that could not get a slot paceMargin before its
// deadline even if no other call came (the k-th newest gets the k-th slot
// due) is turned away at once, not at its deadline.

// callClass is what a call is charged as on the server.
type callClass uint8

const (
	classOther callClass = iota // not paced (coprocessor calls, scans)
	classRead
	classWrite
)

// paceOver is how far over the server's share the client paces.
const paceOver = 1.1

// paceGrow and paceGrowEvery: while no refusal comes, the paced rate grows
// by paceGrow every paceGrowEvery (the share moves with demand; a refusal
// names the new one).
const (
	paceGrow      = 1.1
	paceGrowEvery = 250 * time.Millisecond
)

// paceMargin is the time a paced call must have left when it is sent.
const paceMargin = 20 * time.Millisecond

// paceFor is how long pacing lasts after the last refusal.
const paceFor = 3 * time.Second

type paceKey struct {
	addr  string
	class callClass
}

// pacer paces one class of calls to one server: a token bucket whose
// slots go to waiting calls as they come due. Safe for concurrent use.
type pacer struct {
	mu sync.Mutex
	// Guarded by mu.
	rate    float64 // slots per second
	burst   float64 // most slots held while no call waits
	tokens  float64 // slots free as of last
	last    time.Time
	waiting []*paceWaiter // calls waiting for a slot, oldest first
	timer   *time.Timer   // hands out the next slot while calls wait
	until   time.Time     // pacing ends then, unless refused again
	grown   time.Time     // when the rate last grew
}

// paceWaiter is a call waiting for a slot.
type paceWaiter struct {
	ready chan struct{} // closed once granted or turned away
	// giveUp is when the call stops waiting (zero: never); granted says
	// whether it got a slot. Set before ready is closed, under pacer.mu.
	giveUp  time.Time
	granted bool
	due     time.Duration // turned away: its slot was due this far off at best
}

// pacers are the client's pacers. Safe for concurrent use.
type pacers struct {
	mu sync.Mutex
	m  map[paceKey]*pacer
}

func classOfReason(reason string) callClass {
	switch reason {
	case "tenant_read_rate":
		return classRead
	case "tenant_write_rate":
		return classWrite
	}
	return classOther
}

// refused notes a rate refusal from addr: its class is paced at a little
// over limit per second from now on.
func (ps *pacers) refused(addr string, d *api.ErrorDetail) {
	class := classOfReason(d.GetReason())
	if class == classOther || d.GetLimit() == 0 {
		return
	}
	ps.mu.Lock()
	if ps.m == nil {
		ps.m = map[paceKey]*pacer{}
	}
	p := ps.m[paceKey{addr, class}]
	if p == nil {
		p = &pacer{}
		ps.m[paceKey{addr, class}] = p
	}
	ps.mu.Unlock()
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	fresh := p.rate == 0
	p.refillLocked(now)
	// A little over the share: the server's share moves with demand, and
	// the few refusals the excess draws keep this rate current.
	p.rate = float64(d.GetLimit())*paceOver + 1
	p.burst = max(1, float64(d.GetLimit())/10)
	if fresh {
		p.tokens = p.burst
	}
	p.tokens = min(p.tokens, p.burst)
	p.until, p.grown = now.Add(paceFor), now
	p.dispatchLocked(now)
}

// refillLocked adds the slots come due since p.last.
func (p *pacer) refillLocked(now time.Time) {
	if d := now.Sub(p.last).Seconds(); d > 0 {
		p.tokens = min(p.tokens+d*p.rate, max(p.burst, p.tokens))
	}
	p.last = now
}

// dispatchLocked hands the slots due to the newest waiting calls (every
// waiting call once pacing has ended) and arms the timer for the next.
func (p *pacer) dispatchLocked(now time.Time) {
	p.refillLocked(now)
	active := now.Before(p.until)
	for len(p.waiting) > 0 && (p.tokens >= 1-1e-9 || !active) {
		w := p.waiting[len(p.waiting)-1]
		p.waiting = p.waiting[:len(p.waiting)-1]
		w.granted = true
		close(w.ready)
		if active {
			p.tokens--
		}
	}
	if active {
		p.shedLocked(now)
	}
	if len(p.waiting) == 0 {
		if p.timer != nil {
			p.timer.Stop()
		}
		return
	}
	d := time.Duration((1 - p.tokens) / p.rate * float64(time.Second))
	if p.timer == nil {
		p.timer = time.AfterFunc(d, p.fire)
	} else {
		p.timer.Reset(d)
	}
}

// shedLocked turns away the calls that cannot get a slot before they give
// up even if no other call came: the k-th newest gets the k-th slot due at
// the earliest. They fail now rather than at their deadlines.
func (p *pacer) shedLocked(now time.Time) {
	kept := 0
	for i := len(p.waiting) - 1; i >= 0; i-- {
		w := p.waiting[i]
		due := time.Duration(max(0, float64(kept+1)-p.tokens) / p.rate * float64(time.Second))
		if w.giveUp.IsZero() || now.Add(due).Before(w.giveUp) {
			kept++
			continue
		}
		p.waiting = slices.Delete(p.waiting, i, i+1)
		w.due = due
		close(w.ready)
	}
}

func (p *pacer) fire() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dispatchLocked(time.Now())
}

// wait waits for a paced slot of class at addr, or fails SERVER_BUSY
// client_paced when none came paceMargin before ctx's deadline (at once
// when the next slot is due later than that).
func (ps *pacers) wait(ctx context.Context, addr string, class callClass) error {
	if class == classOther {
		return nil
	}
	ps.mu.Lock()
	p := ps.m[paceKey{addr, class}]
	ps.mu.Unlock()
	if p == nil {
		return nil
	}
	now := time.Now()
	p.mu.Lock()
	if !now.Before(p.until) {
		p.mu.Unlock()
		return nil
	}
	p.refillLocked(now)
	if now.Sub(p.grown) >= paceGrowEvery {
		// No refusal for a while: the share may have grown. Probe up
		// until the server refuses again and names it.
		p.rate *= paceGrow
		p.grown = now
	}
	if len(p.waiting) == 0 && p.tokens >= 1 {
		p.tokens--
		p.mu.Unlock()
		return nil
	}
	rate := p.rate
	dl, hasDL := ctx.Deadline()
	// The newest call is served first: its slot is the next one.
	next := time.Duration(max(0, 1-p.tokens) / p.rate * float64(time.Second))
	if hasDL && !now.Add(next+paceMargin).Before(dl) {
		p.mu.Unlock()
		if err := ctx.Err(); err != nil {
			return err
		}
		return pacedError(addr, rate, next)
	}
	w := &paceWaiter{ready: make(chan struct{})}
	if hasDL {
		w.giveUp = dl.Add(-paceMargin)
	}
	p.waiting = append(p.waiting, w)
	p.dispatchLocked(now)
	p.mu.Unlock()
	var giveUp <-chan time.Time
	if hasDL {
		t := time.NewTimer(time.Until(w.giveUp))
		defer t.Stop()
		giveUp = t.C
	}
	select {
	case <-w.ready:
		if w.granted {
			return nil
		}
		return pacedError(addr, rate, w.due) // turned away: no slot in time
	case <-ctx.Done():
	case <-giveUp:
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if w.granted {
		if ctx.Err() == nil {
			return nil // granted as it gave up: still in time
		}
		// Granted too late to be sent: the slot goes to the next call.
		p.tokens++
		p.dispatchLocked(time.Now())
		return ctx.Err()
	}
	if i := slices.Index(p.waiting, w); i >= 0 {
		p.waiting = slices.Delete(p.waiting, i, i+1)
	}
	now = time.Now()
	p.dispatchLocked(now)
	if err := ctx.Err(); err != nil {
		return err
	}
	return pacedError(addr, rate, time.Duration(max(0, float64(len(p.waiting)+1)-p.tokens)/p.rate*float64(time.Second)))
}

// pacedError is the error of a call the client did not send: no slot came
// in time. Its retry_after is when a slot could come at the earliest
// (due), with paceMargin to run after it: a call that cannot wait so long
// gives up at once rather than coming back for a slot it cannot use.
func pacedError(addr string, rate float64, due time.Duration) error {
	due += paceMargin
	return api.Status(&api.ErrorDetail{
		Code: api.ErrorCode_ERROR_CODE_SERVER_BUSY, Reason: "client_paced",
		RetryAfterMs: uint64(max(1, (due+time.Millisecond-1)/time.Millisecond)), Limit: uint64(rate),
	}, "the tenant is over its quota at "+addr+" (its share there is about "+strconv.FormatFloat(rate, 'f', 0, 64)+" per second): this call could not be sent before its deadline")
}
