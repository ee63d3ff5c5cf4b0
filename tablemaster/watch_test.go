package tablemaster

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tabuladb/tabula/api"
)

// watchView is what a watcher holds: maps by "tenant/name".
type watchView map[string]*api.PartitionMap

// applyWatch applies a watch response to v as a consumer must: a full map
// replaces it, a delta (from v's version, which the caller checks) drops
// removed tables whose id it holds, puts the maps it carries and patches
// the partitions of the others.
func applyWatch(v watchView, resp *api.WatchPartitionMapResponse) watchView {
	next := watchView{}
	if resp.Delta {
		next = maps.Clone(v)
		for _, r := range resp.Removed {
			k := tableKey(r.Tenant, r.Name)
			if cur := next[k]; cur != nil && cur.Table.Id == r.Id {
				delete(next, k)
			}
		}
	}
	for _, m := range resp.Maps {
		next[tableKey(m.Table.Tenant, m.Table.Name)] = m
	}
	for _, m := range resp.Patches {
		k := tableKey(m.Table.Tenant, m.Table.Name)
		pm, err := api.PatchMap(next[k], m)
		if err != nil {
			panic(err)
		}
		next[k] = pm
	}
	return next
}

// sameView reports whether a and b hold the same maps, version stamps
// aside (a delta leaves unchanged tables with the stamp they came with).
func sameView(a, b watchView) error {
	for _, k := range slices.Sorted(maps.Keys(a)) {
		if b[k] == nil {
			return fmt.Errorf("table %s held, not in the full map", k)
		}
		x, y := proto.Clone(a[k]).(*api.PartitionMap), proto.Clone(b[k]).(*api.PartitionMap)
		x.Version, y.Version = 0, 0
		if !proto.Equal(x, y) {
			return fmt.Errorf("table %s: held %v, full map %v", k, x, y)
		}
	}
	for k := range b {
		if a[k] == nil {
			return fmt.Errorf("table %s of the full map not held", k)
		}
	}
	return nil
}

// decode returns msg (an *encodedMsg or a response) as a response.
func decode(t *testing.T, msg any) *api.WatchPartitionMapResponse {
	t.Helper()
	switch m := msg.(type) {
	case *encodedMsg:
		resp := &api.WatchPartitionMapResponse{}
		if err := proto.Unmarshal(m.b, resp); err != nil {
			t.Fatal(err)
		}
		return resp
	case *api.WatchPartitionMapResponse:
		return m
	}
	t.Fatalf("message of type %T", msg)
	return nil
}

func only(v watchView, key string) watchView {
	out := watchView{}
	if m := v[key]; m != nil {
		out[key] = m
	}
	return out
}

