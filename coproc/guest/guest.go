//go:build wasip1

package guest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/tabuladb/tabula/coproc/abi"
)

// The host imports of ABI v1.

//go:wasmimport tabula get
func hostGet(kp unsafe.Pointer, kl int32, op unsafe.Pointer, oc int32) int32

//go:wasmimport tabula get_multi
func hostGetMulti(lp unsafe.Pointer, ll int32, op unsafe.Pointer, oc int32) int32

//go:wasmimport tabula scan_open
func hostScanOpen(rp unsafe.Pointer, rl int32) int32

//go:wasmimport tabula scan_next
func hostScanNext(h int32, op unsafe.Pointer, oc int32) int32

//go:wasmimport tabula scan_close
func hostScanClose(h int32) int32

//go:wasmimport tabula put
func hostPut(kp unsafe.Pointer, kl int32, vp unsafe.Pointer, vl int32, expiresAt int64) int32

//go:wasmimport tabula delete
func hostDelete(kp unsafe.Pointer, kl int32) int32

//go:wasmimport tabula cas
func hostCAS(kp unsafe.Pointer, kl int32, flags int32, ep unsafe.Pointer, el int32, np unsafe.Pointer, nl int32, expiresAt int64) int32

//go:wasmimport tabula emit
func hostEmit(p unsafe.Pointer, l int32) int32

//go:wasmimport tabula set_error
func hostSetError(p unsafe.Pointer, l int32) int32

//go:wasmimport tabula log
func hostLog(level int32, p unsafe.Pointer, l int32) int32

//go:wasmimport tabula now
func hostNow() int64

//go:wasmimport tabula request_id
func hostRequestID(op unsafe.Pointer, oc int32) int32

//go:wasmimport tabula partition_info
func hostPartitionInfo(op unsafe.Pointer, oc int32) int32

//go:wasmimport tabula keys
func hostKeys(op unsafe.Pointer, oc int32) int32

//go:wasmimport tabula get_keys
func hostGetKeys(op unsafe.Pointer, oc int32) int32

//go:wasmimport tabula range
func hostRange(op unsafe.Pointer, oc int32) int32

//go:wasmimport tabula result
func hostResult(op unsafe.Pointer, oc int32) int32

// The exports of ABI v1.

//go:wasmexport tabula_abi_v1
func abiV1() {}

// input is the buffer the host writes a call's input into.
var input []byte

//go:wasmexport tabula_reserve
func reserve(n int32) unsafe.Pointer {
	if n < 0 {
		n = 0
	}
	if int(n) > cap(input) {
		input = make([]byte, n)
	}
	input = input[:n]
	return ptr(input)
}

func ptr(b []byte) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(b)) }

// Errors the host reports; test them with errors.Is.
var (
	ErrReadOnly    = errors.New("guest: read-only (not the primary, or in a merge)")
	ErrReservedKey = errors.New("guest: key is in the reserved namespace")
	ErrTooLarge    = errors.New("guest: too large")
	ErrNoPartition = errors.New("guest: no partition (in a merge)")
	ErrInvalid     = errors.New("guest: invalid argument")
)

func codeErr(code int32) error {
	switch code {
	case abi.CodeReadOnly:
		return ErrReadOnly
	case abi.CodeReservedKey:
		return ErrReservedKey
	case abi.CodeTooLarge:
		return ErrTooLarge
	case abi.CodeNoPartition:
		return ErrNoPartition
	}
	return fmt.Errorf("%w: host %s", ErrInvalid, abi.CodeText(code))
}

// Error is a handler failure with a status; returning one from a handler
// makes the call fail with that status and message. Other errors fail with
// status 1.
type Error struct {
	Status  int32
	Message string
}

func (e *Error) Error() string { return e.Message }

// Failf returns an *Error with status and a formatted message.
func Failf(status int32, format string, args ...any) error {
	return &Error{Status: status, Message: fmt.Sprintf(format, args...)}
}

// Call is one invocation. It is only valid during its handler.
type Call struct {
	in      []byte
	scratch []byte
	batch   []byte // GetKeys's buffer
}

// call is reused: guests serve one call at a time.
var call = &Call{scratch: make([]byte, 64<<10)}

// Serve runs h as the handler of one call. A method's export passes its
// argument (the input length) and returns Serve's result. h's error (or
// panic) becomes the call's status and message, and the staged writes are
// discarded.
func Serve(n int32, h func(c *Call) error) (status int32) {
	// No helper calls on the way in: every Go call costs a guest ~0.1 µs
	// under the runtime's termination checks.
	defer recoverStatus(&status)
	c := call
	c.in = input[:n]
	if err := h(c); err != nil {
		return errStatus(err)
	}
	return 0
}

// recoverStatus turns a handler's panic into status 2 and its message.
func recoverStatus(status *int32) {
	if p := recover(); p != nil {
		setError(fmt.Sprintf("panic: %v", p))
		*status = 2
	}
}

