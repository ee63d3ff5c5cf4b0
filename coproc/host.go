package coproc

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/tabuladb/tabula/coproc/abi"
)

// The host functions of the tabula module, stack-based (api.GoModuleFunc:
// no reflection, no allocation to pass arguments). Each reads its
// arguments from stack and writes its result to stack[0]. A function that
// returns bytes takes (out_ptr, out_cap) and returns the result's length
// n: when n <= out_cap the bytes are in the guest's buffer, otherwise the
// host keeps them and the guest fetches them with result() into a buffer
// of at least n bytes. Negative results are abi.Code* values.
//
// Guest memory is read through api.Memory.Read, which checks bounds; an
// out-of-bounds pointer stops the call with ErrGuestFault (the instance is
// discarded), it never reaches host memory.

type hostFunc struct {
	name    string
	params  []api.ValueType
	results []api.ValueType
	writes  bool
	fn      func(st *callState, mem api.Memory, stack []uint64)
}

func (h hostFunc) sig() string {
	names := func(ts []api.ValueType) string {
		s := make([]string, len(ts))
		for i, t := range ts {
			s[i] = api.ValueTypeName(t)
		}
		return "(" + strings.Join(s, ",") + ")"
	}
	return names(h.params) + "->" + names(h.results)
}

var (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

func types(ts ...api.ValueType) []api.ValueType { return ts }

var hostFuncs = []hostFunc{
	{name: "get", params: types(i32, i32, i32, i32), results: types(i32), fn: hostGet},
	{name: "get_multi", params: types(i32, i32, i32, i32), results: types(i32), fn: hostGetMulti},
	{name: "scan_open", params: types(i32, i32), results: types(i32), fn: hostScanOpen},
	{name: "scan_next", params: types(i32, i32, i32), results: types(i32), fn: hostScanNext},
	{name: "scan_close", params: types(i32), results: types(i32), fn: hostScanClose},
	{name: "put", params: types(i32, i32, i32, i32, i64), results: types(i32), writes: true, fn: hostPut},
	{name: "delete", params: types(i32, i32), results: types(i32), writes: true, fn: hostDelete},
	{name: "cas", params: types(i32, i32, i32, i32, i32, i32, i32, i64), results: types(i32), writes: true, fn: hostCAS},
	{name: "emit", params: types(i32, i32), results: types(i32), fn: hostEmit},
	{name: "set_error", params: types(i32, i32), results: types(i32), fn: hostSetError},
	{name: "log", params: types(i32, i32, i32), results: types(i32), fn: hostLog},
	{name: "now", params: types(), results: types(i64), fn: hostNow},
	{name: "request_id", params: types(i32, i32), results: types(i32), fn: hostRequestID},
	{name: "partition_info", params: types(i32, i32), results: types(i32), fn: hostPartitionInfo},
	{name: "keys", params: types(i32, i32), results: types(i32), fn: hostKeys},
	{name: "get_keys", params: types(i32, i32), results: types(i32), fn: hostGetKeys},
	{name: "range", params: types(i32, i32), results: types(i32), fn: hostRange},
	{name: "result", params: types(i32, i32), results: types(i32), fn: hostResult},
}

var hostFuncByName = func() map[string]hostFunc {
	m := make(map[string]hostFunc, len(hostFuncs))
	for _, h := range hostFuncs {
		m[h.name] = h
	}
	return m
}()

func instantiateHost(ctx context.Context, r wazero.Runtime) error {
	b := r.NewHostModuleBuilder(abi.HostModule)
	for _, h := range hostFuncs {
		fn := h.fn
		name := h.name
		b.NewFunctionBuilder().
			WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, mod api.Module, stack []uint64) {
				st := stateOf(ctx)
				if st == nil {
					// Called outside a call (from _initialize): nothing to serve.
					panic(fmt.Errorf("%w: %s called outside a call", ErrGuestFault, name))
				}
				fn(st, mod.Memory(), stack)
			}), h.params, h.results).
			WithName(h.name).
			Export(h.name)
	}
	_, err := b.Instantiate(ctx)
	return err
}

// fault stops the call: the guest broke the ABI.
func (st *callState) fault(format string, args ...any) {
	st.abort = fmt.Errorf("%w: "+format, append([]any{ErrGuestFault}, args...)...)
	panic(st.abort)
}

// stop stops the call with err (a limit or a storage failure).
func (st *callState) stop(err error) {
	st.abort = err
	panic(err)
}

// read returns a view of guest memory [ptr, ptr+n); it is only valid until
// the guest runs again (copy what is kept).
func (st *callState) read(mem api.Memory, ptr, n uint64, what string) []byte {
	b, ok := mem.Read(uint32(ptr), uint32(n))
	if !ok {
		st.fault("%s: [%#x, +%d) is outside guest memory (%d bytes)", what, uint32(ptr), uint32(n), mem.Size())
	}
	return b
}

