package auth

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

func TestCredentialFileRoundTrip(t *testing.T) {
	c := Credential{Principal: "acme", KeyID: 2, Key: NewKey()}
	got, err := ParseCredential(MarshalCredential(c))
	if err != nil || got.Principal != c.Principal || got.KeyID != c.KeyID || !bytes.Equal(got.Key, c.Key) {
		t.Fatalf("round trip = %+v, %v", got, err)
	}
	b := MarshalCredential(c)
	b[len(b)-20] ^= 1 // a flipped key character
	if _, err := ParseCredential(b); !errors.Is(err, ErrBadKeyFile) {
		t.Fatalf("damaged file parsed: %v", err)
	}
}

func TestLoadOrCreateClusterCredentialKeepsTheFirst(t *testing.T) {
	path := filepath.Join(t.TempDir(), "k", "cluster.key")
	a, made, err := LoadOrCreateClusterCredential(path)
	if err != nil || !made {
		t.Fatalf("create: %v %v", made, err)
	}
	b, made, err := LoadOrCreateClusterCredential(path)
	if err != nil || made || !bytes.Equal(a.Key, b.Key) {
		t.Fatalf("second load made=%v err=%v same=%v", made, err, bytes.Equal(a.Key, b.Key))
	}
}

func TestReplayCache(t *testing.T) {
	now := time.Now().UnixMilli()
	c := newReplayCache(4)
	sig := func(i byte) []byte { return bytes.Repeat([]byte{i}, 32) }
	if err := c.add(sig(1), now, now); err != nil {
		t.Fatal(err)
	}
	if err := c.add(sig(1), now, now); err == nil {
		t.Fatal("replay accepted")
	}
	// Fill past capacity with older minutes: the oldest go, and their
	// timestamps are refused from then on (no replay slips through).
	for i := byte(2); i < 8; i++ {
		if err := c.add(sig(i), now-int64(10-i)*minuteMs, now); err != nil {
			t.Fatalf("add %d: %v", i, err)
		}
	}
	if err := c.add(sig(2), now-8*minuteMs, now); err == nil {
		t.Fatal("a forgotten signature's timestamp was accepted again")
	}
}

func FuzzParseCredential(f *testing.F) {
	f.Add(MarshalCredential(Credential{Principal: ClusterPrincipal, Key: make([]byte, KeyBytes)}))
	f.Add([]byte("tabula-credential 1 a 1 x 00000000"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseCredential(b)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("parsed an invalid credential: %v", err)
		}
		again, err := ParseCredential(MarshalCredential(c))
		if err != nil || !bytes.Equal(again.Key, c.Key) {
			t.Fatalf("re-encode: %v", err)
		}
	})
}
