// Package workload drives a key-value load against a table through the SDK
// and measures it: the engine of `tabula workload kv`.
//
// Each worker owns a seeded random source and two latency histograms, one
// for calls that succeeded and one for calls that failed: failures (often
// instant refusals) are counted by kind and kept out of ops/s and the
// latency quantiles, which would otherwise flatter a failing run. A
// reporter goroutine reads shared atomic counters once a second for the
// progress line. Run is safe to call concurrently with itself on
// different tables.
package workload
