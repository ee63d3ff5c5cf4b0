package splitpolicy

import (
	"bytes"
	"cmp"
	"fmt"
	"slices"
	"time"
)

// Defaults, in the spirit of the systems issue 31 follows (RATIONALE.md,
// "Automatic splits").
const (
	// DefaultSizeBytes: CockroachDB's range_max_bytes, and a partition
	// that copies to a new replica in seconds at the repair bandwidth.
	DefaultSizeBytes = 512 << 20
	// DefaultQPS: CockroachDB's load-based split threshold (TiKV's is
	// 3,000).
	DefaultQPS = 2500
	// DefaultSustain: TiKV's window before a load split.
	DefaultSustain = 10 * time.Second
	// DefaultMaxConcurrent splits in flight in the cluster.
	DefaultMaxConcurrent = 4
	// DefaultCooldown: a child is not split again by load for this long.
	DefaultCooldown = 30 * time.Second
	// DefaultMaxPartitions per table.
	DefaultMaxPartitions = 256
)

// Options are the cluster's split settings. The zero value of a field
// means its default; a table's own settings override SizeBytes, QPS and
// MaxPartitions.
type Options struct {
	SizeBytes     uint64
	QPS           float64
	Sustain       time.Duration
	MaxConcurrent int
	Cooldown      time.Duration
	MaxPartitions int
}

// WithDefaults returns o with zero fields set to their defaults.
func (o Options) WithDefaults() Options {
	if o.SizeBytes == 0 {
		o.SizeBytes = DefaultSizeBytes
	}
	if o.QPS == 0 {
		o.QPS = DefaultQPS
	}
	if o.Sustain == 0 {
		o.Sustain = DefaultSustain
	}
	if o.MaxConcurrent == 0 {
		o.MaxConcurrent = DefaultMaxConcurrent
	}
	if o.Cooldown == 0 {
		o.Cooldown = DefaultCooldown
	}
	if o.MaxPartitions == 0 {
		o.MaxPartitions = DefaultMaxPartitions
	}
	return o
}

// Validate says what is wrong with o.
func (o Options) Validate() error {
	switch {
	case o.QPS < 0:
		return fmt.Errorf("splitpolicy: split QPS %v is negative", o.QPS)
	case o.Sustain < 0 || o.Cooldown < 0:
		return fmt.Errorf("splitpolicy: sustain %v and cooldown %v must not be negative", o.Sustain, o.Cooldown)
	case o.MaxConcurrent < 0 || o.MaxPartitions < 0:
		return fmt.Errorf("splitpolicy: max concurrent splits %d and max partitions %d must not be negative", o.MaxConcurrent, o.MaxPartitions)
	}
	return nil
}

// Table is one table's split settings (0: the cluster's).
type Table struct {
	Name          string
	Ordered       bool
	Partitions    int
	MaxPartitions int
	SizeBytes     uint64
	QPS           float64
}

// Hint is a split point a primary reported: the right child's first
// hash (point tables) or key (ordered tables).
type Hint struct {
	Hash uint64
	Key  []byte
}

// Partition is one partition as the policy sees it.
type Partition struct {
	ID    uint64
	Table string
	// Start and End are a point partition's hash range [Start, End];
	// KeyStart and KeyEnd an ordered one's key range [KeyStart, KeyEnd)
	// (KeyEnd empty: unbounded).
	Start, End       uint64
	KeyStart, KeyEnd []byte
	// Busy: a split or a replica move is pending on it.
	Busy bool
	// SplitAtMs: when the split that made it finished (0: not a split's
	// child, or not known).
	SplitAtMs int64
	// QPS is its reads+writes per second (smoothed); SizeBytes its bytes.
	QPS       float64
	SizeBytes uint64
	// LoadHint and SizeHint are its primary's reported split points (nil:
	// none).
	LoadHint, SizeHint *Hint
}

// Snapshot is the cluster as the policy sees it at NowMs.
type Snapshot struct {
	NowMs      int64
	Tables     []Table
	Partitions []Partition
	// Splitting counts the splits in flight (started, not done).
	Splitting int
	// TotalPartitions is the cluster's partitions, of every table, and
	// MaxTotalPartitions the most it may hold (0: no limit): a split
	// adds one.
	TotalPartitions, MaxTotalPartitions int
}

// Memory is what Decide remembers between calls: since when each
// partition's load has been at or above its threshold. The zero value is
// ready.
type Memory struct {
	HotSinceMs map[uint64]int64
}

// Reason is why a partition splits.
type Reason string

// Reasons. The strings are written to the command log (the children
// record why they were made): never change or reuse one.
const (
	ByLoad Reason = "load"
	BySize Reason = "size"
)

// Split is one split to start.
type Split struct {
	Partition uint64
	Hash      uint64
	Key       []byte
	Reason    Reason
	// Why says it in words.
	Why string
}

// Note says why a partition over a threshold was not split now.
type Note struct {
	Partition uint64
	Why       string
}

// Decision is Decide's answer: the splits to start, in order, and the
// candidates held back.
type Decision struct {
	Splits []Split
	Notes  []Note
}

