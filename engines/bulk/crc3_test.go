package bulk

import (
	"math/rand/v2"
	"testing"
)

// TestCRC3: the three interleaved CRCs are each buffer's CRC32C, at every
// length and alignment.
func TestCRC3(t *testing.T) {
	r := rand.New(rand.NewPCG(testSeed(t), 16))
	buf := make([]byte, 3*310+8)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	for n := 0; n <= 300; n++ {
		for align := 0; align < 8; align += 3 {
			a, b, c := buf[align:align+n], buf[310+align+1:310+align+1+n], buf[620+align+5:620+align+5+n]
			x, y, z := crc3(a, b, c)
			if x != crcOf(a) || y != crcOf(b) || z != crcOf(c) {
				t.Fatalf("length %d, alignment %d: crc3 differs from crc32", n, align)
			}
		}
	}
}
