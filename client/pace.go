package client

import (
	"context"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"

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

// paceMargin is the time a paced call must have left after its slot.
const paceMargin = 20 * time.Millisecond

// paceFor is how long pacing lasts after the last refusal.
const paceFor = 3 * time.Second

type paceKey struct {
	addr  string
	class callClass
}

// pacer paces one class of calls to one server. Safe for concurrent use.
type pacer struct {
	mu    sync.Mutex
	lim   *rate.Limiter
	until time.Time // pacing ends then, unless refused again
	grown time.Time // when the rate last grew
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

// refused notes a rate refusal from addr: its class is paced at limit
// per second from now on.
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
	// A little over the share: the server's share moves with demand, and
	// the few refusals the excess draws keep this rate current.
	r := rate.Limit(float64(d.GetLimit())*paceOver + 1)
	burst := max(1, int(d.GetLimit()/10))
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lim == nil {
		p.lim = rate.NewLimiter(r, burst)
	} else {
		p.lim.SetLimit(r)
		p.lim.SetBurst(burst)
	}
	p.until = time.Now().Add(paceFor)
	p.grown = time.Now()
}

// wait waits for a paced slot of class at addr, or fails at once with
// SERVER_BUSY when none comes before ctx's deadline.
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
	lim, active := p.lim, now.Before(p.until)
	if active && now.Sub(p.grown) >= paceGrowEvery {
		// No refusal for a while: the share may have grown. Probe up
		// until the server refuses again and names it.
		lim.SetLimitAt(now, lim.Limit()*paceGrow)
		p.grown = now
	}
	p.mu.Unlock()
	if !active {
		return nil
	}
	// A slot is taken only if the call then has time left to run.
	r := lim.ReserveN(now, 1)
	if dl, ok := ctx.Deadline(); r.OK() && (!ok || now.Add(r.DelayFrom(now)+paceMargin).Before(dl)) {
		if !sleepCtx(ctx, r.DelayFrom(now)) {
			r.Cancel()
			return ctx.Err()
		}
		return nil
	}
	r.Cancel()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return api.Status(&api.ErrorDetail{
		Code: api.ErrorCode_ERROR_CODE_SERVER_BUSY, Reason: "client_paced",
		RetryAfterMs: uint64(time.Second / time.Millisecond), Limit: uint64(lim.Limit()),
	}, "the tenant is over its quota at "+addr+" (its share there is about "+strconv.FormatFloat(float64(lim.Limit()), 'f', 0, 64)+" per second): this call could not be sent before its deadline")
}
