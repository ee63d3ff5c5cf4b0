// Package balance plans load-aware placement for the Table Master: which
// primary roles to hand off and which replicas to move so that every
// server stays within a band of the mean on each dimension, and where a
// new partition's replicas go (issue 31, item 4; ARCHITECTURE.md,
// "Load-aware placement").
//
// It is a pure core, like raft's RawNode: Plan and Place are functions of
// a Snapshot (servers with fault domain and capacity, partitions with
// their replicas' smoothed loads) and Options; no clock, no I/O, no
// goroutines. The master builds the Snapshot from its map and its load
// view (tablemaster/load.go) and does the moves (tablemaster/move.go).
//
// # Model
//
// Each replica carries a load vector (Vec): 1 replica, reads/s, writes/s,
// engine busy cores, disk bytes and memory bytes, from its own reports,
// so a primary (which serves the strong reads) weighs more than its
// secondaries. Handing the primary role from A to B swaps the two
// replicas' vectors; moving a replica carries its vector to the target. A
// server's load is the sum over its replicas. The mean of a dimension is
// the total over every replica on a live server divided by the servers
// that take replicas (not draining), so a draining server's load is
// spread over the others. A dimension whose mean is below its floor
// (Options.Floors: an idle cluster) is not balanced: noise must not move
// data.
//
// # Score
//
// A server's cost is, over the balanced dimensions, the sum of e + e²
// where e is how far it lies outside mean*(1 ± band) in units of the
// mean (0 inside the band: the square spreads load evenly, the linear
// term keeps a server just outside worth a move); plus 100·(f + f²) for
// disk or memory filled to f above its limit (a full disk outweighs any
// band); plus 100 per replica and per primary held by a draining server.
// The band of the replica count is at least one replica (a mean of 2.4
// has no integer within ±15%).
// Plan is greedy: at each step it takes the action that lowers the sum
// of the costs most, preferring a primary transfer (a handoff, no copy)
// whenever one helps, then a replica move, and stops when no action
// gains more than Options.MinGain or the move limits are reached.
//
// # Rules
//
//   - no two replicas of a partition in one fault domain (an empty domain
//     is the server's own), and never a target that holds the partition;
//   - a target never passes its disk or memory limit (a fraction of the
//     capacity its server reports; unknown capacity does not limit);
//   - only servers not draining receive; a primary goes only to an
//     in-sync secondary; a partition with a move under way, a replica
//     not in sync or a replica on a server missing from the snapshot (a
//     dead one: the master's repair path owns it) stays as it is;
//   - at most MaxMoves replica moves in flight in the cluster (those
//     under way count), MaxMovesPerServer per source or target, and
//     MaxTransfers primary transfers per plan;
//   - hysteresis: the band itself (a server inside it is never a
//     source), one action per partition per plan, never back onto a
//     server the partition left recently (Snapshot.Left), and a primary
//     role that moved recently (Partition.Settling) moves no further,
//     unless it leaves a draining server.
//
// The master plans again after the moves of a plan finish; applying
// plans to the model until they come back empty converges within the
// band (the property test in balance_test.go checks it and every rule
// over seeded random clusters).
//
// # Concurrency
//
// Plan and Place read their arguments and return new values; Snapshot,
// Plan and Rate are plain values, not safe for concurrent mutation.
//
// # Example
//
//	snap := balance.Snapshot{Servers: servers, Partitions: parts}
//	plan := balance.Plan(snap, balance.Options{})
//	for _, a := range plan.Actions {
//		fmt.Println(a) // "move p7 (t/x#3) s1 -> s4: s1 replicas 30 above 20.7; s4 replicas 0 below 15.3"
//	}
package balance