func (st *callState) readKey(mem api.Memory, ptr, n uint64) ([]byte, int32) {
	if int(uint32(n)) > st.rt.opts.MaxKeyBytes {
		return nil, abi.CodeTooLarge
	}
	k := st.read(mem, ptr, n, "key")
	if isReserved(k) {
		return nil, abi.CodeReservedKey
	}
	return k, 0
}

// reply hands result bytes to the guest per the (out_ptr, out_cap) rule.
func (st *callState) reply(mem api.Memory, stack []uint64, outPtr, outCap uint64, b []byte) {
	if uint64(len(b)) > uint64(outCap&0xFFFFFFFF) {
		st.pending = append(st.pending[:0], b...)
	} else if len(b) > 0 && !mem.Write(uint32(outPtr), b) {
		st.fault("result buffer [%#x, +%d) is outside guest memory", uint32(outPtr), len(b))
	}
	stack[0] = uint64(uint32(len(b)))
}

func ret(stack []uint64, code int32) { stack[0] = uint64(uint32(code)) }

func (st *callState) storageErr(op string, err error) {
	st.stop(fmt.Errorf("coproc: partition %s: %w", op, err))
}

// observe records key's state as read from the partition (not from the
// staged writes) for the commit check.
func (st *callState) observe(key, value []byte, found bool) {
	if !st.trackRead {
		return
	}
	if _, ok := st.reads[string(key)]; ok {
		return
	}
	if st.reads == nil {
		st.reads = make(map[string]Read)
	}
	k := string(key)
	st.reads[k] = Read{Key: []byte(k), Existed: found, Value: bytes.Clone(value)}
}

// lookup reads key through the staged writes.
func (st *callState) lookup(key []byte) ([]byte, bool) {
	if w, ok := st.staged[string(key)]; ok {
		return w.value, !w.del
	}
	v, found, err := st.part.Get(key)
	if err != nil {
		st.storageErr("get", err)
	}
	st.observe(key, v, found)
	return v, found
}

func hostGet(st *callState, mem api.Memory, stack []uint64) {
	if st.part == nil {
		ret(stack, abi.CodeNoPartition)
		return
	}
	key, code := st.readKey(mem, stack[0], stack[1])
	if code != 0 {
		ret(stack, code)
		return
	}
	v, found := st.lookup(key)
	if !found {
		ret(stack, abi.CodeNotFound)
		return
	}
	st.reply(mem, stack, stack[2], stack[3], v)
}

// maxMultiKeys bounds one get_multi.
const maxMultiKeys = 1 << 16

func hostGetMulti(st *callState, mem api.Memory, stack []uint64) {
	if st.part == nil {
		ret(stack, abi.CodeNoPartition)
		return
	}
	keys, err := abi.DecodeList(st.read(mem, stack[0], stack[1], "key list"), maxMultiKeys)
	if err != nil {
		ret(stack, abi.CodeInvalid)
		return
	}
	for _, k := range keys {
		if k == nil || len(k) > st.rt.opts.MaxKeyBytes {
			ret(stack, abi.CodeInvalid)
			return
		}
		if isReserved(k) {
			ret(stack, abi.CodeReservedKey)
			return
		}
	}
	// keys alias guest memory, which the host functions do not change
	// while this one runs; getBatch copies what it keeps.
	values := st.getBatch(keys)
	st.scratch = abi.AppendList(st.scratch[:0], values)
	st.reply(mem, stack, stack[2], stack[3], st.scratch)
}

// hostGetKeys reads the values of the call's target keys with one engine
// batch read and returns them in the indexed encoding, written straight
// into the guest's buffer when they fit.
func hostGetKeys(st *callState, mem api.Memory, stack []uint64) {
	if st.part == nil {
		ret(stack, abi.CodeNoPartition)
		return
	}
	values := st.getBatch(st.keys)
	size := abi.IndexedSize(values)
	outPtr, outCap := uint32(stack[0]), uint32(stack[1])
	if uint64(size) > uint64(outCap) {
		st.pending = slices.Grow(st.pending[:0], size)[:size]
		abi.PutIndexed(st.pending, values)
	} else if size > 0 {
		buf, ok := mem.Read(outPtr, uint32(size))
		if !ok {
			st.fault("result buffer [%#x, +%d) is outside guest memory", outPtr, size)
		}
		abi.PutIndexed(buf, values)
	}
	stack[0] = uint64(uint32(size))
}

