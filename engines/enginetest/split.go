package enginetest

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/vfs"
	"github.com/tabuladb/tabula/internal/keyspace"
)

// SplitHarness opens the engines of the split and merge suite.
type SplitHarness struct {
	// Open opens (creating or reopening) an engine with opts; Dir is
	// filled from NewDir, Now from the suite's clock.
	Open func(t *testing.T, opts engines.Options) engines.Engine
	// NewDir returns a path for a new engine's directory (not created);
	// "" for engines without files.
	NewDir func(t *testing.T) string
	// FS is the file system the directories are on (nil: the OS's).
	FS vfs.FS
	// Hashed says the engine splits by keyspace.Hash (point tables), else
	// by key order (ordered tables).
	Hashed bool
}

// RunSplit runs the split and merge suite: an engine implementing
// engines.Splitter and engines.Merger must pass it.
func RunSplit(t *testing.T, h SplitHarness) {
	t.Run("SplitKeys", func(t *testing.T) { testSplit(t, h, false) })
	t.Run("SplitReopenWithoutParent", func(t *testing.T) { testSplit(t, h, true) })
	t.Run("SplitEmpty", func(t *testing.T) { testSplitEmpty(t, h) })
}

type splitEnv struct {
	t     *testing.T
	h     SplitHarness
	clock *Clock
}

func (s *splitEnv) open(dir string) engines.Engine {
	s.t.Helper()
	return s.h.Open(s.t, s.opts(dir))
}

func (s *splitEnv) opts(dir string) engines.Options {
	return engines.Options{Dir: dir, Now: s.clock.Now, FS: s.h.FS}
}

func (s *splitEnv) newDir() string {
	if s.h.NewDir == nil {
		return ""
	}
	return s.h.NewDir(s.t)
}

// contents is every live record of e by key.
func contents(t *testing.T, e engines.Engine) map[string]engines.Record {
	t.Helper()
	out := map[string]engines.Record{}
	if err := e.Scan(func(r engines.Record) error {
		k := string(r.Key)
		if _, dup := out[k]; dup {
			return fmt.Errorf("key %q scanned twice", k)
		}
		out[k] = engines.Record{Key: bytes.Clone(r.Key), Value: bytes.Clone(r.Value), ExpiresAt: r.ExpiresAt}
		return nil
	}); err != nil {
		t.Fatalf("scan: %v", err)
	}
	return out
}

// same checks that e holds exactly want, by Scan and by Get.
func same(t *testing.T, what string, e engines.Engine, want map[string]engines.Record) {
	t.Helper()
	got := contents(t, e)
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			t.Fatalf("%s: key %q missing", what, k)
		}
		if !bytes.Equal(g.Value, w.Value) || g.ExpiresAt != w.ExpiresAt {
			t.Fatalf("%s: key %q = %q exp %d, want %q exp %d", what, k, g.Value, g.ExpiresAt, w.Value, w.ExpiresAt)
		}
		v, exp, err := e.Get([]byte(k))
		if err != nil || !bytes.Equal(v, w.Value) || exp != w.ExpiresAt {
			t.Fatalf("%s: Get(%q) = %q, %d, %v; want %q, %d", what, k, v, exp, err, w.Value, w.ExpiresAt)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Fatalf("%s: key %q present, want absent (%d keys, want %d)", what, k, len(got), len(want))
		}
	}
	if st := e.Stats(); int(st.Keys) < len(want) {
		t.Fatalf("%s: Stats.Keys %d < %d live keys", what, st.Keys, len(want))
	}
}

func apply(t *testing.T, e engines.Engine, ms ...engines.Mutation) {
	t.Helper()
	if err := e.(engines.Writer).Apply(ms); err != nil {
		t.Fatalf("apply: %v", err)
	}
}

func closeEngine(t *testing.T, e engines.Engine) {
	t.Helper()
	if err := e.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
}

