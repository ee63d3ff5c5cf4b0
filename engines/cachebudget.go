package engines

import (
	"fmt"
	"sync"
)

// CacheBudget is one byte budget for the read caches of many engines (a
// table server's partitions): each member's cache is sized to an equal
// share, resized as members join and leave, so a server hosting a
// thousand partitions asks for its budget, not a thousand caches' worth.
// Safe for concurrent use.
type CacheBudget struct {
	total int64

	mu      sync.Mutex
	members map[*budgetMember]struct{}
}

// CacheMember is a cache a budget sizes.
type CacheMember interface {
	// SetMaxBytes bounds the cache to n bytes, evicting as needed.
	SetMaxBytes(n int64)
}

type budgetMember struct{ c CacheMember }

// minCacheShare is the least a member gets, however many share.
const minCacheShare = 256 << 10

// NewCacheBudget returns a budget of total bytes (at least 1 MiB).
func NewCacheBudget(total int64) (*CacheBudget, error) {
	if total < 1<<20 {
		return nil, fmt.Errorf("engines: read cache budget of %d bytes: want at least 1 MiB", total)
	}
	return &CacheBudget{total: total, members: map[*budgetMember]struct{}{}}, nil
}

// Total is the budget's size in bytes.
func (b *CacheBudget) Total() int64 { return b.total }

// Share is what one more member would get now: the size to create a
// cache with before it joins.
func (b *CacheBudget) Share() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.shareLocked(len(b.members) + 1)
}

func (b *CacheBudget) shareLocked(n int) int64 {
	return max(b.total/int64(max(n, 1)), minCacheShare)
}

// Join adds c to the budget and resizes every member to its share; leave
// (idempotent) takes it out and resizes the rest.
func (b *CacheBudget) Join(c CacheMember) (leave func()) {
	m := &budgetMember{c: c}
	b.mu.Lock()
	b.members[m] = struct{}{}
	b.resizeLocked()
	b.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			delete(b.members, m)
			b.resizeLocked()
			b.mu.Unlock()
		})
	}
}

func (b *CacheBudget) resizeLocked() {
	share := b.shareLocked(len(b.members))
	for m := range b.members {
		m.c.SetMaxBytes(share)
	}
}
