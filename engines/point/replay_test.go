package point

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/diskstore"
	"github.com/tabuladb/tabula/engines/enginetest"
	"github.com/tabuladb/tabula/engines/vfs"
)

// copyDir copies the files of src into a new directory (a crash image of
// an open store whose writes were synced).
func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, de := range ents {
		in, err := os.Open(filepath.Join(src, de.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out, err := os.Create(filepath.Join(dst, de.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(out, in); err != nil {
			t.Fatal(err)
		}
		in.Close()
		if err := out.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// TestReplayTailAfterBlocks: a crash image whose log holds, after its last
// index block, thousands of overwrites, deletes and new keys (more than
// one replay batch, so the tail is replayed in several read-ahead
// batches, on the real file system, where sealed segments are mapped and
// the read-ahead reads them with pread). The reopened engine must equal
// the model, and count the same live bytes as a reopen that scans the
// whole log.
func TestReplayTailAfterBlocks(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 11))
	const base, tail = 20000, 2*replayBatchOps + 500
	dir := t.TempDir()
	clock := enginetest.NewClock()
	ds := diskstore.Options{IndexBlockBytes: 4 << 20, CacheBytes: -1, GCInterval: 1 << 62}
	e, err := OpenDisk(engines.Options{Dir: dir, Now: clock.Now, Logger: quiet}, ds)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	model := map[string]string{}
	key := func(i int) string { return fmt.Sprintf("key-%07d", i) }
	put := func(muts []engines.Mutation) {
		t.Helper()
		if err := e.Apply(muts); err != nil {
			t.Fatal(err)
		}
		for _, m := range muts {
			if m.Delete {
				delete(model, string(m.Key))
			} else {
				model[string(m.Key)] = string(m.Value)
			}
		}
	}
	val := func() []byte {
		v := make([]byte, 150+rng.IntN(100))
		for j := range v {
			v[j] = byte('a' + rng.IntN(26))
		}
		return v
	}
	for i := 0; i < base; i += 500 {
		batch := make([]engines.Mutation, 0, 500)
		for j := i; j < i+500; j++ {
			batch = append(batch, engines.Mutation{Key: []byte(key(j)), Value: val()})
		}
		put(batch)
	}
	if err := e.writeIndexBlock(); err != nil {
		t.Fatal(err)
	}
	next := base
	for range tail {
		var m engines.Mutation
		switch r := rng.IntN(10); {
		case r < 6:
			m = engines.Mutation{Key: []byte(key(rng.IntN(next))), Value: val()}
		case r < 8:
			m = engines.Mutation{Key: []byte(key(rng.IntN(next))), Delete: true}
		default:
			m = engines.Mutation{Key: []byte(key(next)), Value: val()}
			next++
		}
		put([]engines.Mutation{m})
	}
	if err := e.Sync(); err != nil {
		t.Fatal(err)
	}
	img := copyDir(t, dir)
	full := copyDir(t, dir)

	r, err := OpenDisk(engines.Options{Dir: img, Now: clock.Now, Logger: quiet}, ds)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	st, _ := r.DiskStats()
	if st.RecoveryBytes == 0 {
		t.Fatal("recovery read nothing")
	}
	for i := range next {
		k := key(i)
		v, _, err := r.Get([]byte(k))
		want, ok := model[k]
		switch {
		case !ok && !errors.Is(err, engines.ErrNotFound):
			t.Fatalf("%s: deleted, read %q, %v", k, v, err)
		case ok && (err != nil || string(v) != want):
			t.Fatalf("%s: read %d bytes, %v; want %d bytes", k, len(v), err, len(want))
		}
	}
	if got := r.Stats().Keys; got != uint64(len(model)) {
		t.Fatalf("%d keys, want %d", got, len(model))
	}
	fds := ds
	fds.IndexBlockBytes = -1
	f, err := OpenDisk(engines.Options{Dir: full, Now: clock.Now, Logger: quiet}, fds)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fst, _ := f.DiskStats()
	if st.LiveBytes != fst.LiveBytes {
		t.Fatalf("live bytes %d after the indexed recovery, %d after a full scan", st.LiveBytes, fst.LiveBytes)
	}
}

// TestIndexBlockInterval: with writes too slow to fill IndexBlockBytes, a
// block is still cut once IndexBlockInterval passed and enough changes are
// pending, so a crash replays little log; a trickle below the minimum
// makes no block.
func TestIndexBlockInterval(t *testing.T) {
	mem := vfs.NewMem()
	clock := enginetest.NewClock()
	e, err := openMemOpts(t, mem, clock, diskstore.Options{CacheBytes: -1, GCInterval: 1 << 62})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	blocks := func() int {
		names, err := mem.List(crashDir)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, name := range names {
			if filepath.Ext(name) == ".idx" {
				n++
			}
		}
		return n
	}
	start := blocks()
	for i := range 10 {
		mustPut(t, e, fmt.Sprintf("k%03d", i), "v")
	}
	clock.Advance(1000)
	mustPut(t, e, "k-late", "v")
	if got := blocks(); got != start {
		t.Fatalf("11 changes cut a block by time (%d blocks, %d before)", got, start)
	}
	for i := range 100 {
		mustPut(t, e, fmt.Sprintf("m%03d", i), "v")
	}
	if got := blocks(); got != start+1 {
		t.Fatalf("%d blocks after 111 changes and %v, want %d", got, diskstore.DefaultIndexBlockInterval, start+1)
	}
	for i := range 100 {
		mustPut(t, e, fmt.Sprintf("n%03d", i), "v")
	}
	if got := blocks(); got != start+1 {
		t.Fatalf("%d blocks: a block was cut before the interval passed", got)
	}
}

// TestSlotNotReusedBeforeRemoval: a collected segment's slot is reused only
// once its file is durably removed. Here the removal fails, new segments
// are written, and the machine crashes: the reopened store must not find
// two files of one slot (refused as corruption), and must hold every key.
func TestSlotNotReusedBeforeRemoval(t *testing.T) {
	mem := vfs.NewMem()
	clock := enginetest.NewClock()
	ds := diskstore.Options{SegmentSize: 4096, CacheBytes: -1, GCInterval: 1 << 62, MaxSpaceAmp: 1.2}
	e, err := openMemOpts(t, mem, clock, ds)
	if err != nil {
		t.Fatal(err)
	}
	model := map[string]string{}
	put := func(k, v string) {
		t.Helper()
		mustPut(t, e, k, v)
		model[k] = v
	}
	for round := range 4 {
		for i := range 40 {
			put(fmt.Sprintf("k%02d", i), fmt.Sprintf("r%d-%d-%s", round, i, pad(100)))
		}
	}
	mem.InjectAfter(0, vfs.OpRemove, nil) // the collector's first file removal fails
	if _, err := e.GC(); err == nil {
		t.Fatal("a collection whose file removal failed reported no error")
	}
	mem.ClearFaults()
	for i := range 40 { // new segments, which must not take the slot
		put(fmt.Sprintf("k%02d", i), fmt.Sprintf("after-%d-%s", i, pad(100)))
	}
	if err := e.Sync(); err != nil {
		t.Fatal(err)
	}
	mem.Crash()
	_ = e.Close()
	e, err = openMemOpts(t, mem, clock, ds)
	if err != nil {
		t.Fatalf("reopen after the crash: %v", err)
	}
	defer e.Close()
	checkModel(t, e, model, "after the crash")
}
