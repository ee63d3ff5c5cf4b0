package stream

import (
	"cmp"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestPtreeModel compares ptree to a map over random writes, with
// versions: each step writes a new version (a new owner) or the current
// one in place, and every version keeps the contents it had.
func TestPtreeModel(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 0))
	kind := &treeKind[uint64, []int]{cmp: cmp.Compare[uint64], hash: hashU64, clone: slices.Clone[[]int]}
	type version struct {
		tr    ptree[uint64, []int]
		model map[uint64][]int
	}
	check := func(v version) {
		t.Helper()
		if v.tr.Len() != len(v.model) {
			t.Fatalf("len %d, model %d", v.tr.Len(), len(v.model))
		}
		keys := slices.Sorted(maps.Keys(v.model))
		if got := v.tr.Keys(); !slices.Equal(got, keys) {
			t.Fatalf("keys %v, model %v", got, keys)
		}
		for _, k := range keys {
			if got := *v.tr.Get(k); !slices.Equal(got, v.model[k]) {
				t.Fatalf("key %d: %v, model %v", k, got, v.model[k])
			}
		}
		from := uint64(rng.IntN(300))
		var got []uint64
		for k := range v.tr.From(from) {
			got = append(got, k)
		}
		want := slices.DeleteFunc(slices.Clone(keys), func(k uint64) bool { return k < from })
		if !slices.Equal(got, want) {
			t.Fatalf("from %d: %v, want %v", from, got, want)
		}
	}
	cur := version{newTree(kind), map[uint64][]int{}}
	o := new(owner)
	var old []version
	for step := range 20000 {
		if rng.IntN(8) == 0 { // publish: later writes copy
			model := map[uint64][]int{}
			for k, v := range cur.model {
				model[k] = slices.Clone(v)
			}
			old = append(old, version{cur.tr, model})
			o = new(owner)
		}
		k := uint64(rng.IntN(300))
		switch rng.IntN(3) {
		case 0:
			cur.tr.Set(o, k, []int{step})
			cur.model[k] = []int{step}
		case 1:
			if cur.tr.Delete(o, k) != (cur.model[k] != nil) {
				t.Fatalf("delete %d: presence differs", k)
			}
			delete(cur.model, k)
		case 2:
			if p := cur.tr.Mut(o, k); p != nil {
				(*p)[0] = -step // in place: must not show in older versions
				cur.model[k][0] = -step
			}
		}
	}
	check(cur)
	for _, v := range old {
		check(v)
	}
}
