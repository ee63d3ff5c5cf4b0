// Package splitpolicy decides the Table Master's automatic splits (issue
// 31, item 5; ARCHITECTURE.md, "Automatic splits"): which partitions to
// split now, where, and why not the others.
//
// It is a pure core, like tablemaster/balance: Decide is a function of a
// Snapshot (tables with their split settings, partitions with their
// smoothed load, size and the split hints their primaries reported) and
// Options, plus a Memory of when each partition's load first passed its
// threshold (the sustain window), which Decide updates. No clock, no I/O,
// no goroutines. The master's leader builds the Snapshot from its map and
// load view and proposes the splits (tablemaster/autosplit.go).
//
// # Rules
//
//   - By size: a partition whose bytes reach its table's size threshold
//     (Options.SizeBytes, 512 MiB by default) splits at once, at its size
//     hint: an ordered table's median key by bytes, a point table's
//     hash-range midpoint (keys hash uniformly, so the midpoint is the
//     median of the data). An ordered partition with no size hint waits.
//   - By load: a partition whose reads+writes per second stay at or above
//     its table's threshold (Options.QPS, 2,500 by default) for
//     Options.Sustain (10 s) splits at its load hint, the point where its
//     sampled load halves; with none, a point partition splits at its
//     midpoint and an ordered one waits (there is no midpoint of keys).
//     An ordered split point is cut back to its Azure PartitionKey's
//     first key when it is an entity key (GroupStart).
//   - Guard rails: at most Options.MaxConcurrent splits in flight in the
//     cluster (the most loaded candidates first); no table beyond its
//     maximum partitions; nothing for a partition with a split or a move
//     pending; and a partition made by a split less than Options.Cooldown
//     ago is not split again by load (its rates are still settling), only
//     by size.
//
// Every candidate held back gets a Note saying why, so `tabula table
// describe` and the transcripts can show it.
//
// Decide is safe to call from one goroutine at a time per Memory.
package splitpolicy
