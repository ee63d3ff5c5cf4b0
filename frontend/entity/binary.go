package entity

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"strings"
	"time"

	"github.com/tabuladb/tabula/frontend/edm"
)

// Format version of AppendBinary's encoding. Never change or reuse a
// version: stored entities carry it, and a new layout takes a new one.
const binaryV1 = 1

// 100 ns ticks per second: DateTime and Timestamp are stored as signed
// ticks since the Unix epoch (covering years 1 to 9999 and beyond).
const ticksPerSecond = int64(time.Second / edm.Ticks)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// AppendBinary appends the stored form of e (its Timestamp and custom
// properties; the keys live in the engine key, see Key) to dst. It
// stores whatever e holds, valid or not: call Validate first.
func AppendBinary(dst []byte, e *edm.Entity) []byte {
	start := len(dst)
	dst = append(dst, binaryV1)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(toTicks(e.Timestamp)))
	dst = binary.AppendUvarint(dst, uint64(len(e.Props)))
	for _, p := range e.Props {
		dst = binary.AppendUvarint(dst, uint64(len(p.Name)))
		dst = append(dst, p.Name...)
		v := p.Value
		dst = append(dst, byte(v.Type()))
		switch v.Type() {
		case edm.String, edm.Binary:
			s := v.AsString()
			dst = binary.AppendUvarint(dst, uint64(len(s)))
			dst = append(dst, s...)
		case edm.Int32:
			dst = binary.LittleEndian.AppendUint32(dst, uint32(int32(v.AsInt())))
		case edm.Int64:
			dst = binary.LittleEndian.AppendUint64(dst, uint64(v.AsInt()))
		case edm.Double:
			dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(v.AsDouble()))
		case edm.Boolean:
			b := byte(0)
			if v.AsBool() {
				b = 1
			}
			dst = append(dst, b)
		case edm.DateTime:
			dst = binary.LittleEndian.AppendUint64(dst, uint64(toTicks(v.AsTime())))
		case edm.Guid:
			g := guidBytes(v.AsString())
			dst = append(dst, g[:]...)
		}
	}
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
}

