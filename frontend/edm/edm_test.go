package edm

import (
	"testing"
	"time"
)

func TestCompare(t *testing.T) {
	g1, err := ParseGUID("C9DA6455-213D-42C9-9A79-3E9149A57833")
	if err != nil {
		t.Fatal(err)
	}
	if g1.AsString() != "c9da6455-213d-42c9-9a79-3e9149a57833" {
		t.Fatalf("guid canonical form %q", g1.AsString())
	}
	now := time.Date(2024, 5, 6, 7, 8, 9, 123456710, time.UTC)
	cases := []struct {
		a, b Value
		c    int
		ok   bool
	}{
		{Str("a"), Str("b"), -1, true},
		{Str("é"), Str("z"), 1, true}, // ordinal UTF-8 bytes
		{I32(5), I32(5), 0, true},
		{I32(5), I64(5), 0, false}, // types differ: no match
		{I64(-1), I64(1), -1, true},
		{F64(2.5), F64(1), 1, true},
		{Bool(false), Bool(true), -1, true},
		{Time(now), Time(now.Add(50 * time.Nanosecond)), 0, true}, // 100 ns resolution
		{Time(now), Time(now.Add(Ticks)), -1, true},
		{g1, g1, 0, true},
		{Bin([]byte{0, 1}), Bin([]byte{0, 2}), -1, true},
		{Value{}, Value{}, 0, false},
	}
	for _, c := range cases {
		got, ok := Compare(c.a, c.b)
		if got != c.c || ok != c.ok {
			t.Errorf("Compare(%#v, %#v) = %d, %t; want %d, %t", c.a, c.b, got, ok, c.c, c.ok)
		}
	}
	for _, bad := range []string{"not-a-guid", "00-00000-0000-0000-0000-000000000000", "0000000-0000-0000-0000-0000000000000"} {
		if _, err := ParseGUID(bad); err == nil {
			t.Errorf("ParseGUID accepted %q", bad)
		}
	}
	for _, tm := range []time.Time{MinTime, MaxTime, time.Date(1601, 1, 1, 0, 0, 0, 0, time.UTC), now, time.Unix(0, 0).UTC()} {
		if got := Time(tm).AsTime(); !got.Equal(tm.Truncate(Ticks)) {
			t.Errorf("Time(%v).AsTime() = %v", tm, got)
		}
	}
	if c, _ := Compare(Time(MinTime), Time(now)); c != -1 {
		t.Error("year 1 must sort before 2024")
	}
	for ty := String; ty <= Binary; ty++ {
		if got, ok := ParseType(ty.String()); !ok || got != ty {
			t.Errorf("ParseType(%q) = %v, %t", ty.String(), got, ok)
		}
	}
}

func TestEntityGet(t *testing.T) {
	e := Entity{PartitionKey: "p", RowKey: "r", Props: []Property{{"Age", I32(3)}}}
	if v, ok := e.Get("RowKey"); !ok || !Equal(v, Str("r")) {
		t.Errorf("RowKey = %#v", v)
	}
	if _, ok := e.Get("age"); ok {
		t.Error("names must be case-sensitive")
	}
}
