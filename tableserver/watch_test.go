package tableserver

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tabuladb/tabula/api"
)

// mapGen makes a random sequence of cluster maps of memory tables whose
// partitions live on srv-1..srv-3, and the deltas between them.
type mapGen struct {
	r        *rand.Rand
	version  uint64
	nextID   uint64
	nextPart uint64
	tables   map[string]*api.PartitionMap
	patches  int // tables sent as patches
}

func (g *mapGen) newTable(name string) *api.PartitionMap {
	g.nextID++
	n := 1 + g.r.IntN(4)
	m := &api.PartitionMap{Table: &api.Table{Tenant: "default", Name: name, Id: g.nextID, Kind: api.TableKind_TABLE_KIND_POINT,
		Options: &api.TableOptions{Partitions: uint32(n), Replication: 1, Storage: "memory"}}}
	for i := range n {
		g.nextPart++
		m.Partitions = append(m.Partitions, &api.Partition{Id: g.nextPart, Index: uint32(i), Start: uint64(i) << 60, End: uint64(i+1)<<60 - 1, Epoch: 1,
			Replicas: []*api.Replica{{ServerId: fmt.Sprintf("srv-%d", 1+g.r.IntN(3)), Addr: "a", Role: api.ReplicaRole_REPLICA_ROLE_PRIMARY}}})
	}
	return m
}

// step changes the map and returns the full map and the delta of the new
// version.
func (g *mapGen) step() (full, delta *api.WatchPartitionMapResponse) {
	from := g.version
	g.version++
	delta = &api.WatchPartitionMapResponse{Version: g.version, Delta: true, FromVersion: from}
	changed := map[string]*api.PartitionMap{}
	// moved holds the indexes of the partitions that moved in tables
	// changed only so: sent as patches half the time.
	moved := map[string]map[int]bool{}
	for range 1 + g.r.IntN(2) {
		name := fmt.Sprintf("t%d", g.r.IntN(6))
		cur := g.tables[name]
		switch k := g.r.IntN(5); {
		case cur == nil:
			changed[name] = g.newTable(name)
			delete(moved, name)
		case k == 0: // dropped
			delta.Removed = append(delta.Removed, &api.Table{Tenant: "default", Name: name, Id: cur.Table.Id})
			delete(g.tables, name)
			delete(changed, name)
			delete(moved, name)
		case k == 1: // dropped and created again
			delta.Removed = append(delta.Removed, &api.Table{Tenant: "default", Name: name, Id: cur.Table.Id})
			changed[name] = g.newTable(name)
			delete(moved, name)
		default: // a partition moves
			m := proto.Clone(cur).(*api.PartitionMap)
			i := g.r.IntN(len(m.Partitions))
			p := m.Partitions[i]
			p.Epoch++
			p.Replicas[0].ServerId = fmt.Sprintf("srv-%d", 1+g.r.IntN(3))
			if _, isNew := changed[name]; !isNew || moved[name] != nil {
				if moved[name] == nil {
					moved[name] = map[int]bool{}
				}
				moved[name][i] = true
			}
			changed[name] = m
		}
		if m := changed[name]; m != nil {
			g.tables[name] = m
		}
	}
	for _, name := range slices.Sorted(maps.Keys(changed)) {
		m := proto.Clone(changed[name]).(*api.PartitionMap)
		m.Version = g.version
		g.tables[name] = m
		if idx := moved[name]; idx != nil && g.r.IntN(2) == 0 {
			patch := &api.PartitionMap{Table: m.Table, Version: m.Version}
			for _, i := range slices.Sorted(maps.Keys(idx)) {
				patch.Partitions = append(patch.Partitions, m.Partitions[i])
			}
			delta.Patches = append(delta.Patches, patch)
			g.patches++
			continue
		}
		delta.Maps = append(delta.Maps, m)
	}
	// A removal of a table the watcher never held (created and dropped
	// within a merged delta) changes nothing.
	if g.r.IntN(4) == 0 {
		delta.Removed = append(delta.Removed, &api.Table{Tenant: "default", Name: "t0", Id: 999_999})
	}
	full = &api.WatchPartitionMapResponse{Version: g.version}
	for _, name := range slices.Sorted(maps.Keys(g.tables)) {
		m := proto.Clone(g.tables[name]).(*api.PartitionMap)
		m.Version = g.version
		full.Maps = append(full.Maps, m)
	}
	return full, delta
}

