package coproc_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tabuladb/tabula/coproc"
)

// A tiny WebAssembly binary writer for hand-made modules.

func leb(v uint32) []byte {
	var b []byte
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			b = append(b, c|0x80)
			continue
		}
		return append(b, c)
	}
}

func vecOf(items ...[]byte) []byte {
	b := leb(uint32(len(items)))
	for _, it := range items {
		b = append(b, it...)
	}
	return b
}

func name(s string) []byte { return append(leb(uint32(len(s))), s...) }

func section(id byte, body []byte) []byte {
	return append(append([]byte{id}, leb(uint32(len(body)))...), body...)
}

const (
	tI32 = 0x7f
)

type fn struct {
	name string
	typ  int
	body []byte // locals + code, without the size
}

// wasmModule builds a module with types (0: ()->(), 1: (i32)->(i32)),
// imports (module, name, type), memory of 1 page exported as "memory",
// and functions exported by name.
func wasmModule(imports [][3]string, funcs []fn) []byte {
	b := []byte("\x00asm\x01\x00\x00\x00")
	b = append(b, section(1, vecOf(
		[]byte{0x60, 0, 0},
		[]byte{0x60, 1, tI32, 1, tI32},
		[]byte{0x60, 2, tI32, tI32, 1, tI32},
	))...)
	var ims [][]byte
	for _, im := range imports {
		t := map[string]byte{"0": 0, "1": 1, "2": 2}[im[2]]
		ims = append(ims, append(append(name(im[0]), name(im[1])...), 0, t))
	}
	if len(ims) > 0 {
		b = append(b, section(2, vecOf(ims...))...)
	}
	var fs, codes, exps [][]byte
	for i, f := range funcs {
		fs = append(fs, leb(uint32(f.typ)))
		body := append([]byte{0}, f.body...) // no locals
		codes = append(codes, append(leb(uint32(len(body))), body...))
		exps = append(exps, append(append(name(f.name), 0), leb(uint32(len(imports)+i))...))
	}
	exps = append(exps, append(name("memory"), 2, 0))
	b = append(b, section(3, vecOf(fs...))...)
	b = append(b, section(5, vecOf([]byte{0, 1}))...)
	b = append(b, section(7, vecOf(exps...))...)
	b = append(b, section(10, vecOf(codes...))...)
	return b
}

var (
	abiFn     = fn{"tabula_abi_v1", 0, []byte{0x0b}}
	reserveFn = fn{"tabula_reserve", 1, []byte{0x41, 0x00, 0x0b}}                     // i32.const 0
	okFn      = fn{"ok", 1, []byte{0x41, 0x00, 0x0b}}                                 // return 0
	loopFn    = fn{"loop", 1, []byte{0x03, 0x40, 0x0c, 0x00, 0x0b, 0x41, 0x00, 0x0b}} // loop br 0 end; i32.const 0
)

func TestValidate(t *testing.T) {
	good := wasmModule(nil, []fn{abiFn, reserveFn, okFn, loopFn})
	man, err := coproc.Validate(good)
	if err != nil || !man.HasMethod("ok") || !man.HasMethod("loop") || man.Writes || man.ABI != 1 {
		t.Fatalf("good module: %+v %v", man, err)
	}
	for _, tc := range []struct {
		name string
		wasm []byte
		want error
		text string
	}{
		{"empty", nil, coproc.ErrInvalidModule, "bad magic"},
		{"garbage", []byte("not wasm at all"), coproc.ErrInvalidModule, "bad magic"},
		{"truncated", good[:len(good)-7], coproc.ErrInvalidModule, "truncated"},
		{"no abi export", wasmModule(nil, []fn{reserveFn, okFn}), coproc.ErrInvalidModule, "tabula_abi_v1"},
		{"no reserve", wasmModule(nil, []fn{abiFn, okFn}), coproc.ErrInvalidModule, "tabula_reserve"},
		{"no methods", wasmModule(nil, []fn{abiFn, reserveFn}), coproc.ErrInvalidModule, "no handler exports"},
		{"command", wasmModule(nil, []fn{abiFn, reserveFn, okFn, {"_start", 0, []byte{0x0b}}}), coproc.ErrInvalidModule, "_start"},
		{"orphan merge", wasmModule(nil, []fn{abiFn, reserveFn, okFn, {"x__merge", 1, []byte{0x41, 0, 0x0b}}}), coproc.ErrInvalidModule, "no method x"},
		{"env import", wasmModule([][3]string{{"env", "something", "0"}}, []fn{abiFn, reserveFn, okFn}), coproc.ErrImportNotAllowed, "env.something"},
		{"socket", wasmModule([][3]string{{"wasi_snapshot_preview1", "sock_accept", "2"}}, []fn{abiFn, reserveFn, okFn}), coproc.ErrImportNotAllowed, "sock_accept"},
		{"unknown host function", wasmModule([][3]string{{"tabula", "launch_missiles", "0"}}, []fn{abiFn, reserveFn, okFn}), coproc.ErrImportNotAllowed, "launch_missiles"},
		{"host signature", wasmModule([][3]string{{"tabula", "emit", "0"}}, []fn{abiFn, reserveFn, okFn}), coproc.ErrInvalidModule, "tabula.emit has signature ()->()"},
		{"oversized", append(good, make([]byte, coproc.DefaultMaxModuleBytes)...), coproc.ErrModuleTooLarge, ""},
	} {
		_, err := coproc.Validate(tc.wasm)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%s: got %v, want %v containing %q", tc.name, err, tc.want, tc.text)
		}
	}
}

