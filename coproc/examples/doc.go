// Package examples holds example coprocessors, each a package main built
// for GOOS=wasip1 GOARCH=wasm with -buildmode=c-shared (their files carry
// the wasip1 build tag, so the host's go build, vet and test skip them):
//
//   - counter_add: atomic read-modify-write of 8-byte counters, made
//     exactly-once by the caller's idempotency token.
//   - score_candidates: dot product of a weight vector with feature vectors
//     fetched by one batch get, local top-k per partition, merged top-k.
//   - filter_scan: a predicate and a projection over a key range.
//   - hostile: misbehaving handlers (infinite loop, memory bomb, huge
//     output, bad pointers...) that the runtime must contain.
//
// coproc/coproctest builds them; the coproc tests run each against a real
// engine.
package examples
