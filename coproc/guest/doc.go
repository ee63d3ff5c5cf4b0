// Package guest is the Go SDK for writing Tabula coprocessors: WebAssembly
// modules that run next to a table's data. It hides ABI v1
// (coproc/ABI.md): the input buffer, the host imports, the encodings and
// the status codes.
//
// A coprocessor is a package main built as a WASI reactor:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o counter.wasm ./counter
//
// Every handler is an export of signature (input length int32) -> status
// int32 that passes its argument to Serve; a method's optional merge (run at
// the coordinator of a scatter-gather call over the partials) is the export
// "<method>__merge" and calls ServeMerge:
//
//	//go:wasmexport add
//	func add(n int32) int32 { return guest.Serve(n, addHandler) }
//
//	func addHandler(c *guest.Call) error {
//		keys, err := c.Keys()
//		...
//		v, found, err := c.Get(keys[0])
//		...
//		return c.Put(keys[0], next)
//	}
//
//	func main() {}
//
// Writes (Put, Delete, CAS) are staged: the call sees them (read your
// writes) and they commit as one atomic write when the handler returns nil;
// an error, a panic or a trap discards them. Time (Now, time.Now) and
// randomness are deterministic per call; os.Stdout and os.Stderr go to the
// server's rate-limited log; there is no file system and no network.
//
// A Call is only valid during its handler; slices it returns belong to the
// caller unless documented otherwise. Guests are single-threaded: one call
// at a time per instance.
//
// The package only builds for GOOS=wasip1 GOARCH=wasm (this file excepted,
// so that it documents itself everywhere).
package guest
