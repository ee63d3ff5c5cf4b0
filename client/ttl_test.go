package client

import (
	"math"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
)

// A TTL converts to whole milliseconds rounded up; one past 100 years (or
// one whose rounding used to overflow int64) is refused, not sent.
func TestTTLMillisLimits(t *testing.T) {
	for _, c := range []struct {
		d      time.Duration
		ms     uint64
		reason string
	}{
		{0, 0, ""},
		{time.Nanosecond, 1, ""},
		{1500 * time.Microsecond, 2, ""},
		{time.Hour, 3_600_000, ""},
		{time.Duration(api.MaxTTLMs) * time.Millisecond, api.MaxTTLMs, ""},
		{time.Duration(api.MaxTTLMs)*time.Millisecond + 1, 0, "ttl_too_long"},
		{math.MaxInt64, 0, "ttl_too_long"},
		{-time.Second, 0, "ttl_negative"},
	} {
		ms, err := ttlMillis("ttl", c.d)
		if got := api.DetailOf(err).GetReason(); got != c.reason || (err == nil && ms != c.ms) {
			t.Errorf("ttlMillis(%v) = %d, %v (reason %q); want %d, reason %q", c.d, ms, err, got, c.ms, c.reason)
		}
	}
}
