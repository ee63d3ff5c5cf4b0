// Package lhash is the point engine's in-memory index: a linear-hashing table
// (Larson 1988, "Dynamic hash tables") that maps a key's 64-bit hash to a
// 48-bit location in a value store. It holds no keys and no pointers per
// entry: every entry is one 8-byte word, and the table is a few large
// []uint64 segments the garbage collector scans in no time.
//
// # Entry word
//
//	63            48 47                                             0
//	| tag (16 bits) |              location (48 bits)                |
//
// tag is hash bits 32..47, forced non-zero (0 becomes 1) so that the zero word
// means "empty slot". Buckets are addressed by the low bits of the hash
// (level+1 <= 32 bits, i.e. up to 2^32 buckets), so the tag is independent of
// the bucket and rejects 65535 of 65536 non-matching entries without touching
// the value store. The high hash bits are not used: keyspace routes partitions
// by them, so inside one partition they are nearly constant. A location is
// opaque to the index (the in-memory store uses a slot number, the disk store
// a log offset); it must be below MaxLocation+1 = 2^48.
//
// # Bucket
//
// A bucket is 8 words, one 64-byte cache line:
//
//	word 0:  | overflow id (32 bits) | seq (32 bits, odd = locked) |
//	words 1-7: entry words, packed: the entries of a chain fill a prefix of
//	           its slots, so a bucket with an empty slot ends its chain.
//
// Overflow buckets have the same shape, live in a separate arena and chain
// through word 0's overflow id (id 0 = end of chain; the seq half is unused).
// At the load factors kept here (split above 0.80 of the primary slots,
// merge below 0.50) about a quarter of primary buckets have an overflow
// bucket — unsplit buckets carry twice the load of split ones, as linear
// hashing does — for 14.4 index bytes per entry at 1M-4M entries (11.4 in
// primary buckets, 3 in overflow).
//
// # Linear hashing
//
// The table has 2^level + next buckets. A hash h lives in bucket
// b = h mod 2^level, or h mod 2^(level+1) when b < next. Growing splits
// bucket next into next and next+2^level, moving the entries whose hash bit
// "level" is set; shrinking merges the last bucket back into its buddy. Each
// step moves one bucket's chain (about 6 entries), so there is never a global
// rehash or table copy; only the directory of segment pointers (one pointer
// per 4096 buckets) is copied when a segment is added or dropped. The index
// stores no full hash, so a split asks the Hasher for the hash of each entry
// it moves (the engine re-hashes the key at that location).
//
// # Concurrency
//
// An Index is safe for concurrent use. The (level, next) pair is one atomic
// word. Writers lock the bucket (CAS on seq, even to odd), re-read the pair to
// check that the bucket still owns the hash, change slots with atomic stores
// and unlock (seq+1). Readers take no lock: they read seq, the slots (calling
// the match callback on tag hits), seq again and the pair again, and retry if
// anything moved. Splits and merges lock the buckets they touch and are
// serialised by one resize mutex; a writer whose insert or delete crosses a
// water mark does one step itself (TryLock: it never waits for another
// resizer).
//
// A Lookup's match callback runs inside the optimistic read, so it may be
// shown a location that a concurrent writer has just replaced or deleted (and
// the store may have freed or even reused it). It must tolerate that: read
// the location safely and answer whether it holds the key. The answer is only
// trusted if the bucket did not change meanwhile; otherwise the lookup
// retries. Writers' callbacks run under the bucket lock and see only live
// entries. No callback may call back into the Index.
//
// # Example
//
//	ix := lhash.New(lhash.Options{Hasher: func(loc uint64) uint64 { return hash(keys[loc]) }})
//	old, replaced := ix.Upsert(hash(k), loc, func(l uint64) bool { return bytes.Equal(keys[l], k) })
//	loc, ok := ix.Lookup(hash(k), func(l uint64) bool { return bytes.Equal(keys[l], k) })
package lhash
