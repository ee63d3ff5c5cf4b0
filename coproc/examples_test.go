package coproc_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/tabuladb/tabula/coproc"
	"github.com/tabuladb/tabula/coproc/abi"
	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/internal/keyspace"
)

// table is n partitions, each its own point engine, as a table server
// hosts them.
type table struct {
	parts []*coproc.EnginePartition
	eng   []engines.Engine
}

func newTable(t *testing.T, n int) *table {
	tb := &table{}
	for i := 0; i < n; i++ {
		e := newEngine(t)
		start, end := keyspace.Range(i, n)
		tb.eng = append(tb.eng, e)
		tb.parts = append(tb.parts, coproc.PartitionFromEngine(e, coproc.PartitionInfo{ID: uint64(i + 1), Index: i, Count: n, HashStart: start, HashEnd: end, Primary: true}, nil))
	}
	return tb
}

func (tb *table) put(t *testing.T, k, v []byte) {
	i := keyspace.Index(keyspace.Hash(k), len(tb.eng))
	if err := tb.eng[i].(engines.Writer).Apply([]engines.Mutation{{Key: k, Value: v}}); err != nil {
		t.Fatal(err)
	}
}

// batch groups keys by partition: one call per partition, as a coordinator does.
func (tb *table) batch(keys [][]byte) map[int][][]byte {
	g := map[int][][]byte{}
	for _, k := range keys {
		i := keyspace.Index(keyspace.Hash(k), len(tb.eng))
		g[i] = append(g[i], k)
	}
	return g
}

func vec(xs ...float32) []byte {
	var b []byte
	for _, x := range xs {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

func TestScoreCandidates(t *testing.T) {
	r := newRuntime(t, coproc.Options{})
	k := key("score")
	man := compile(t, r, k, scoreCandidates)
	if man.Writes || !man.HasMerge("score") {
		t.Fatalf("manifest %+v", man)
	}
	tb := newTable(t, 4)
	const n, dim = 200, 8
	w := []float32{1, -1, 0.5, 2, 0, 0, 1, -0.25}
	type want struct {
		key   string
		score float64
	}
	var all []want
	var keys [][]byte
	for i := 0; i < n; i++ {
		f := make([]float32, dim)
		var s float64
		for j := range f {
			f[j] = float32((i*7+j*13)%17) - 8
			s += float64(w[j]) * float64(f[j])
		}
		kk := fmt.Sprintf("cand%03d", i)
		tb.put(t, []byte(kk), vec(f...))
		keys = append(keys, []byte(kk))
		all = append(all, want{kk, s})
	}
	keys = append(keys, []byte("missing"))
	sort.Slice(all, func(i, j int) bool {
		if all[i].score != all[j].score {
			return all[i].score > all[j].score
		}
		return all[i].key < all[j].key
	})
	const topK = 10
	input := binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, topK), dim)
	input = append(input, vec(w...)...)

	// Scatter: one call per partition, in parallel.
	groups := tb.batch(keys)
	partials := make([][]byte, len(tb.parts))
	var wg sync.WaitGroup
	for i, ks := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := r.Call(context.Background(), k, "score", coproc.CallRequest{Partition: tb.parts[i], Input: input, Keys: ks})
			if err != nil {
				t.Error(err)
				return
			}
			partials[i] = res.Output
		}()
	}
	wg.Wait()
	var nonEmpty [][]byte
	for _, p := range partials {
		if p != nil {
			nonEmpty = append(nonEmpty, p)
		}
	}
	// Gather: the module's merge at the coordinator.
	merged, err := r.Merge(context.Background(), k, "score", nonEmpty)
	if err != nil {
		t.Fatal(err)
	}
	if binary.LittleEndian.Uint32(merged) != topK {
		t.Fatalf("merged k %d", binary.LittleEndian.Uint32(merged))
	}
	items, err := abi.DecodeList(merged[4:], 0)
	if err != nil || len(items) != topK {
		t.Fatalf("merged: %d items, %v", len(items), err)
	}
	for i, it := range items {
		score := math.Float64frombits(binary.LittleEndian.Uint64(it))
		if string(it[8:]) != all[i].key || score != all[i].score {
			t.Fatalf("rank %d: %s %v, want %s %v", i, it[8:], score, all[i].key, all[i].score)
		}
	}
}

func TestFilterScan(t *testing.T) {
	r := newRuntime(t, coproc.Options{})
	k := key("filter")
	man := compile(t, r, k, filterScan)
	if man.Writes || len(man.Merges) != 0 {
		t.Fatalf("manifest %+v", man)
	}
	tb := newTable(t, 3)
	for i := 0; i < 100; i++ {
		tb.put(t, []byte(fmt.Sprintf("user%03d", i)), []byte(fmt.Sprintf("name=u%d,age=%d,city=%s", i, 20+i%50, []string{"paris", "oslo"}[i%2])))
	}
	tb.put(t, []byte("other"), []byte("name=x,age=99,city=paris"))
	query := []byte("where age>=60\nwhere city=paris\nselect name,age\n")
	rng := coproc.KeyRange{Start: []byte("user"), End: []byte("user~")}
	// Every partition, no merge export: the outputs are concatenated.
	var partials [][]byte
	for _, p := range tb.parts {
		res, err := r.Call(context.Background(), k, "filter", coproc.CallRequest{Partition: p, Input: query, Range: rng})
		if err != nil {
			t.Fatal(err)
		}
		partials = append(partials, res.Output)
	}
	merged, err := r.Merge(context.Background(), k, "filter", partials)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(merged)), "\n")
	slices.Sort(lines)
	var want []string
	for i := 0; i < 100; i++ {
		if age := 20 + i%50; age >= 60 && i%2 == 0 {
			want = append(want, fmt.Sprintf("user%03d\tname=u%d,age=%d", i, i, age))
		}
	}
	if !slices.Equal(lines, want) {
		t.Fatalf("got %q\nwant %q", lines, want)
	}
	_, err = r.Call(context.Background(), k, "filter", coproc.CallRequest{Partition: tb.parts[0], Input: []byte("frobnicate")})
	if err == nil || !strings.Contains(err.Error(), `unknown verb "frobnicate"`) {
		t.Fatalf("bad query: %v", err)
	}
}
