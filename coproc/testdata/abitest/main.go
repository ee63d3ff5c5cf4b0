//go:build wasip1

// Command abitest exercises every host function for the coproc tests.
package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sort"

	"github.com/tabuladb/tabula/coproc/abi"
	"github.com/tabuladb/tabula/coproc/guest"
)

//go:wasmexport echo
func echo(n int32) int32 {
	return guest.Serve(n, func(c *guest.Call) error { return c.Emit(c.Input()) })
}

// info emits [request id, now ns, partition info, keys list, range list].
//
//go:wasmexport info
func info(n int32) int32 {
	return guest.Serve(n, func(c *guest.Call) error {
		p, err := c.Partition()
		if err != nil {
			return err
		}
		keys, err := c.Keys()
		if err != nil {
			return err
		}
		start, end, err := c.Range()
		if err != nil {
			return err
		}
		pi := abi.EncodePartitionInfo(p)
		return c.Emit(abi.AppendList(nil, [][]byte{
			[]byte(c.RequestID()),
			binary.LittleEndian.AppendUint64(nil, uint64(c.Now().UnixNano())),
			pi[:],
			abi.AppendList(nil, keys),
			abi.AppendList(nil, [][]byte{start, end}),
		}))
	})
}

// put stages the pairs of the input list (key, value, key, value...).
//
//go:wasmexport put
func put(n int32) int32 {
	return guest.Serve(n, func(c *guest.Call) error {
		items, err := abi.DecodeList(c.Input(), 0)
		if err != nil {
			return err
		}
		for i := 0; i+1 < len(items); i += 2 {
			if err := c.Put(items[i], items[i+1]); err != nil {
				return err
			}
		}
		return nil
	})
}

// get emits the value of the input key, or fails with status 9.
//
//go:wasmexport get
func get(n int32) int32 {
	return guest.Serve(n, func(c *guest.Call) error {
		v, ok, err := c.Get(c.Input())
		if err != nil {
			return err
		}
		if !ok {
			return guest.Failf(9, "absent")
		}
		return c.Emit(v)
	})
}

// getmulti emits the values of the input key list as a list.
//
//go:wasmexport getmulti
func getmulti(n int32) int32 {
	return guest.Serve(n, func(c *guest.Call) error {
		keys, err := abi.DecodeList(c.Input(), 0)
		if err != nil {
			return err
		}
		vs, err := c.GetMulti(keys)
		if err != nil {
			return err
		}
		return c.Emit(abi.AppendList(nil, vs))
	})
}

// scan emits the records of the input range (a 2-item list) as a list of
// alternating keys and values, sorted by key.
//
//go:wasmexport scan
func scan(n int32) int32 {
	return guest.Serve(n, func(c *guest.Call) error {
		r, err := abi.DecodeList(c.Input(), 2)
		if err != nil || len(r) != 2 {
			return guest.Failf(3, "bad range")
		}
		return c.Emit(scanSorted(c, r[0], r[1]))
	})
}

func scanSorted(c *guest.Call, start, end []byte) []byte {
	type kv struct{ k, v []byte }
	var recs []kv
	err := c.Scan(start, end, func(k, v []byte) error {
		recs = append(recs, kv{bytes.Clone(k), bytes.Clone(v)})
		return nil
	})
	if err != nil {
		panic(err)
	}
	sort.Slice(recs, func(i, j int) bool { return bytes.Compare(recs[i].k, recs[j].k) < 0 })
	var items [][]byte
	for _, r := range recs {
		items = append(items, r.k, r.v)
	}
	return abi.AppendList(nil, items)
}

// ryw checks read-your-writes inside one call and emits "ok" or fails.
//
//go:wasmexport ryw
func ryw(n int32) int32 {
	return guest.Serve(n, func(c *guest.Call) error {
		must := func(cond bool, what string) {
			if !cond {
				panic("ryw: " + what)
			}
		}
		a, b := []byte("ryw/a"), []byte("ryw/b")
		must(c.Put(a, []byte("1")) == nil, "put a")
		v, ok, _ := c.Get(a)
		must(ok && string(v) == "1", "get a after put")
		must(c.Put(b, []byte("2")) == nil, "put b")
		existed, _ := c.Delete(a)
		must(existed, "delete a existed")
		_, ok, _ = c.Get(a)
		must(!ok, "a absent after delete")
		sw, _ := c.CAS(b, true, []byte("2"), []byte("3"))
		must(sw, "cas b 2->3")
		sw, _ = c.CAS(b, true, []byte("2"), []byte("4"))
		must(!sw, "cas b 2->4 must fail")
		vs, _ := c.GetMulti([][]byte{a, b, []byte("ryw/c")})
		must(vs[0] == nil && string(vs[1]) == "3", "getmulti sees staged")
		// The call's target keys, if given, are [a, b, c].
		if keys, _ := c.Keys(); len(keys) == 3 {
			kv, err := c.GetKeys()
			must(err == nil && kv.Len() == 3, "get_keys")
			must(kv.At(0) == nil && string(kv.At(1)) == "3" && string(kv.At(2)) == "stored", "get_keys sees staged and stored")
		}
		// The scan sees staged b=3 and the stored ryw/c (if any), not a.
		return c.Emit(scanSorted(c, []byte("ryw/"), []byte("ryw0")))
	})
}

// put_then_fail stages a write and fails: nothing must apply.
//
//go:wasmexport put_then_fail
func putThenFail(n int32) int32 {
	return guest.Serve(n, func(c *guest.Call) error {
		if err := c.Put([]byte("fail-key"), []byte("x")); err != nil {
			return err
		}
		return guest.Failf(7, "changed my mind")
	})
}

// reserved tries the reserved namespace and emits what the host said.
//
//go:wasmexport reserved
func reserved(n int32) int32 {
	return guest.Serve(n, func(c *guest.Call) error {
		k := []byte(abi.IdempotencyPrefix + "x")
		_, _, gerr := c.Get(k)
		perr := c.Put(k, []byte("evil"))
		return c.Emit([]byte(fmt.Sprintf("%v|%v", gerr, perr)))
	})
}

// tryput tries one write and emits the error (for read-only replicas and merges).
//
//go:wasmexport tryput
func tryput(n int32) int32 {
	return guest.Serve(n, func(c *guest.Call) error {
		return c.Emit([]byte(fmt.Sprint(c.Put([]byte("k"), []byte("v")))))
	})
}

// tryput__merge tries data functions in a merge and emits the errors, then the partials.
//
//go:wasmexport tryput__merge
func tryputMerge(n int32) int32 {
	return guest.ServeMerge(n, func(c *guest.Call, partials [][]byte) error {
		_, _, gerr := c.Get([]byte("k"))
		perr := c.Put([]byte("k"), []byte("v"))
		c.Emit([]byte(fmt.Sprintf("%v|%v|%d", gerr, perr, len(partials))))
		return nil
	})
}

func main() {}

var seq uint64

// seq emits an instance-local counter: it reveals which instance served.
//
//go:wasmexport seq
func seqHandler(n int32) int32 {
	return guest.Serve(n, func(c *guest.Call) error {
		seq++
		return c.Emit(binary.LittleEndian.AppendUint64(nil, seq))
	})
}
