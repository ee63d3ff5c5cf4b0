// Package keyspace maps keys to the hash space partitions cut: the one place
// the routing hash is defined, shared by clients, servers and builders.
//
// A key's position is xxhash64(key). Partition i of n covers
// [i*step, (i+1)*step-1] with step = ceil(2^64/n) — the last ends at 2^64-1 —
// so Index(h, n) is one multiply-shift. Never change the hash or the cut:
// they decide where every stored key lives.
//
// All functions are pure and safe for concurrent use.
package keyspace
