package point

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/diskstore"
	"github.com/tabuladb/tabula/engines/enginetest"
	"github.com/tabuladb/tabula/engines/vfs"
)

// countingFS counts the bytes read through it.
type countingFS struct {
	vfs.FS
	read atomic.Int64
}

type countingFile struct {
	vfs.File
	fs *countingFS
}

func (c *countingFS) Open(name string) (vfs.File, error) {
	f, err := c.FS.Open(name)
	if err != nil {
		return nil, err
	}
	return countingFile{f, c}, nil
}

func (c *countingFS) Create(name string) (vfs.File, error) {
	f, err := c.FS.Create(name)
	if err != nil {
		return nil, err
	}
	return countingFile{f, c}, nil
}

func (c *countingFS) OpenReadWrite(name string) (vfs.File, error) {
	f, err := c.FS.OpenReadWrite(name)
	if err != nil {
		return nil, err
	}
	return countingFile{f, c}, nil
}

func (f countingFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.File.ReadAt(p, off)
	f.fs.read.Add(int64(n))
	return n, err
}

func (f countingFile) Read(p []byte) (int, error) {
	n, err := f.File.Read(p)
	f.fs.read.Add(int64(n))
	return n, err
}

// TestReopenReadsLittle: after a close, a reopen with index blocks reads at
// most 5% of the data bytes (the blocks, no values); without them it reads
// the whole log. Both serve every key.
func TestReopenReadsLittle(t *testing.T) {
	const n, valLen = 20000, 1000
	mem := vfs.NewMem()
	clock := enginetest.NewClock()
	ds := diskstore.Options{SegmentSize: 1 << 20, IndexBlockBytes: 4 << 20, CacheBytes: -1}
	e, err := openMemOpts(t, mem, clock, ds)
	if err != nil {
		t.Fatal(err)
	}
	val := strings.Repeat("v", valLen)
	for i := 0; i < n; i += 100 {
		batch := make([]engines.Mutation, 0, 100)
		for j := i; j < i+100; j++ {
			batch = append(batch, engines.Mutation{Key: fmt.Appendf(nil, "key-%06d", j), Value: []byte(val)})
		}
		if err := e.Apply(batch); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < n; i += 10 {
		if _, err := e.Delete(fmt.Appendf(nil, "key-%06d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	data := int64(n * (valLen + 10))
	for _, blocks := range []bool{true, false} {
		cfs := &countingFS{FS: mem}
		o := ds
		if !blocks {
			o.IndexBlockBytes = -1
		}
		start := time.Now()
		e, err := openMemOpts(t, cfs, clock, o)
		if err != nil {
			t.Fatal(err)
		}
		took, read := time.Since(start), cfs.read.Load()
		st, _ := e.DiskStats()
		t.Logf("index blocks %v: reopen read %d bytes (%.1f%% of %d data bytes; store counted %d) in %v",
			blocks, read, 100*float64(read)/float64(data), data, st.RecoveryBytes, took)
		if blocks && read > data/20 {
			t.Errorf("reopen with index blocks read %d bytes, more than 5%% of %d", read, data)
		}
		if !blocks && read < data {
			t.Errorf("reopen without index blocks read %d bytes, less than the %d data bytes", read, data)
		}
		for i := range n {
			v, _, err := e.Get(fmt.Appendf(nil, "key-%06d", i))
			switch {
			case i%10 == 0 && !errors.Is(err, engines.ErrNotFound):
				t.Fatalf("deleted key %d: %v", i, err)
			case i%10 != 0 && (err != nil || string(v) != val):
				t.Fatalf("key %d: %d bytes, %v", i, len(v), err)
			}
		}
		if got := e.Stats().Keys; got != n-n/10 {
			t.Fatalf("%d keys after reopen, want %d", got, n-n/10)
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestIndexBlocksGCThenCrash runs random puts, deletes, collections, index
// blocks and reopens, then crashes (no close): records a block points at
// were relocated and their segments freed after it. Every write is
// acknowledged (fsynced), so the reopened engine must equal the model.
func TestIndexBlocksGCThenCrash(t *testing.T) {
	seed := enginetest.Seed(t)
	rounds := 10
	if testing.Short() {
		rounds = 3
	}
	for round := range rounds {
		rng := rand.New(rand.NewPCG(seed, uint64(round)))
		fs := vfs.NewMem()
		clock := enginetest.NewClock()
		ds := diskstore.Options{SegmentSize: 4096, IndexBlockBytes: 1 << 30, MaxSpaceAmp: 1.2, GCInterval: time.Hour}
		var kfs *killableFS
		open := func() *Engine {
			kfs = &killableFS{FS: fs}
			e, err := openMemOpts(t, kfs, clock, ds)
			if err != nil {
				t.Fatalf("round %d: open: %v", round, err)
			}
			return e
		}
		e := open()
		model := map[string]string{}
		freed := int64(0)
		for step := range 200 {
			// Time passes too: blocks are also cut by IndexBlockInterval.
			clock.Advance(int64(rng.IntN(60)))
			k := fmt.Sprintf("k%02d", rng.IntN(40))
			switch op := rng.IntN(20); {
			case op < 12:
				v := fmt.Sprintf("%s-%d-%s", k, step, pad(rng.IntN(200)))
				mustPut(t, e, k, v)
				model[k] = v
			case op < 15:
				if _, err := e.Delete([]byte(k)); err != nil {
					t.Fatal(err)
				}
				delete(model, k)
			case op < 17:
				if _, err := e.GC(); err != nil {
					t.Fatal(err)
				}
				st, _ := e.DiskStats()
				freed = st.GCSegmentsFreed
			case op < 19:
				if err := e.writeIndexBlock(); err != nil {
					t.Fatal(err)
				}
			default:
				if err := e.Close(); err != nil {
					t.Fatal(err)
				}
				e = open()
				checkModel(t, e, model, fmt.Sprintf("round %d step %d reopen", round, step))
			}
		}
		// Garbage and a collection after the last block, then the crash.
		for i := range 40 {
			k := fmt.Sprintf("k%02d", i)
			v := fmt.Sprintf("%s-last-%s", k, pad(rng.IntN(200)))
			mustPut(t, e, k, v)
			model[k] = v
		}
		if _, err := e.GC(); err != nil {
			t.Fatal(err)
		}
		st, _ := e.DiskStats()
		freed = st.GCSegmentsFreed
		if freed == 0 {
			t.Fatalf("round %d: nothing collected before the crash", round)
		}
		kfs.dead.Store(true)
		fs.Crash()
		_ = e.Close()
		e = open()
		checkModel(t, e, model, fmt.Sprintf("round %d after crash", round))
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func checkModel(t *testing.T, e *Engine, model map[string]string, where string) {
	t.Helper()
	for i := range 40 {
		k := fmt.Sprintf("k%02d", i)
		v, _, err := e.Get([]byte(k))
		want, ok := model[k]
		switch {
		case !ok && !errors.Is(err, engines.ErrNotFound):
			t.Fatalf("%s: deleted %s reads %q, %v", where, k, v, err)
		case ok && (err != nil || string(v) != want):
			t.Fatalf("%s: %s = %q, %v; want %q", where, k, v, err, want)
		}
	}
	n := 0
	if err := e.Scan(func(r engines.Record) error {
		if model[string(r.Key)] != string(r.Value) {
			return fmt.Errorf("scan: %s = %q, want %q", r.Key, r.Value, model[string(r.Key)])
		}
		n++
		return nil
	}); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	if n != len(model) {
		t.Fatalf("%s: scan saw %d records, want %d", where, n, len(model))
	}
	if got := e.Stats().Keys; got != uint64(len(model)) {
		t.Fatalf("%s: index holds %d keys, want %d", where, got, len(model))
	}
}

// TestIndexBlockDamage: a flipped bit in an index block (or a removed one)
// makes the reopen fall back to an earlier block or the whole log, never
// lose a key.
func TestIndexBlockDamage(t *testing.T) {
	seed := enginetest.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 0))
	for round := range 30 {
		fs := vfs.NewMem()
		clock := enginetest.NewClock()
		ds := diskstore.Options{SegmentSize: 8192, IndexBlockBytes: 2048}
		e, err := openMemOpts(t, fs, clock, ds)
		if err != nil {
			t.Fatal(err)
		}
		model := map[string]string{}
		for i := range 200 {
			k := fmt.Sprintf("k%02d", rng.IntN(40))
			if rng.IntN(4) == 0 {
				if _, err := e.Delete([]byte(k)); err != nil {
					t.Fatal(err)
				}
				delete(model, k)
				continue
			}
			v := fmt.Sprintf("%s-%d-%s", k, i, pad(rng.IntN(100)))
			mustPut(t, e, k, v)
			model[k] = v
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		var idx []string
		for _, name := range segFiles(t, fs) {
			if strings.HasSuffix(name, ".idx") {
				idx = append(idx, path.Join(crashDir, name))
			}
		}
		if len(idx) < 2 {
			t.Fatalf("round %d: %d index blocks, want a chain", round, len(idx))
		}
		name := idx[rng.IntN(len(idx))]
		if rng.IntN(3) == 0 {
			if err := fs.Remove(name); err != nil {
				t.Fatal(err)
			}
		} else {
			size, _ := fs.Stat(name)
			if err := fs.FlipBit(name, rng.Int64N(size), uint(rng.IntN(8))); err != nil {
				t.Fatal(err)
			}
		}
		e, err = openMemOpts(t, fs, clock, ds)
		if err != nil {
			t.Fatalf("round %d: reopen after damaging %s: %v", round, name, err)
		}
		checkModel(t, e, model, fmt.Sprintf("round %d: damaged %s", round, name))
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRecoveryLarge measures reopen on the real file system with and
// without index blocks: TABULA_RECOVERY_N=200000 go test -run
// TestRecoveryLarge -v ./engines/point (1 KB values; skipped by default).
func TestRecoveryLarge(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("TABULA_RECOVERY_N"))
	if n == 0 {
		t.Skip("set TABULA_RECOVERY_N to run")
	}
	dir := t.TempDir()
	clock := enginetest.NewClock()
	open := func(fs vfs.FS, blocks int64) *Engine {
		e, err := OpenDisk(engines.Options{Dir: dir, Now: clock.Now, Logger: quiet},
			diskstore.Options{FS: fs, IndexBlockBytes: blocks, CacheBytes: -1, Durability: diskstore.DurabilityLazy})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	e := open(vfs.Default, 0)
	val := strings.Repeat("v", 1000)
	for i := 0; i < n; i += 500 {
		batch := make([]engines.Mutation, 0, 500)
		for j := i; j < min(i+500, n); j++ {
			batch = append(batch, engines.Mutation{Key: fmt.Appendf(nil, "key-%09d", j), Value: []byte(val)})
		}
		if err := e.Apply(batch); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	data := int64(n) * 1013
	for _, blocks := range []int64{-1, 0} {
		cfs := &countingFS{FS: vfs.Default}
		start := time.Now()
		e := open(cfs, blocks)
		took := time.Since(start)
		t.Logf("index blocks %v: %d keys reopened in %v, read %d bytes (%.2f%% of %d data bytes)",
			blocks >= 0, e.Stats().Keys, took, cfs.read.Load(), 100*float64(cfs.read.Load())/float64(data), data)
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// killableFS is a file system a crashed process held: once dead is set,
// every operation fails, so the process's Close after a crash (tests call
// it to stop its goroutines) writes nothing the crash did not leave.
type killableFS struct {
	vfs.FS
	dead atomic.Bool
}

var errKilled = errors.New("process killed")

type killableFile struct {
	vfs.File
	fs *killableFS
}

func (k *killableFS) wrap(f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return nil, err
	}
	return killableFile{f, k}, nil
}

func (k *killableFS) Create(name string) (vfs.File, error) {
	if k.dead.Load() {
		return nil, errKilled
	}
	return k.wrap(k.FS.Create(name))
}

func (k *killableFS) Open(name string) (vfs.File, error) {
	if k.dead.Load() {
		return nil, errKilled
	}
	return k.wrap(k.FS.Open(name))
}

func (k *killableFS) OpenReadWrite(name string) (vfs.File, error) {
	if k.dead.Load() {
		return nil, errKilled
	}
	return k.wrap(k.FS.OpenReadWrite(name))
}

func (k *killableFS) Remove(name string) error {
	if k.dead.Load() {
		return errKilled
	}
	return k.FS.Remove(name)
}

func (k *killableFS) Rename(a, b string) error {
	if k.dead.Load() {
		return errKilled
	}
	return k.FS.Rename(a, b)
}

func (k *killableFS) SyncDir(dir string) error {
	if k.dead.Load() {
		return errKilled
	}
	return k.FS.SyncDir(dir)
}

func (f killableFile) Write(p []byte) (int, error) {
	if f.fs.dead.Load() {
		return 0, errKilled
	}
	return f.File.Write(p)
}

func (f killableFile) Sync() error {
	if f.fs.dead.Load() {
		return errKilled
	}
	return f.File.Sync()
}

func (f killableFile) Truncate(n int64) error {
	if f.fs.dead.Load() {
		return errKilled
	}
	return f.File.Truncate(n)
}

// TestIndexChainCompaction: while writes go on, a chain whose deltas
// outgrow its base is compacted in the background (a base replaces its
// newest block), so the chain stays short; reopens, also after a crash,
// read the compacted chain and serve every key.
func TestIndexChainCompaction(t *testing.T) {
	const n = 30000
	mem := vfs.NewMem()
	clock := enginetest.NewClock()
	ds := diskstore.Options{SegmentSize: 1 << 20, IndexBlockBytes: 64 << 10, CacheBytes: -1}
	e, err := openMemOpts(t, mem, clock, ds)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i += 100 {
		batch := make([]engines.Mutation, 0, 100)
		for j := i; j < i+100; j++ {
			batch = append(batch, engines.Mutation{Key: fmt.Appendf(nil, "key-%06d", j), Value: fmt.Appendf(nil, "v%d", j%7)})
		}
		if err := e.Apply(batch); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < n; i += 3 {
		mustPut(t, e, fmt.Sprintf("key-%06d", i), "new")
	}
	// Compaction runs behind the writes; on a loaded machine it may still
	// be at work (Close would abandon it), so let it finish first.
	st, _ := e.DiskStats()
	for deadline := time.Now().Add(30 * time.Second); st.IndexCompacting && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		st, _ = e.DiskStats()
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	names, err := mem.List(crashDir)
	if err != nil {
		t.Fatal(err)
	}
	var idx []string
	for _, name := range names {
		if strings.HasSuffix(name, ".idx") {
			idx = append(idx, name)
		}
	}
	blocks := st.LiveBytes / (64 << 10) // blocks written, about
	t.Logf("%d index files after writing ~%d blocks: %v", len(idx), blocks, idx)
	if len(idx) > 18 {
		t.Fatalf("%d index blocks kept, want a compacted chain", len(idx))
	}
	check := func(e *Engine) {
		t.Helper()
		for i := range n {
			want := fmt.Sprintf("v%d", i%7)
			if i%3 == 0 {
				want = "new"
			}
			v, _, err := e.Get(fmt.Appendf(nil, "key-%06d", i))
			if err != nil || string(v) != want {
				t.Fatalf("key %d = %q, %v; want %q", i, v, err, want)
			}
		}
	}
	reopen := func(fs vfs.FS) (*Engine, int64) {
		cfs := &countingFS{FS: fs}
		e, err := openMemOpts(t, cfs, clock, ds)
		if err != nil {
			t.Fatal(err)
		}
		return e, cfs.read.Load()
	}
	kfs := &killableFS{FS: mem}
	e, read := reopen(kfs)
	check(e)
	t.Logf("reopen read %d bytes", read)
	for i := 1; i < n; i += 3 {
		mustPut(t, e, fmt.Sprintf("key-%06d", i), "v1")
	}
	// The chain, compacted or not, survives a crash.
	kfs.dead.Store(true)
	mem.Crash()
	e2, _ := reopen(mem)
	for i := 1; i < n; i += 3 {
		if v, _, err := e2.Get(fmt.Appendf(nil, "key-%06d", i)); err != nil || string(v) != "v1" {
			t.Fatalf("key %d after crash = %q, %v", i, v, err)
		}
	}
	if err := e2.Close(); err != nil {
		t.Fatal(err)
	}
	_ = e.Close()
}
