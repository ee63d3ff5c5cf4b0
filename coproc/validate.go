package coproc

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/tabuladb/tabula/coproc/abi"
)

// Manifest is what Validate found in a module.
type Manifest struct {
	// Digest is the sha256 of the module bytes: the content address.
	Digest [32]byte
	// Size is the module's length in bytes.
	Size int
	// ABI is the ABI version the module declares (1).
	ABI int
	// Methods are the exported handlers, sorted.
	Methods []string
	// Merges are the methods that also export "<method>__merge", sorted.
	Merges []string
	// Imports are the imported functions as "module.name", sorted.
	Imports []string
	// Writes reports that the module imports put, delete or cas, so its
	// calls must be routed to the primary.
	Writes bool
	// MinMemoryPages is the memory the module declares at instantiation.
	MinMemoryPages uint32
}

// DigestHex is the digest in hex.
func (m Manifest) DigestHex() string { return hex.EncodeToString(m.Digest[:]) }

// HasMethod reports whether the module exports method.
func (m Manifest) HasMethod(method string) bool {
	_, ok := slices.BinarySearch(m.Methods, method)
	return ok
}

// HasMerge reports whether the module exports method's merge.
func (m Manifest) HasMerge(method string) bool {
	_, ok := slices.BinarySearch(m.Merges, method)
	return ok
}

// DefaultMaxModuleBytes is Options.MaxModuleBytes's default and Validate's limit.
const DefaultMaxModuleBytes = 32 << 20

// Validate checks that wasm is an ABI v1 module: the wasm header and the
// type, import, function, memory and export sections decode; the ABI
// exports are present with their signatures; every import is granted; and
// it is at most DefaultMaxModuleBytes. It does not validate function bodies:
// Runtime.Compile does, at deploy. Pure; safe for concurrent use.
func Validate(wasm []byte) (Manifest, error) { return validate(wasm, DefaultMaxModuleBytes) }

// Method names: what a handler export may be called. Reserved: the ABI's own
// exports, _initialize/_start, and the merge suffix.
const maxMethodLen = 128