func TestCompileAndCallRefusals(t *testing.T) {
	r := newRuntime(t, coproc.Options{MaxModuleBytes: 1 << 20, MaxInputBytes: 100})
	ctx := context.Background()
	k := key("tiny")
	// Structurally fine, but a function body that does not validate: only
	// Compile finds it.
	bad := wasmModule(nil, []fn{abiFn, reserveFn, {"ok", 1, []byte{0x0b}}})
	if _, err := coproc.Validate(bad); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Compile(ctx, k, bad); !errors.Is(err, coproc.ErrInvalidModule) {
		t.Fatalf("invalid body: %v", err)
	}
	if _, err := r.Compile(ctx, k, module(t, abiTest)); !errors.Is(err, coproc.ErrModuleTooLarge) {
		t.Fatalf("over MaxModuleBytes: %v", err)
	}
	if len(r.Keys()) != 0 {
		t.Fatalf("a refused compile registered %v", r.Keys())
	}
	good := wasmModule(nil, []fn{abiFn, reserveFn, okFn, loopFn})
	if _, err := r.Compile(ctx, k, good); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Compile(ctx, k, good); err != nil {
		t.Fatalf("same content again: %v", err)
	}
	other := wasmModule(nil, []fn{abiFn, reserveFn, okFn})
	if _, err := r.Compile(ctx, k, other); !errors.Is(err, coproc.ErrDigestMismatch) {
		t.Fatalf("other content under one version: %v", err)
	}
	p := primary(newEngine(t))
	if _, err := r.Call(ctx, k, "nope", coproc.CallRequest{Partition: p}); !errors.Is(err, coproc.ErrUnknownMethod) {
		t.Fatalf("unknown method: %v", err)
	}
	if _, err := r.Call(ctx, k, "tabula_reserve", coproc.CallRequest{Partition: p}); !errors.Is(err, coproc.ErrUnknownMethod) {
		t.Fatalf("ABI export as a method: %v", err)
	}
	if _, err := r.Call(ctx, k, "ok", coproc.CallRequest{Partition: p, Input: bytes.Repeat([]byte("x"), 101)}); !errors.Is(err, coproc.ErrInputTooLarge) {
		t.Fatalf("input over the limit: %v", err)
	}
	if _, err := r.Call(ctx, key("absent"), "ok", coproc.CallRequest{Partition: p}); !errors.Is(err, coproc.ErrModuleNotFound) {
		t.Fatalf("absent module: %v", err)
	}
	if res, err := r.Call(ctx, k, "ok", coproc.CallRequest{Partition: p}); err != nil || res.Status != 0 {
		t.Fatalf("ok: %v", err)
	}
	// A plain wasm loop (no Go runtime) is stopped at its deadline too.
	start := time.Now()
	if _, err := r.Call(ctx, k, "loop", coproc.CallRequest{Partition: p, Deadline: time.Now().Add(10 * time.Millisecond)}); !errors.Is(err, coproc.ErrDeadline) {
		t.Fatalf("loop: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("loop ran %v", d)
	}
	if err := r.Evict(ctx, k); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Call(ctx, k, "ok", coproc.CallRequest{Partition: p}); !errors.Is(err, coproc.ErrModuleNotFound) {
		t.Fatalf("after evict: %v", err)
	}
}
