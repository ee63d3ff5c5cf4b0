//go:build wasip1

// Command bench is the module the coproc benchmarks call: handlers that do
// as little as possible, so that a call's time is the platform's.
package main

import "github.com/tabuladb/tabula/coproc/guest"

// nop returns at once, without the guest SDK: the platform's cost of a
// call.
//
//go:wasmexport nop
func nop(n int32) int32 { return 0 }

// input takes its input through the guest SDK and does nothing with it.
//
//go:wasmexport input
func input(n int32) int32 {
	return guest.Serve(n, func(c *guest.Call) error {
		_ = c.Input()
		return nil
	})
}

// batch reads the call's target keys with one batch get (GetKeys) and
// fails with status 3 unless its first and last keys are present. It does not walk the
// values: that is user code (a Go guest pays ~0.3 µs per loop iteration
// under the runtime's termination checks).
//
//go:wasmexport batch
func batch(n int32) int32 {
	return guest.Serve(n, func(c *guest.Call) error {
		vs, err := c.GetKeys()
		if err != nil {
			return err
		}
		if n := vs.Len(); n == 0 || vs.At(0) == nil || vs.At(n-1) == nil {
			return guest.Failf(3, "the first or last of %d keys is absent", n)
		}
		return nil
	})
}

// batch_multi is batch through the general GetMulti: the keys fetched,
// decoded, encoded again and the values decoded and copied.
//
//go:wasmexport batch_multi
func batchMulti(n int32) int32 {
	return guest.Serve(n, func(c *guest.Call) error {
		keys, err := c.Keys()
		if err != nil {
			return err
		}
		vs, err := c.GetMulti(keys)
		if err != nil {
			return err
		}
		if len(vs) != len(keys) {
			return guest.Failf(3, "%d values for %d keys", len(vs), len(keys))
		}
		return nil
	})
}

// keys_only returns at once through the guest SDK: the baseline of batch.
//
//go:wasmexport keys_only
func keysOnly(n int32) int32 {
	return guest.Serve(n, func(c *guest.Call) error { return nil })
}
func main() {}