func validMethodName(name string) bool {
	if name == "" || len(name) > maxMethodLen || strings.HasPrefix(name, "tabula_") || strings.HasPrefix(name, "_") {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// allowedWASI are the WASI preview 1 functions a module may import. The
// host grants no preopened directory, no environment, no arguments and no
// sockets, so the file-system functions (which Go's os package links)
// fail with EBADF/ENOENT; clocks and randomness are deterministic per call;
// stdout and stderr go to the rate-limited log. sock_* are refused.
var allowedWASI = map[string]bool{
	"args_get": true, "args_sizes_get": true, "environ_get": true, "environ_sizes_get": true,
	"clock_res_get": true, "clock_time_get": true, "proc_exit": true, "random_get": true,
	"sched_yield": true, "poll_oneoff": true,
	"fd_advise": true, "fd_allocate": true, "fd_close": true, "fd_datasync": true,
	"fd_fdstat_get": true, "fd_fdstat_set_flags": true, "fd_fdstat_set_rights": true,
	"fd_filestat_get": true, "fd_filestat_set_size": true, "fd_filestat_set_times": true,
	"fd_pread": true, "fd_prestat_get": true, "fd_prestat_dir_name": true, "fd_pwrite": true,
	"fd_read": true, "fd_readdir": true, "fd_renumber": true, "fd_seek": true, "fd_sync": true,
	"fd_tell": true, "fd_write": true,
	"path_create_directory": true, "path_filestat_get": true, "path_filestat_set_times": true,
	"path_link": true, "path_open": true, "path_readlink": true, "path_remove_directory": true,
	"path_rename": true, "path_symlink": true, "path_unlink_file": true,
}

func validate(wasm []byte, maxBytes int) (Manifest, error) {
	m := Manifest{Digest: sha256.Sum256(wasm), Size: len(wasm)}
	if len(wasm) > maxBytes {
		return m, fmt.Errorf("%w: %d bytes, limit %d", ErrModuleTooLarge, len(wasm), maxBytes)
	}
	mod, err := parseModule(wasm)
	if err != nil {
		return m, fmt.Errorf("%w: %w", ErrInvalidModule, err)
	}
	m.MinMemoryPages = mod.memMin
	for _, im := range mod.imports {
		name := im.module + "." + im.name
		m.Imports = append(m.Imports, name)
		switch im.module {
		case abi.HostModule:
			hf, ok := hostFuncByName[im.name]
			if !ok {
				return m, fmt.Errorf("%w: %s (the host has no such function)", ErrImportNotAllowed, name)
			}
			if im.sig != hf.sig() {
				return m, fmt.Errorf("%w: %s has signature %s, want %s", ErrInvalidModule, name, im.sig, hf.sig())
			}
			if hf.writes {
				m.Writes = true
			}
		case abi.WASIModule:
			if !allowedWASI[im.name] {
				return m, fmt.Errorf("%w: %s", ErrImportNotAllowed, name)
			}
		default:
			return m, fmt.Errorf("%w: %s (modules may import only %q and %q)", ErrImportNotAllowed, name, abi.HostModule, abi.WASIModule)
		}
		if im.kind != kindFunc {
			return m, fmt.Errorf("%w: %s is not a function import", ErrImportNotAllowed, name)
		}
	}
	slices.Sort(m.Imports)

	sigOf := map[string]string{}
	hasMemory := false
	for _, ex := range mod.exports {
		switch ex.kind {
		case kindFunc:
			sigOf[ex.name] = ex.sig
		case kindMemory:
			if ex.name == "memory" {
				hasMemory = true
			}
		}
	}
	if _, ok := sigOf["_start"]; ok {
		return m, fmt.Errorf("%w: module exports _start (a command); build a reactor (go build -buildmode=c-shared)", ErrInvalidModule)
	}
	abiSig, ok := sigOf[abi.ABIExport]
	if !ok {
		return m, fmt.Errorf("%w: no %s export (not an ABI v1 module)", ErrInvalidModule, abi.ABIExport)
	}
	if abiSig != "()->()" {
		return m, fmt.Errorf("%w: %s has signature %s, want ()->()", ErrInvalidModule, abi.ABIExport, abiSig)
	}
	m.ABI = 1
	if s, ok := sigOf[abi.ReserveExport]; !ok {
		return m, fmt.Errorf("%w: no %s export", ErrInvalidModule, abi.ReserveExport)
	} else if s != "(i32)->(i32)" {
		return m, fmt.Errorf("%w: %s has signature %s, want (i32)->(i32)", ErrInvalidModule, abi.ReserveExport, s)
	}
	if !hasMemory {
		return m, fmt.Errorf("%w: no exported memory named \"memory\"", ErrInvalidModule)
	}
	if s, ok := sigOf["_initialize"]; ok && s != "()->()" {
		return m, fmt.Errorf("%w: _initialize has signature %s, want ()->()", ErrInvalidModule, s)
	}
	var merges []string
	for name, s := range sigOf {
		if s != handlerSig || name == abi.ReserveExport {
			continue
		}
		if base, ok := strings.CutSuffix(name, abi.MergeSuffix); ok {
			merges = append(merges, base)
			continue
		}
		if validMethodName(name) {
			m.Methods = append(m.Methods, name)
		}
	}
	slices.Sort(m.Methods)
	for _, base := range merges {
		if !m.HasMethod(base) {
			return m, fmt.Errorf("%w: merge export %s%s has no method %s", ErrInvalidModule, base, abi.MergeSuffix, base)
		}
		m.Merges = append(m.Merges, base)
	}
	slices.Sort(m.Merges)
	if len(m.Methods) == 0 {
		return m, fmt.Errorf("%w: no handler exports (functions of signature %s)", ErrInvalidModule, handlerSig)
	}
	return m, nil
}

// handlerSig is a method's and a merge's signature: (input length) -> status.
const handlerSig = "(i32)->(i32)"
