package eliasfano

import (
	"encoding/binary"
	"fmt"
	"math/bits"

	"github.com/tabuladb/tabula/engines"
)

const (
	headerLen   = 24
	sampleShift = 8 // a sample every 256 ones
)

// List is an Elias-Fano coded list.
type List struct {
	n       uint64
	lowBits uint
	hiLen   uint64
	low     []uint64
	high    []uint64
	samples []uint64
}

// Build encodes vals, which must be non-decreasing.
func Build(vals []uint64) (*List, error) {
	n := uint64(len(vals))
	l := &List{n: n}
	if n == 0 {
		return l, nil
	}
	u := vals[n-1]
	if u/n > 0 {
		l.lowBits = uint(bits.Len64(u/n)) - 1
	}
	l.hiLen = n + u>>l.lowBits + 1
	l.low = make([]uint64, (n*uint64(l.lowBits)+63)/64)
	l.high = make([]uint64, (l.hiLen+63)/64)
	l.samples = make([]uint64, (n+255)>>sampleShift)
	mask := uint64(1)<<l.lowBits - 1
	prev := uint64(0)
	for i, v := range vals {
		if v < prev {
			return nil, fmt.Errorf("eliasfano: value %d at %d after %d: not non-decreasing", v, i, prev)
		}
		prev = v
		if l.lowBits > 0 {
			setBits(l.low, uint64(i)*uint64(l.lowBits), l.lowBits, v&mask)
		}
		pos := v>>l.lowBits + uint64(i)
		l.high[pos/64] |= 1 << (pos % 64)
		if i&(1<<sampleShift-1) == 0 {
			l.samples[i>>sampleShift] = pos
		}
	}
	return l, nil
}

func setBits(ws []uint64, pos uint64, width uint, v uint64) {
	w, o := pos/64, uint(pos%64)
	ws[w] |= v << o
	if o+width > 64 {
		ws[w+1] |= v >> (64 - o)
	}
}

func getBits(ws []uint64, pos uint64, width uint) uint64 {
	w, o := pos/64, uint(pos%64)
	v := ws[w] >> o
	if o+width > 64 {
		v |= ws[w+1] << (64 - o)
	}
	return v & (1<<width - 1)
}

// Len is the number of values.
func (l *List) Len() int { return int(l.n) }

// MemoryBytes is the memory the list holds.
func (l *List) MemoryBytes() int { return 8*(len(l.low)+len(l.high)+len(l.samples)) + 64 }

// selectHigh returns the position in high of the i-th one (i < n).
func (l *List) selectHigh(i uint64) uint64 {
	pos := l.samples[i>>sampleShift]
	r := i & (1<<sampleShift - 1)
	w := pos / 64
	word := l.high[w] &^ (1<<(pos%64) - 1)
	for {
		c := uint64(bits.OnesCount64(word))
		if r < c {
			break
		}
		r -= c
		w++
		word = l.high[w]
	}
	return w*64 + uint64(selectInWord(word, uint(r)))
}

// selectInWord is the position of the r-th (0-based) set bit of w, which has
// more than r set bits.
func selectInWord(w uint64, r uint) uint {
	base := uint(0)
	for {
		c := uint(bits.OnesCount16(uint16(w)))
		if r < c {
			break
		}
		r -= c
		w >>= 16
		base += 16
	}
	for ; r > 0; r-- {
		w &= w - 1
	}
	return base + uint(bits.TrailingZeros64(w))
}

// Get returns value i (i < Len).
func (l *List) Get(i int) uint64 {
	ui := uint64(i)
	hi := l.selectHigh(ui) - ui
	if l.lowBits == 0 {
		return hi
	}
	return hi<<l.lowBits | getBits(l.low, ui*uint64(l.lowBits), l.lowBits)
}

// Get2 returns values i and i+1 (i+1 < Len) for the price of about one Get.
func (l *List) Get2(i int) (uint64, uint64) {
	ui := uint64(i)
	p := l.selectHigh(ui)
	// The next one is the next set bit after p.
	q := p + 1
	w := q / 64
	word := l.high[w] &^ (1<<(q%64) - 1)
	for word == 0 {
		w++
		word = l.high[w]
	}
	q = w*64 + uint64(bits.TrailingZeros64(word))
	a, b := p-ui, q-ui-1
	if l.lowBits > 0 {
		a = a<<l.lowBits | getBits(l.low, ui*uint64(l.lowBits), l.lowBits)
		b = b<<l.lowBits | getBits(l.low, (ui+1)*uint64(l.lowBits), l.lowBits)
	}
	return a, b
}

