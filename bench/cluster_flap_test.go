package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
)

func TestClusterParseDropsRejoins(t *testing.T) {
	page := `# HELP tabula_stream_secondary_drops_total Secondaries dropped.
# TYPE tabula_stream_secondary_drops_total counter
tabula_stream_secondary_drops_total 7
tabula_stream_secondary_drops_totals 99
tabula_stream_secondary_rejoins_total 6
tabula_stream_rejoin_bytes_total 12345
`
	v, err := clParseDropsRejoins(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	if v != (clDropsRejoins{drops: 7, rejoins: 6}) {
		t.Fatalf("parsed %+v, want 7 drops, 6 rejoins", v)
	}
	if _, err := clParseDropsRejoins(strings.NewReader("tabula_stream_secondary_drops_total 7\n")); err == nil {
		t.Fatal("a page without the rejoin counter parsed")
	}
	if _, err := clParseDropsRejoins(strings.NewReader(page + "tabula_stream_secondary_rejoins_total x\n")); err == nil {
		t.Fatal("a counter that is no number parsed")
	}
}

// flapSnap builds a poll: the map's replicas per partition (the first
// one primary), what each replica reported applied (negative: not
// IN_SYNC), and the counters.
func flapSnap(at time.Duration, hosts map[uint64][]string, applied map[uint64]map[string]int64, drops, rejoins float64) *clFlapSnap {
	d := &api.DescribeTableResponse{Map: &api.PartitionMap{}}
	for id, hs := range hosts {
		p := &api.Partition{Id: id}
		for i, h := range hs {
			role := api.ReplicaRole_REPLICA_ROLE_SECONDARY
			if i == 0 {
				role = api.ReplicaRole_REPLICA_ROLE_PRIMARY
			}
			p.Replicas = append(p.Replicas, &api.Replica{ServerId: h, Role: role})
		}
		d.Map.Partitions = append(d.Map.Partitions, p)
	}
	for id, by := range applied {
		for h, a := range by {
			st := api.ReplicaState_REPLICA_STATE_IN_SYNC
			if a < 0 {
				st, a = api.ReplicaState_REPLICA_STATE_CATCHING_UP, -a
			}
			d.Replicas = append(d.Replicas, &api.ReplicaStatus{PartitionId: id, ServerId: h, AppliedLsn: uint64(a), State: st})
		}
	}
	return clNewFlapSnap(time.Unix(1000, 0).Add(at), d, clDropsRejoins{drops: drops, rejoins: rejoins})
}

// One pause followed poll by poll: a partition's target is the first
// applied LSN its primary reports after the first poll (what the master
// had at the resume may predate the pause), the paused server's replicas
// are in step once at their targets, the ack sets whole once the rejoins
// have caught up with the drops, and the table full once every partition
// has its three replicas in sync at their targets.
func TestClusterFlapPause(t *testing.T) {
	hosts := map[uint64][]string{1: {"s0", "s1", "s2"}, 2: {"s1", "s2", "s3"}}
	p := &clFlapPause{victim: "s2", replicas: 3, outBase: 1, resumed: time.Unix(1000, 0), slotEnd: time.Unix(1000, 0).Add(1200 * time.Millisecond)}
	type st = map[uint64]map[string]int64
	steps := []struct {
		at                   time.Duration
		applied              st
		drops, rejoins       float64
		inStep, ackSet, full bool
	}{
		// The paused server's replicas have what their primaries
		// reported before the pause: not in step for that.
		{0, st{1: {"s0": 100, "s1": 100, "s2": 100}, 2: {"s1": 200, "s2": 200, "s3": 200}}, 5, 2, false, false, false},
		// Partition 2's primary reports afresh: its target is 260.
		{100 * time.Millisecond, st{1: {"s0": 100, "s1": 100, "s2": 100}, 2: {"s1": 260, "s2": 200, "s3": 200}}, 5, 3, false, false, false},
		// Partition 1's too (130); the counters caught up.
		{500 * time.Millisecond, st{1: {"s0": 130, "s1": 130, "s2": 120}, 2: {"s1": 300, "s2": 260, "s3": 260}}, 5, 4, false, true, false},
		// The paused server at both targets; s3 still catching up; a
		// drop within the slot: the ack sets are not whole after all.
		{time.Second, st{1: {"s0": 160, "s1": 160, "s2": 130}, 2: {"s1": 330, "s2": 300, "s3": -330}}, 6, 4, true, false, false},
		{1500 * time.Millisecond, st{1: {"s0": 190, "s1": 190, "s2": 190}, 2: {"s1": 360, "s2": 360, "s3": 360}}, 6, 5, true, true, true},
		// A drop after the slot (the next pause's) changes nothing.
		{1600 * time.Millisecond, st{1: {"s0": 190, "s1": 190, "s2": 190}, 2: {"s1": 360, "s2": 360, "s3": 360}}, 9, 5, true, true, true},
	}
	for i, s := range steps {
		p.observe(flapSnap(s.at, hosts, s.applied, s.drops, s.rejoins))
		if got := [3]bool{!p.inStep.IsZero(), !p.ackSet.IsZero(), !p.full.IsZero()}; got != [3]bool{s.inStep, s.ackSet, s.full} {
			t.Fatalf("step %d: in step, ack set, full = %v, want %v", i, got, [3]bool{s.inStep, s.ackSet, s.full})
		}
	}
	if got := [3]float64{p.since(p.inStep), p.since(p.ackSet), p.since(p.full)}; got != [3]float64{1, 1.5, 1.5} {
		t.Fatalf("in step, ack set, full after %v s, want [1 1.5 1.5]", got)
	}
	if !p.done(p.slotEnd) || p.done(p.slotEnd.Add(-time.Millisecond)) {
		t.Fatal("done before the slot's end, or not after it")
	}
	if p.target[1] != 130 || p.target[2] != 260 {
		t.Fatalf("targets %v, want 1:130 2:260", p.target)
	}
}

// A partition whose primary reports nothing new (no writes) has what it
// has as its target, once clFlapIdle has passed; a partition short of
// replicas keeps the table from being full.
func TestClusterFlapPauseIdleAndShort(t *testing.T) {
	type st = map[uint64]map[string]int64
	p := &clFlapPause{victim: "s2", replicas: 3, resumed: time.Unix(1000, 0)}
	hosts := map[uint64][]string{1: {"s0", "s2"}}
	applied := st{1: {"s0": 50, "s2": 50}}
	p.observe(flapSnap(0, hosts, applied, 0, 0))
	p.observe(flapSnap(clFlapIdle-time.Millisecond, hosts, applied, 0, 0))
	if !p.inStep.IsZero() {
		t.Fatal("in step before an idle partition's target was known")
	}
	p.observe(flapSnap(clFlapIdle, hosts, applied, 0, 0))
	if p.inStep.IsZero() || p.ackSet.IsZero() {
		t.Fatal("not in step with an idle partition at its target and no drops")
	}
	if !p.full.IsZero() {
		t.Fatal("full with 2 of 3 replicas")
	}
	if p.done(time.Unix(2000, 0)) {
		t.Fatal("done with the table short of a replica")
	}
	if got := p.since(time.Time{}); got != clFlapGiveUp.Seconds() {
		t.Fatalf("never reached counts %v s, want %v", got, clFlapGiveUp.Seconds())
	}
}

func TestClusterFlapVictim(t *testing.T) {
	part := func(servers ...string) *api.Partition {
		p := &api.Partition{}
		for i, s := range servers {
			role := api.ReplicaRole_REPLICA_ROLE_SECONDARY
			if i == 0 {
				role = api.ReplicaRole_REPLICA_ROLE_PRIMARY
			}
			p.Replicas = append(p.Replicas, &api.Replica{ServerId: s, Role: role})
		}
		return p
	}
	ids := map[string]string{"fd-0": "a", "fd-1": "b", "fd-2": "c", "fd-3": "d"}
	// Every server primary of something: c has one primary and three
	// secondaries, b one and two.
	m := &api.PartitionMap{Partitions: []*api.Partition{
		part("a", "c", "b"), part("b", "c", "a"), part("c", "a", "d"), part("d", "c", "a"), part("a", "d", "b"),
	}}
	if idx, prim, sec := clFlapVictim(m, ids, 4); idx != 2 || prim != 1 || sec != 3 {
		t.Fatalf("victim fd-%d (%d primaries, %d secondaries), want fd-2 (1, 3)", idx, prim, sec)
	}
	// A server hosting only secondaries wins, however few: d has one,
	// c (one primary) three.
	m.Partitions = []*api.Partition{part("a", "c", "d"), part("c", "a", "b"), part("a", "c", "b"), part("b", "c", "a")}
	if idx, prim, sec := clFlapVictim(m, ids, 4); idx != 3 || prim != 0 || sec != 1 {
		t.Fatalf("victim fd-%d (%d primaries, %d secondaries), want fd-3 (0, 1)", idx, prim, sec)
	}
	if idx, _, _ := clFlapVictim(&api.PartitionMap{Partitions: []*api.Partition{part("a")}}, ids, 4); idx != -1 {
		t.Fatalf("victim fd-%d of a table without secondaries", idx)
	}
}

func TestClusterQuantile(t *testing.T) {
	vs := []float64{0.5, 0.2, 3, 0.4, 0.3}
	if got := clQuantile(vs, 0.5); got != 0.4 {
		t.Fatalf("p50 %v, want 0.4", got)
	}
	if got := clQuantile(vs, 0.99); got != 3 {
		t.Fatalf("p99 %v, want 3", got)
	}
	if got := clQuantile(nil, 0.99); got != 0 {
		t.Fatalf("p99 of nothing %v, want 0", got)
	}
}

// Given-up rejoins are counted from the log as it grows, a line only
// once it is whole, and they settle a drop as a rejoin does.
func TestClusterLogCount(t *testing.T) {
	path := filepath.Join(t.TempDir(), "server.log")
	l := &clLogCount{path: path, what: clGivenUp}
	appendLog := func(s string) {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(s); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	line := `level=INFO msg="` + clGivenUp + `" extent=2` + "\n"
	appendLog("level=WARN msg=\"secondary dropped from the ack set\"\n" + line)
	half := len(line) / 2
	appendLog(line[:half])
	if n, err := l.count(); n != 1 || err != nil {
		t.Fatalf("count %d, %v; want 1 (the second line is not whole)", n, err)
	}
	appendLog(line[half:] + line)
	if n, err := l.count(); n != 3 || err != nil {
		t.Fatalf("count %d, %v; want 3", n, err)
	}
	if n, err := l.count(); n != 3 || err != nil {
		t.Fatalf("count again %d, %v; want 3", n, err)
	}

	s := &clFlapSnap{ctr: clDropsRejoins{drops: 5, rejoins: 2, givenUp: 3}}
	if s.out() != 0 {
		t.Fatalf("out %v with 5 drops, 2 rejoins, 3 given up; want 0", s.out())
	}
}
