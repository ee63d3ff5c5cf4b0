//go:build wasip1

// Command score_candidates is a coprocessor that ranks candidates: each
// candidate key holds a feature vector (dim little-endian float32s), the
// input holds a weight vector, and the score is their dot product.
//
// Call "score" as a batch call over the candidate keys: on each partition
// it fetches that partition's candidates with one batch get (GetKeys), scores them
// and emits its local top k; "score__merge" merges the partitions' top k
// into the global top k at the coordinator.
//
// Input:  | k u32 | dim u32 | dim × weight f32 |
// Output: | k u32 | list of entries |, an entry being | score f64 | key |
// (the list encoding of coproc/ABI.md), best first; ties by key.
// Candidates that are absent or whose vector has another length are skipped.
package main

import (
	"bytes"
	"encoding/binary"
	"math"
	"sort"

	"github.com/tabuladb/tabula/coproc/abi"
	"github.com/tabuladb/tabula/coproc/guest"
)

type scored struct {
	key   []byte
	score float64
}

//go:wasmexport score
func score(n int32) int32 { return guest.Serve(n, scoreHandler) }

//go:wasmexport score__merge
func scoreMerge(n int32) int32 { return guest.ServeMerge(n, mergeHandler) }

func scoreHandler(c *guest.Call) error {
	in := c.Input()
	if len(in) < 8 {
		return guest.Failf(3, "score_candidates: input of %d bytes has no header", len(in))
	}
	k := int(binary.LittleEndian.Uint32(in))
	dim := int(binary.LittleEndian.Uint32(in[4:]))
	if len(in) != 8+4*dim {
		return guest.Failf(3, "score_candidates: input of %d bytes, want %d for dim %d", len(in), 8+4*dim, dim)
	}
	w := make([]float32, dim)
	for i := range w {
		w[i] = math.Float32frombits(binary.LittleEndian.Uint32(in[8+4*i:]))
	}
	keys, err := c.Keys()
	if err != nil {
		return err
	}
	values, err := c.GetKeys()
	if err != nil {
		return err
	}
	top := make([]scored, 0, len(keys))
	for i := range values.Len() {
		v := values.At(i)
		if v == nil || len(v) != 4*dim {
			continue
		}
		var s float64
		for j := range w {
			s += float64(w[j]) * float64(math.Float32frombits(binary.LittleEndian.Uint32(v[4*j:])))
		}
		top = append(top, scored{keys[i], s})
	}
	return c.Emit(encode(k, topK(top, k)))
}

func mergeHandler(c *guest.Call, partials [][]byte) error {
	var all []scored
	k := 0
	for i, p := range partials {
		pk, items, err := decode(p)
		if err != nil {
			return guest.Failf(5, "score_candidates: partial %d: %v", i, err)
		}
		k = max(k, pk)
		all = append(all, items...)
	}
	return c.Emit(encode(k, topK(all, k)))
}

func topK(s []scored, k int) []scored {
	sort.Slice(s, func(i, j int) bool {
		if s[i].score != s[j].score {
			return s[i].score > s[j].score
		}
		return bytes.Compare(s[i].key, s[j].key) < 0
	})
	if len(s) > k {
		s = s[:k]
	}
	return s
}

func encode(k int, s []scored) []byte {
	items := make([][]byte, len(s))
	for i, e := range s {
		items[i] = append(binary.LittleEndian.AppendUint64(nil, math.Float64bits(e.score)), e.key...)
	}
	return abi.AppendList(binary.LittleEndian.AppendUint32(nil, uint32(k)), items)
}

func decode(b []byte) (int, []scored, error) {
	if len(b) < 4 {
		return 0, nil, guest.ErrInvalid
	}
	items, err := abi.DecodeList(b[4:], 0)
	if err != nil {
		return 0, nil, err
	}
	s := make([]scored, 0, len(items))
	for _, it := range items {
		if len(it) < 8 {
			return 0, nil, guest.ErrInvalid
		}
		s = append(s, scored{key: it[8:], score: math.Float64frombits(binary.LittleEndian.Uint64(it))})
	}
	return int(binary.LittleEndian.Uint32(b)), s, nil
}

func main() {}
