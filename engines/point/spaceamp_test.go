package point

import (
	"io/fs"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/diskstore"
)

// TestSpaceAmpGoal checks the collector's goal as a user measures it: after
// half the keys are overwritten and a collection pass, the bytes of every
// file in the directory over the live keys and values are within
// MaxSpaceAmp (1.15 by default), record headers and index blocks included.
func TestSpaceAmpGoal(t *testing.T) {
	n := 40_000
	if testing.Short() {
		n = 10_000
	}
	const valSize = 1024
	dir := t.TempDir()
	// Small segments and index blocks, so that this many records make the
	// shape of a large store.
	e, err := OpenDisk(engines.Options{Dir: dir, Logger: quiet}, diskstore.Options{
		SegmentSize: 1 << 20, IndexBlockBytes: 1 << 20, CacheBytes: -1, GCInterval: 1 << 62,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	rng := rand.New(rand.NewPCG(3, 4))
	key := func(i int) []byte {
		k := make([]byte, 16)
		x := rand.New(rand.NewPCG(uint64(i), 1))
		for j := range k {
			k[j] = byte(x.Uint32())
		}
		return k
	}
	write := func(ids []int) {
		batch := make([]engines.Mutation, 0, 256)
		for _, i := range ids {
			v := make([]byte, valSize)
			for j := range v {
				v[j] = byte(rng.Uint32())
			}
			batch = append(batch, engines.Mutation{Key: key(i), Value: v})
			if len(batch) == cap(batch) {
				if err := e.Apply(batch); err != nil {
					t.Fatal(err)
				}
				batch = batch[:0]
			}
		}
		if err := e.Apply(batch); err != nil {
			t.Fatal(err)
		}
	}
	all := rng.Perm(n)
	write(all)
	write(rng.Perm(n)[:n/2])
	live := float64(n * (16 + valSize))
	before := dirBytes(t, dir) / live
	if _, err := e.GC(); err != nil {
		t.Fatal(err)
	}
	if err := e.Sync(); err != nil {
		t.Fatal(err)
	}
	after := dirBytes(t, dir) / live
	t.Logf("space amplification (files / live keys+values): %.3f after the overwrite, %.3f after GC", before, after)
	if after > 1.15 {
		t.Fatalf("space amplification %.3f after GC, want <= 1.15", after)
	}
}

func dirBytes(t *testing.T, dir string) float64 {
	t.Helper()
	var total int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		total += fi.Size()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return float64(total)
}
