package point

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"path"
	"sync"
	"testing"
	"time"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/diskstore"
	"github.com/tabuladb/tabula/engines/enginetest"
	"github.com/tabuladb/tabula/engines/vfs"
)

func openMemOpts(t *testing.T, fs vfs.FS, clock *enginetest.Clock, ds diskstore.Options) (*Engine, error) {
	t.Helper()
	ds.FS = fs
	return OpenDisk(engines.Options{Dir: crashDir, Now: clock.Now, Logger: quiet}, ds)
}

func mustPut(t *testing.T, e *Engine, k, v string) {
	t.Helper()
	if err := e.Apply([]engines.Mutation{{Key: []byte(k), Value: []byte(v)}}); err != nil {
		t.Fatalf("put %s: %v", k, err)
	}
}

func segFiles(t *testing.T, fs vfs.FS) []string {
	t.Helper()
	names, err := fs.List(crashDir)
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// TestReopenServesData: a closed store reopens with every key, overwrite,
// delete and TTL as it was, on the real file system through engines.Open.
func TestReopenServesData(t *testing.T) {
	dir := t.TempDir()
	clock := enginetest.NewClock()
	open := func() engines.Engine {
		e, err := engines.Open(engines.KindPoint, engines.Options{Dir: dir, Storage: StorageSSD, Now: clock.Now, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	e := open()
	w := e.(engines.Writer)
	for i := range 500 {
		if err := w.Apply([]engines.Mutation{{Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "v%d", i)}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 500; i += 3 {
		if _, err := w.Delete(fmt.Appendf(nil, "k%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Apply([]engines.Mutation{{Key: []byte("k1"), Value: []byte("new")}, {Key: []byte("ttl"), Value: []byte("x"), ExpiresAt: enginetest.Start + 1000}}); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = open()
	defer e.Close()
	for i := range 500 {
		want := fmt.Sprintf("v%d", i)
		if i == 1 {
			want = "new"
		}
		v, _, err := e.Get(fmt.Appendf(nil, "k%d", i))
		switch {
		case i%3 == 0 && !errors.Is(err, engines.ErrNotFound):
			t.Fatalf("deleted k%d: %q, %v", i, v, err)
		case i%3 != 0 && (err != nil || string(v) != want):
			t.Fatalf("k%d = %q, %v; want %q", i, v, err, want)
		}
	}
	if v, exp, err := e.Get([]byte("ttl")); err != nil || string(v) != "x" || exp != enginetest.Start+1000 {
		t.Fatalf("ttl = %q %d %v", v, exp, err)
	}
	clock.Advance(1000)
	if _, _, err := e.Get([]byte("ttl")); !errors.Is(err, engines.ErrNotFound) {
		t.Fatalf("expired ttl: %v", err)
	}
	if st := e.Stats(); st.Keys != 333 {
		t.Fatalf("reopened with %d keys, want 333", st.Keys)
	}
}

// TestBitFlips flips one random bit of a synced segment and checks that
// the record is never served: reads of it fail with ErrCorrupt while open,
// and reopening fails with ErrCorrupt — except for a flip in the very last
// record of the log, which is indistinguishable from a torn write and is
// cut off (that key then reads as absent, never as a wrong value).
func TestBitFlips(t *testing.T) {
	seed := enginetest.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 0))
	for round := range 60 {
		fs := vfs.NewMem()
		clock := enginetest.NewClock()
		// No read cache: it would serve the copy checked when it was
		// written, and this test is about the reads that go to the log.
		// No index blocks: this test is about the full scan's checks (a
		// reopen from index blocks reads no values; a flip then shows as a
		// failed read, as while open).
		e, err := openMemOpts(t, fs, clock, diskstore.Options{SegmentSize: 8192, CacheBytes: -1, IndexBlockBytes: -1})
		if err != nil {
			t.Fatal(err)
		}
		vals := map[string]string{}
		for i := range 100 {
			k, v := fmt.Sprintf("k%03d", i), fmt.Sprintf("value-%d-%s", i, pad(rng.IntN(100)))
			mustPut(t, e, k, v)
			vals[k] = v
		}
		files := segFiles(t, fs)
		name := path.Join(crashDir, files[rng.IntN(len(files))])
		size, _ := fs.Stat(name)
		off := 32 + rng.Int64N(size-32) // past the segment header
		if err := fs.FlipBit(name, off, uint(rng.IntN(8))); err != nil {
			t.Fatal(err)
		}
		// While open: every key reads its value or fails with ErrCorrupt.
		bad := 0
		for k, want := range vals {
			v, _, err := e.Get([]byte(k))
			switch {
			case errors.Is(err, engines.ErrCorrupt):
				bad++
			case err != nil || string(v) != want:
				t.Fatalf("round %d: flip in %s at %d: %s = %q, %v", round, name, off, k, v, err)
			}
		}
		if bad != 1 {
			t.Fatalf("round %d: flip in %s at %d: %d reads failed, want 1", round, name, off, bad)
		}
		_ = e.Close()
		e, err = openMemOpts(t, fs, clock, diskstore.Options{SegmentSize: 8192, IndexBlockBytes: -1})
		if err == nil {
			// Only the log's last record may be cut as a torn tail.
			missing := 0
			for k, want := range vals {
				v, _, err := e.Get([]byte(k))
				switch {
				case errors.Is(err, engines.ErrNotFound):
					missing++
				case err != nil || string(v) != want:
					t.Fatalf("round %d: reopened after flip: %s = %q, %v", round, k, v, err)
				}
			}
			if missing != 1 || name != path.Join(crashDir, files[len(files)-1]) {
				t.Fatalf("round %d: flip in %s at %d reopened with %d keys missing", round, name, off, missing)
			}
			_ = e.Close()
			continue
		}
		if !errors.Is(err, engines.ErrCorrupt) {
			t.Fatalf("round %d: reopen after flip: %v, want ErrCorrupt", round, err)
		}
	}
}

// TestFullDisk: a write that hits ENOSPC fails with it, the store takes no
// more writes, and a reopen (disk freed) serves every acknowledged write.
func TestFullDisk(t *testing.T) {
	fs := vfs.NewMem()
	clock := enginetest.NewClock()
	e, err := openMemOpts(t, fs, clock, diskstore.Options{SegmentSize: 8192})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		mustPut(t, e, fmt.Sprintf("k%d", i), "v")
	}
	fs.Inject(vfs.Fault{Ops: vfs.OpWrite, Err: vfs.ErrNoSpace, Sticky: true, Torn: true})
	err = e.Apply([]engines.Mutation{{Key: []byte("full"), Value: []byte("v")}})
	if !errors.Is(err, vfs.ErrNoSpace) {
		t.Fatalf("write on a full disk: %v, want ErrNoSpace", err)
	}
	if _, _, err := e.Get([]byte("full")); !errors.Is(err, engines.ErrNotFound) {
		t.Fatalf("failed write is visible: %v", err)
	}
	if err := e.Apply([]engines.Mutation{{Key: []byte("later"), Value: []byte("v")}}); err == nil {
		t.Fatal("write after a failed sync succeeded")
	}
	if v, _, err := e.Get([]byte("k7")); err != nil || string(v) != "v" {
		t.Fatalf("read after full disk: %q, %v", v, err)
	}
	_ = e.Close()
	fs.ClearFaults()
	e, err = openMemOpts(t, fs, clock, diskstore.Options{SegmentSize: 8192})
	if err != nil {
		t.Fatalf("reopen after full disk: %v", err)
	}
	defer e.Close()
	for i := range 50 {
		if _, _, err := e.Get(fmt.Appendf(nil, "k%d", i)); err != nil {
			t.Fatalf("k%d after full disk: %v", i, err)
		}
	}
	mustPut(t, e, "after", "v")
}

// TestOtherFormatVersion: a directory written by another format version is
// refused with a clear error.
func TestOtherFormatVersion(t *testing.T) {
	fs := vfs.NewMem()
	if err := fs.MkdirAll(crashDir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := fs.Create(path.Join(crashDir, "0000000000000001.log"))
	if err != nil {
		t.Fatal(err)
	}
	hdr := make([]byte, 32)
	copy(hdr, "TABLOGSG")
	hdr[8] = 9 // version 9
	crc := crc32c(hdr[:28])
	hdr[28], hdr[29], hdr[30], hdr[31] = byte(crc), byte(crc>>8), byte(crc>>16), byte(crc>>24)
	if _, err := f.Write(hdr); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	_, err = openMemOpts(t, fs, enginetest.NewClock(), diskstore.Options{})
	if !errors.Is(err, diskstore.ErrFormatVersion) {
		t.Fatalf("open of a version-9 store: %v, want ErrFormatVersion", err)
	}
	t.Log(err)
}

// TestGCConcurrentWriters overwrites and deletes keys from several
// goroutines on small segments while the collector runs, then checks every
// live key, the space amplification after a full collection, and a reopen.
func TestGCConcurrentWriters(t *testing.T) {
	seed := enginetest.Seed(t)
	fs := vfs.NewMem()
	clock := enginetest.NewClock()
	ds := diskstore.Options{SegmentSize: 16 << 10, GCInterval: time.Millisecond, GCDutyCycle: 1}
	e, err := openMemOpts(t, fs, clock, ds)
	if err != nil {
		t.Fatal(err)
	}
	const writers, keys, ops = 4, 200, 3000
	final := make([]map[string]string, writers)
	var wg sync.WaitGroup
	for w := range writers {
		final[w] = map[string]string{}
		rng := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range ops {
				k := fmt.Sprintf("w%d-%03d", w, rng.IntN(keys))
				if rng.IntN(10) == 0 {
					if _, err := e.Delete([]byte(k)); err != nil {
						t.Error(err)
						return
					}
					delete(final[w], k)
					continue
				}
				v := fmt.Sprintf("%s-%d-%s", k, i, pad(rng.IntN(64)))
				if err := e.Apply([]engines.Mutation{{Key: []byte(k), Value: []byte(v)}}); err != nil {
					t.Error(err)
					return
				}
				final[w][k] = v
			}
		}()
	}
	wg.Wait()
	check := func(e *Engine, where string) {
		t.Helper()
		n := 0
		for w := range writers {
			for k, want := range final[w] {
				v, _, err := e.Get([]byte(k))
				if err != nil || string(v) != want {
					t.Fatalf("%s: %s = %q, %v; want %q", where, k, v, err, want)
				}
				n++
			}
		}
		if got := e.Stats().Keys; got != uint64(n) {
			t.Fatalf("%s: %d keys, want %d", where, got, n)
		}
	}
	check(e, "after writes")
	if _, err := e.GC(); err != nil {
		t.Fatal(err)
	}
	st, _ := e.DiskStats()
	t.Logf("after GC: %+v", st)
	if st.GCSegmentsFreed == 0 {
		t.Fatal("the collector freed nothing")
	}
	if st.SpaceAmp > 1.15+float64(2*ds.SegmentSize)/float64(st.LiveBytes) {
		t.Fatalf("space amplification %.2f after a full collection", st.SpaceAmp)
	}
	check(e, "after GC")
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e, err = openMemOpts(t, fs, clock, ds)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	check(e, "after reopen")
}

// TestGCDropsExpired: the collector drops expired records (and they stay
// gone after a restart, even though older versions sat in older segments).
func TestGCDropsExpired(t *testing.T) {
	fs := vfs.NewMem()
	clock := enginetest.NewClock()
	ds := diskstore.Options{SegmentSize: 4096, GCInterval: time.Hour}
	e, err := openMemOpts(t, fs, clock, ds)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		mustPut(t, e, fmt.Sprintf("k%d", i), "old-"+pad(40))
	}
	for i := range 100 {
		if err := e.Apply([]engines.Mutation{{Key: fmt.Appendf(nil, "k%d", i), Value: []byte("ttl"), ExpiresAt: enginetest.Start + 10}}); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(10)
	for range 3 {
		if _, err := e.GC(); err != nil {
			t.Fatal(err)
		}
	}
	st, _ := e.DiskStats()
	t.Logf("after GC: %+v, %d keys", st, e.Stats().Keys)
	// The head segment is never collected, so its expired keys wait.
	if e.Stats().Keys >= 100 || st.LiveBytes != 0 || st.GCSegmentsFreed == 0 {
		t.Fatalf("expired records survived the collector: %d keys, %d live bytes", e.Stats().Keys, st.LiveBytes)
	}
	_ = e.Close()
	e, err = openMemOpts(t, fs, clock, ds)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for i := range 100 {
		if v, _, err := e.Get(fmt.Appendf(nil, "k%d", i)); !errors.Is(err, engines.ErrNotFound) {
			t.Fatalf("k%d after expiry, GC and reopen: %q, %v", i, v, err)
		}
	}
}

func crc32c(b []byte) uint32 { return crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)) }

func TestOpenDurabilityOption(t *testing.T) {
	for _, d := range []string{"", "sync", "lazy"} {
		e, err := Open(engines.Options{Dir: t.TempDir(), Storage: StorageSSD, Durability: d})
		if err != nil {
			t.Fatalf("durability %q: %v", d, err)
		}
		if err := e.Apply([]engines.Mutation{{Key: []byte("k"), Value: []byte("v")}}); err != nil {
			t.Fatal(err)
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Open(engines.Options{Dir: t.TempDir(), Storage: StorageSSD, Durability: "eventually"}); err == nil {
		t.Fatal("unknown durability accepted")
	}
}

// TestBatchLargerThanSegment: a batch larger than SegmentSize gets a
// segment of its own, reads back, and survives a reopen.
func TestBatchLargerThanSegment(t *testing.T) {
	mem := vfs.NewMem()
	clock := enginetest.NewClock()
	ds := diskstore.Options{SegmentSize: 16 << 10, CacheBytes: -1}
	e, err := openMemOpts(t, mem, clock, ds)
	if err != nil {
		t.Fatal(err)
	}
	mustPut(t, e, "before", "x")
	var batch []engines.Mutation
	for i := range 100 {
		batch = append(batch, engines.Mutation{Key: fmt.Appendf(nil, "big-%03d", i), Value: bytes.Repeat([]byte{byte(i)}, 1000)})
	}
	if err := e.Apply(batch); err != nil {
		t.Fatalf("a 100 KB batch with 16 KiB segments: %v", err)
	}
	mustPut(t, e, "after", "y")
	check := func(e *Engine) {
		t.Helper()
		for i := range 100 {
			v, _, err := e.Get(fmt.Appendf(nil, "big-%03d", i))
			if err != nil || !bytes.Equal(v, bytes.Repeat([]byte{byte(i)}, 1000)) {
				t.Fatalf("big-%03d: %d bytes, %v", i, len(v), err)
			}
		}
	}
	check(e)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	mem.Crash()
	e, err = openMemOpts(t, mem, clock, ds)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	check(e)
}
