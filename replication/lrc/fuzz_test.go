package lrc

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzReconstruct loses the shards in mask from a stripe of the fuzzer's
// bytes and checks that Reconstruct either restores every byte or returns
// ErrUndecodable, exactly when the paper's check says so, leaving the
// shards untouched.
func FuzzReconstruct(f *testing.F) {
	c, err := New(Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte("hello, erasure coding"), uint16(1))
	f.Add(bytes.Repeat([]byte{0xA5}, 300), uint16(0b0000_0011_0000_0011)) // 2+2 in both groups
	f.Add(bytes.Repeat([]byte{0x5A}, 123), uint16(0b0100_0000_0000_0011)) // x0, x1, global 0
	f.Add(bytes.Repeat([]byte{0xFF}, 64), uint16(0b0001_0000_0000_0111))  // x0..x2 + local 0
	f.Add([]byte{1, 2, 3}, uint16(0xFFFF))
	f.Fuzz(func(t *testing.T, data []byte, mask uint16) {
		if len(data) == 0 {
			return
		}
		orig, err := c.Split(data)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Encode(orig); err != nil {
			t.Fatal(err)
		}
		s := cloneShards(orig)
		var lost []int
		for i := range c.n {
			if mask&(1<<i) != 0 {
				lost = append(lost, i)
				s[i] = nil
			}
		}
		err = c.Reconstruct(s)
		if c.Decodable(lost) {
			if err != nil {
				t.Fatalf("lost %v: decodable, got %v", lost, err)
			}
			for i := range s {
				if !bytes.Equal(s[i], orig[i]) {
					t.Fatalf("lost %v: shard %d wrong", lost, i)
				}
			}
			var out bytes.Buffer
			if err := c.Join(&out, s, len(data)); err != nil || !bytes.Equal(out.Bytes(), data) {
				t.Fatalf("lost %v: Join: %v", lost, err)
			}
			return
		}
		if !errors.Is(err, ErrUndecodable) {
			t.Fatalf("lost %v: undecodable, got %v", lost, err)
		}
		for _, i := range lost {
			if s[i] != nil {
				t.Fatalf("lost %v: shard %d filled", lost, i)
			}
		}
	})
}
