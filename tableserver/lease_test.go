package tableserver

import (
	"testing"
	"time"
)

func TestLease(t *testing.T) {
	ms := time.Millisecond
	type step struct {
		op      string // "renewed", "answered", "renew", "raise"
		at      time.Duration
		dur     time.Duration
		version uint64
	}
	type probe struct {
		now     time.Duration
		version uint64
		valid   bool
		serves  bool
	}
	for _, tc := range []struct {
		name   string
		steps  []step
		probes []probe
	}{
		{"zero lease serves nothing", nil, []probe{{0, 0, false, false}, {time.Hour, 9, false, false}}},
		{"runs from the send time", []step{{op: "renewed", at: 100 * ms, dur: 800 * ms, version: 3}},
			[]probe{{100 * ms, 3, true, true}, {899 * ms, 3, true, true}, {900 * ms, 3, false, false}}},
		{"map older than the master's is not served", []step{{op: "renewed", at: 0, dur: 800 * ms, version: 3}},
			[]probe{{10 * ms, 2, true, false}, {10 * ms, 4, true, true}}},
		{"answered alone does not renew", []step{{op: "answered", dur: 800 * ms, version: 5}},
			[]probe{{0, 5, false, false}}},
		{"answered raises the map version a valid lease serves from", []step{
			{op: "renewed", at: 0, dur: 800 * ms, version: 1}, {op: "answered", version: 7}},
			[]probe{{10 * ms, 6, true, false}, {10 * ms, 7, true, true}}},
		{"an older answer neither shortens the lease nor lowers the version", []step{
			{op: "renewed", at: 500 * ms, dur: 800 * ms, version: 7}, {op: "renewed", at: 100 * ms, dur: 800 * ms, version: 2}},
			[]probe{{1299 * ms, 7, true, true}, {1300 * ms, 7, false, false}, {1000 * ms, 6, true, false}}},
		{"a zero duration keeps the last one", []step{
			{op: "renewed", at: 0, dur: 300 * ms, version: 1}, {op: "renewed", at: 100 * ms, dur: 0, version: 1}},
			[]probe{{399 * ms, 1, true, true}, {400 * ms, 1, false, false}}},
		{"raise alone fences", []step{{op: "renewed", at: 0, dur: time.Second, version: 1}, {op: "raise", version: 4}},
			[]probe{{0, 3, true, false}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l Lease
			for _, s := range tc.steps {
				switch s.op {
				case "renewed":
					l.Renewed(s.at, s.dur, s.version)
				case "answered":
					l.Answered(s.dur, s.version)
				case "renew":
					l.Renew(s.at)
				case "raise":
					l.RaiseMinMapVersion(s.version)
				}
			}
			for _, p := range tc.probes {
				if got := l.Valid(p.now); got != p.valid {
					t.Errorf("Valid(%v) = %v, want %v", p.now, got, p.valid)
				}
				if got := l.Serves(p.now, p.version); got != p.serves {
					t.Errorf("Serves(%v, %d) = %v, want %v", p.now, p.version, got, p.serves)
				}
			}
		})
	}
}
