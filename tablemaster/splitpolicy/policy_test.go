package splitpolicy

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// TestDecide runs the transcripts in testdata: a cluster's tables and
// partitions are set up line by line, the clock moves with tick, and
// decide prints the splits and the notes. Rewrite the expectations with
//
//	go test ./tablemaster/splitpolicy -run TestDecide -rewrite
//
// Commands (key=value arguments):
//
//	options [size=] [qps=] [sustain=] [max-concurrent=] [cooldown=] [max-partitions=]
//	table name= [kind=point|ordered] partitions= [max=] [size=] [qps=]
//	partition id= table= [start=] [end=] [key-start=] [key-end=] [qps=] [size=]
//	          [hint=HASH|KEY] [size-hint=KEY] [busy] [split-at=MS]
//	set id= [qps=] [size=] [busy] [idle]  (changes a partition)
//	drop id=                               (a partition split or went away)
//	splitting n=                           (splits in flight)
//	cluster partitions= max=               (the cluster's partition count and limit)
//	tick [ms=]                             (default 1000)
//	decide
func TestDecide(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		var snap Snapshot
		var o Options
		var m Memory
		snap.NowMs = 1000
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			args := map[string]string{}
			for _, a := range d.CmdArgs {
				args[a.Key] = strings.Join(a.Vals, ",")
			}
			num := func(k string) float64 {
				v, ok := args[k]
				if !ok {
					return 0
				}
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					d.Fatalf(t, "%s=%s: %v", k, v, err)
				}
				return f
			}
			u64 := func(k string) uint64 {
				v, ok := args[k]
				if !ok {
					return 0
				}
				n, err := strconv.ParseUint(v, 0, 64)
				if err != nil {
					d.Fatalf(t, "%s=%s: %v", k, v, err)
				}
				return n
			}
			dur := func(k string) time.Duration {
				v, ok := args[k]
				if !ok {
					return 0
				}
				x, err := time.ParseDuration(v)
				if err != nil {
					d.Fatalf(t, "%s=%s: %v", k, v, err)
				}
				return x
			}
			find := func() *Partition {
				for i := range snap.Partitions {
					if snap.Partitions[i].ID == u64("id") {
						return &snap.Partitions[i]
					}
				}
				d.Fatalf(t, "no partition %s", args["id"])
				return nil
			}
			switch d.Cmd {
			case "options":
				o = Options{SizeBytes: u64("size"), QPS: num("qps"), Sustain: dur("sustain"), MaxConcurrent: int(num("max-concurrent")),
					Cooldown: dur("cooldown"), MaxPartitions: int(num("max-partitions"))}
				if err := o.Validate(); err != nil {
					return err.Error() + "\n"
				}
				return ""
			case "table":
				snap.Tables = append(snap.Tables, Table{Name: args["name"], Ordered: args["kind"] == "ordered", Partitions: int(num("partitions")),
					MaxPartitions: int(num("max")), SizeBytes: u64("size"), QPS: num("qps")})
				return ""
			case "partition":
				p := Partition{ID: u64("id"), Table: args["table"], Start: u64("start"), End: u64("end"),
					KeyStart: []byte(unescape(d, t, args["key-start"])), KeyEnd: []byte(unescape(d, t, args["key-end"])), QPS: num("qps"), SizeBytes: u64("size"),
					Busy: d.HasArg("busy"), SplitAtMs: int64(num("split-at"))}
				_, ordered := args["key-start"]
				if _, ok := args["end"]; !ok && !ordered {
					p.End = ^uint64(0)
				}
				if h, ok := args["hint"]; ok {
					h = unescape(d, t, h)
					p.LoadHint = &Hint{}
					if n, err := strconv.ParseUint(h, 0, 64); err == nil {
						p.LoadHint.Hash = n
					} else {
						p.LoadHint.Key = []byte(h)
					}
				}
				if h, ok := args["size-hint"]; ok {
					p.SizeHint = &Hint{Key: []byte(h)}
				}
				snap.Partitions = append(snap.Partitions, p)
				return ""
			case "set":
				p := find()
				if _, ok := args["qps"]; ok {
					p.QPS = num("qps")
				}
				if _, ok := args["size"]; ok {
					p.SizeBytes = u64("size")
				}
				if d.HasArg("busy") {
					p.Busy = true
				}
				if d.HasArg("idle") {
					p.Busy = false
				}
				return ""
			case "drop":
				p := find()
				for i := range snap.Partitions {
					if &snap.Partitions[i] == p {
						snap.Partitions = append(snap.Partitions[:i], snap.Partitions[i+1:]...)
						break
					}
				}
				return ""
			case "splitting":
				snap.Splitting = int(num("n"))
				return ""
			case "cluster":
				snap.TotalPartitions, snap.MaxTotalPartitions = int(num("partitions")), int(num("max"))
				return ""
			case "tick":
				ms := int64(1000)
				if _, ok := args["ms"]; ok {
					ms = int64(num("ms"))
				}
				snap.NowMs += ms
				return fmt.Sprintf("now %d\n", snap.NowMs)
			case "decide":
				dec := Decide(snap, o, &m)
				var b strings.Builder
				for _, s := range dec.Splits {
					at := fmt.Sprintf("%#x", s.Hash)
					if s.Key != nil {
						at = fmt.Sprintf("%q", s.Key)
					}
					fmt.Fprintf(&b, "split %d at %s by %s (%s)\n", s.Partition, at, s.Reason, s.Why)
				}
				for _, n := range dec.Notes {
					fmt.Fprintf(&b, "hold %d: %s\n", n.Partition, n.Why)
				}
				if b.Len() == 0 {
					b.WriteString("nothing\n")
				}
				return b.String()
			}
			d.Fatalf(t, "unknown command %s", d.Cmd)
			return ""
		})
	})
}

// unescape reads \xNN escapes in a transcript's key.
func unescape(d *datadriven.TestData, t *testing.T, s string) string {
	if !strings.Contains(s, `\x`) {
		return s
	}
	u, err := strconv.Unquote(`"` + s + `"`)
	if err != nil {
		d.Fatalf(t, "key %s: %v", s, err)
	}
	return u
}

// BenchmarkDecide is one round over 100,000 partitions (the cluster
// limit), 1% of them hot: the leader runs one a second.
func BenchmarkDecide(b *testing.B) {
	const n = 100000
	snap := Snapshot{NowMs: 1000, Tables: []Table{{Name: "t", Partitions: n, MaxPartitions: 2 * n}}}
	for i := range n {
		p := Partition{ID: uint64(i + 1), Table: "t", Start: uint64(i) << 40, End: uint64(i+1)<<40 - 1, QPS: 10}
		if i%100 == 0 {
			p.QPS = 5000
		}
		snap.Partitions = append(snap.Partitions, p)
	}
	var m Memory
	b.ReportAllocs()
	for b.Loop() {
		Decide(snap, Options{}, &m)
	}
}