// DecodeBinary reads an entity AppendBinary wrote, with the keys the
// engine key carried. It checks the CRC32C first; any damage is an
// error wrapping ErrCorrupt, an unknown version one that says so. The
// entity does not alias b; its names and String values share one
// allocation.
func DecodeBinary(pk, rk string, b []byte) (*edm.Entity, error) {
	corrupt := func(why string, args ...any) (*edm.Entity, error) {
		return nil, fmt.Errorf("entity: decode stored entity: %s: %w", fmt.Sprintf(why, args...), ErrCorrupt)
	}
	if len(b) < 1+8+1+4 {
		return corrupt("%d bytes, too short", len(b))
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return corrupt("crc32c %08x, stored %08x", got, sum)
	}
	if body[0] != binaryV1 {
		return corrupt("format version %d, this build reads %d", body[0], binaryV1)
	}
	ts, ok := fromTicks(int64(binary.LittleEndian.Uint64(body[1:9])))
	if !ok {
		return corrupt("timestamp out of range")
	}
	p := body[9:]
	uvarint := func() (uint64, bool) {
		v, n := binary.Uvarint(p)
		if n <= 0 {
			return 0, false
		}
		p = p[n:]
		return v, true
	}
	take := func(n uint64) ([]byte, bool) {
		if n > uint64(len(p)) {
			return nil, false
		}
		s := p[:n]
		p = p[n:]
		return s, true
	}
	count, ok := uvarint()
	if !ok || count > uint64(len(p))/3 { // a property takes at least 3 bytes
		return corrupt("bad property count")
	}
	e := &edm.Entity{PartitionKey: pk, RowKey: rk, Timestamp: ts, Props: make([]edm.Property, 0, count)}
	// Where each name and String value lies in b, copied once all are
	// known.
	type span struct{ name, str []byte }
	var spanBuf [32]span
	spans := spanBuf[:0]
	size := 0
	for i := uint64(0); i < count; i++ {
		n, ok := uvarint()
		if !ok {
			return corrupt("property %d: bad name length", i)
		}
		name, ok := take(n)
		if !ok {
			return corrupt("property %d: name past the end", i)
		}
		tb, ok := take(1)
		if !ok {
			return corrupt("property %d: no type", i)
		}
		var (
			v   edm.Value
			str []byte // a String's bytes
		)
		switch t := edm.Type(tb[0]); t {
		case edm.String, edm.Binary:
			n, ok := uvarint()
			if !ok {
				return corrupt("property %d: bad value length", i)
			}
			s, ok := take(n)
			if !ok {
				return corrupt("property %d: value past the end", i)
			}
			if t == edm.String {
				v, str = edm.Str(""), s // the text is set below
			} else {
				v = edm.Bin(s)
			}
		case edm.Int32:
			s, ok := take(4)
			if !ok {
				return corrupt("property %d: short Int32", i)
			}
			v = edm.I32(int32(binary.LittleEndian.Uint32(s)))
		case edm.Int64, edm.Double, edm.DateTime:
			s, ok := take(8)
			if !ok {
				return corrupt("property %d: short %s", i, t)
			}
			u := binary.LittleEndian.Uint64(s)
			switch t {
			case edm.Int64:
				v = edm.I64(int64(u))
			case edm.Double:
				v = edm.F64(math.Float64frombits(u))
			default:
				tm, ok := fromTicks(int64(u))
				if !ok || tm.Before(minTime) || tm.After(maxTime) {
					return corrupt("property %d: DateTime out of range", i)
				}
				v = edm.Time(tm)
			}
		case edm.Boolean:
			s, ok := take(1)
			if !ok || s[0] > 1 {
				return corrupt("property %d: bad Boolean", i)
			}
			v = edm.Bool(s[0] == 1)
		case edm.Guid:
			s, ok := take(16)
			if !ok {
				return corrupt("property %d: short Guid", i)
			}
			v = edm.GUID([16]byte(s))
		default:
			return corrupt("property %d: unknown type %d", i, tb[0])
		}
		spans = append(spans, span{name: name, str: str})
		size += len(name) + len(str)
		e.Props = append(e.Props, edm.Property{Value: v})
	}
	if len(p) != 0 {
		return corrupt("%d bytes after the last property", len(p))
	}
	var sb strings.Builder
	sb.Grow(size)
	for _, sp := range spans {
		sb.Write(sp.name)
		sb.Write(sp.str)
	}
	text := sb.String()
	for i, sp := range spans {
		prop := &e.Props[i]
		prop.Name, text = text[:len(sp.name)], text[len(sp.name):]
		if prop.Value.Type() == edm.String {
			prop.Value, text = edm.Str(text[:len(sp.str)]), text[len(sp.str):]
		}
	}
	return e, nil
}

// toTicks is t in 100 ns ticks since the Unix epoch.
func toTicks(t time.Time) int64 {
	return t.Unix()*ticksPerSecond + int64(t.Nanosecond())/int64(edm.Ticks)
}

// fromTicks inverts toTicks; ok is false past year 9999 or before year 1.
func fromTicks(ticks int64) (time.Time, bool) {
	sec, rem := ticks/ticksPerSecond, ticks%ticksPerSecond
	if rem < 0 {
		sec, rem = sec-1, rem+ticksPerSecond
	}
	t := time.Unix(sec, rem*int64(edm.Ticks)).UTC()
	if y := t.Year(); y < 1 || y > 9999 {
		return time.Time{}, false
	}
	return t, true
}

// guidBytes is the 16 bytes of a GUID in edm's canonical form.
func guidBytes(s string) [16]byte {
	var b [16]byte
	j := 0
	for i := 0; i+1 < len(s) && j < 16; {
		if s[i] == '-' {
			i++
			continue
		}
		b[j] = unhex(s[i])<<4 | unhex(s[i+1])
		i += 2
		j++
	}
	return b
}

func unhex(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10
	}
	return 0
}
