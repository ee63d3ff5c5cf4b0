package point

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/diskstore"
	"github.com/tabuladb/tabula/engines/enginetest"
	"github.com/tabuladb/tabula/engines/vfs"
	"github.com/tabuladb/tabula/internal/keyspace"
)

// mutating is every MemFS operation that changes what a crash keeps.
const mutating = vfs.OpCreate | vfs.OpWrite | vfs.OpSync | vfs.OpSyncDir | vfs.OpTruncate |
	vfs.OpRename | vfs.OpRemove | vfs.OpMkdir | vfs.OpLink

const (
	splitParent = "/data/parent"
	splitLeft   = "/data/left"
	splitRight  = "/data/right"
)

// splitFixture writes a parent store over several small segments, with
// index blocks, overwrites, deletes and shared keys, closes it and returns
// its records by key.
func splitFixture(t *testing.T, fs *vfs.MemFS, clock *enginetest.Clock) map[string]string {
	t.Helper()
	e, err := OpenDisk(engines.Options{Dir: splitParent, Now: clock.Now, Logger: quiet}, splitDS(fs))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for i := range 300 {
		k := fmt.Sprintf("key%03d", i)
		mustPut(t, e, k, "v-"+k)
		want[k] = "v-" + k
		if i%4 == 0 {
			mustPut(t, e, k, "w-"+k)
			want[k] = "w-" + k
		}
		if i%9 == 0 {
			if _, err := e.Delete([]byte(k)); err != nil {
				t.Fatal(err)
			}
			delete(want, k)
		}
	}
	for _, k := range []string{"log/applied", "req/x"} {
		mustPut(t, e, engines.SharedPrefix+k, "s-"+k)
		want[engines.SharedPrefix+k] = "s-" + k
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	return want
}

func splitOpts(fs vfs.FS, clock *enginetest.Clock, dir string) engines.Options {
	return engines.Options{Dir: dir, FS: fs, Storage: StorageSSD, Now: clock.Now, Logger: quiet}
}

// splitDS is the stores' tuning: small segments and frequent index
// blocks, so that a split shares several of each; no background
// collection.
func splitDS(fs vfs.FS) diskstore.Options {
	return diskstore.Options{FS: fs, SegmentSize: 4096, IndexBlockBytes: 2048, GCInterval: time.Hour}
}

func openSplit(t *testing.T, fs vfs.FS, clock *enginetest.Clock, dir string) *Engine {
	t.Helper()
	e, err := OpenDisk(splitOpts(fs, clock, dir), splitDS(fs))
	if err != nil {
		t.Fatalf("open %s: %v", dir, err)
	}
	return e
}

func checkHolds(t *testing.T, what string, e engines.Engine, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	if err := e.Scan(func(r engines.Record) error { got[string(r.Key)] = string(r.Value); return nil }); err != nil {
		t.Fatalf("%s: scan: %v", what, err)
	}
	if len(got) != len(want) {
		t.Fatalf("%s: %d keys, want %d", what, len(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("%s: %q = %q, want %q", what, k, got[k], v)
		}
	}
}

var splitAt = uint64(1) << 63

func splitWant(want map[string]string) (l, r map[string]string) {
	l, r = map[string]string{}, map[string]string{}
	spec := engines.SplitSpec{Hash: splitAt}
	for k, v := range want {
		inL, inR := engines.SplitSide(spec, true, []byte(k), keyspace.Hash([]byte(k)))
		if inL {
			l[k] = v
		}
		if inR {
			r[k] = v
		}
	}
	return l, r
}

// TestSplitCrash fails every mutating file operation from the k-th on (a
// dead disk) during a split, for every k the split makes, crashes the file
// system, and checks that the restart finds either the split committed
// (SplitDone) with both children complete even once the parent's files are
// gone, or the parent intact, which then splits.
func TestSplitCrash(t *testing.T) {
	clock := enginetest.NewClock()
	// How many operations a whole split makes.
	fs := vfs.NewMem()
	want := splitFixture(t, fs, clock)
	wl, wr := splitWant(want)
	p := openSplit(t, fs, clock, splitParent)
	before := fs.Ops(mutating)
	l, r, err := p.Split(engines.SplitSpec{Hash: splitAt, Left: splitOpts(fs, clock, splitLeft), Right: splitOpts(fs, clock, splitRight)})
	if err != nil {
		t.Fatal(err)
	}
	total := int(fs.Ops(mutating) - before)
	checkHolds(t, "left", l, wl)
	checkHolds(t, "right", r, wr)
	if err := errors.Join(l.Close(), r.Close()); err != nil {
		t.Fatal(err)
	}

	var committed, abandoned int
	step := 1
	if testing.Short() { // the race run: every few ops, still each phase
		step = max(1, total/20)
	}
	for k := 0; k <= total; k = nextCrashPoint(k, step, total) {
		what := fmt.Sprintf("crash at op %d of %d", k, total)
		fs := vfs.NewMem()
		splitFixture(t, fs, clock)
		p := openSplit(t, fs, clock, splitParent)
		fs.Inject(vfs.Fault{Ops: mutating, After: k, Sticky: true})
		l, r, err := p.Split(engines.SplitSpec{Hash: splitAt, Left: splitOpts(fs, clock, splitLeft), Right: splitOpts(fs, clock, splitRight)})
		if err == nil {
			_ = l.Close()
			_ = r.Close()
		}
		fs.Crash()
		lf, rf, done, derr := engines.SplitDone(fs, splitParent)
		if derr != nil {
			t.Fatalf("%s: SplitDone: %v", what, derr)
		}
		if !done {
			abandoned++
			pe := openSplit(t, fs, clock, splitParent)
			checkHolds(t, what+": parent", pe, want)
			l, r, err := pe.Split(engines.SplitSpec{Hash: splitAt, Left: splitOpts(fs, clock, splitLeft), Right: splitOpts(fs, clock, splitRight)})
			if err != nil {
				t.Fatalf("%s: split again: %v", what, err)
			}
			_ = l.Close()
			_ = r.Close()
		} else {
			committed++
			if lf != splitLeft || rf != splitRight {
				t.Fatalf("%s: marker names %q, %q", what, lf, rf)
			}
		}
		if err := engines.RemoveDir(fs, splitParent); err != nil {
			t.Fatalf("%s: remove parent: %v", what, err)
		}
		fs.Crash()
		le, re := openSplit(t, fs, clock, splitLeft), openSplit(t, fs, clock, splitRight)
		checkHolds(t, what+": left", le, wl)
		checkHolds(t, what+": right", re, wr)
		if err := errors.Join(le.Close(), re.Close()); err != nil {
			t.Fatal(err)
		}
	}
	if committed == 0 || abandoned == 0 {
		t.Fatalf("%d crashes left the split committed, %d abandoned: want both", committed, abandoned)
	}
	t.Logf("%d operations: %d crashes after the commit point, %d before", total, committed, abandoned)
}

// TestSplitChildCollects: the other child's records in the shared
// segments are garbage to a child's collector, which rewrites what the
// child keeps into its own segments and drops its links to the parent's;
// the child then holds exactly its records, before and after a reopen.
func TestSplitChildCollects(t *testing.T) {
	clock := enginetest.NewClock()
	fs := vfs.NewMem()
	want := splitFixture(t, fs, clock)
	wl, wr := splitWant(want)
	p := openSplit(t, fs, clock, splitParent)
	parentSegs, _, err := diskstore.SharedFiles(fs, splitParent)
	if err != nil {
		t.Fatal(err)
	}
	l, r, err := p.Split(engines.SplitSpec{Hash: splitAt, Left: splitOpts(fs, clock, splitLeft), Right: splitOpts(fs, clock, splitRight)})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	left := l.(*Engine)
	st0, _ := left.DiskStats()
	if st0.GarbageBytes < st0.LiveBytes/2 {
		t.Fatalf("after the split the left child counts %d garbage bytes beside %d live: the right's records should be garbage", st0.GarbageBytes, st0.LiveBytes)
	}
	if _, err := left.GC(); err != nil {
		t.Fatal(err)
	}
	st1, _ := left.DiskStats()
	if st1.GarbageBytes >= st0.GarbageBytes/2 {
		t.Fatalf("garbage %d bytes before the collection, %d after", st0.GarbageBytes, st1.GarbageBytes)
	}
	names, err := fs.List(splitLeft)
	if err != nil {
		t.Fatal(err)
	}
	shared := 0
	for _, n := range names {
		for _, pn := range parentSegs {
			if n == pn && n[len(n)-4:] == ".log" {
				shared++
			}
		}
	}
	t.Logf("left child: %d of the parent's files still linked after the collection; garbage %d -> %d bytes", shared, st0.GarbageBytes, st1.GarbageBytes)
	checkHolds(t, "left after collection", left, wl)
	if err := left.Close(); err != nil {
		t.Fatal(err)
	}
	le := openSplit(t, fs, clock, splitLeft)
	defer le.Close()
	checkHolds(t, "left reopened after collection", le, wl)
	checkHolds(t, "right", r, wr)
}

// TestMergeCrash splits the fixture, writes to both children, then fails
// every mutating file operation from the k-th on during their merge, for
// every k, crashes, and checks that the restart finds either the merge
// committed (MergeDone) with the union, or both children intact.
func TestMergeCrash(t *testing.T) {
	clock := enginetest.NewClock()
	const merged = "/data/merged"
	setup := func() (*vfs.MemFS, *Engine, *Engine, map[string]string, map[string]string) {
		fs := vfs.NewMem()
		want := splitFixture(t, fs, clock)
		wl, wr := splitWant(want)
		p := openSplit(t, fs, clock, splitParent)
		l, r, err := p.Split(engines.SplitSpec{Hash: splitAt, Left: splitOpts(fs, clock, splitLeft), Right: splitOpts(fs, clock, splitRight)})
		if err != nil {
			t.Fatal(err)
		}
		left, right := l.(*Engine), r.(*Engine)
		mustPut(t, left, "after-left", "l")
		wl["after-left"] = "l"
		mustPut(t, right, engines.SharedPrefix+"log/applied", "r-lsn")
		wr[engines.SharedPrefix+"log/applied"] = "r-lsn"
		return fs, left, right, wl, wr
	}
	union := func(wl, wr map[string]string) map[string]string {
		u := map[string]string{}
		for k, v := range wl {
			u[k] = v
		}
		for k, v := range wr {
			u[k] = v
		}
		return u
	}
	fs, l, r, wl, wr := setup()
	before := fs.Ops(mutating)
	m, err := l.Merge(r, splitOpts(fs, clock, merged))
	if err != nil {
		t.Fatal(err)
	}
	total := int(fs.Ops(mutating) - before)
	checkHolds(t, "merged", m, union(wl, wr))
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	var committed, abandoned int
	samples := 40
	if testing.Short() { // the race run
		samples = 15
	}
	for k := 0; k <= total; k = nextCrashPoint(k, max(1, total/samples), total) {
		what := fmt.Sprintf("crash at op %d of %d", k, total)
		fs, l, r, wl, wr := setup()
		fs.Inject(vfs.Fault{Ops: mutating, After: k, Sticky: true})
		if m, err := l.Merge(r, splitOpts(fs, clock, merged)); err == nil {
			_ = m.Close()
		}
		fs.Crash()
		_, _, done, err := engines.MergeDone(fs, merged)
		if err != nil {
			t.Fatalf("%s: MergeDone: %v", what, err)
		}
		if done {
			committed++
			for _, d := range []string{splitLeft, splitRight, splitParent} {
				if err := engines.RemoveDir(fs, d); err != nil {
					t.Fatal(err)
				}
			}
			fs.Crash()
			me := openSplit(t, fs, clock, merged)
			checkHolds(t, what+": merged", me, union(wl, wr))
			_ = me.Close()
			continue
		}
		abandoned++
		if err := engines.RemoveDir(fs, merged); err != nil {
			t.Fatal(err)
		}
		le, re := openSplit(t, fs, clock, splitLeft), openSplit(t, fs, clock, splitRight)
		checkHolds(t, what+": left", le, wl)
		checkHolds(t, what+": right", re, wr)
		_ = le.Close()
		_ = re.Close()
	}
	if committed == 0 || abandoned == 0 {
		t.Fatalf("%d crashes left the merge committed, %d abandoned: want both", committed, abandoned)
	}
	t.Logf("%d operations: %d crashes after the commit point, %d before", total, committed, abandoned)
}

// nextCrashPoint is the crash point after k when sampling every step of
// total operations: the last two are always taken (a crash there leaves
// the split or merge committed, or all but its last sync done), whatever
// step skips.
func nextCrashPoint(k, step, total int) int {
	switch {
	case k+step < total-1:
		return k + step
	case k < total-1:
		return total - 1
	}
	return k + 1
}
