package client

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
)

func busyDetail(limit uint64) *api.ErrorDetail {
	return &api.ErrorDetail{Code: api.ErrorCode_ERROR_CODE_SERVER_BUSY, Reason: "tenant_write_rate", Limit: limit}
}

// TestPacerHoldsCallsToTheShare: after a rate refusal naming a share of
// 50/s, calls of that class to that server are spaced out (others are
// not), and a call that could not be sent before its deadline fails
// SERVER_BUSY client_paced at once, without waiting.
func TestPacerHoldsCallsToTheShare(t *testing.T) {
	var ps pacers
	ps.refused("s1", busyDetail(50))
	ctx := context.Background()
	start := time.Now()
	for range 20 {
		if err := ps.wait(ctx, "s1", classWrite); err != nil {
			t.Fatal(err)
		}
	}
	// 20 calls at about 56/s with a burst of 5: at least ~0.25 s.
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("20 paced calls took %v; want them spaced out", d)
	}
	start = time.Now()
	for range 100 {
		if err := ps.wait(ctx, "s1", classRead); err != nil {
			t.Fatal(err)
		}
		if err := ps.wait(ctx, "s2", classWrite); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d > 50*time.Millisecond {
		t.Errorf("calls of another class or server were held %v", d)
	}
	// A share of 5/s (a slot every ~150 ms, a burst of 1): once the burst
	// is taken, a call with 30 ms left cannot be sent in time.
	ps.refused("s3", busyDetail(5))
	if err := ps.wait(ctx, "s3", classWrite); err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	start = time.Now()
	err := ps.wait(dctx, "s3", classWrite)
	if d := api.DetailOf(err); d.GetCode() != api.ErrorCode_ERROR_CODE_SERVER_BUSY || d.GetReason() != "client_paced" {
		t.Fatalf("a call with no slot before its deadline: %v, want SERVER_BUSY client_paced", err)
	}
	if d := time.Since(start); d > 20*time.Millisecond {
		t.Errorf("the refused call waited %v", d)
	}
	// Its retry_after is when the next slot is due (~150 ms, and 20 ms
	// to run), so a call that cannot wait so long gives up rather than
	// coming back for a slot it cannot use.
	if ms := api.DetailOf(err).GetRetryAfterMs(); ms < 100 || ms > 250 {
		t.Errorf("retry_after of the paced call %d ms; want the next slot, ~150 ms off", ms)
	}
}

// TestPacerLowerRateLosesNoSlots: calls queue for a pacer at a high rate,
// then a refusal names a tenth of it. The client must go on sending at the
// new rate. (A limiter that had promised the queued calls their slots
// kept them as a debt, paid at the new rate for seconds, during which
// every new call failed unsent while the server's bucket stood full: a
// paced tenant got about 0.8 of its quota.)
func TestPacerLowerRateLosesNoSlots(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for 3 s")
	}
	var ps pacers
	ps.refused("s", busyDetail(200)) // 221/s
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	var (
		mu    sync.Mutex
		sent  []time.Duration // when each call was let through
		wg    sync.WaitGroup
		total = 2200 * time.Millisecond
	)
	// The server: a share of 20/s from 0.3 s on, refusing now and then,
	// as a bucket does the excess of a client pacing a little over it.
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if time.Since(start) >= 300*time.Millisecond {
					ps.refused("s", busyDetail(20)) // 23/s
				}
			}
		}
	}()
	// The tenant: 500 calls a second, each with a deadline of 1 s.
	tick := time.NewTicker(2 * time.Millisecond)
	for time.Since(start) < total {
		<-tick.C
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, ccancel := context.WithTimeout(ctx, time.Second)
			defer ccancel()
			if ps.wait(cctx, "s", classWrite) == nil {
				mu.Lock()
				sent = append(sent, time.Since(start))
				mu.Unlock()
			}
		}()
	}
	tick.Stop()
	cancel()
	wg.Wait()
	// From 1.4 s to 2.2 s the calls queued at the old rate are gone: the
	// new rate (23/s, probing up by at most a tenth between refusals) is
	// what goes through.
	var n int
	for _, at := range sent {
		if at >= 1400*time.Millisecond && at < total {
			n++
		}
	}
	if n < 10 || n > 35 {
		t.Errorf("%d calls sent from 1.4 s to 2.2 s at a paced rate of ~23/s; want ~18 (%d sent in all)", n, len(sent))
	}
}

