// Package workload drives a key-value load against a table through the SDK
// and measures it: the engine of `tabula workload kv`.
//
// Each worker owns a seeded random source and a latency histogram; a
// reporter goroutine reads shared atomic counters once a second for the
// progress line. Run is safe to call concurrently with itself on different
// tables.
package workload