// ServeMerge runs h as a merge: partials are the per-partition outputs of
// the method, in partition order; what h emits is the merged result.
func ServeMerge(n int32, h func(c *Call, partials [][]byte) error) int32 {
	c := call
	c.in = input[:n]
	partials, err := abi.DecodeList(c.in, 0)
	if err != nil {
		return finish(func() error { return err })
	}
	return finish(func() error { return h(c, partials) })
}

func finish(f func() error) (status int32) {
	defer recoverStatus(&status)
	if err := f(); err != nil {
		return errStatus(err)
	}
	return 0
}

// errStatus reports a handler's error to the host and returns its status.
func errStatus(err error) int32 {
	var ge *Error
	if errors.As(err, &ge) && ge.Status != 0 {
		setError(ge.Message)
		return ge.Status
	}
	setError(err.Error())
	return 1
}

func setError(msg string) {
	b := []byte(msg)
	hostSetError(ptr(b), int32(len(b)))
}

// fetch completes a call that returned n result bytes into c.scratch.
func (c *Call) fetch(n int32) ([]byte, error) {
	if n < 0 {
		return nil, codeErr(n)
	}
	if int(n) <= len(c.scratch) {
		return c.scratch[:n], nil
	}
	c.scratch = make([]byte, n)
	if m := hostResult(ptr(c.scratch), n); m != n {
		return nil, fmt.Errorf("%w: result returned %d, want %d", ErrInvalid, m, n)
	}
	return c.scratch[:n], nil
}

func (c *Call) out() (unsafe.Pointer, int32) { return ptr(c.scratch), int32(len(c.scratch)) }

// Input is the call's input. It aliases a buffer the next call reuses.
func (c *Call) Input() []byte { return c.in }

// Keys are the call's target keys on this partition (the key of a point
// call, this partition's share of a batch call).
func (c *Call) Keys() ([][]byte, error) {
	op, oc := c.out()
	b, err := c.fetch(hostKeys(op, oc))
	if err != nil {
		return nil, err
	}
	return abi.DecodeList(clone(b), 0)
}

// Range is the call's target range [start, end); nil is unbounded.
func (c *Call) Range() (start, end []byte, err error) {
	op, oc := c.out()
	b, err := c.fetch(hostRange(op, oc))
	if err != nil {
		return nil, nil, err
	}
	items, err := abi.DecodeList(clone(b), 2)
	if err != nil || len(items) != 2 {
		return nil, nil, fmt.Errorf("%w: range: %v", ErrInvalid, err)
	}
	return items[0], items[1], nil
}

// Get returns key's value (the call's own staged write if it made one).
func (c *Call) Get(key []byte) (value []byte, found bool, err error) {
	op, oc := c.out()
	n := hostGet(ptr(key), int32(len(key)), op, oc)
	if n == abi.CodeNotFound {
		return nil, false, nil
	}
	b, err := c.fetch(n)
	if err != nil {
		return nil, false, err
	}
	return clone(b), true, nil
}

// GetMulti looks keys up with one host call; values[i] is nil when keys[i]
// is absent.
func (c *Call) GetMulti(keys [][]byte) (values [][]byte, err error) {
	req := abi.AppendList(nil, keys)
	op, oc := c.out()
	b, err := c.fetch(hostGetMulti(ptr(req), int32(len(req)), op, oc))
	if err != nil {
		return nil, err
	}
	return abi.DecodeList(clone(b), 0)
}

// Values is a batch read's result: Len values, in the order of the keys
// read. It aliases a buffer of the call that the next GetKeys reuses: copy
// a value that must outlive it.
type Values struct{ x abi.Indexed }

// Len is the number of values.
func (v Values) Len() int { return v.x.Len() }

// At is the i-th value; nil when that key is absent.
func (v Values) At(i int) []byte {
	b, _ := v.x.At(i)
	return b
}

// GetKeys reads the values of the call's target keys (Keys, in that order)
// with one host call and one engine batch read, through the call's staged
// writes. It copies nothing and walks nothing: the fastest way to read a
// batch call's keys.
func (c *Call) GetKeys() (Values, error) {
	if c.batch == nil {
		c.batch = make([]byte, 64<<10)
	}
	n := hostGetKeys(ptr(c.batch), int32(len(c.batch)))
	if n < 0 {
		return Values{}, codeErr(n)
	}
	if int(n) > len(c.batch) {
		c.batch = make([]byte, n)
		if m := hostResult(ptr(c.batch), n); m != n {
			return Values{}, fmt.Errorf("%w: result returned %d, want %d", ErrInvalid, m, n)
		}
	}
	x, err := abi.ParseIndexed(c.batch[:n])
	if err != nil {
		return Values{}, err
	}
	return Values{x}, nil
}

