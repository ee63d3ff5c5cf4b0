package coproc

import (
	"bytes"
	"testing"
)

// FuzzValidate: Validate reads untrusted modules at deploy; no input may
// panic or allocate beyond its size.
func FuzzValidate(f *testing.F) {
	f.Add([]byte("\x00asm\x01\x00\x00\x00"))
	f.Add([]byte("\x00asm\x01\x00\x00\x00\x01\x04\x01\x60\x00\x00"))
	f.Add([]byte("\x00asm\x01\x00\x00\x00\x02\x0b\x01\x03env\x01x\x00\x00"))
	f.Add([]byte("\x00asm\x01\x00\x00\x00\x07\x05\x01\x01m\x02\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Validate(b)
		if err == nil && (m.ABI != 1 || len(m.Methods) == 0) {
			t.Fatalf("accepted without ABI or methods: %+v", m)
		}
	})
}

// FuzzIdemRecord: stored idempotency records are decoded on every retry;
// corruption is an error, never a panic, and records round-trip.
func FuzzIdemRecord(f *testing.F) {
	f.Add(encodeIdemRecord(idemRecord{module: "m", method: "add", output: []byte("out")}), "m", "add", []byte("x"))
	f.Add([]byte{1, 0, 0, 0, 0}, "", "", []byte(nil))
	f.Fuzz(func(t *testing.T, b []byte, module, method string, out []byte) {
		decodeIdemRecord(b)
		if len(module) > 0xffff || len(method) > 0xffff {
			return
		}
		r, err := decodeIdemRecord(encodeIdemRecord(idemRecord{module: module, method: method, output: out}))
		if err != nil {
			if bytes.IndexByte([]byte(module), 0) >= 0 {
				return
			}
			t.Fatal(err)
		}
		if r.module != module || r.method != method || !bytes.Equal(r.output, out) {
			t.Fatalf("round trip: %+v", r)
		}
	})
}

func TestIdemRecordCorruption(t *testing.T) {
	b := encodeIdemRecord(idemRecord{module: "m", method: "add", output: []byte("out")})
	for i := range b {
		c := bytes.Clone(b)
		c[i] ^= 0x10
		if _, err := decodeIdemRecord(c); err == nil {
			t.Errorf("flip at %d not detected", i)
		}
	}
}
