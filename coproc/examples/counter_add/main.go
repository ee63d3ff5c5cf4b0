//go:build wasip1

// Command counter_add is a coprocessor that adds a delta to 8-byte
// little-endian signed counters: an atomic read-modify-write next to the
// data. Call "add" with the input delta (int64 LE, 8 bytes) on a key or a
// batch of keys; an absent counter counts as 0. It emits each new value
// (8 bytes per target key, in target order). A key listed twice is added
// twice: the second read sees the first write. Pass an idempotency token
// so that a retried call applies once.
package main

import (
	"encoding/binary"

	"github.com/tabuladb/tabula/coproc/guest"
)

//go:wasmexport add
func add(n int32) int32 { return guest.Serve(n, addHandler) }

func addHandler(c *guest.Call) error {
	in := c.Input()
	if len(in) != 8 {
		return guest.Failf(3, "counter_add: input is %d bytes, want an 8-byte delta", len(in))
	}
	delta := int64(binary.LittleEndian.Uint64(in))
	keys, err := c.Keys()
	if err != nil {
		return err
	}
	out := make([]byte, 0, 8*len(keys))
	for _, k := range keys {
		v, found, err := c.Get(k)
		if err != nil {
			return err
		}
		var cur int64
		if found {
			if len(v) != 8 {
				return guest.Failf(4, "counter_add: %q holds %d bytes, not a counter", k, len(v))
			}
			cur = int64(binary.LittleEndian.Uint64(v))
		}
		next := binary.LittleEndian.AppendUint64(nil, uint64(cur+delta))
		if err := c.Put(k, next); err != nil {
			return err
		}
		out = append(out, next...)
	}
	return c.Emit(out)
}

func main() {}