// sameHosting says how a (from deltas) differs from b (from full maps),
// version stamps of the maps aside.
func sameHosting(a, b *hosting) error {
	if a.version != b.version {
		return fmt.Errorf("version %d, want %d", a.version, b.version)
	}
	unstamped := func(m *api.PartitionMap) *api.PartitionMap {
		c := proto.Clone(m).(*api.PartitionMap)
		c.Version = 0
		return c
	}
	if !slices.Equal(slices.Sorted(maps.Keys(a.tables)), slices.Sorted(maps.Keys(b.tables))) {
		return fmt.Errorf("tables %v, want %v", slices.Sorted(maps.Keys(a.tables)), slices.Sorted(maps.Keys(b.tables)))
	}
	for k, m := range b.tables {
		if !proto.Equal(unstamped(a.tables[k]), unstamped(m)) {
			return fmt.Errorf("table %s: %v, want %v", k, a.tables[k], m)
		}
		for _, p := range m.Partitions {
			if !proto.Equal(a.part(p.Id), b.part(p.Id)) {
				return fmt.Errorf("partition %d: %v, want %v", p.Id, a.part(p.Id), b.part(p.Id))
			}
		}
	}
	if !slices.Equal(slices.Sorted(maps.Keys(a.replicas)), slices.Sorted(maps.Keys(b.replicas))) {
		return fmt.Errorf("replicas %v, want %v", slices.Sorted(maps.Keys(a.replicas)), slices.Sorted(maps.Keys(b.replicas)))
	}
	for id, r := range b.replicas {
		if !proto.Equal(a.replicas[id].part, r.part) || !proto.Equal(a.replicas[id].table, r.table) {
			return fmt.Errorf("replica %d: %v of %v, want %v of %v", id, a.replicas[id].part, a.replicas[id].table, r.part, r.table)
		}
	}
	if len(a.failed) != len(b.failed) {
		return fmt.Errorf("failed %v, want %v", a.failed, b.failed)
	}
	return nil
}

// A server fed a random sequence of deltas hosts exactly what a server fed
// the full maps does, keeps the replicas of tables a delta does not name
// untouched, and refuses a delta that does not start at its version.
func TestMapDeltasMatchFullMaps(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	g := &mapGen{r: rand.New(rand.NewPCG(seed, 3)), tables: map[string]*api.PartitionMap{}}
	byFull, byDelta := newDirServer(t), newDirServer(t)
	for _, s := range []*Server{byFull, byDelta} {
		id := "srv-1"
		s.serverID.Store(&id)
	}
	full, _ := g.step()
	for _, s := range []*Server{byFull, byDelta} {
		if err := s.apply(full); err != nil {
			t.Fatal(err)
		}
	}
	var hosted int
	for i := range 300 {
		full, delta := g.step()
		before := byDelta.hosting.Load()
		if i%17 == 0 || i%17 == 5 && len(delta.Patches) > 0 {
			gap := proto.Clone(delta).(*api.WatchPartitionMapResponse)
			if i%17 == 0 {
				gap.FromVersion--
			} else {
				gap.Patches[0].Table.Id++ // a table not held
			}
			if err := byDelta.apply(gap); !errors.Is(err, api.ErrMapGap) {
				t.Fatalf("step %d: a delta from %d applied to version %d: %v", i, gap.FromVersion, before.version, err)
			}
			if byDelta.hosting.Load() != before {
				t.Fatalf("step %d: a refused delta changed the hosting", i)
			}
		}
		if err := byFull.apply(full); err != nil {
			t.Fatal(err)
		}
		if err := byDelta.apply(delta); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		got, want := byDelta.hosting.Load(), byFull.hosting.Load()
		if err := sameHosting(got, want); err != nil {
			t.Fatalf("step %d (seed %d): %v", i, seed, err)
		}
		named := map[string]bool{}
		for _, m := range delta.Maps {
			named[m.Table.Name] = true
		}
		for _, r := range delta.Removed {
			named[r.Name] = true
		}
		for _, m := range delta.Patches {
			named[m.Table.Name] = true
		}
		for id, r := range before.replicas {
			if !named[r.table.Name] && got.replicas[id] != r {
				t.Fatalf("step %d: replica %d of table %s, which the delta does not name, was rebuilt", i, id, r.table.Name)
			}
		}
		hosted += len(got.replicas)
	}
	if hosted < 300 || g.patches < 30 {
		t.Fatalf("only %d replicas hosted and %d patches sent over the run: the test exercises too little", hosted, g.patches)
	}
}