// Scan calls fn for every record of the partition with start <= key < end
// (nil: unbounded), with the call's staged writes applied. On point and
// bulk tables the order is the engine's, not the keys'. key and value are
// only valid during fn. fn's error stops the scan and is returned.
func (c *Call) Scan(start, end []byte, fn func(key, value []byte) error) error {
	rng := abi.AppendList(nil, [][]byte{start, end})
	h := hostScanOpen(ptr(rng), int32(len(rng)))
	if h < 0 {
		return codeErr(h)
	}
	defer hostScanClose(h)
	buf := make([]byte, 64<<10)
	for {
		n := hostScanNext(h, ptr(buf), int32(len(buf)))
		if n == 0 {
			return nil
		}
		if n < 0 {
			return codeErr(n)
		}
		if int(n) > len(buf) {
			buf = make([]byte, n)
			if m := hostResult(ptr(buf), n); m != n {
				return fmt.Errorf("%w: result returned %d, want %d", ErrInvalid, m, n)
			}
		}
		items, err := abi.DecodeList(buf[:n], 0)
		if err != nil {
			return err
		}
		for i := 0; i+1 < len(items); i += 2 {
			if err := fn(items[i], items[i+1]); err != nil {
				return err
			}
		}
	}
}

// Put stages key = value.
func (c *Call) Put(key, value []byte) error { return c.PutExpiring(key, value, 0) }

// PutExpiring stages key = value expiring at expiresAt (Unix milliseconds;
// 0: never).
func (c *Call) PutExpiring(key, value []byte, expiresAt int64) error {
	if code := hostPut(ptr(key), int32(len(key)), ptr(value), int32(len(value)), expiresAt); code < 0 {
		return codeErr(code)
	}
	return nil
}

// Delete stages the removal of key and reports whether it existed.
func (c *Call) Delete(key []byte) (existed bool, err error) {
	code := hostDelete(ptr(key), int32(len(key)))
	if code < 0 {
		return false, codeErr(code)
	}
	return code == 1, nil
}

// CAS stages key = newValue if key's current state (with the call's staged
// writes) is: absent when !expectExists, else present with exactly
// expected. It reports whether it swapped.
func (c *Call) CAS(key []byte, expectExists bool, expected, newValue []byte) (swapped bool, err error) {
	var flags int32
	if expectExists {
		flags |= abi.CASExpectExists
	}
	return casResult(hostCAS(ptr(key), int32(len(key)), flags, ptr(expected), int32(len(expected)), ptr(newValue), int32(len(newValue)), 0))
}

// CASDelete stages the removal of key if it exists with exactly expected.
func (c *Call) CASDelete(key, expected []byte) (swapped bool, err error) {
	flags := int32(abi.CASExpectExists | abi.CASDelete)
	return casResult(hostCAS(ptr(key), int32(len(key)), flags, ptr(expected), int32(len(expected)), nil, 0, 0))
}

func casResult(code int32) (bool, error) {
	if code < 0 {
		return false, codeErr(code)
	}
	return code == 1, nil
}

// Emit appends b to the call's output. Past the host's output limit the
// call is stopped.
func (c *Call) Emit(b []byte) error {
	if code := hostEmit(ptr(b), int32(len(b))); code < 0 {
		return codeErr(code)
	}
	return nil
}

// Log levels.
const (
	LevelDebug = abi.LogDebug
	LevelInfo  = abi.LogInfo
	LevelWarn  = abi.LogWarn
	LevelError = abi.LogError
)

// Log writes msg to the server's log at level, labelled with the module and
// the request; the host rate-limits it.
func (c *Call) Log(level int32, msg string) {
	b := []byte(msg)
	hostLog(level, ptr(b), int32(len(b)))
}

// Logf is Log at LevelInfo with a format.
func (c *Call) Logf(format string, args ...any) { c.Log(LevelInfo, fmt.Sprintf(format, args...)) }

// Now is the request's time, fixed for the call.
func (c *Call) Now() time.Time { return time.Unix(0, hostNow()) }

// RequestID identifies the client request.
func (c *Call) RequestID() string {
	op, oc := c.out()
	b, err := c.fetch(hostRequestID(op, oc))
	if err != nil {
		return ""
	}
	return string(b)
}

// Partition describes the partition the call runs on.
func (c *Call) Partition() (abi.PartitionInfo, error) {
	op, oc := c.out()
	b, err := c.fetch(hostPartitionInfo(op, oc))
	if err != nil {
		return abi.PartitionInfo{}, err
	}
	return abi.DecodePartitionInfo(b)
}

func clone(b []byte) []byte { return append(make([]byte, 0, len(b)), b...) }

// Uint64 and PutUint64 are the little-endian helpers examples share.
func Uint64(b []byte) uint64 { return binary.LittleEndian.Uint64(b) }

// AppendUint64 appends v little-endian.
func AppendUint64(b []byte, v uint64) []byte { return binary.LittleEndian.AppendUint64(b, v) }
