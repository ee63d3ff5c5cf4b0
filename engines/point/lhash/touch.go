package lhash

import "sync/atomic"

// Touch loads the first word of the primary bucket that owns hash and
// returns it; it finds nothing. A batch reader touches the buckets of all
// its keys first, in a loop of independent loads, so the processor has
// their cache misses in flight at once; the Lookups that follow then find
// the buckets in cache. The result means nothing to the caller except as
// a value to keep (so the compiler keeps the load).
func (ix *Index) Touch(hash uint64) uint64 {
	bk := ix.bucketAt(addr(hash, ix.state.Load()))
	if bk == nil {
		return 0
	}
	return atomic.LoadUint64(&bk[0])
}
