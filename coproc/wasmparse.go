package coproc

import (
	"errors"
	"fmt"
	"strings"
)

// A minimal reader of the WebAssembly binary format (core spec §5), enough
// to list a module's imports and exports with their signatures before any
// compilation. It reads the header and the type (1), import (2), function
// (3), memory (5) and export (7) sections, and skips the others by their
// declared sizes. Every length is checked against the bytes left, so a
// hostile module cannot make it allocate more than its own size.

const (
	kindFunc   = 0
	kindTable  = 1
	kindMemory = 2
	kindGlobal = 3
	kindTag    = 4
)

type wasmImport struct {
	module, name string
	kind         byte
	sig          string // for functions
}

type wasmExport struct {
	name string
	kind byte
	sig  string // for functions
}

type wasmModule struct {
	imports []wasmImport
	exports []wasmExport
	memMin  uint32
}

var errTruncated = errors.New("truncated")

type wasmReader struct {
	b   []byte
	off int
}

func (r *wasmReader) byte() (byte, error) {
	if r.off >= len(r.b) {
		return 0, errTruncated
	}
	c := r.b[r.off]
	r.off++
	return c, nil
}

func (r *wasmReader) u32() (uint32, error) {
	var v uint64
	for shift := uint(0); shift < 35; shift += 7 {
		c, err := r.byte()
		if err != nil {
			return 0, err
		}
		v |= uint64(c&0x7f) << shift
		if c&0x80 == 0 {
			if v > 0xFFFFFFFF {
				return 0, errors.New("LEB128 u32 overflows")
			}
			return uint32(v), nil
		}
	}
	return 0, errors.New("LEB128 u32 too long")
}

func (r *wasmReader) bytes(n uint32) ([]byte, error) {
	if uint64(n) > uint64(len(r.b)-r.off) {
		return nil, errTruncated
	}
	b := r.b[r.off : r.off+int(n)]
	r.off += int(n)
	return b, nil
}

func (r *wasmReader) name() (string, error) {
	n, err := r.u32()
	if err != nil {
		return "", err
	}
	b, err := r.bytes(n)
	return string(b), err
}

// count reads a vector length, refusing one that cannot fit in the bytes
// left (every element takes at least min bytes).
func (r *wasmReader) count(min int) (int, error) {
	n, err := r.u32()
	if err != nil {
		return 0, err
	}
	if uint64(n)*uint64(min) > uint64(len(r.b)-r.off) {
		return 0, fmt.Errorf("vector of %d elements does not fit in %d bytes", n, len(r.b)-r.off)
	}
	return int(n), nil
}

func valType(c byte) (string, error) {
	switch c {
	case 0x7f:
		return "i32", nil
	case 0x7e:
		return "i64", nil
	case 0x7d:
		return "f32", nil
	case 0x7c:
		return "f64", nil
	case 0x7b:
		return "v128", nil
	case 0x70:
		return "funcref", nil
	case 0x6f:
		return "externref", nil
	}
	return "", fmt.Errorf("unknown value type 0x%02x", c)
}

func (r *wasmReader) valTypes() (string, error) {
	n, err := r.count(1)
	if err != nil {
		return "", err
	}
	parts := make([]string, n)
	for i := range parts {
		c, err := r.byte()
		if err != nil {
			return "", err
		}
		if parts[i], err = valType(c); err != nil {
			return "", err
		}
	}
	return "(" + strings.Join(parts, ",") + ")", nil
}

func (r *wasmReader) limits() (min uint32, err error) {
	flag, err := r.byte()
	if err != nil {
		return 0, err
	}
	if flag > 3 {
		return 0, fmt.Errorf("unknown limits flag 0x%02x", flag)
	}
	if min, err = r.u32(); err != nil {
		return 0, err
	}
	if flag&1 != 0 {
		if _, err = r.u32(); err != nil {
			return 0, err
		}
	}
	return min, nil
}

