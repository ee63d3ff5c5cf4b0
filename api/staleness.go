package api

import "time"

// DefaultMaxStalenessMs is the bound of a read_any read when its header
// sets none (RequestHeader.max_staleness_ms 0): a secondary not in step
// with its primary within it refuses the read ("replica_behind").
const DefaultMaxStalenessMs = 1000

// MaxStaleness is the staleness bound header h asks for.
func MaxStaleness(h *RequestHeader) time.Duration {
	ms := h.GetMaxStalenessMs()
	if ms == 0 {
		ms = DefaultMaxStalenessMs
	}
	return time.Duration(ms) * time.Millisecond
}