// waitWaiting waits (5 s at most) until n calls wait for a slot of p.
func waitWaiting(t *testing.T, p *pacer, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		p.mu.Lock()
		got := len(p.waiting)
		p.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls waiting, want %d", got, n)
		}
	}
}

// TestPacerServesNewestFirst: of two calls waiting for a slot, the newer
// gets the next one: it has the most time left, so it is the least likely
// to run out of time at the server after taking a token there.
func TestPacerServesNewestFirst(t *testing.T) {
	var ps pacers
	ps.refused("s", busyDetail(8)) // ~10/s, a burst of 1
	ctx := context.Background()
	if err := ps.wait(ctx, "s", classWrite); err != nil { // the burst
		t.Fatal(err)
	}
	p := ps.m[paceKey{"s", classWrite}]
	order := make(chan string, 2)
	for _, name := range []string{"older", "newer"} {
		go func() {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if err := ps.wait(cctx, "s", classWrite); err != nil {
				t.Error(err)
			}
			order <- name
		}()
		if name == "older" {
			waitWaiting(t, p, 1)
		}
	}
	if first := <-order; first != "newer" {
		t.Errorf("the %s call went first; want the newer", first)
	}
	<-order
}

// TestPacerSlotOfAGoneCallIsNotLost: a call that gives up (its context
// ends) while waiting leaves the slot to the next call.
func TestPacerSlotOfAGoneCallIsNotLost(t *testing.T) {
	var ps pacers
	ps.refused("s", busyDetail(1)) // ~2.1/s: a slot every ~476 ms
	ctx := context.Background()
	if err := ps.wait(ctx, "s", classWrite); err != nil {
		t.Fatal(err)
	}
	gone, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- ps.wait(gone, "s", classWrite) }()
	p := ps.m[paceKey{"s", classWrite}]
	waitWaiting(t, p, 1)
	cancel()
	if err := <-done; err != context.Canceled {
		t.Fatalf("a call whose context ended: %v, want context.Canceled", err)
	}
	// The next slot is due within ~476 ms of the burst; the next call
	// gets it (a lost slot would hold it to the one after, ~952 ms).
	start := time.Now()
	if err := ps.wait(ctx, "s", classWrite); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 800*time.Millisecond {
		t.Errorf("the next call waited %v for a slot due within ~476 ms", d)
	}
}

// TestPacerTurnsAwayCallsWithNoSlotInTime: of five calls with 1.3 s left
// at ~2.1 slots a second (a slot every ~476 ms), two can be sent in time; the other three fail
// client_paced at once rather than at their deadlines. (The scale is
// seconds so that a loaded machine, whose timers fire late by a few
// hundred milliseconds, cannot move a slot past the deadline.)
func TestPacerTurnsAwayCallsWithNoSlotInTime(t *testing.T) {
	var ps pacers
	ps.refused("s", busyDetail(1)) // ~2.1/s, a burst of 1
	ctx := context.Background()
	if err := ps.wait(ctx, "s", classWrite); err != nil { // the burst
		t.Fatal(err)
	}
	type result struct {
		err  error
		took time.Duration
		left time.Duration // until the deadline, when the call returned
	}
	// One deadline for all five, so a goroutine started late has no
	// less time than the others.
	dl := time.Now().Add(1300 * time.Millisecond)
	results := make(chan result, 5)
	for range 5 {
		go func() {
			cctx, cancel := context.WithDeadline(ctx, dl)
			defer cancel()
			start := time.Now()
			err := ps.wait(cctx, "s", classWrite)
			results <- result{err, time.Since(start), time.Until(dl)}
		}()
	}
	var sent, away int
	for range 5 {
		r := <-results
		switch d := api.DetailOf(r.err); {
		case r.err == nil:
			sent++
		case d.GetReason() == "client_paced":
			away++
			if r.took > 900*time.Millisecond {
				t.Errorf("a call turned away waited %v", r.took)
			}
			// The third slot at best: later than it could wait.
			if ms := d.GetRetryAfterMs(); time.Duration(ms)*time.Millisecond < r.left-paceMargin {
				t.Errorf("a call turned away with %v left has a retry_after of %d ms; want at least the time it had left", r.left, ms)
			}
		default:
			t.Errorf("a paced call: %v", r.err)
		}
	}
	if sent != 2 || away != 3 {
		t.Errorf("%d calls sent and %d turned away; want 2 and 3", sent, away)
	}
}
