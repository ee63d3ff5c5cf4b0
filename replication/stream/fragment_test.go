package stream

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/vfs"
)

func putBytes(s *FragmentStore, extent uint64, index int, data []byte) error {
	return s.Put(extent, index, int64(len(data)), crc32c(data), func(write func([]byte) error) error {
		for len(data) > 0 { // in uneven pieces, as a stream delivers them
			n := min(len(data), 1000+len(data)/3)
			if err := write(data[:n]); err != nil {
				return err
			}
			data = data[n:]
		}
		return nil
	})
}

func randBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

func TestFragmentStoreRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 0))
	fs := vfs.NewMem()
	s, err := OpenFragmentStore(fs, "/frags")
	if err != nil {
		t.Fatal(err)
	}
	sizes := []int{1, FragmentChunk - 1, FragmentChunk, 3*FragmentChunk + 17}
	data := map[int][]byte{}
	for i, n := range sizes {
		data[i] = randBytes(rng, n)
		if err := putBytes(s, 9, i, data[i]); err != nil {
			t.Fatal(err)
		}
	}
	// A put whose bytes do not match its CRC is refused and leaves nothing.
	bad := randBytes(rng, 100)
	if err := s.Put(9, 15, 100, crc32c(bad)+1, func(w func([]byte) error) error { return w(bad) }); !errors.Is(err, engines.ErrCorrupt) {
		t.Fatalf("bad crc put: %v", err)
	}
	check := func(s *FragmentStore) {
		t.Helper()
		for i, d := range data {
			for range 20 {
				off := rng.Int64N(int64(len(d)))
				n := rng.Int64N(int64(len(d)) - off + 1)
				got, err := s.Read(9, i, off, n)
				if err != nil || !bytes.Equal(got, d[off:off+n]) {
					t.Fatalf("fragment %d read [%d,+%d): %v", i, off, n, err)
				}
			}
			if err := s.Scrub(9, i); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.Read(9, 0, 0, 2); !errors.Is(err, ErrBadRange) {
			t.Fatalf("read past the end: %v", err)
		}
		if _, err := s.Read(9, 15, 0, 1); !errors.Is(err, ErrNoExtent) {
			t.Fatalf("refused put is readable: %v", err)
		}
		if got := len(s.List()); got != len(sizes) {
			t.Fatalf("%d fragments listed", got)
		}
	}
	check(s)
	s.Close()
	fs.Crash() // everything was acknowledged: it survives
	s, err = OpenFragmentStore(fs, "/frags")
	if err != nil {
		t.Fatal(err)
	}
	check(s)
	if err := s.Delete(9, 0); err != nil {
		t.Fatal(err)
	}
	fs.Crash()
	s, _ = OpenFragmentStore(fs, "/frags")
	if len(s.List()) != len(sizes)-1 {
		t.Fatal("delete not durable")
	}
}

// TestFragmentBitFlip flips every tenth bit of a fragment file (header,
// payload, table): the fragment is never served with wrong bytes.
func TestFragmentBitFlip(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 1))
	data := randBytes(rng, 2*FragmentChunk+5)
	base := vfs.NewMem()
	s, _ := OpenFragmentStore(base, "/f")
	if err := putBytes(s, 1, 2, data); err != nil {
		t.Fatal(err)
	}
	name := "/f/0000000000000001.02.frag"
	size, _ := base.Stat(name)
	for bit := int64(0); bit < size*8; bit += 1 + rng.Int64N(4000) {
		fs := vfs.NewMem()
		s, _ := OpenFragmentStore(fs, "/f")
		if err := putBytes(s, 1, 2, data); err != nil {
			t.Fatal(err)
		}
		if err := fs.FlipBit(name, bit/8, uint(bit%8)); err != nil {
			t.Fatal(err)
		}
		for _, reopen := range []bool{false, true} {
			if reopen {
				s, _ = OpenFragmentStore(fs, "/f")
			}
			got, err := s.Read(1, 2, 0, int64(len(data)))
			if err == nil && !bytes.Equal(got, data) {
				t.Fatalf("bit %d reopen=%v: wrong bytes served", bit, reopen)
			}
			serr := s.Scrub(1, 2)
			if !reopen && bit >= fragHeaderLen*8 && bit < (fragHeaderLen+int64(len(data)))*8 && (err == nil || serr == nil) {
				t.Fatalf("bit %d in the payload not caught: read %v, scrub %v", bit, err, serr)
			}
			if reopen && serr == nil && !bytes.Equal(got, data) {
				t.Fatalf("bit %d: scrub passed a bad fragment", bit)
			}
			if serr != nil && !errors.Is(serr, engines.ErrCorrupt) {
				t.Fatalf("bit %d: scrub error %v", bit, serr)
			}
		}
	}
}

