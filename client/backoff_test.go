package client

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	const seed = 42
	t.Logf("seed %d", seed)
	base, limit := 5*time.Millisecond, time.Second
	for _, tc := range []struct {
		attempt int
		window  time.Duration // draws are in [0, window)
	}{
		{0, 5 * time.Millisecond},
		{1, 10 * time.Millisecond},
		{3, 40 * time.Millisecond},
		{7, 640 * time.Millisecond},
		{8, time.Second}, // 1.28 s capped
		{40, time.Second},
		{62, time.Second}, // base<<62 overflows
		{63, time.Second},
		{1000, time.Second},
	} {
		r := rand.New(rand.NewPCG(seed, seed))
		var largest, sum time.Duration
		const n = 2000
		for range n {
			d := backoff(r, tc.attempt, base, limit)
			if d < 0 || d >= tc.window {
				t.Fatalf("attempt %d: backoff %v outside [0, %v)", tc.attempt, d, tc.window)
			}
			largest = max(largest, d)
			sum += d
		}
		// Full jitter is uniform over the window: the mean is near half of
		// it and the draws reach near its top.
		mean := sum / n
		if mean < tc.window*4/10 || mean > tc.window*6/10 {
			t.Errorf("attempt %d: mean %v, want about %v", tc.attempt, mean, tc.window/2)
		}
		if largest < tc.window*9/10 {
			t.Errorf("attempt %d: largest draw %v, want near %v", tc.attempt, largest, tc.window)
		}
	}
}

func TestBackoffDeterministic(t *testing.T) {
	a, b := newJitter(7), newJitter(7)
	for i := range 100 {
		if x, y := a.backoff(i%12, backoffBase, backoffCap), b.backoff(i%12, backoffBase, backoffCap); x != y {
			t.Fatalf("draw %d: same seed gave %v and %v", i, x, y)
		}
	}
	c := newJitter(8)
	same := 0
	for range 100 {
		if a.backoff(10, backoffBase, backoffCap) == c.backoff(10, backoffBase, backoffCap) {
			same++
		}
	}
	if same > 5 {
		t.Errorf("seeds 7 and 8 gave %d equal draws of 100", same)
	}
}

func TestBackoffZero(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	if d := backoff(r, 3, 0, time.Second); d != 0 {
		t.Errorf("zero base: %v", d)
	}
	if d := backoff(r, 3, time.Millisecond, 0); d != 0 {
		t.Errorf("zero cap: %v", d)
	}
}

func TestTTLMillis(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want uint64
		bad  bool
	}{
		{0, 0, false},
		{time.Nanosecond, 1, false},
		{time.Millisecond, 1, false},
		{time.Millisecond + 1, 2, false},
		{time.Hour, 3_600_000, false},
		{-time.Nanosecond, 0, true},
	} {
		got, err := ttlMillis("ttl", tc.d)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("ttlMillis(%v) = %d, %v; want %d, bad=%v", tc.d, got, err, tc.want, tc.bad)
		}
	}
}
