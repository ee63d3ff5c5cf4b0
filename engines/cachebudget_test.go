package engines

import (
	"sync"
	"testing"
)

type fakeCache struct {
	mu  sync.Mutex
	max int64
}

func (f *fakeCache) SetMaxBytes(n int64) {
	f.mu.Lock()
	f.max = n
	f.mu.Unlock()
}

func (f *fakeCache) get() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.max
}

// Members share the budget equally, and are resized as others join and
// leave; a thousand members ask for the budget, not a thousand of it.
func TestCacheBudgetShares(t *testing.T) {
	if _, err := NewCacheBudget(1000); err == nil {
		t.Fatal("a 1000-byte budget was accepted")
	}
	b, err := NewCacheBudget(64 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if b.Share() != 64<<20 {
		t.Fatalf("first share %d, want the whole budget", b.Share())
	}
	var cs []*fakeCache
	var leaves []func()
	for range 4 {
		c := &fakeCache{}
		cs = append(cs, c)
		leaves = append(leaves, b.Join(c))
	}
	for i, c := range cs {
		if c.get() != 16<<20 {
			t.Fatalf("member %d has %d bytes, want a quarter", i, c.get())
		}
	}
	leaves[0]()
	leaves[0]() // idempotent
	if cs[1].get() != (64<<20)/3 {
		t.Fatalf("after one left: %d, want a third", cs[1].get())
	}
	var sum int64
	many := make([]*fakeCache, 1000)
	for i := range many {
		many[i] = &fakeCache{}
		b.Join(many[i])
	}
	for _, c := range many {
		sum += c.get()
	}
	if sum > 64<<20+1000*minCacheShare {
		t.Fatalf("1000 members hold %d bytes together", sum)
	}
}