// getBatch reads keys (valid, not reserved) through the staged writes, the
// rest with one engine batch read; values[i] is nil when keys[i] is absent.
func (st *callState) getBatch(keys [][]byte) [][]byte {
	miss := keys
	var values [][]byte // with staged writes: the result, misses filled in below
	var at []int        // at[j]: the index in keys of miss[j] (nil: j itself)
	if len(st.staged) > 0 {
		values, miss = make([][]byte, len(keys)), nil
		for i, k := range keys {
			if w, ok := st.staged[string(k)]; ok {
				if !w.del {
					values[i] = w.value
				}
				continue
			}
			miss, at = append(miss, k), append(at, i)
		}
		if len(miss) == 0 {
			return values
		}
	}
	vs, found, err := st.part.GetBatch(miss)
	if err != nil {
		st.storageErr("get batch", err)
	}
	for j, k := range miss {
		st.observe(k, vs[j], found[j])
		switch {
		case !found[j]:
			vs[j] = nil
		case vs[j] == nil:
			vs[j] = []byte{}
		}
		if values != nil {
			values[at[j]] = vs[j]
		}
	}
	if values != nil {
		return values
	}
	return vs
}

// maxScans bounds the scans a call keeps open.
const maxScans = 64

func hostScanOpen(st *callState, mem api.Memory, stack []uint64) {
	if st.part == nil {
		ret(stack, abi.CodeNoPartition)
		return
	}
	items, err := abi.DecodeList(st.read(mem, stack[0], stack[1], "scan range"), 2)
	if err != nil || len(items) != 2 || len(st.scans) >= maxScans {
		ret(stack, abi.CodeInvalid)
		return
	}
	r := KeyRange{Start: bytes.Clone(items[0]), End: bytes.Clone(items[1])}
	if st.scans == nil {
		st.scans = make(map[int32]*scanIter)
	}
	st.nextScan++
	st.scans[st.nextScan] = st.openScan(r)
	ret(stack, st.nextScan)
}

func hostScanNext(st *callState, mem api.Memory, stack []uint64) {
	it, ok := st.scans[int32(uint32(stack[0]))]
	if !ok {
		ret(stack, abi.CodeBadHandle)
		return
	}
	outCap := int(uint32(stack[2]))
	buf := append(st.scratch[:0], 0, 0, 0, 0)
	n := 0
	for {
		k, v, ok, err := it.nextRecord()
		if err != nil {
			st.storageErr("scan", err)
		}
		if !ok {
			break
		}
		size := abi.ListItemSize(k) + abi.ListItemSize(v)
		if n > 0 && len(buf)+size > outCap {
			it.unread(k, v)
			break
		}
		buf = abi.AppendListItem(abi.AppendListItem(buf, k), v)
		n += 2
		if len(buf) >= outCap {
			break
		}
	}
	st.scratch = buf
	if n == 0 {
		ret(stack, 0)
		return
	}
	binary.LittleEndian.PutUint32(buf, uint32(n))
	st.reply(mem, stack, stack[1], stack[2], buf)
}

func hostScanClose(st *callState, _ api.Memory, stack []uint64) {
	h := int32(uint32(stack[0]))
	it, ok := st.scans[h]
	if !ok {
		ret(stack, abi.CodeBadHandle)
		return
	}
	it.stop()
	delete(st.scans, h)
	ret(stack, 0)
}

// stage records a write of key (copied) after checking the limits.
func (st *callState) stage(key []byte, w stagedWrite) int32 {
	if st.part == nil {
		return abi.CodeReadOnly
	}
	if !st.info.Primary {
		return abi.CodeReadOnly
	}
	old, exists := st.staged[string(key)]
	add := len(w.value)
	if !exists {
		add += len(key)
	} else {
		add -= len(old.value)
	}
	if !exists && len(st.order) >= st.rt.opts.MaxWrites || st.stagedBytes+add > st.rt.opts.MaxWriteBytes {
		st.stop(fmt.Errorf("%w: more than %d writes or %d bytes", ErrWritesTooLarge, st.rt.opts.MaxWrites, st.rt.opts.MaxWriteBytes))
	}
	st.stagedBytes += add
	w.value = bytes.Clone(w.value)
	if w.value == nil && !w.del {
		w.value = []byte{}
	}
	if st.staged == nil {
		st.staged = make(map[string]*stagedWrite)
	}
	if exists {
		*old = w
	} else {
		k := string(key)
		st.staged[k] = &w
		st.order = append(st.order, k)
	}
	return 0
}

func hostPut(st *callState, mem api.Memory, stack []uint64) {
	key, code := st.readKey(mem, stack[0], stack[1])
	if code != 0 {
		ret(stack, code)
		return
	}
	v := st.read(mem, stack[2], stack[3], "value")
	ret(stack, st.stage(key, stagedWrite{value: v, expiresAt: int64(stack[4])}))
}

