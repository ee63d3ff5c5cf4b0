package diskstore

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/dgraph-io/ristretto/v2"
)

// The read cache keeps encoded put records by where they are in
// the log: the key is (segment sequence number, offset), the value the
// record's bytes exactly as in the segment (header, key, value), already
// checked against their CRC. A segment's bytes never change and its
// sequence number is never reused (unlike its slot and 4-bit generation),
// so an entry can never be stale: whatever the cache returns for a position
// is what a disk read of that position would return. Which position is a
// key's current one is the owner's index's business, and the index is
// updated only under the key's write lock after the write is committed, so
// an overwrite or delete needs no cache invalidation to be correct. Free
// still deletes the freed position's entry so that garbage does not hold
// cache space until evicted.
//
// ristretto admits and evicts asynchronously (a Set may be dropped, or
// applied a little later): both only cost hit rate, never correctness.
//
// Close of a ristretto cache must not race with its Get, Set or Del (it
// closes the channels they send on), so every call holds one of 16 read
// locks (picked by key, so two cores rarely share one) and Close takes them
// all.

// cacheShards is the number of read locks and counter shards.
const cacheShards = 16

// cacheKey names the record at off in segment seq: 36 bits of sequence
// (6.9e10 segments) above the 28-bit offset.
func cacheKey(seq uint64, off int64) uint64 { return seq<<offsetBits | uint64(off) }

type cacheShard struct {
	mu           sync.RWMutex
	closed       bool // guarded by mu
	hits, misses atomic.Int64
	_            [24]byte
}

// readCache is the store's record cache; safe for concurrent use.
type readCache struct {
	c      *ristretto.Cache[uint64, []byte]
	shards [cacheShards]cacheShard
	// leave takes the cache out of the budget it shares (nil: none).
	leave func()
}

// SetMaxBytes implements engines.CacheMember: a budget resizes the cache.
func (rc *readCache) SetMaxBytes(n int64) {
	sh := &rc.shards[0]
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	if !sh.closed {
		rc.c.UpdateMaxCost(n)
	}
}

// newReadCache returns a cache of records holding at most maxBytes (encoded
// record bytes plus ristretto's per-item overhead).
func newReadCache(maxBytes int64) (*readCache, error) {
	// ristretto wants about 10 counters per item it can hold; items are
	// assumed to be 1 KiB on average (3 bytes per counter: 64 MiB of cache
	// costs 2 MiB of counters).
	counters := max(maxBytes/1024*10, 1<<12)
	c, err := ristretto.NewCache(&ristretto.Config[uint64, []byte]{
		NumCounters: counters,
		MaxCost:     maxBytes,
		BufferItems: 64,
		KeyToHash:   func(k uint64) (uint64, uint64) { return mix64(k), 0 },
	})
	if err != nil {
		return nil, fmt.Errorf("diskstore: read cache of %d bytes: %w", maxBytes, err)
	}
	return &readCache{c: c}, nil
}

// mix64 spreads a position's bits (sequence numbers and offsets are small
// and regular) over the word: ristretto picks shards and counters from them.
func mix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

func (rc *readCache) shard(k uint64) *cacheShard { return &rc.shards[mix64(k)>>60] }

// get returns the record at position k, counting a hit or a miss. The
// returned bytes are immutable.
func (rc *readCache) get(k uint64) ([]byte, bool) {
	sh := rc.shard(k)
	sh.mu.RLock()
	var (
		b  []byte
		ok bool
	)
	if !sh.closed {
		b, ok = rc.c.Get(k)
	}
	sh.mu.RUnlock()
	if ok {
		sh.hits.Add(1)
	} else {
		sh.misses.Add(1)
	}
	return b, ok
}

// set caches rec, the encoded record at position k; rec must never be
// modified afterwards.
func (rc *readCache) set(k uint64, rec []byte) {
	sh := rc.shard(k)
	sh.mu.RLock()
	if !sh.closed {
		rc.c.Set(k, rec, int64(len(rec)))
	}
	sh.mu.RUnlock()
}

func (rc *readCache) del(k uint64) {
	sh := rc.shard(k)
	sh.mu.RLock()
	if !sh.closed {
		rc.c.Del(k)
	}
	sh.mu.RUnlock()
}

// counts returns the hits and misses so far.
func (rc *readCache) counts() (hits, misses int64) {
	for i := range rc.shards {
		hits += rc.shards[i].hits.Load()
		misses += rc.shards[i].misses.Load()
	}
	return hits, misses
}

// close stops ristretto's goroutines once no call is inside it; calls after
// it miss. Idempotent. ristretto's own Close (which clears its counters and
// waits for its goroutines, tens to hundreds of milliseconds on a loaded
// machine) runs in the background: nothing reaches the cache after this
// returns, and a split closes its parent's store with writes waiting.
func (rc *readCache) close() {
	for i := range rc.shards {
		rc.shards[i].mu.Lock()
	}
	was := rc.shards[0].closed
	for i := range rc.shards {
		rc.shards[i].closed = true
		rc.shards[i].mu.Unlock()
	}
	if !was {
		if rc.leave != nil {
			rc.leave()
		}
		go rc.c.Close()
	}
}