// splitPoint is a split point between keys' halves.
func splitPoint(h SplitHarness, keys []string) engines.SplitSpec {
	if h.Hashed {
		hs := make([]uint64, len(keys))
		for i, k := range keys {
			hs[i] = keyspace.Hash([]byte(k))
		}
		slices.Sort(hs)
		return engines.SplitSpec{Hash: hs[len(hs)/2]}
	}
	ks := slices.Clone(keys)
	slices.Sort(ks)
	return engines.SplitSpec{Key: []byte(ks[len(ks)/2])}
}

func sides(h SplitHarness, spec engines.SplitSpec, want map[string]engines.Record) (l, r map[string]engines.Record) {
	l, r = map[string]engines.Record{}, map[string]engines.Record{}
	for k, v := range want {
		inL, inR := engines.SplitSide(spec, h.Hashed, []byte(k), keyspace.Hash([]byte(k)))
		if inL {
			l[k] = v
		}
		if inR {
			r[k] = v
		}
	}
	return l, r
}

func testSplit(t *testing.T, h SplitHarness, dropParent bool) {
	s := &splitEnv{t: t, h: h, clock: NewClock()}
	pdir := s.newDir()
	p := s.open(pdir)
	want := map[string]engines.Record{}
	var users []string
	put := func(e engines.Engine, k, v string, exp int64) {
		apply(t, e, engines.Mutation{Key: []byte(k), Value: []byte(v), ExpiresAt: exp})
	}
	for i := range 400 {
		k := fmt.Sprintf("user%04d", i)
		users = append(users, k)
		exp := int64(0)
		if i%7 == 0 {
			exp = Start + 60_000
		}
		put(p, k, "v1-"+k, exp)
		want[k] = engines.Record{Value: []byte("v1-" + k), ExpiresAt: exp}
	}
	// Overwrites and deletes before the split: the children must see
	// the last version only.
	for i := 0; i < 400; i += 5 {
		k := users[i]
		put(p, k, "v2-"+k, 0)
		want[k] = engines.Record{Value: []byte("v2-" + k)}
	}
	for i := 3; i < 400; i += 11 {
		apply(t, p, engines.Mutation{Key: []byte(users[i]), Delete: true})
		delete(want, users[i])
	}
	// The owner's records go to both children.
	for _, k := range []string{"log/applied", "req/a", "req/b", "probe"} {
		key := engines.SharedPrefix + k
		put(p, key, "shared-"+k, Start+90_000)
		want[key] = engines.Record{Value: []byte("shared-" + k), ExpiresAt: Start + 90_000}
	}
	spec := splitPoint(h, users)
	spec.Left, spec.Right = s.opts(s.newDir()), s.opts(s.newDir())
	l, r, err := p.(engines.Splitter).Split(spec)
	if err != nil {
		t.Fatalf("split: %v", err)
	}
	if _, _, err := p.Get([]byte(users[0])); !errors.Is(err, engines.ErrClosed) {
		t.Fatalf("parent Get after split: %v, want ErrClosed", err)
	}
	wl, wr := sides(h, spec, want)
	if len(wl) < 100 || len(wr) < 100 {
		t.Fatalf("split point leaves %d and %d keys", len(wl), len(wr))
	}
	same(t, "left", l, wl)
	same(t, "right", r, wr)
	if pdir != "" {
		lf, rf, done, err := engines.SplitDone(h.FS, pdir)
		if err != nil || !done || lf != spec.Left.Dir || rf != spec.Right.Dir {
			t.Fatalf("SplitDone = %q, %q, %v, %v", lf, rf, done, err)
		}
	}

	// Writes to each child are its own.
	lk, rk := firstKey(wl), firstKey(wr)
	put(l, lk, "left-only", 0)
	wl[lk] = engines.Record{Value: []byte("left-only")}
	put(r, rk, "right-only", 0)
	wr[rk] = engines.Record{Value: []byte("right-only")}
	applied := engines.SharedPrefix + "log/applied"
	put(l, applied, "left-lsn", 0)
	wl[applied] = engines.Record{Value: []byte("left-lsn")}
	apply(t, r, engines.Mutation{Key: []byte(engines.SharedPrefix + "req/a"), Delete: true})
	delete(wr, engines.SharedPrefix+"req/a")
	same(t, "left after writes", l, wl)
	same(t, "right after writes", r, wr)

	if pdir != "" {
		closeEngine(t, l)
		closeEngine(t, r)
		if dropParent {
			if err := engines.RemoveDir(h.FS, pdir); err != nil {
				t.Fatalf("remove parent: %v", err)
			}
		}
		l, r = s.open(spec.Left.Dir), s.open(spec.Right.Dir)
		same(t, "left reopened", l, wl)
		same(t, "right reopened", r, wr)
	}

	// TTLs kept: past the parent's expiries, the records go in both.
	s.clock.Advance(70_000)
	for _, w := range []map[string]engines.Record{wl, wr} {
		for k, v := range w {
			if v.ExpiresAt != 0 && v.ExpiresAt <= s.clock.Now() {
				delete(w, k)
			}
		}
	}
	same(t, "left after expiry", l, wl)
	same(t, "right after expiry", r, wr)

	// Merge gives back the union; right's version of shared keys.
	union := map[string]engines.Record{}
	for k, v := range wl {
		union[k] = v
	}
	for k, v := range wr {
		union[k] = v
	}
	mdir := s.newDir()
	m, err := l.(engines.Merger).Merge(r, s.opts(mdir))
	if err != nil {
		t.Fatalf("merge: %v", err)
	}
	same(t, "merged", m, union)
	if mdir != "" {
		if _, _, done, err := engines.MergeDone(h.FS, mdir); err != nil || !done {
			t.Fatalf("MergeDone = %v, %v", done, err)
		}
		closeEngine(t, m)
		if dropParent {
			for _, d := range []string{spec.Left.Dir, spec.Right.Dir} {
				if err := engines.RemoveDir(h.FS, d); err != nil {
					t.Fatalf("remove child: %v", err)
				}
			}
		}
		m = s.open(mdir)
		same(t, "merged reopened", m, union)
	}
	// A merged engine splits again.
	spec2 := splitPoint(h, users)
	spec2.Left, spec2.Right = s.opts(s.newDir()), s.opts(s.newDir())
	l2, r2, err := m.(engines.Splitter).Split(spec2)
	if err != nil {
		t.Fatalf("second split: %v", err)
	}
	w2l, w2r := sides(h, spec2, union)
	same(t, "left of the second split", l2, w2l)
	same(t, "right of the second split", r2, w2r)
	closeEngine(t, l2)
	closeEngine(t, r2)
}

func firstKey(m map[string]engines.Record) string {
	var ks []string
	for k := range m {
		if !engines.SharedKey([]byte(k)) {
			ks = append(ks, k)
		}
	}
	slices.Sort(ks)
	return ks[0]
}

func testSplitEmpty(t *testing.T, h SplitHarness) {
	s := &splitEnv{t: t, h: h, clock: NewClock()}
	p := s.open(s.newDir())
	spec := engines.SplitSpec{Hash: 1 << 63, Key: []byte("m")}
	spec.Left, spec.Right = s.opts(s.newDir()), s.opts(s.newDir())
	l, r, err := p.(engines.Splitter).Split(spec)
	if err != nil {
		t.Fatalf("split: %v", err)
	}
	same(t, "left", l, nil)
	same(t, "right", r, nil)
	apply(t, l, engines.Mutation{Key: []byte("a"), Value: []byte("1")})
	same(t, "left", l, map[string]engines.Record{"a": {Value: []byte("1")}})
	same(t, "right", r, nil)
	closeEngine(t, l)
	closeEngine(t, r)
}
