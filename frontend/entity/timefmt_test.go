package entity

import (
	"testing"
	"time"
)

func TestETag(t *testing.T) {
	ts := time.Date(2026, 11, 21, 19, 22, 43, 117191800, time.UTC)
	const want = `W/"datetime'2026-11-21T19%3A22%3A43.1171918Z'"`
	if got := ETag(ts); got != want {
		t.Fatalf("ETag = %s, want %s", got, want)
	}
	for _, s := range []string{want, `W/"datetime'2026-11-21T19:22:43.1171918Z'"`, `W/"datetime'2026-11-21T19%3a22%3a43.1171918Z'"`,
		`w/"datetime'2026-11-21T19%3A22%3A43.1171918Z'"`} {
		got, err := ParseETag(s)
		if err != nil || !got.Equal(ts) {
			t.Errorf("ParseETag(%s) = %v, %v", s, got, err)
		}
	}
	// Weak ETags this service never gives match nothing: 412, as the
	// service answers (Azurite's issue-1229 tests).
	for _, s := range []string{`W/"0x8D9"`, `W/"wrong"`, `w/"wrong"`, `W/""`, `W/"datetime'x'"`, `W/"a\"b"`, `W/"datetime'2026-11-21T19%3A22%3A43.1171918Z"`} {
		_, err := ParseETag(s)
		wantCode(t, "ParseETag "+s, err, "UpdateConditionNotSatisfied")
	}
	// Not weak ETags at all: 400.
	for _, s := range []string{"*", `"wrong"`, `"datetime'2026-11-21T19%3A22%3A43.1171918Z'"`, "wrong", `"`, `W/"`, `W/"datetime'`,
		`W/"a"b"`, `W/wrong`, `X/"wrong"`, ``} {
		_, err := ParseETag(s)
		wantCode(t, "ParseETag "+s, err, "InvalidInput")
	}
}

func TestFormatParseTime(t *testing.T) {
	cases := []struct {
		in   time.Time
		want string
	}{
		{time.Date(2024, 5, 6, 7, 8, 9, 123456700, time.UTC), "2024-05-06T07:08:09.1234567Z"},
		{time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC), "2024-05-06T07:08:09.0000000Z"},
		{time.Date(1999, 12, 31, 23, 59, 59, 999999999, time.FixedZone("x", 3600)), "1999-12-31T22:59:59.9999999Z"},
		{time.Time{}, "0001-01-01T00:00:00.0000000Z"},
	}
	for _, c := range cases {
		if got := FormatTime(c.in); got != c.want {
			t.Errorf("FormatTime(%v) = %s, want %s", c.in, got, c.want)
		}
		back, err := ParseTime(c.want)
		if c.in.IsZero() {
			wantCode(t, "year 1", err, "OutOfRangeInput")
			continue
		}
		if err != nil || !back.Equal(c.in.Truncate(100*time.Nanosecond)) {
			t.Errorf("ParseTime(%s) = %v, %v", c.want, back, err)
		}
	}
	for _, s := range []string{"2024-05-06", "2024-05-06T07:08", "2024-05-06T24:00:00Z", "2024-05-06T07:08:09.Z",
		"2024-05-06T07:08:09+0100", "2024-05-06T07:08:09+01:6x", "2024-05-06 07:08:09Z", "２０２４-05-06T07:08:09Z"} {
		_, err := ParseTime(s)
		wantCode(t, s, err, "InvalidInput")
	}
}
