package client

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/keyspace"
)

// evenMap is a map of n evenly cut partitions with ids 100+i, epoch 1 and a
// primary each.
func evenMap(tableID, version uint64, n int) *api.PartitionMap {
	m := &api.PartitionMap{Table: &api.Table{Name: "t", Id: tableID}, Version: version}
	for i := range n {
		start, end := keyspace.Range(i, n)
		m.Partitions = append(m.Partitions, &api.Partition{
			Id: uint64(100 + i), Start: start, End: end, Epoch: 1, Index: uint32(i),
			Replicas: []*api.Replica{{Addr: fmt.Sprintf("s%d", i%3), Role: api.ReplicaRole_REPLICA_ROLE_PRIMARY}},
		})
	}
	return m
}

func TestPartitionOf(t *testing.T) {
	m := evenMap(1, 1, 12)
	for i := range 5000 {
		key := []byte(fmt.Sprintf("key-%d", i))
		h := keyspace.Hash(key)
		p, ok := partitionOf(m, route{h: h})
		if !ok || h < p.GetStart() || h > p.GetEnd() || int(p.GetIndex()) != keyspace.Index(h, 12) {
			t.Fatalf("key %q: hash %#x routed to %v", key, h, p)
		}
	}
	// An uneven cut (partition 0 split in two) is found by range.
	s := evenMap(1, 2, 2)
	mid := s.Partitions[0].End / 2
	split := &api.PartitionMap{Table: s.Table, Version: 2, Partitions: []*api.Partition{
		{Id: 1, Start: 0, End: mid, Index: 0},
		{Id: 2, Start: mid + 1, End: s.Partitions[0].End, Index: 1},
		{Id: 3, Start: s.Partitions[1].Start, End: s.Partitions[1].End, Index: 2},
	}}
	for _, tc := range []struct {
		h  uint64
		id uint64
	}{{0, 1}, {mid, 1}, {mid + 1, 2}, {s.Partitions[0].End, 2}, {s.Partitions[1].Start, 3}, {^uint64(0), 3}} {
		if p, ok := partitionOf(split, route{h: tc.h}); !ok || p.GetId() != tc.id {
			t.Errorf("hash %#x: got %v, want partition %d", tc.h, p, tc.id)
		}
	}
	if _, ok := partitionOf(&api.PartitionMap{}, route{h: 5}); ok {
		t.Error("empty map routed a hash")
	}
}

// TestPartitionOfKeyRange: an ordered table's keys go to the partition
// whose key range holds them, by key, not hash.
func TestPartitionOfKeyRange(t *testing.T) {
	m := &api.PartitionMap{Table: &api.Table{Kind: api.TableKind_TABLE_KIND_ORDERED}, Partitions: []*api.Partition{
		{Id: 1, Index: 0, KeyEnd: []byte("g")},
		{Id: 2, Index: 1, KeyStart: []byte("g"), KeyEnd: []byte("p")},
		{Id: 3, Index: 2, KeyStart: []byte("p")},
	}}
	for _, tc := range []struct {
		key string
		id  uint64
	}{{"", 1}, {"a", 1}, {"fzzz", 1}, {"g", 2}, {"g\x00", 2}, {"ozz", 2}, {"p", 3}, {"zzzz", 3}, {"\xff\xff", 3}} {
		p, ok := partitionOf(m, routeOf([]byte(tc.key)))
		if !ok || p.GetId() != tc.id {
			t.Errorf("key %q: got %v, want partition %d", tc.key, p, tc.id)
		}
		if !inPartition(m, p, routeOf([]byte(tc.key))) {
			t.Errorf("key %q: not in the partition it routed to", tc.key)
		}
	}
	// A map with a gap (a partition missing) routes nothing into it.
	gap := &api.PartitionMap{Table: m.Table, Partitions: []*api.Partition{m.Partitions[0], m.Partitions[2]}}
	if p, ok := partitionOf(gap, routeOf([]byte("h"))); ok {
		t.Errorf("key in a gap routed to %v", p)
	}
}

