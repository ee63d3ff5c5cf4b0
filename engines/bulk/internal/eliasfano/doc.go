// Package eliasfano is a static, compressed, random-access list of
// non-decreasing uint64s (Elias 1974, Fano 1971): with n values below U it
// takes n·(2 + ⌈log2(U/n)⌉) bits plus a select sample every 256 values.
// Bulk files use it for record offsets: about 9 bits per record of ~100
// bytes, where a []uint64 would take 64.
//
// # Encoding (AppendBinary / Decode)
//
//	 0       8          9         16      24
//	| n (8) | lowBits(1)| 0 (7)   | hiLen(8)| low words | high words | samples |
//
// low is n·lowBits bits in ⌈n·lowBits/64⌉ little-endian words; high is the
// unary-coded high parts, hiLen bits in ⌈hiLen/64⌉ words; samples is the
// position in high of every 256th one, ⌈n/256⌉ words. The encoding has no
// checksum: its container carries one. Decode validates sizes, and Get stays
// in bounds on any input that Decode accepted.
//
// A *List is immutable and safe for concurrent use.
package eliasfano
