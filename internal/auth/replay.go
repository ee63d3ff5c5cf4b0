package auth

import (
	"encoding/binary"
	"sync"
	"time"
)

// DefaultReplayCapacity is how many signatures a Verifier remembers by
// default: about 24 MB, 15 minutes of ~1,100 requests/s. Past it the
// window of timestamps a server accepts shrinks (see replayCache).
const DefaultReplayCapacity = 1 << 20

// replayCache remembers accepted signatures (their first 8 bytes, in
// buckets by the minute of their timestamp) until their timestamp leaves
// the clock window, so none is accepted twice. When full, it drops its
// oldest bucket and refuses timestamps before the newest one dropped
// (floor): replays stay impossible, at the price of a narrower window for
// clocks that lag under heavy load.
type replayCache struct {
	mu       sync.Mutex
	capacity int
	size     int
	buckets  map[int64]map[uint64]struct{} // by timestamp minute
	floorMs  int64                         // timestamps below are refused
	swept    int64                         // the oldest minute at the last sweep
}

func newReplayCache(capacity int) *replayCache {
	return &replayCache{capacity: capacity, buckets: map[int64]map[uint64]struct{}{}}
}

const minuteMs = int64(time.Minute / time.Millisecond)

// add records a signature of timestamp tsMs at server time nowMs, or
// refuses it as a replay or below the floor.
func (c *replayCache) add(sig []byte, tsMs, nowMs int64) error {
	id := binary.LittleEndian.Uint64(sig)
	c.mu.Lock()
	defer c.mu.Unlock()
	// Forget buckets wholly out of the window: their timestamps are
	// refused by the clock check anyway.
	oldest := (nowMs - int64(MaxClockSkew/time.Millisecond)) / minuteMs
	if oldest != c.swept { // once a minute, not per request
		c.swept = oldest
		for m, b := range c.buckets {
			if m < oldest-1 {
				c.size -= len(b)
				delete(c.buckets, m)
			}
		}
	}
	if tsMs < c.floorMs {
		return unauthenticated("replay_window", "request timestamp is older than this server's replay window under its current load (%s); retry with a fresh signature (the SDK does)",
			time.Duration(nowMs-c.floorMs)*time.Millisecond)
	}
	m := tsMs / minuteMs
	b := c.buckets[m]
	if _, seen := b[id]; seen {
		return unauthenticated("replayed", "replayed signature: this request was already served")
	}
	for c.size >= c.capacity {
		first := int64(1<<63 - 1)
		for k := range c.buckets {
			first = min(first, k)
		}
		if first == m {
			break // everything left is this minute's: let it grow
		}
		c.size -= len(c.buckets[first])
		delete(c.buckets, first)
		c.floorMs = max(c.floorMs, (first+1)*minuteMs)
		if tsMs < c.floorMs {
			return unauthenticated("replay_window", "request timestamp is older than this server's replay window under its current load; retry with a fresh signature")
		}
	}
	if b == nil {
		b = map[uint64]struct{}{}
		c.buckets[m] = b
	}
	b[id] = struct{}{}
	c.size++
	return nil
}
