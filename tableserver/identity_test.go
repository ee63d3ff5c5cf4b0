package tableserver

import (
	"errors"
	"testing"
)

func TestIdentityRoundTrip(t *testing.T) {
	dir := t.TempDir()
	if id, err := loadIdentity(dir); err != nil || id != "" {
		t.Fatalf("fresh dir: %q, %v", id, err)
	}
	if err := storeIdentity(dir, "srv-7"); err != nil {
		t.Fatal(err)
	}
	if id, err := loadIdentity(dir); err != nil || id != "srv-7" {
		t.Fatalf("got %q, %v", id, err)
	}
}

func TestIdentityCorruption(t *testing.T) {
	good := encodeIdentity("srv-1")
	for i := range good {
		b := append([]byte(nil), good...)
		b[i] ^= 0x04
		id, err := decodeIdentity(b)
		if err == nil && id != "srv-1" {
			t.Fatalf("flip at %d decoded to %q without error", i, id)
		}
		if err != nil && !errors.Is(err, ErrCorruptIdentity) {
			t.Fatalf("flip at %d: error %v is not ErrCorruptIdentity", i, err)
		}
	}
}

func FuzzDecodeIdentity(f *testing.F) {
	f.Add(encodeIdentity("srv-1"))
	f.Add([]byte("tabula-server-identity v2\nid=x\ncrc32c=00000000\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		id, err := decodeIdentity(b)
		if err != nil {
			if !errors.Is(err, ErrCorruptIdentity) {
				t.Fatalf("error %v is not ErrCorruptIdentity", err)
			}
			return
		}
		if string(encodeIdentity(id)) != string(b) && string(encodeIdentity(id)) != string(b)+"\n" {
			// Trailing newlines are trimmed; anything else must re-encode exactly.
			if _, err2 := decodeIdentity(encodeIdentity(id)); err2 != nil {
				t.Fatalf("re-encode of %q does not decode: %v", id, err2)
			}
		}
	})
}
