package entity

import (
	"strings"
	"time"

	"github.com/tabuladb/tabula/frontend/edm"
)

// The DateTime values the service accepts, 1601-01-01 to 9999-12-31
// (edm.Value holds years 1 to 9999); others are refused with
// OutOfRangeInput (see doc.go).
var (
	minTime = time.Date(1601, 1, 1, 0, 0, 0, 0, time.UTC)
	maxTime = edm.MaxTime
)

// FormatTime writes t as the service does: UTC with exactly seven
// fractional digits, "2024-05-06T07:08:09.1234567Z".
func FormatTime(t time.Time) string { return string(AppendTime(nil, t)) }

// AppendTime appends FormatTime(t) to dst.
func AppendTime(dst []byte, t time.Time) []byte { return appendTime(dst, t, ":") }

// appendTime is AppendTime with colon between hours, minutes and
// seconds.
func appendTime(dst []byte, t time.Time, colon string) []byte {
	t = t.UTC()
	y, mo, d := t.Date()
	h, mi, s := t.Clock()
	dst = appendInt(dst, y, 4)
	dst = append(dst, '-')
	dst = appendInt(dst, int(mo), 2)
	dst = append(dst, '-')
	dst = appendInt(dst, d, 2)
	dst = append(dst, 'T')
	dst = appendInt(dst, h, 2)
	dst = append(dst, colon...)
	dst = appendInt(dst, mi, 2)
	dst = append(dst, colon...)
	dst = appendInt(dst, s, 2)
	dst = append(dst, '.')
	dst = appendInt(dst, t.Nanosecond()/int(edm.Ticks), 7)
	return append(dst, 'Z')
}

func appendInt(dst []byte, v, width int) []byte {
	var buf [20]byte
	i := len(buf)
	for v > 0 || width > 0 {
		i--
		buf[i] = byte('0' + v%10)
		v /= 10
		width--
	}
	return append(dst, buf[i:]...)
}

// ParseTime reads an Edm.DateTime as clients send it: ISO 8601
// "YYYY-MM-DDTHH:MM:SS", then up to seven fractional digits, then "Z",
// a "+HH:MM"/"-HH:MM" offset, or nothing (taken as UTC). The result is
// in UTC. A malformed value is InvalidInput; one outside the range an
// edm.Value holds is OutOfRangeInput.
func ParseTime(s string) (time.Time, error) {
	t, err := parseTime(s)
	if err != nil {
		return time.Time{}, err
	}
	return t, nil
}

// parseTime is ParseTime of a string or of bytes (not copied).
func parseTime[S ~string | ~[]byte](s S) (time.Time, *Error) {
	bad := func(why string) (time.Time, *Error) {
		return time.Time{}, ErrInvalidInput.with("DateTime %q: %s", s, why)
	}
	p := s
	num := func(n int) (int, bool) {
		if len(p) < n {
			return 0, false
		}
		v := 0
		for i := 0; i < n; i++ {
			c := p[i]
			if c < '0' || c > '9' {
				return 0, false
			}
			v = v*10 + int(c-'0')
		}
		p = p[n:]
		return v, true
	}
	lit := func(c byte) bool {
		if len(p) == 0 || p[0] != c {
			return false
		}
		p = p[1:]
		return true
	}
	y, ok1 := num(4)
	ok2 := lit('-')
	mo, ok3 := num(2)
	ok4 := lit('-')
	d, ok5 := num(2)
	ok6 := lit('T')
	h, ok7 := num(2)
	ok8 := lit(':')
	mi, ok9 := num(2)
	ok10 := lit(':')
	sec, ok11 := num(2)
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6 && ok7 && ok8 && ok9 && ok10 && ok11) {
		return bad("want YYYY-MM-DDTHH:MM:SS[.fffffff][Z]")
	}
	ns := 0
	if lit('.') {
		n := 0
		for n < len(p) && p[n] >= '0' && p[n] <= '9' {
			n++
		}
		if n == 0 || n > 7 {
			return bad("want 1 to 7 fractional digits")
		}
		f, _ := num(n)
		for i := n; i < 9; i++ {
			f *= 10
		}
		ns = f
	}
	offset := 0
	switch {
	case len(p) == 0 || len(p) == 1 && (p[0] == 'Z' || p[0] == 'z'):
	case len(p) == 6 && (p[0] == '+' || p[0] == '-') && p[3] == ':':
		sign := 1
		if p[0] == '-' {
			sign = -1
		}
		oh := int(p[1]-'0')*10 + int(p[2]-'0')
		om := int(p[4]-'0')*10 + int(p[5]-'0')
		if !isDigits(p[1:3]) || !isDigits(p[4:6]) || oh > 23 || om > 59 {
			return bad("bad offset")
		}
		offset = sign * (oh*3600 + om*60)
	default:
		return bad("bad zone")
	}
	if mo < 1 || mo > 12 || d < 1 || h > 23 || mi > 59 || sec > 59 {
		return bad("field out of range")
	}
	t := time.Date(y, time.Month(mo), d, h, mi, sec, ns, time.UTC)
	if t.Day() != d {
		return bad("no such day")
	}
	t = t.Add(-time.Duration(offset) * time.Second)
	if t.Before(minTime) || t.After(maxTime) {
		return time.Time{}, ErrOutOfRangeInput.with("DateTime %q: outside %s..%s, the range this gateway stores", s, FormatTime(minTime), FormatTime(maxTime))
	}
	return t, nil
}

