// Package coproc runs coprocessors: WebAssembly modules that a table's
// owner deploys and that run next to the table's data, on
// github.com/tetratelabs/wazero.
//
// A table server holds one Runtime. At deploy it calls Compile with the
// module's key (tenant, table, name, version): the module is validated
// (ABI v1 exports, allowed imports, size; see Validate and ABI.md),
// compiled to machine code (kept in Options.CacheDir across restarts) and
// instantiated once. A request then calls Call with a Partition, the
// server's view of one partition's engine: one guest call per request and
// partition, whatever the number of keys. A batch request is split by
// partition by the coordinator and called on each partition in parallel; a
// range or scatter-gather request calls every partition and Merge combines
// the outputs with the module's "<method>__merge" export (or concatenates
// them when the module has none).
//
// # Isolation and limits
//
//   - Instances are pooled per ModuleKey (Options.PoolSize each, at most
//     Options.MaxWaiters calls waiting, then ErrBusy): never shared between
//     tenants, tables, modules or versions.
//   - Every call has a deadline (CallRequest.Deadline, the context's, or
//     Options.DefaultTimeout); wazero closes the module when it passes, and
//     compiled loops check for that on every back-edge, so a runaway guest
//     is stopped within milliseconds.
//   - At most Options.MaxConcurrency guests execute at once (default
//     GOMAXPROCS-1): Go cannot preempt guest code for its 10 ms time slice,
//     so one P always stays free for the server's own goroutines.
//   - Memory is capped per instance (Options.MemoryLimitPages); input,
//     output, staged writes and keys are bounded.
//   - An instance that traps, times out, runs out of memory or breaks the
//     ABI is closed and never reused; a replacement is instantiated in the
//     background.
//   - WASI is filtered: no files, no network, no environment; clocks and
//     randomness are deterministic per call; stdout and stderr go to the
//     rate-limited, labelled log.
//
// # Writes
//
// put, delete and cas are staged in the call (the call reads its own
// writes) and committed by one Partition.Commit iff the handler returns 0
// without trapping, together with an idempotency record when the request
// has a token (see ABI.md for the reserved key namespace and TTL).
// Commit is optimistic: it applies only if every key the call read is
// unchanged, and Call runs the guest again on ErrConflict.
//
// # Concurrency
//
// A Runtime is safe for concurrent use; Close is idempotent. An
// EnginePartition is safe for concurrent use.
//
// # Example
//
//	rt, err := coproc.New(ctx, coproc.Options{CacheDir: dir})
//	key := coproc.ModuleKey{Tenant: "acme", Table: "counters", Name: "counter_add", Version: 1}
//	man, err := rt.Compile(ctx, key, wasm) // at deploy
//	part := coproc.PartitionFromEngine(engine, coproc.PartitionInfo{Primary: true}, nil)
//	res, err := rt.Call(ctx, key, "add", coproc.CallRequest{
//		Partition: part, Input: delta, Keys: [][]byte{[]byte("visits")},
//		RequestID: "r1", IdempotencyToken: "client-token-1",
//	})
//
// The guest side is package coproc/guest; examples are in coproc/examples
// and coproc/coproctest builds them.
package coproc