func TestPrimaryOf(t *testing.T) {
	p := &api.Partition{Replicas: []*api.Replica{
		{Addr: "a", Role: api.ReplicaRole_REPLICA_ROLE_SECONDARY},
		{Addr: "b", Role: api.ReplicaRole_REPLICA_ROLE_PRIMARY},
	}}
	if r := primaryOf(p); r.GetAddr() != "b" {
		t.Errorf("primary %v, want b", r)
	}
	if r := primaryOf(&api.Partition{}); r != nil {
		t.Errorf("no replicas: primary %v", r)
	}
}

func TestStoreAndPatch(t *testing.T) {
	ts := &tableState{name: "t"}
	m1 := evenMap(1, 10, 4)
	if got := ts.store(m1); got != m1 {
		t.Fatal("first store not kept")
	}
	// An older version is refused.
	if got := ts.store(evenMap(1, 9, 4)); got != m1 {
		t.Fatal("older map replaced a newer one")
	}
	// A server's newer entry patches the cached map without changing the
	// original.
	newer := &api.Partition{Id: 102, Start: m1.Partitions[2].Start, End: m1.Partitions[2].End, Epoch: 5, Index: 2,
		Replicas: []*api.Replica{{Addr: "x", Role: api.ReplicaRole_REPLICA_ROLE_PRIMARY}}}
	if !ts.patch(newer) {
		t.Fatal("newer entry not patched in")
	}
	if m1.Partitions[2].GetEpoch() != 1 {
		t.Fatal("patch modified a stored map")
	}
	if got := ts.m.Load().Partitions[2]; got != newer {
		t.Fatalf("patched entry %v", got)
	}
	if ts.patch(&api.Partition{Id: 102, Epoch: 5}) || ts.patch(&api.Partition{Id: 999, Epoch: 9}) || ts.patch(nil) {
		t.Fatal("patched with an entry that is not newer or unknown")
	}
	// A master map of the same version but an older epoch keeps the patch;
	// a later one with a newer epoch wins.
	got := ts.store(evenMap(1, 10, 4))
	if got.Partitions[2] != newer || got.Partitions[1].GetEpoch() != 1 {
		t.Fatalf("merge lost the patched entry: %v", got.Partitions[2])
	}
	m3 := evenMap(1, 11, 4)
	m3.Partitions[2].Epoch = 6
	if got := ts.store(m3); got != m3 {
		t.Fatal("newer map with newer epochs not stored as is")
	}
	// A re-created table (new id) replaces everything.
	m4 := evenMap(2, 12, 8)
	if got := ts.store(m4); got != m4 {
		t.Fatal("re-created table's map not stored")
	}
	ts.forget()
	if ts.m.Load() != nil {
		t.Fatal("forget kept the map")
	}
}

func TestGroup(t *testing.T) {
	m := evenMap(1, 1, 12)
	var routes []route
	var idx []int
	for i := range 3000 {
		routes = append(routes, routeOf([]byte(fmt.Sprintf("k%d", i))))
		idx = append(idx, i)
	}
	groups := group(m, routes, idx)
	if len(groups) != 12 {
		t.Fatalf("%d groups, want 12", len(groups))
	}
	seen := 0
	last := -1
	for _, g := range groups {
		p, err := pickGroup(routes, g)(m)
		if err != nil {
			t.Fatal(err)
		}
		if int(p.GetIndex()) <= last {
			t.Fatal("groups not in partition order")
		}
		last = int(p.GetIndex())
		for j := 1; j < len(g); j++ {
			if g[j] <= g[j-1] {
				t.Fatal("group lost the items' order")
			}
		}
		seen += len(g)
	}
	if seen != len(idx) {
		t.Fatalf("grouped %d items of %d", seen, len(idx))
	}
	// Re-cut into 24 partitions, a 12-way group spans two: regroup.
	m24 := evenMap(1, 2, 24)
	if _, err := pickGroup(routes, groups[0])(m24); !errors.Is(err, errRegroup) {
		t.Fatalf("pick over a re-cut map: %v, want errRegroup", err)
	}
}

