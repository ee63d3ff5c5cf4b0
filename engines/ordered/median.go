package ordered

import (
	"bytes"
	"slices"
	"sort"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/engines"
)

var _ engines.SizeMedianer = (*Engine)(nil)

// sizeMedianMinShare: a median whose share of the bytes on its left is
// outside [sizeMedianMinShare, 1-sizeMedianMinShare] is no median (the
// sstables are too few or too wide to say).
const sizeMedianMinShare = 0.25

// SizeMedian implements engines.SizeMedianer by bisecting
// EstimateDiskUsage over the user keys that bound the engine's sstables:
// O(files) keys gathered, O(log files) estimates, all from the LSM's
// metadata and the sstables' index blocks (cached). Records still in the
// memtable (the last ≤ 4 MiB written) are not counted, so an engine of a
// few MiB has no median: far below any size worth splitting at.
func (e *Engine) SizeMedian(lo, hi []byte) ([]byte, float64, int, error) {
	if !e.enter() {
		return nil, 0, 0, engines.ErrClosed
	}
	defer e.exit()
	levels, err := e.db.SSTables()
	if err != nil {
		return nil, 0, 0, wrapPebble(err)
	}
	inside := func(k []byte) bool {
		return bytes.Compare(k, lo) > 0 && (hi == nil || bytes.Compare(k, hi) < 0) && !api.IsReservedKey(k)
	}
	var cands [][]byte
	files := 0
	for _, lv := range levels {
		for _, f := range lv {
			files++
			for _, k := range [][]byte{f.Smallest.UserKey, f.Largest.UserKey} {
				if inside(k) {
					cands = append(cands, k)
				}
			}
		}
	}
	if len(cands) == 0 {
		return nil, 0, files, nil
	}
	slices.SortFunc(cands, bytes.Compare)
	cands = slices.CompactFunc(cands, func(a, b []byte) bool { return bytes.Equal(a, b) })
	end := hi
	if end == nil {
		if end, err = e.upper(); err != nil || end == nil {
			return nil, 0, files, err
		}
	}
	total, err := e.db.EstimateDiskUsage(lo, end)
	if err != nil || total == 0 {
		return nil, 0, files, wrapPebble(err)
	}
	var serr error
	i := sort.Search(len(cands), func(i int) bool {
		n, err := e.db.EstimateDiskUsage(lo, cands[i])
		if err != nil {
			serr = err
		}
		return n*2 >= total
	})
	if serr != nil {
		return nil, 0, files, wrapPebble(serr)
	}
	if i == len(cands) {
		i--
	}
	left, err := e.db.EstimateDiskUsage(lo, cands[i])
	if err != nil {
		return nil, 0, files, wrapPebble(err)
	}
	share := float64(left) / float64(total)
	if share < sizeMedianMinShare || share > 1-sizeMedianMinShare {
		return nil, share, files, nil
	}
	return bytes.Clone(cands[i]), share, files, nil
}
