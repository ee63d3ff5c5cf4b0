//go:build wasip1

// Command hostile is a coprocessor that misbehaves on purpose, one way per
// method, to test that the runtime contains it: the call fails with a
// clear error, its staged writes are discarded, the instance is thrown
// away, and the server keeps serving.
package main

import (
	"os"
	"time"

	"github.com/tabuladb/tabula/coproc/guest"
)

var sink uint64

// spin loops forever without calling the host.
//
//go:wasmexport spin
func spin(n int32) int32 {
	for i := uint64(0); ; i++ {
		sink += i * 7
	}
}

// spin_host loops forever calling the host.
//
//go:wasmexport spin_host
func spinHost(n int32) int32 {
	return guest.Serve(n, func(c *guest.Call) error {
		for {
			sink += uint64(c.Now().UnixNano())
		}
	})
}

var hoard [][]byte

// membomb allocates until the memory cap stops it.
//
//go:wasmexport membomb
func membomb(n int32) int32 {
	for {
		b := make([]byte, 1<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		hoard = append(hoard, b)
	}
}

// bigout emits without end.
//
//go:wasmexport bigout
func bigout(n int32) int32 {
	return guest.Serve(n, func(c *guest.Call) error {
		chunk := make([]byte, 1<<20)
		for {
			if err := c.Emit(chunk); err != nil {
				return err
			}
		}
	})
}

//go:wasmimport tabula get
func rawGet(kp uint32, kl int32, op uint32, oc int32) int32

//go:wasmimport tabula emit
func rawEmit(p uint32, l int32) int32

// badptr passes the host a key pointer outside its memory.
//
//go:wasmexport badptr
func badptr(n int32) int32 {
	return rawGet(0xFFFFFF00, 1024, 0, 0)
}

// badlen emits a huge length from a valid pointer.
//
//go:wasmexport badlen
func badlen(n int32) int32 {
	return rawEmit(16, 0x7FFFFFFF)
}

// put_then_trap stages a write, then breaks the ABI: the write must not apply.
//
//go:wasmexport put_then_trap
func putThenTrap(n int32) int32 {
	guest.Serve(n, func(c *guest.Call) error { return c.Put([]byte("trap-key"), []byte("x")) })
	return rawGet(0xFFFFFF00, 1024, 0, 0)
}

// put_then_spin stages a write, then loops past its deadline.
//
//go:wasmexport put_then_spin
func putThenSpin(n int32) int32 {
	guest.Serve(n, func(c *guest.Call) error { return c.Put([]byte("spin-key"), []byte("x")) })
	return spin(n)
}

// panic panics in a handler: Serve turns it into status 2.
//
//go:wasmexport panic
func panicky(n int32) int32 {
	return guest.Serve(n, func(c *guest.Call) error { panic("boom") })
}

// exit exits the module as a Go program would on a fatal error.
//
//go:wasmexport exit
func exit(n int32) int32 {
	os.Stderr.WriteString("hostile: exiting\n")
	os.Exit(3)
	return 0
}

// sleep sleeps an hour: the host's virtual clock makes it instant.
//
//go:wasmexport sleep
func sleep(n int32) int32 {
	return guest.Serve(n, func(c *guest.Call) error {
		t0 := time.Now()
		time.Sleep(time.Hour)
		return c.Emit([]byte(time.Since(t0).String()))
	})
}

// logspam logs many lines; the host rate-limits them.
//
//go:wasmexport logspam
func logspam(n int32) int32 {
	return guest.Serve(n, func(c *guest.Call) error {
		for i := 0; i < 1000; i++ {
			c.Logf("spam %d", i)
			os.Stdout.WriteString("stdout spam\n")
		}
		return nil
	})
}

// ok answers, to show the module still serves after the others.
//
//go:wasmexport ok
func ok(n int32) int32 {
	return guest.Serve(n, func(c *guest.Call) error { return c.Emit([]byte("ok")) })
}

func main() {}