// A map change wakes the calls waiting to retry and cuts short the
// attempts in flight to the partitions whose entry changed, and only
// those: a failover delivered by the watch is followed at once.
func TestMapChangeWakesAndCuts(t *testing.T) {
	ts := &tableState{}
	m1 := evenMap(1, 1, 3)
	ts.store(m1)
	changed := ts.changedCh()
	p0, p1 := m1.GetPartitions()[0], m1.GetPartitions()[1]
	moved0, moved1 := ts.moved(p0), ts.moved(p1)
	if ts.moved(p0) != moved0 {
		t.Fatal("two attempts on one entry got different contexts")
	}

	// Partition 0 fails over to another server at epoch 2.
	m2 := evenMap(1, 2, 3)
	m2.Partitions[0] = &api.Partition{Id: p0.GetId(), Start: p0.GetStart(), End: p0.GetEnd(), Epoch: 2, Index: 0,
		Replicas: []*api.Replica{{Addr: "s9", Role: api.ReplicaRole_REPLICA_ROLE_PRIMARY}}}
	ts.store(m2)
	select {
	case <-changed:
	default:
		t.Fatal("a waiting call was not woken by the map change")
	}
	if !errors.Is(context.Cause(moved0), errMoved) {
		t.Fatal("the attempt to the failed-over partition was not cut short")
	}
	if moved1.Err() != nil {
		t.Fatal("an attempt to an unchanged partition was cut short")
	}
	// An attempt routed by the old entry is cut at once; by the new one not.
	if ts.moved(p0).Err() == nil {
		t.Fatal("an attempt routed by a replaced entry was not cut")
	}
	if ts.moved(m2.GetPartitions()[0]).Err() != nil {
		t.Fatal("an attempt routed by the current entry was cut")
	}

	// The wait itself: it ends on the change, long before the backoff.
	ch := ts.changedCh()
	go ts.store(evenMap(1, 3, 3))
	start := time.Now()
	if r := pauseOrChange(context.Background(), time.Now().Add(time.Minute), 30*time.Second, ch); r != pauseChanged {
		t.Fatalf("pause ended with %v, want pauseChanged", r)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("woken after %v", d)
	}
}

// A ReadAny read spreads over the replicas; after failures it tries the
// other secondaries, then the primary.
func TestReplicaFor(t *testing.T) {
	c := &Client{jitter: newJitter(1)}
	p := &api.Partition{Id: 1, Replicas: []*api.Replica{
		{Addr: "a", Role: api.ReplicaRole_REPLICA_ROLE_PRIMARY},
		{Addr: "b", Role: api.ReplicaRole_REPLICA_ROLE_SECONDARY},
		{Addr: "c", Role: api.ReplicaRole_REPLICA_ROLE_SECONDARY},
	}}
	seen := map[string]bool{}
	for range 50 {
		seen[c.replicaFor(p, map[string]bool{}).GetAddr()] = true
	}
	if len(seen) != 3 {
		t.Fatalf("50 picks reached %v", seen)
	}
	tried := map[string]bool{"b": true}
	if r := c.replicaFor(p, tried); r.GetAddr() != "c" {
		t.Fatalf("after b failed: %s, want the other secondary c", r.GetAddr())
	}
	tried["c"] = true
	if r := c.replicaFor(p, tried); r.GetAddr() != "a" {
		t.Fatalf("after both secondaries failed: %s, want the primary", r.GetAddr())
	}
	tried["a"] = true
	if r := c.replicaFor(p, tried); r == nil || len(tried) != 0 {
		t.Fatalf("after every replica failed: %v with tried %v; want a fresh round", r, tried)
	}
}