func hostDelete(st *callState, mem api.Memory, stack []uint64) {
	if st.part == nil || !st.info.Primary {
		ret(stack, abi.CodeReadOnly)
		return
	}
	key, code := st.readKey(mem, stack[0], stack[1])
	if code != 0 {
		ret(stack, code)
		return
	}
	_, existed := st.lookup(key)
	if code := st.stage(key, stagedWrite{del: true}); code != 0 {
		ret(stack, code)
		return
	}
	if existed {
		ret(stack, 1)
	} else {
		ret(stack, 0)
	}
}

func hostCAS(st *callState, mem api.Memory, stack []uint64) {
	if st.part == nil || !st.info.Primary {
		ret(stack, abi.CodeReadOnly)
		return
	}
	key, code := st.readKey(mem, stack[0], stack[1])
	if code != 0 {
		ret(stack, code)
		return
	}
	flags := uint32(stack[2])
	if flags&^uint32(abi.CASExpectExists|abi.CASDelete) != 0 {
		ret(stack, abi.CodeInvalid)
		return
	}
	expected := st.read(mem, stack[3], stack[4], "cas expected value")
	newValue := st.read(mem, stack[5], stack[6], "cas new value")
	cur, exists := st.lookup(key)
	wantExists := flags&abi.CASExpectExists != 0
	if exists != wantExists || (exists && !bytes.Equal(cur, expected)) {
		ret(stack, 0)
		return
	}
	w := stagedWrite{value: newValue, expiresAt: int64(stack[7])}
	if flags&abi.CASDelete != 0 {
		w = stagedWrite{del: true}
	}
	if code := st.stage(key, w); code != 0 {
		ret(stack, code)
		return
	}
	ret(stack, 1)
}

func hostEmit(st *callState, mem api.Memory, stack []uint64) {
	b := st.read(mem, stack[0], stack[1], "emit")
	if len(st.out)+len(b) > st.rt.opts.MaxOutputBytes {
		st.stop(fmt.Errorf("%w: more than %d bytes", ErrOutputTooLarge, st.rt.opts.MaxOutputBytes))
	}
	st.out = append(st.out, b...)
	ret(stack, 0)
}

// maxErrorMessage bounds set_error's message.
const maxErrorMessage = 4096

func hostSetError(st *callState, mem api.Memory, stack []uint64) {
	b := st.read(mem, stack[0], stack[1], "error message")
	if len(b) > maxErrorMessage {
		b = b[:maxErrorMessage]
	}
	st.errMsg = string(b)
	ret(stack, 0)
}

func hostLog(st *callState, mem api.Memory, stack []uint64) {
	level := slog.Level(int32(uint32(stack[0])))
	b := st.read(mem, stack[1], stack[2], "log message")
	if len(b) > maxLogLine {
		b = b[:maxLogLine]
	}
	st.m.logs.log(level, "log", st, string(b))
	ret(stack, 0)
}

func hostNow(st *callState, _ api.Memory, stack []uint64) {
	stack[0] = uint64(st.now.UnixNano())
}

func hostRequestID(st *callState, mem api.Memory, stack []uint64) {
	st.reply(mem, stack, stack[0], stack[1], []byte(st.requestID))
}

func hostPartitionInfo(st *callState, mem api.Memory, stack []uint64) {
	if st.part == nil {
		ret(stack, abi.CodeNoPartition)
		return
	}
	b := abi.EncodePartitionInfo(st.info)
	st.reply(mem, stack, stack[0], stack[1], b[:])
}

func hostKeys(st *callState, mem api.Memory, stack []uint64) {
	st.scratch = abi.AppendList(st.scratch[:0], st.keys)
	st.reply(mem, stack, stack[0], stack[1], st.scratch)
}

func hostRange(st *callState, mem api.Memory, stack []uint64) {
	st.scratch = abi.AppendList(st.scratch[:0], [][]byte{st.rng.Start, st.rng.End})
	st.reply(mem, stack, stack[0], stack[1], st.scratch)
}

func hostResult(st *callState, mem api.Memory, stack []uint64) {
	if st.pending == nil {
		ret(stack, abi.CodeInvalid)
		return
	}
	n := len(st.pending)
	if uint64(n) > uint64(uint32(stack[1])) {
		ret(stack, int32(n))
		return
	}
	if n > 0 && !mem.Write(uint32(stack[0]), st.pending) {
		st.fault("result buffer [%#x, +%d) is outside guest memory", uint32(stack[0]), n)
	}
	st.pending = st.pending[:0]
	st.pending = nil
	ret(stack, int32(n))
}