// Decide chooses the splits to start now (see the package comment) and
// updates m.
func Decide(s Snapshot, o Options, m *Memory) Decision {
	o = o.WithDefaults()
	tables := map[string]*Table{}
	for i := range s.Tables {
		tables[s.Tables[i].Name] = &s.Tables[i]
	}
	hot := map[uint64]int64{}
	type cand struct {
		p      *Partition
		reason Reason
		over   float64 // how far over its threshold (a ratio)
		why    string
	}
	var cands []cand
	var out Decision
	for i := range s.Partitions {
		p := &s.Partitions[i]
		t := tables[p.Table]
		if t == nil {
			continue
		}
		qps, size := o.QPS, o.SizeBytes
		if t.QPS > 0 {
			qps = t.QPS
		}
		if t.SizeBytes > 0 {
			size = t.SizeBytes
		}
		c := cand{p: p}
		if p.QPS >= qps {
			since, ok := m.HotSinceMs[p.ID]
			if !ok {
				since = s.NowMs
			}
			hot[p.ID] = since
			if held := time.Duration(s.NowMs-since) * time.Millisecond; held >= o.Sustain {
				c.reason, c.over = ByLoad, p.QPS/qps
				c.why = fmt.Sprintf("%.0f reads+writes/s, over %.0f for %v", p.QPS, qps, held)
			}
		}
		// By size when it is over and the load split is not ready, is
		// cooling down, or is less pressing.
		cooling := p.SplitAtMs > 0 && s.NowMs-p.SplitAtMs < o.Cooldown.Milliseconds()
		if p.SizeBytes >= size {
			if r := float64(p.SizeBytes) / float64(size); c.reason == "" || cooling || r > c.over {
				c.reason, c.over = BySize, r
				c.why = fmt.Sprintf("%d bytes, over %d", p.SizeBytes, size)
			}
		}
		if c.reason != "" {
			cands = append(cands, c)
		}
	}
	m.HotSinceMs = hot
	slices.SortStableFunc(cands, func(a, b cand) int {
		if c := cmp.Compare(b.over, a.over); c != 0 {
			return c
		}
		return cmp.Compare(a.p.ID, b.p.ID)
	})
	count := map[string]int{}
	for _, t := range s.Tables {
		count[t.Name] = t.Partitions
	}
	inFlight, total := s.Splitting, s.TotalPartitions
	for _, c := range cands {
		p, t := c.p, tables[c.p.Table]
		maxParts := o.MaxPartitions
		if t.MaxPartitions > 0 {
			maxParts = t.MaxPartitions
		}
		note := func(format string, args ...any) {
			out.Notes = append(out.Notes, Note{Partition: p.ID, Why: c.why + ": " + fmt.Sprintf(format, args...)})
		}
		switch {
		case p.Busy:
			note("a split or move is pending")
			continue
		case count[t.Name] >= maxParts:
			note("table %s has %d partitions, its maximum", t.Name, count[t.Name])
			continue
		case s.MaxTotalPartitions > 0 && total >= s.MaxTotalPartitions:
			note("the cluster has %d partitions, its limit", total)
			continue
		case c.reason == ByLoad && p.SplitAtMs > 0 && s.NowMs-p.SplitAtMs < o.Cooldown.Milliseconds():
			// (A cooling partition over its size splits by size, above.)
			note("split %v ago; cooling down for %v", time.Duration(s.NowMs-p.SplitAtMs)*time.Millisecond, o.Cooldown)
			continue
		}
		sp, ok := point(p, t.Ordered, c.reason)
		if !ok {
			note("no split point: its primary reported no %s hint", c.reason)
			continue
		}
		if inFlight >= o.MaxConcurrent {
			note("%d splits in flight, the cluster's limit", inFlight)
			continue
		}
		sp.Reason, sp.Why = c.reason, c.why
		out.Splits = append(out.Splits, sp)
		inFlight++
		count[t.Name]++
		total++
	}
	return out
}

// point is where p splits for reason: its hint if it is inside p's range,
// else a point partition's midpoint; ok false when there is none.
func point(p *Partition, ordered bool, reason Reason) (Split, bool) {
	h := p.LoadHint
	if reason == BySize {
		h = p.SizeHint
	}
	if ordered {
		if h == nil {
			return Split{}, false
		}
		k := GroupStart(h.Key)
		if len(k) == 0 || bytes.Compare(k, p.KeyStart) <= 0 || len(p.KeyEnd) > 0 && bytes.Compare(k, p.KeyEnd) >= 0 {
			return Split{}, false
		}
		return Split{Partition: p.ID, Key: k}, true
	}
	if reason == ByLoad && h != nil && h.Hash > p.Start && h.Hash <= p.End {
		return Split{Partition: p.ID, Hash: h.Hash}, true
	}
	if p.Start == p.End {
		return Split{}, false
	}
	return Split{Partition: p.ID, Hash: Midpoint(p.Start, p.End)}, true
}

// Midpoint is the first hash of the right half of hash range [start,
// end] (tablemaster's default split point).
func Midpoint(start, end uint64) uint64 { return start + (end-start)/2 + 1 }

// GroupStart is the split point an automatic split of an ordered table
// uses for key k: k itself, unless k is an Azure Table entity key
// (frontend/entity.Key: the PartitionKey with each 0x00 written 0x00
// 0xFF, then 0x00 0x01, then the RowKey), which is cut back to its
// PartitionKey's first key, so the entities of one PartitionKey (an
// entity group transaction's scope) always stay in one partition. Other
// keys seldom hold 0x00 0x01; cutting them there is still a split point.
func GroupStart(k []byte) []byte {
	for i := 0; i+1 < len(k); i++ {
		if k[i] != 0 {
			continue
		}
		if k[i+1] == 0x01 {
			return k[:i+2]
		}
		i++ // an escaped 0x00 (0x00 0xFF)
	}
	return k
}