func parseModule(b []byte) (*wasmModule, error) {
	if len(b) < 8 || string(b[:4]) != "\x00asm" {
		return nil, errors.New("not a WebAssembly module (bad magic)")
	}
	if b[4] != 1 || b[5] != 0 || b[6] != 0 || b[7] != 0 {
		return nil, fmt.Errorf("unsupported WebAssembly binary version %x", b[4:8])
	}
	var (
		m        wasmModule
		types    []string
		funcSigs []string // imported functions first, then defined ones
		exports  []struct {
			name string
			kind byte
			idx  uint32
		}
		lastID byte
	)
	r := &wasmReader{b: b, off: 8}
	for r.off < len(b) {
		id, err := r.byte()
		if err != nil {
			return nil, err
		}
		size, err := r.u32()
		if err != nil {
			return nil, fmt.Errorf("section %d: %w", id, err)
		}
		body, err := r.bytes(size)
		if err != nil {
			return nil, fmt.Errorf("section %d of %d bytes: %w", id, size, err)
		}
		if id != 0 {
			// Known sections appear at most once, in order (data count, 12,
			// sits between import-ish and code; only check strictly for ours).
			if id <= 7 && id <= lastID && lastID <= 7 {
				return nil, fmt.Errorf("section %d out of order or repeated", id)
			}
			lastID = id
		}
		s := &wasmReader{b: body}
		switch id {
		case 1: // type
			n, err := s.count(3)
			if err != nil {
				return nil, fmt.Errorf("type section: %w", err)
			}
			types = make([]string, 0, n)
			for i := 0; i < n; i++ {
				form, err := s.byte()
				if err != nil {
					return nil, fmt.Errorf("type %d: %w", i, err)
				}
				if form != 0x60 {
					return nil, fmt.Errorf("type %d: form 0x%02x is not a function type", i, form)
				}
				params, err := s.valTypes()
				if err != nil {
					return nil, fmt.Errorf("type %d params: %w", i, err)
				}
				results, err := s.valTypes()
				if err != nil {
					return nil, fmt.Errorf("type %d results: %w", i, err)
				}
				types = append(types, params+"->"+results)
			}
		case 2: // import
			n, err := s.count(4)
			if err != nil {
				return nil, fmt.Errorf("import section: %w", err)
			}
			for i := 0; i < n; i++ {
				var im wasmImport
				if im.module, err = s.name(); err != nil {
					return nil, fmt.Errorf("import %d: %w", i, err)
				}
				if im.name, err = s.name(); err != nil {
					return nil, fmt.Errorf("import %d: %w", i, err)
				}
				if im.kind, err = s.byte(); err != nil {
					return nil, fmt.Errorf("import %d: %w", i, err)
				}
				switch im.kind {
				case kindFunc:
					ti, err := s.u32()
					if err != nil {
						return nil, fmt.Errorf("import %s.%s: %w", im.module, im.name, err)
					}
					if int(ti) >= len(types) {
						return nil, fmt.Errorf("import %s.%s: type index %d out of range", im.module, im.name, ti)
					}
					im.sig = types[ti]
					funcSigs = append(funcSigs, im.sig)
				case kindTable:
					if _, err := s.byte(); err != nil {
						return nil, err
					}
					if _, err := s.limits(); err != nil {
						return nil, fmt.Errorf("import %s.%s: %w", im.module, im.name, err)
					}
				case kindMemory:
					if _, err := s.limits(); err != nil {
						return nil, fmt.Errorf("import %s.%s: %w", im.module, im.name, err)
					}
				case kindGlobal:
					if _, err := s.bytes(2); err != nil {
						return nil, fmt.Errorf("import %s.%s: %w", im.module, im.name, err)
					}
				default:
					return nil, fmt.Errorf("import %s.%s: unsupported kind %d", im.module, im.name, im.kind)
				}
				m.imports = append(m.imports, im)
			}
		case 3: // function
			n, err := s.count(1)
			if err != nil {
				return nil, fmt.Errorf("function section: %w", err)
			}
			for i := 0; i < n; i++ {
				ti, err := s.u32()
				if err != nil {
					return nil, fmt.Errorf("function %d: %w", i, err)
				}
				if int(ti) >= len(types) {
					return nil, fmt.Errorf("function %d: type index %d out of range", i, ti)
				}
				funcSigs = append(funcSigs, types[ti])
			}
		case 5: // memory
			n, err := s.count(1)
			if err != nil {
				return nil, fmt.Errorf("memory section: %w", err)
			}
			for i := 0; i < n; i++ {
				min, err := s.limits()
				if err != nil {
					return nil, fmt.Errorf("memory %d: %w", i, err)
				}
				if i == 0 {
					m.memMin = min
				}
			}
		case 7: // export
			n, err := s.count(3)
			if err != nil {
				return nil, fmt.Errorf("export section: %w", err)
			}
			for i := 0; i < n; i++ {
				name, err := s.name()
				if err != nil {
					return nil, fmt.Errorf("export %d: %w", i, err)
				}
				kind, err := s.byte()
				if err != nil {
					return nil, fmt.Errorf("export %q: %w", name, err)
				}
				idx, err := s.u32()
				if err != nil {
					return nil, fmt.Errorf("export %q: %w", name, err)
				}
				exports = append(exports, struct {
					name string
					kind byte
					idx  uint32
				}{name, kind, idx})
			}
		default:
			continue
		}
		if s.off != len(s.b) {
			return nil, fmt.Errorf("section %d: %d trailing bytes", id, len(s.b)-s.off)
		}
	}
	seen := make(map[string]bool, len(exports))
	for _, e := range exports {
		if seen[e.name] {
			return nil, fmt.Errorf("duplicate export %q", e.name)
		}
		seen[e.name] = true
		ex := wasmExport{name: e.name, kind: e.kind}
		if e.kind == kindFunc {
			if int(e.idx) >= len(funcSigs) {
				return nil, fmt.Errorf("export %q: function index %d out of range", e.name, e.idx)
			}
			ex.sig = funcSigs[e.idx]
		}
		m.exports = append(m.exports, ex)
	}
	return &m, nil
}