// EncodedLen is the length of the list's encoding.
func (l *List) EncodedLen() int { return headerLen + 8*(len(l.low)+len(l.high)+len(l.samples)) }

// AppendBinary appends the list's encoding to dst.
func (l *List) AppendBinary(dst []byte) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, l.n)
	dst = append(dst, byte(l.lowBits), 0, 0, 0, 0, 0, 0, 0)
	dst = binary.LittleEndian.AppendUint64(dst, l.hiLen)
	for _, ws := range [][]uint64{l.low, l.high, l.samples} {
		for _, w := range ws {
			dst = binary.LittleEndian.AppendUint64(dst, w)
		}
	}
	return dst
}

// Decode decodes a list encoded by AppendBinary, which must be all of b. The
// list does not alias b. A malformed encoding is an error wrapping
// engines.ErrCorrupt.
func Decode(b []byte) (*List, error) {
	if len(b) < headerLen {
		return nil, fmt.Errorf("eliasfano: %d bytes: %w", len(b), engines.ErrCorrupt)
	}
	l := &List{
		n:       binary.LittleEndian.Uint64(b),
		lowBits: uint(b[8]),
		hiLen:   binary.LittleEndian.Uint64(b[16:]),
	}
	for _, c := range b[9:16] {
		if c != 0 {
			return nil, fmt.Errorf("eliasfano: header padding %x: %w", b[9:16], engines.ErrCorrupt)
		}
	}
	if l.n == 0 {
		if len(b) != headerLen || l.lowBits != 0 || l.hiLen != 0 {
			return nil, fmt.Errorf("eliasfano: empty list with a body: %w", engines.ErrCorrupt)
		}
		return l, nil
	}
	words := uint64(len(b)-headerLen) / 8
	if l.lowBits > 62 || l.n > words*64 || l.hiLen < l.n+1 || l.hiLen > words*64 {
		return nil, fmt.Errorf("eliasfano: n %d, lowBits %d, hiLen %d in %d bytes: %w", l.n, l.lowBits, l.hiLen, len(b), engines.ErrCorrupt)
	}
	nLow := (l.n*uint64(l.lowBits) + 63) / 64
	nHigh := (l.hiLen + 63) / 64
	nSamples := (l.n + 255) >> sampleShift
	if uint64(len(b)-headerLen) != 8*(nLow+nHigh+nSamples) {
		return nil, fmt.Errorf("eliasfano: %d bytes, want %d: %w", len(b), headerLen+8*(nLow+nHigh+nSamples), engines.ErrCorrupt)
	}
	words64 := func(k uint64) []uint64 {
		ws := make([]uint64, k)
		for i := range ws {
			ws[i] = binary.LittleEndian.Uint64(b)
			b = b[8:]
		}
		return ws
	}
	b = b[headerLen:]
	l.low, l.high, l.samples = words64(nLow), words64(nHigh), words64(nSamples)
	// The high part must hold exactly n ones, the last at hiLen-1 or
	// below, and every sample must point at the right one: then select
	// never runs off the end.
	if l.hiLen%64 != 0 && l.high[nHigh-1]>>(l.hiLen%64) != 0 {
		return nil, fmt.Errorf("eliasfano: bits past the high part: %w", engines.ErrCorrupt)
	}
	// The values must be non-decreasing too (equal high parts with
	// decreasing low parts would not be): callers slice with them.
	ones, prev := uint64(0), uint64(0)
	for w, word := range l.high {
		for word != 0 {
			pos := uint64(w)*64 + uint64(bits.TrailingZeros64(word))
			if ones&(1<<sampleShift-1) == 0 {
				if ones>>sampleShift >= nSamples || l.samples[ones>>sampleShift] != pos {
					return nil, fmt.Errorf("eliasfano: sample %d wrong: %w", ones>>sampleShift, engines.ErrCorrupt)
				}
			}
			if ones < l.n {
				v := (pos - ones) << l.lowBits
				if l.lowBits > 0 {
					v |= getBits(l.low, ones*uint64(l.lowBits), l.lowBits)
				}
				if v < prev {
					return nil, fmt.Errorf("eliasfano: value %d decreases: %w", ones, engines.ErrCorrupt)
				}
				prev = v
			}
			ones++
			word &= word - 1
		}
	}
	if ones != l.n {
		return nil, fmt.Errorf("eliasfano: %d ones in the high part, want %d: %w", ones, l.n, engines.ErrCorrupt)
	}
	return l, nil
}
