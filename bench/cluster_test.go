package main

import (
	"fmt"
	"testing"
	"time"
)

// The read-back check of the failover run: a key keeps its last
// acknowledged write when it holds that value or a later unacknowledged
// one, and only then.
func TestClusterReadBackCheck(t *testing.T) {
	key := []byte("key-0000042")
	s := &clKeyState{key: key, lastAcked: 7, attempted: 9}
	val := func(k []byte, seq uint64) []byte { return clFoValue(nil, k, seq, 100) }
	if v := val(key, 7); len(v) != 100 {
		t.Fatalf("value of %d bytes, want 100", len(v))
	}
	for _, c := range []struct {
		found bool
		v     []byte
		want  bool
	}{
		{true, val(key, 7), true},                     // the last acknowledged value
		{true, val(key, 8), true},                     // a later write that timed out
		{true, val(key, 9), true},                     // the last one sent
		{true, val(key, 6), false},                    // an older value: the ack was lost
		{true, val(key, 10), false},                   // never sent
		{false, nil, false},                           // gone
		{true, val([]byte("key-0000041"), 7), false},  // another key's value
		{true, []byte("key-0000042|x|...."), false},   // garbage
		{true, fmt.Appendf(nil, "%s|7", key), false},  // truncated
		{true, val([]byte("key-00000421"), 7), false}, // a key with this one as prefix
	} {
		if got := s.holds(c.found, c.v); got != c.want {
			t.Errorf("holds(%v, %q) = %v, want %v", c.found, c.v, got, c.want)
		}
	}
}

// The failover timer counts only writes that started after the kill, and
// is done once every watched partition has one.
func TestClusterAckWatch(t *testing.T) {
	w := newClAckWatch()
	before := time.Now()
	since := before.Add(time.Millisecond)
	done := w.arm(since, []int{1, 3})
	w.ack(1, before)                      // started before the kill: not counted
	w.ack(2, since.Add(time.Millisecond)) // not watched
	w.ack(1, since.Add(time.Millisecond))
	select {
	case <-done:
		t.Fatal("done with partition 3 unacknowledged")
	default:
	}
	w.ack(3, since.Add(time.Millisecond))
	select {
	case <-done:
	default:
		t.Fatal("not done with both partitions acknowledged")
	}
	if got := w.results(); len(got) != 2 {
		t.Fatalf("results %v, want partitions 1 and 3", got)
	}
	w.ack(1, since.Add(time.Millisecond)) // disarmed: ignored, no panic
}
