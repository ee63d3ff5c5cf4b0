package stream

import (
	"testing"
	"time"
)

// TestLinkTimeoutFollowsRoundTrips: a link's replicate timeout is the
// configured floor while batches come back fast, grows with slow and
// jittery round trips (a busy machine) so healthy secondaries are not
// dropped, and never passes the cap, so a paused one still is.
func TestLinkTimeoutFollowsRoundTrips(t *testing.T) {
	floor, cap := 150*time.Millisecond, 1200*time.Millisecond
	l := &link{n: &Node{opts: NodeOptions{ReplicateTimeout: floor, ReplicateTimeoutMax: cap}}}
	if got := l.timeout(); got != floor {
		t.Fatalf("no round trip seen: timeout %v, want the floor %v", got, floor)
	}
	for range 50 {
		l.observeRTT(2 * time.Millisecond)
	}
	if got := l.timeout(); got != floor {
		t.Fatalf("2 ms round trips: timeout %v, want the floor %v", got, floor)
	}
	for i := range 50 {
		l.observeRTT(time.Duration(20+100*(i%2)) * time.Millisecond) // 20 and 120 ms
	}
	got := l.timeout()
	if got <= floor || got >= cap {
		t.Fatalf("20-120 ms round trips: timeout %v, want above the floor %v and below the cap %v", got, floor, cap)
	}
	for range 50 {
		l.observeRTT(5 * time.Second)
	}
	if got := l.timeout(); got != cap {
		t.Fatalf("5 s round trips: timeout %v, want the cap %v", got, cap)
	}
}
