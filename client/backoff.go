package client

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"
)

// Retry timing. Data calls start at 5 ms (a NOT_OWNER refresh plus a retry is
// about one master round trip) and cap at 250 ms: a failover takes about a
// second (lease ~1 s) and a call waiting through it is also woken by the map
// change that ends it (tableState.changedCh), which resets its backoff, so
// the cap only bounds how late a call notices a partition that became
// ready without a map change (a new primary still catching up answers
// log_reconfiguring). Master calls cap at 1 s. The partition-map watch is
// a background stream: it backs off further, up to 5 s, so a cluster with
// its masters down is not hammered by every idle client.
const (
	backoffBase      = 5 * time.Millisecond
	backoffCap       = 250 * time.Millisecond
	masterBackoffCap = time.Second
	// masterAttemptTimeout bounds one master's part of a call when there
	// are several masters.
	masterAttemptTimeout = 2 * time.Second
	watchBackoffBase     = 50 * time.Millisecond
	watchBackoffCap      = 5 * time.Second
)

// backoff is the wait before retry number attempt (0-based) under
// exponential backoff with full jitter: uniform in [0, min(limit, base<<attempt)).
// Full jitter spreads clients that failed together (a server died under all
// of them) evenly over the window instead of retrying in lockstep. r supplies
// the randomness; the function is otherwise pure.
func backoff(r *rand.Rand, attempt int, base, limit time.Duration) time.Duration {
	if base <= 0 || limit <= 0 {
		return 0
	}
	window := limit
	// base<<attempt overflows past 62 doublings; stop doubling once the cap
	// is reached.
	if attempt < 62 {
		if w := base << attempt; w > 0 && w < limit {
			window = w
		}
	}
	return time.Duration(r.Int64N(int64(window)))
}

// jitter is a mutex-guarded seeded source: math/rand's Rand is not safe for
// concurrent use. Safe for concurrent use.
type jitter struct {
	mu sync.Mutex // guards r
	r  *rand.Rand
}

func newJitter(seed uint64) *jitter {
	return &jitter{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// intN is uniform in [0, n).
func (j *jitter) intN(n int) int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.r.IntN(n)
}

func (j *jitter) backoff(attempt int, base, limit time.Duration) time.Duration {
	j.mu.Lock()
	defer j.mu.Unlock()
	return backoff(j.r, attempt, base, limit)
}

// sleepCtx waits d or until ctx ends; it reports whether the full wait passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
