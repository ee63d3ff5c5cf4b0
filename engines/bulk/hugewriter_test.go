package bulk

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"
)

// writeLog records each write a HugeWriter issues.
type writeLog struct {
	data   bytes.Buffer
	writes [][2]int64 // offset, length
	off    int64
	failAt int // fail the failAt-th write (1-based); 0: never
}

func (l *writeLog) Write(p []byte) (int, error) {
	if l.failAt > 0 && len(l.writes)+1 == l.failAt {
		return 0, errors.New("injected")
	}
	l.writes = append(l.writes, [2]int64{l.off, int64(len(p))})
	l.off += int64(len(p))
	return l.data.Write(p)
}

func TestHugeWriterAligns(t *testing.T) {
	seed := uint64(rand.Int64())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 7))
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	fill := rand.NewChaCha8(key) // the bytes written: fast, from the same seed
	rounds := 40
	if testing.Short() { // the race run: a few hundred MB through the race detector take a minute
		rounds = 6
	}
	for round := 0; round < rounds; round++ {
		start := int64(0)
		if round%2 == 1 {
			start = r.Int64N(3 * HugePageBytes)
		}
		l := &writeLog{off: start}
		w := NewHugeWriter(l, start)
		var want bytes.Buffer
		total := r.IntN(9 * HugePageBytes)
		for want.Len() < total {
			var n int
			switch r.IntN(4) {
			case 0:
				n = r.IntN(100)
			case 1:
				n = r.IntN(1 << 20)
			case 2:
				n = HugePageBytes
			default:
				n = r.IntN(5 * HugePageBytes)
			}
			p := make([]byte, n)
			fill.Read(p)
			if k, err := w.Write(p); k != n || err != nil {
				t.Fatalf("Write(%d bytes) = %d, %v", n, k, err)
			}
			want.Write(p)
			if got := w.Offset(); got != start+int64(want.Len()) {
				t.Fatalf("Offset %d, want %d", got, start+int64(want.Len()))
			}
			if w.Buffered() >= HugePageBytes {
				t.Fatalf("buffers %d bytes", w.Buffered())
			}
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(l.data.Bytes(), want.Bytes()) {
			t.Fatalf("round %d: the bytes written differ from the bytes given", round)
		}
		for i, wr := range l.writes {
			end := wr[0] + wr[1]
			if i < len(l.writes)-1 && end%HugePageBytes != 0 {
				t.Fatalf("round %d: write %d of %d ends at %d, not at a huge-page boundary", round, i, len(l.writes), end)
			}
			if i > 0 && wr[0]%HugePageBytes != 0 {
				t.Fatalf("round %d: write %d starts at %d, not at a huge-page boundary", round, i, wr[0])
			}
		}
	}
}

func TestHugeWriterErrorSticks(t *testing.T) {
	l := &writeLog{failAt: 2}
	w := NewHugeWriter(l, 0)
	p := make([]byte, 3*HugePageBytes+5)
	if _, err := w.Write(p); err != nil { // one direct write of 3 pages; 5 bytes buffered
		t.Fatal(err)
	}
	if err := w.Flush(); err == nil {
		t.Fatal("Flush after an injected failure succeeded")
	}
	if _, err := w.Write([]byte("x")); err == nil {
		t.Fatal("Write after a failure succeeded")
	}
	if err := w.Flush(); err == nil {
		t.Fatal("a failure did not stick")
	}
}
