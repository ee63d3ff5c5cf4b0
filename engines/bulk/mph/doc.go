// Package mph is the minimal perfect hash of bulk table files: it
// maps n distinct 64-bit key hashes to distinct slots in [0, n), using about
// 3.5 bits per key, and answers a lookup with a few multiplications and one or
// two memory reads.
//
// # Construction (PtrHash-style, Groot Koerkamp 2025)
//
// A hash h is mixed with the table's seed into x = fmix64(h ^ seed). Keys are
// split into P = round(n/2^16) parts (at least 1) by x·P = part·2^64 + rest,
// and each part is built on its own, so that its working set (~14 bytes per
// key, ~1 MB) stays in a core's L2 cache: at 10M keys this took the build
// from 2.7M to 5-7M keys/s on the dev box (PtrHash's parts). A part of m
// keys has S_p = ceil(m/α) slots and B_p = ceil(m/λ) buckets, chosen by the
// high bits of rest (λ = 2.5 keys per bucket on average, near the seed
// design's "groups of about 4 keys"; 60% of the keys go to the first 30% of
// buckets, PTHash's skew). Each bucket gets an 8-bit pilot p (the seed
// design's "displacement factor") such that every key of the bucket lands on
// a free slot of its part
//
//	slot(x, p) = slotStart_part + ⌊((x ^ H[p]) * C) * S_p / 2^64⌋   α = 0.99
//
// where H is a table of 256 pilot hashes derived from the seed. The parts'
// slots and buckets are laid end to end: S = ΣS_p, B = ΣB_p. Buckets are
// placed largest first; a bucket that finds no pilot with all its slots free
// takes the pilot whose collisions are cheapest (sum of squared sizes of the
// buckets it hits) and evicts those buckets, which are placed again (cuckoo
// style; this is what lets 8-bit pilots reach α = 0.99 where plain greedy
// displacement needs a collision table). The pilot search tests a bucket's
// first keys (up to three) under 8 pilots at a time without branches
// (whether a slot is free is a coin toss the branch predictor loses; 20%
// faster with the first key, 9% more with up to three). Slots in
// [n, S) that got keys are remapped to the free slots below n through a
// table of S-n uint32.
//
// A lookup is: part (one multiply, a 64-byte part record that stays cached),
// bucket, pilot byte, one multiply, and — for about 1% of keys — one remap
// read. BuildSlots also returns every input's slot, which the builder knows,
// saving a Lookup per key afterwards. The table never stores keys: a hash that was not built in
// maps to some slot too, so callers reject absent keys themselves
// (engines/bulk keeps a fingerprint per slot and compares the full key).
//
// Build is deterministic: the same set of hashes and Options give the same
// table (and the same bytes), whatever their order and whatever
// Options.Workers (the parts are independent: up to Workers goroutines
// build them, 1.5x faster with 2 on the 2-core dev box). If eviction does
// not converge (it always has in testing) Build retries with the next seed.
//
// # Encoding (AppendBinary / Decode)
//
//	 0          4        8        16       24       32         40       48
//	| magic (4) | ver(4) | n (8)  | S (8)  | B (8)  | seed (8) | P (8)  |
//	| parts: P × {S_p (4) | B_p (4)} | pilots (B) | remap (4*(S-n)) |
//
// magic is "MPH1"; ver is 2 (version 1, a single part without the part
// table, is no longer read). P must be round(n/2^16), at least 1 (0 when n
// is 0); every S_p and B_p at least 1, summing to S and B. Integers are
// little-endian. The encoding has no
// checksum of its own: the bulk file's footer carries a CRC32C of the section
// that holds it. Decode validates sizes and the remap targets (< n), so a
// damaged table is an error, never a panic or an out-of-range slot.
//
// # Concurrency
//
// A *Table is immutable after Build or Decode and safe for concurrent use.
//
// # Example
//
//	t, err := mph.Build(hashes, mph.Options{})
//	slot := t.Lookup(hashes[0]) // in [0, len(hashes))
package mph