// Random commands of every kind, published as the Master does: a watcher
// at any earlier version (the one before, or one further back, of every
// table or of one) that applies what it is sent holds exactly the full map
// of the new version.
func TestWatchDeltasMatchFullMaps(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 2))
	cur := NewState()
	mustApply(t, cur, Command{Payload: CreateTenant{Tenant: "default"}})
	cur.seal()
	mv := newMapVersion(nil, cur)
	full := map[uint64]watchView{mv.version: applyWatch(nil, decode(t, must(mv.fullMsg())))}
	keys := map[string]bool{}
	next := cowWorkload(r, func() *State { return cur }, 600)
	var deltas, merged, fulls, scoped, patches int
	for i := range 600 {
		st, res, _, err := successor(cur, next(i))
		if err != nil || !res.Changed {
			continue
		}
		if st.Version == cur.Version {
			cur = st // a stream manager command: same map version
			continue
		}
		prev := mv
		mv = newMapVersion(prev, st)
		prev.superseded()
		cur = st
		want := applyWatch(nil, decode(t, must(mv.fullMsg())))
		full[mv.version] = want
		for k := range want {
			keys[k] = true
		}
		// The watcher one version behind gets the shared delta.
		msg := must(watchMsg(mv, prev.version, true, ""))
		resp := decode(t, msg)
		patches += len(resp.Patches)
		if resp.Delta {
			deltas++
			if resp.FromVersion != prev.version || resp.Version != mv.version {
				t.Fatalf("step %d: delta %d→%d, want %d→%d", i, resp.FromVersion, resp.Version, prev.version, mv.version)
			}
			if again := must(watchMsg(mv, prev.version, true, "")); again != msg {
				t.Fatalf("step %d: the delta was encoded twice", i)
			}
		} else {
			fulls++
		}
		if err := sameView(applyWatch(full[prev.version], resp), want); err != nil {
			t.Fatalf("step %d (version %d from %d, delta %v): %v", i, mv.version, prev.version, resp.Delta, err)
		}
		// A watcher further behind, of every table or of one.
		versions := slices.Sorted(maps.Keys(full))
		have := versions[r.IntN(len(versions))]
		if have == mv.version {
			continue
		}
		resp = decode(t, must(watchMsg(mv, have, true, "")))
		if resp.Delta {
			merged++
			if resp.FromVersion != have {
				t.Fatalf("step %d: delta from %d, want from %d", i, resp.FromVersion, have)
			}
		}
		if err := sameView(applyWatch(full[have], resp), want); err != nil {
			t.Fatalf("step %d (version %d from %d, delta %v): %v", i, mv.version, have, resp.Delta, err)
		}
		ks := append(slices.Sorted(maps.Keys(keys)), "default/never")
		key := ks[r.IntN(len(ks))]
		resp = decode(t, must(watchMsg(mv, have, true, key)))
		if resp.Delta {
			scoped++
		}
		for _, m := range resp.Maps {
			if k := tableKey(m.Table.Tenant, m.Table.Name); k != key {
				t.Fatalf("step %d: watch of %s sent %s", i, key, k)
			}
		}
		if err := sameView(applyWatch(only(full[have], key), resp), only(want, key)); err != nil {
			t.Fatalf("step %d (table %s, version %d from %d, delta %v): %v", i, key, mv.version, have, resp.Delta, err)
		}
		// Without deltas: always the full map.
		if resp := decode(t, must(watchMsg(mv, have, false, ""))); resp.Delta || sameView(applyWatch(nil, resp), want) != nil {
			t.Fatalf("step %d: a watcher without deltas got %v", i, resp)
		}
	}
	t.Logf("%d versions: %d deltas (%d patched tables), %d full maps to the watcher one behind; %d merged deltas, %d of one table", len(full), deltas, patches, fulls, merged, scoped)
	if deltas < 100 || merged < 10 || scoped < 50 || patches < 50 {
		t.Fatalf("too few deltas exercised")
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// The chain of deltas stays bounded: maxDeltaHistory versions at most, and
// no more partitions than about the cluster's.
func TestWatchHistoryBounded(t *testing.T) {
	cur := NewState()
	mustApply(t, cur, Command{Payload: CreateTenant{Tenant: "default"}})
	mustApply(t, cur, register("", "h:1", ""))
	cur.seal()
	mv := newMapVersion(nil, cur)
	for i := range 3 * maxDeltaHistory {
		st, _, _, err := successor(cur, createTable("default", fmt.Sprintf("t%d", i), 1))
		if err != nil {
			t.Fatal(err)
		}
		prev := mv
		mv, cur = newMapVersion(prev, st), st
		prev.superseded()
		if prev.full != nil {
			t.Fatal("a superseded version kept its full map")
		}
	}
	n := 0
	for x := mv; x != nil; x = x.prev.Load() {
		n++
	}
	if n != maxDeltaHistory {
		t.Fatalf("history of %d versions, want %d", n, maxDeltaHistory)
	}
	// Too far behind: a full map.
	if resp := decode(t, must(watchMsg(mv, mv.version-maxDeltaHistory-1, true, ""))); resp.Delta {
		t.Fatal("a watcher behind the history got a delta")
	}
	if resp := decode(t, must(watchMsg(mv, mv.version-maxDeltaHistory+1, true, ""))); !resp.Delta || len(resp.Maps) != maxDeltaHistory-1 {
		t.Fatalf("a watcher within the history got delta %v with %d maps", resp.Delta, len(resp.Maps))
	}

	// A big table dropped and created again: every creation counts all
	// its partitions.
	cur = NewState()
	mustApply(t, cur, Command{Payload: CreateTenant{Tenant: "default"}})
	mustApply(t, cur, register("", "h:1", ""))
	mustApply(t, cur, createTable("default", "big", 500))
	cur.seal()
	mv = newMapVersion(nil, cur)
	for i := range 40 {
		cmd := Command{Payload: DropTable{Tenant: "default", Table: "big"}}
		if i%2 == 1 {
			cmd = createTable("default", "big", 500)
		}
		st, _, _, err := successor(cur, cmd)
		if err != nil {
			t.Fatal(err)
		}
		prev := mv
		mv, cur = newMapVersion(prev, st), st
	}
	n = 0
	for x := mv; x != nil; x = x.prev.Load() {
		n++
	}
	if n > 5 {
		t.Fatalf("history of %d versions creating a 500-partition table, want ≤ ~1,000 partitions", n)
	}

	// A delta of more than half the map: the full map, shared.
	cur = NewState()
	mustApply(t, cur, Command{Payload: CreateTenant{Tenant: "default"}})
	mustApply(t, cur, register("", "h:1", ""))
	mustApply(t, cur, createTable("default", "small", 1000))
	cur.seal()
	mv = newMapVersion(nil, cur)
	st, _, _, err := successor(cur, createTable("default", "big", 2000))
	if err != nil {
		t.Fatal(err)
	}
	mv = newMapVersion(mv, st)
	if msg := must(watchMsg(mv, mv.from, true, "")); decode(t, msg).Delta || msg != must(mv.fullMsg()) {
		t.Fatal("a delta of 2,000 of 3,000 partitions was sent instead of the shared full map")
	}
}

// Over gRPC: a watcher that asks for deltas gets a full map, then deltas;
// one that reconnects from a version in the history gets a delta from it;
// one that does not ask gets full maps (through the encoding codec); a
// restarted master has no history and sends a full map.
func TestWatchDeltasGRPC(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dir := t.TempDir()
	r := start(t, Options{DataDir: dir, Now: newFakeClock().Now})
	c := r.c
	if _, err := c.RegisterServer(ctx, &api.RegisterServerRequest{Addr: "127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	create := func(name string) uint64 {
		t.Helper()
		resp, err := c.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: name, Kind: api.TableKind_TABLE_KIND_POINT,
			Options: &api.TableOptions{Partitions: 4, Storage: "memory"}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Map.Version
	}
	v1 := create("a")
	dw, err := c.WatchPartitionMap(ctx, &api.WatchPartitionMapRequest{Deltas: true})
	if err != nil {
		t.Fatal(err)
	}
	fw, err := c.WatchPartitionMap(ctx, &api.WatchPartitionMapRequest{})
	if err != nil {
		t.Fatal(err)
	}
	recv := func(w api.Master_WatchPartitionMapClient, version uint64) *api.WatchPartitionMapResponse {
		t.Helper()
		for {
			resp, err := w.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if resp.Version >= version {
				return resp
			}
		}
	}
	first := recv(dw, v1)
	if first.Delta || len(first.Maps) != 1 || first.Maps[0].Table.Name != "a" {
		t.Fatalf("first message %v, want the full map", first)
	}
	view := applyWatch(nil, first)
	v2 := create("b")
	d := recv(dw, v2)
	if !d.Delta || d.FromVersion != first.Version || len(d.Maps) != 1 || d.Maps[0].Table.Name != "b" || len(d.Removed) != 0 {
		t.Fatalf("after a create: %v, want a delta of table b from %d", d, first.Version)
	}
	view = applyWatch(view, d)
	if _, err := c.DropTable(ctx, &api.DropTableRequest{Tenant: api.DefaultTenant, Name: "a"}); err != nil {
		t.Fatal(err)
	}
	v3 := r.m.State().Version
	d = recv(dw, v3)
	if !d.Delta || d.FromVersion != v2 || len(d.Maps) != 0 || len(d.Removed) != 1 || d.Removed[0].Name != "a" {
		t.Fatalf("after a drop: %v, want a delta removing a", d)
	}
	view = applyWatch(view, d)
	f := recv(fw, v3)
	if f.Delta || len(f.Maps) != 1 || f.Maps[0].Table.Name != "b" {
		t.Fatalf("watcher without deltas got %v", f)
	}
	if err := sameView(view, applyWatch(nil, f)); err != nil {
		t.Fatal(err)
	}
	// Reconnecting from v1 (a, no b): one delta to v3.
	dw2, err := c.WatchPartitionMap(ctx, &api.WatchPartitionMapRequest{AfterVersion: v1, Deltas: true})
	if err != nil {
		t.Fatal(err)
	}
	d = recv(dw2, v3)
	if !d.Delta || d.FromVersion != v1 || d.Version != v3 || len(d.Maps) != 1 || len(d.Removed) != 1 {
		t.Fatalf("reconnect from %d: %v, want one delta adding b and removing a", v1, d)
	}
	r.stop(t)

	// A restarted master has the deltas since the version it opened at
	// only: a full map to a watcher at an earlier one.
	r = start(t, Options{DataDir: dir, Now: newFakeClock().Now})
	defer r.stop(t)
	c = r.c
	v4 := create("c")
	dw3, err := c.WatchPartitionMap(ctx, &api.WatchPartitionMapRequest{AfterVersion: v2, Deltas: true})
	if err != nil {
		t.Fatal(err)
	}
	if f := recv(dw3, v4); f.Delta || len(f.Maps) != 2 {
		t.Fatalf("after a restart: %v, want the full map of b and c", f)
	}
	dw4, err := c.WatchPartitionMap(ctx, &api.WatchPartitionMapRequest{AfterVersion: v3, Deltas: true})
	if err != nil {
		t.Fatal(err)
	}
	if d := recv(dw4, v4); !d.Delta || d.FromVersion != v3 || len(d.Maps) != 1 {
		t.Fatalf("after a restart, from the version it opened at: %v, want a delta adding c", d)
	}
}

// BenchmarkWatchFullMarshal is what sharing the encoded full map saves per
// watcher and version: one marshal of a 200-table x 100-partition map
// (20,000 partitions on 200 servers), which caching the response object
// alone would still pay for every watcher.
func BenchmarkWatchFullMarshal(b *testing.B) {
	st := NewState()
	if _, err := st.Apply(Command{Payload: CreateTenant{Tenant: "default"}}); err != nil {
		b.Fatal(err)
	}
	for i := range 200 {
		if _, err := st.Apply(register("", fmt.Sprintf("10.0.0.%d:7401", i), "")); err != nil {
			b.Fatal(err)
		}
	}
	for i := range 200 {
		if _, err := st.Apply(createTable("default", fmt.Sprintf("t%d", i), 100)); err != nil {
			b.Fatal(err)
		}
	}
	enc := must(newMapVersion(nil, st).fullMsg())
	resp := &api.WatchPartitionMapResponse{}
	if err := proto.Unmarshal(enc.b, resp); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(len(enc.b)), "bytes/msg")
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := proto.Marshal(resp); err != nil {
			b.Fatal(err)
		}
	}
}
