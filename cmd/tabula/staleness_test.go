package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/linearize"
)

// anyRead is one ReadAny Get a nemesis reader made: times are the
// recorder's (linearize.Recorder.Now), as in its history.
type anyRead struct {
	key, value string
	found      bool
	call, ret  int64
}

const (
	// readAnyBound is the SDK's default staleness bound for ReadAny.
	readAnyBound = time.Second
	// readAnySlack covers what the bound does not: the time from a
	// write's commit to its acknowledgement reaching the client, and from
	// the primary's commit notice to the secondary hearing it, on a
	// loaded 2-core machine.
	readAnySlack = 250 * time.Millisecond
)

// staleReads checks ReadAny reads against the history of writes: a read
// may return any value written to its key, but not one that a later
// acknowledged write had replaced more than bound before the read began,
// nor "not found" when a value written more than bound before the read
// began could not have been deleted since. Writes of unknown outcome may
// have applied at any time, so they never make a read stale (and may be
// what it returns). It returns a description of each violation.
func staleReads(hist []porcupine.Operation, reads []anyRead, bound time.Duration) []string {
	type write struct {
		call, ret int64
		value     string
		del       bool // deletes the key (Delete, or a swap that deletes)
		known     bool // acknowledged: it applied within [call, ret]
	}
	writes := map[string][]write{}
	for _, op := range hist {
		in, out := op.Input.(linearize.Input), op.Output.(linearize.Output)
		w := write{call: op.Call, ret: op.Return, known: !out.Unknown}
		switch in.Kind {
		case linearize.Put:
			w.value = in.Value
		case linearize.Delete:
			w.del = true
		case linearize.CAS:
			if w.known && !out.Swapped {
				continue // changed nothing
			}
			w.value, w.del = in.Value, in.SwapDelete
		default:
			continue
		}
		writes[in.Key] = append(writes[in.Key], w)
	}
	var out []string
	for _, r := range reads {
		cutoff := r.call - int64(bound)
		ws := writes[r.key]
		if r.found {
			var of *write
			for i := range ws {
				if !ws[i].del && ws[i].value == r.value {
					of = &ws[i]
					break
				}
			}
			if of == nil {
				out = append(out, fmt.Sprintf("ReadAny of %q at %.3fs returned %q, which no write wrote", r.key, sec(r.call), r.value))
				continue
			}
			if !of.known {
				continue
			}
			for _, w := range ws {
				if w.known && w.call > of.ret && w.ret < cutoff {
					out = append(out, fmt.Sprintf("ReadAny of %q at %.3fs returned %q (written %.3f-%.3fs), replaced by a write acknowledged at %.3fs, more than the bound before the read", r.key, sec(r.call), r.value, sec(of.call), sec(of.ret), sec(w.ret)))
					break
				}
			}
			continue
		}
		for _, w := range ws {
			if w.del || !w.known || w.ret >= cutoff {
				continue
			}
			deletable := false // a delete that may be ordered after w
			for _, d := range ws {
				if d.del && d.ret > w.call {
					deletable = true
					break
				}
			}
			if !deletable {
				out = append(out, fmt.Sprintf("ReadAny of %q at %.3fs found nothing; %q was acknowledged at %.3fs, more than the bound before, and no delete could follow it", r.key, sec(r.call), w.value, sec(w.ret)))
				break
			}
		}
	}
	return out
}

func sec(ns int64) float64 { return float64(ns) / 1e9 }

// replicasInStep reports whether every replica of table's partitions has
// applied its primary's applied LSN, with an error naming one that has
// not.
func replicasInStep(ctx context.Context, admin *client.Client, table string) (bool, error) {
	d, err := admin.DescribeTable(ctx, table)
	if err != nil {
		return false, err
	}
	applied := map[string]uint64{}
	for _, r := range d.GetReplicas() {
		applied[fmt.Sprintf("%d/%s", r.GetPartitionId(), r.GetServerId())] = r.GetAppliedLsn()
	}
	for _, p := range d.GetMap().GetPartitions() {
		want, ok := applied[fmt.Sprintf("%d/%s", p.GetId(), primaryID(p))]
		if !ok {
			return false, fmt.Errorf("partition %d: no report from its primary", p.GetId())
		}
		for _, r := range p.GetReplicas() {
			got, ok := applied[fmt.Sprintf("%d/%s", p.GetId(), r.GetServerId())]
			if !ok || got != want {
				return false, fmt.Errorf("partition %d: %s applied %d, its primary %d", p.GetId(), r.GetServerId(), got, want)
			}
		}
	}
	return true, nil
}

// TestStaleReads: the ReadAny checker flags a value replaced long before
// the read, and a miss after a long-acknowledged write, and passes reads
// within the bound or racing writes of unknown outcome.
func TestStaleReads(t *testing.T) {
	s := int64(time.Second)
	op := func(kind linearize.Kind, v string, call, ret int64, out linearize.Output) porcupine.Operation {
		return porcupine.Operation{Input: linearize.Input{Kind: kind, Key: "k", Value: v}, Call: call, Return: ret, Output: out}
	}
	hist := []porcupine.Operation{
		op(linearize.Put, "v1", 0, 1*s, linearize.Output{}),
		op(linearize.Put, "v2", 2*s, 3*s, linearize.Output{}),
		op(linearize.Put, "v3", 4*s, 10*s, linearize.Output{Unknown: true}),
	}
	for _, c := range []struct {
		name  string
		read  anyRead
		stale bool
	}{
		{"v1 within the bound of v2", anyRead{key: "k", value: "v1", found: true, call: 3*s + s/2}, false},
		{"v1 long after v2", anyRead{key: "k", value: "v1", found: true, call: 5 * s}, true},
		{"v2 while v3 is unknown", anyRead{key: "k", value: "v2", found: true, call: 20 * s}, false},
		{"a value never written", anyRead{key: "k", value: "v9", found: true, call: 5 * s}, true},
		{"a miss long after v1", anyRead{key: "k", call: 5 * s}, true},
		{"a miss within the bound of v1", anyRead{key: "k", call: 1*s + s/2}, false},
	} {
		if got := len(staleReads(hist, []anyRead{c.read}, time.Second)) > 0; got != c.stale {
			t.Errorf("%s: stale %v, want %v", c.name, got, c.stale)
		}
	}
}