func isDigits[S ~string | ~[]byte](s S) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// ETag is the entity's ETag for a Timestamp, as the service forms it:
// W/"datetime'2026-11-21T19%3A22%3A43.1171918Z'" (the Timestamp with
// seven fractional digits, its colons percent-encoded).
func ETag(ts time.Time) string { return string(AppendETag(nil, ts)) }

// AppendETag appends ETag(ts) to dst.
func AppendETag(dst []byte, ts time.Time) []byte {
	dst = append(dst, `W/"datetime'`...)
	dst = appendTime(dst, ts, "%3A")
	return append(dst, `'"`...)
}

// ParseETag reads an If-Match ETag. The form ETag makes,
// W/"datetime'…'" (the W in either case, colons percent-encoded or
// plain), yields its Timestamp. Any other weak ETag, W/"…" with every
// quote inside escaped by a backslash, is well-formed but one this
// service never gives: it matches no entity, and the error is
// ErrUpdateConditionNotSatisfied (412), as the service answers (Azurite
// issue 1229). Anything else — a strong ETag "…", a bare word, "*" (the
// gateway handles it before) — is InvalidInput, the service's code for
// an invalid ETag value.
func ParseETag(s string) (time.Time, error) {
	if len(s) < 4 || (s[0] != 'W' && s[0] != 'w') || s[1] != '/' || s[2] != '"' || s[len(s)-1] != '"' {
		return time.Time{}, ErrInvalidInput.with("ETag %q is not a weak ETag W/\"...\"", s)
	}
	opaque := s[3 : len(s)-1]
	for i := 0; i < len(opaque); i++ {
		if opaque[i] == '"' && (i == 0 || opaque[i-1] != '\\') {
			return time.Time{}, ErrInvalidInput.with("ETag %q has an unescaped quote inside", s)
		}
	}
	const pre, post = "datetime'", "'"
	if len(opaque) < len(pre)+len(post) || !strings.HasPrefix(opaque, pre) || !strings.HasSuffix(opaque, post) {
		return time.Time{}, ErrUpdateConditionNotSatisfied.with("ETag %q is not one this service gives", s)
	}
	inner := opaque[len(pre) : len(opaque)-len(post)]
	inner = strings.ReplaceAll(inner, "%3A", ":")
	inner = strings.ReplaceAll(inner, "%3a", ":")
	t, err := ParseTime(inner)
	if err != nil {
		return time.Time{}, ErrUpdateConditionNotSatisfied.with("ETag %q is not one this service gives: %v", s, err)
	}
	return t, nil
}