// TestFragmentCrash fails the k-th file operation of a put, for every k,
// then crashes: the fragment is either absent or whole, never partial, and
// an acknowledged put is always there.
func TestFragmentCrash(t *testing.T) {
	seed := testSeed(t)
	data := randBytes(rand.New(rand.NewPCG(seed, 2)), FragmentChunk+300)
	run := func(fs vfs.FS) (acked bool, err error) {
		s, err := OpenFragmentStore(fs, "/f")
		if err != nil {
			return false, err
		}
		if err := putBytes(s, 4, 1, data); err != nil {
			return false, err
		}
		return true, nil
	}
	clean := vfs.NewMem()
	if _, err := run(clean); err != nil {
		t.Fatal(err)
	}
	ops := vfs.OpWrite | vfs.OpSync | vfs.OpCreate | vfs.OpSyncDir | vfs.OpRename
	n := clean.Ops(ops)
	for k := range n + 1 {
		for _, torn := range []bool{false, true} {
			fs := vfs.NewMem()
			fs.InjectAfter(int(k), ops, nil)
			acked, _ := run(fs)
			if torn {
				fs.CrashKeepingPrefix(rand.New(rand.NewPCG(seed, uint64(k))))
			} else {
				fs.Crash()
			}
			s, err := OpenFragmentStore(fs, "/f")
			if err != nil {
				if acked {
					t.Fatalf("k=%d: reopen: %v", k, err)
				}
				continue
			}
			got, err := s.Read(4, 1, 0, int64(len(data)))
			switch {
			case err == nil && !bytes.Equal(got, data):
				t.Fatalf("k=%d torn=%v: wrong fragment after crash", k, torn)
			case err != nil && acked:
				t.Fatalf("k=%d torn=%v: acknowledged fragment lost: %v", k, torn, err)
			case err != nil && !errors.Is(err, ErrNoExtent):
				t.Fatalf("k=%d torn=%v: partial fragment visible: %v", k, torn, err)
			}
			if names, _ := fs.List("/f"); slices.ContainsFunc(names, func(n string) bool { return len(n) > 4 && n[len(n)-4:] == ".tmp" }) {
				t.Fatalf("k=%d: temp file left after reopen: %v", k, names)
			}
		}
	}
	t.Logf("%d fault points", n)
}

// FuzzFragmentFile: arbitrary file contents never panic the loader or a
// read, and never read back as something other than what a valid file
// holds.
func FuzzFragmentFile(f *testing.F) {
	fs := vfs.NewMem()
	s, _ := OpenFragmentStore(fs, "/f")
	_ = putBytes(s, 1, 0, bytes.Repeat([]byte("abc"), 100))
	raw, _ := fs.Open("/f/0000000000000001.00.frag")
	size, _ := raw.Size()
	b := make([]byte, size)
	_, _ = raw.ReadAt(b, 0)
	raw.Close()
	f.Add(b)
	f.Add(b[:fragHeaderLen])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		ff, err := loadFragment(memFile(t, b), "/x", fragKey{1, 0})
		if err != nil {
			if !errors.Is(err, engines.ErrCorrupt) && !errors.Is(err, ErrFormatVersion) {
				t.Fatalf("error %v is neither corrupt nor version", err)
			}
			return
		}
		if want := fragHeaderLen + ff.size + 4*int64(len(ff.chunks)) + 4; want != int64(len(b)) {
			t.Fatalf("accepted %d bytes for a %d-byte fragment", len(b), ff.size)
		}
	})
}

func memFile(t *testing.T, b []byte) vfs.FS {
	fs := vfs.NewMem()
	f, err := fs.Create("/x")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.Write(b)
	_ = f.Close()
	return fs
}

// TestSplitAtBlocks checks the split keeps blocks whole and is as even as
// whole blocks allow.
func TestSplitAtBlocks(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 3))
	for range 500 {
		nb := 1 + rng.IntN(60)
		var starts []int64
		var off, big int64
		for range nb {
			starts = append(starts, off)
			sz := 21 + rng.Int64N(5000)
			if rng.IntN(10) == 0 {
				sz *= 20
			}
			big = max(big, sz)
			off += sz
		}
		b := splitAtBlocks(starts, off, 12)
		if len(b) != 13 || b[0] != 0 || b[12] != off {
			t.Fatalf("bounds %v for %d bytes", b, off)
		}
		var largest int64
		for i := range 12 {
			if b[i+1] < b[i] || (b[i] < off && !slices.Contains(starts, b[i])) {
				t.Fatalf("bound %d = %d not at a block start: %v", i, b[i], b)
			}
			largest = max(largest, b[i+1]-b[i])
		}
		// Never worse than one block over the even share.
		if largest > (off+11)/12+big {
			t.Fatalf("largest fragment %d of %d bytes (block max %d)", largest, off, big)
		}
		for _, p := range fragmentPieces(b, 0, off) {
			if p.offset != 0 || p.length != b[p.index+1]-b[p.index] {
				t.Fatalf("piece %+v", p)
			}
		}
	}
}
