package vfs_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/tabuladb/tabula/engines/vfs"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// readFile returns name's content, or "<absent>".
func readFile(t *testing.T, fs vfs.FS, name string) string {
	t.Helper()
	f, err := fs.Open(name)
	if errors.Is(err, os.ErrNotExist) {
		return "<absent>"
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func writeFile(t *testing.T, fs vfs.FS, name, content string, sync bool) {
	t.Helper()
	f, err := fs.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte(content)); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// newDB returns a MemFS with a durable directory /db.
func newDB(t *testing.T) *vfs.MemFS {
	t.Helper()
	fs := vfs.NewMem()
	must(t, fs.MkdirAll("/db", 0o755))
	must(t, fs.SyncDir("/"))
	return fs
}

func TestCrashDurability(t *testing.T) {
	for _, tc := range []struct {
		name string
		// run acts on a MemFS with a durable /db; want maps file -> content
		// after the crash ("<absent>" for none).
		run  func(t *testing.T, fs *vfs.MemFS)
		want map[string]string
	}{{
		name: "synced data survives, unsynced tail does not",
		run: func(t *testing.T, fs *vfs.MemFS) {
			f, err := fs.Create("/db/log")
			must(t, err)
			must(t, fs.SyncDir("/db"))
			_, err = f.Write([]byte("durable"))
			must(t, err)
			must(t, f.Sync())
			_, err = f.Write([]byte("-lost"))
			must(t, err)
		},
		want: map[string]string{"/db/log": "durable"},
	}, {
		name: "create without SyncDir vanishes though synced",
		run: func(t *testing.T, fs *vfs.MemFS) {
			writeFile(t, fs, "/db/a", "data", true)
		},
		want: map[string]string{"/db/a": "<absent>"},
	}, {
		name: "create with SyncDir but no Sync is empty",
		run: func(t *testing.T, fs *vfs.MemFS) {
			writeFile(t, fs, "/db/a", "data", false)
			must(t, fs.SyncDir("/db"))
		},
		want: map[string]string{"/db/a": ""},
	}, {
		name: "rename without SyncDir is undone",
		run: func(t *testing.T, fs *vfs.MemFS) {
			writeFile(t, fs, "/db/CURRENT", "v1", true)
			must(t, fs.SyncDir("/db"))
			writeFile(t, fs, "/db/CURRENT.tmp", "v2", true)
			must(t, fs.Rename("/db/CURRENT.tmp", "/db/CURRENT"))
		},
		want: map[string]string{"/db/CURRENT": "v1", "/db/CURRENT.tmp": "<absent>"},
	}, {
		name: "rename with SyncDir sticks",
		run: func(t *testing.T, fs *vfs.MemFS) {
			writeFile(t, fs, "/db/CURRENT", "v1", true)
			must(t, fs.SyncDir("/db"))
			writeFile(t, fs, "/db/CURRENT.tmp", "v2", true)
			must(t, fs.Rename("/db/CURRENT.tmp", "/db/CURRENT"))
			must(t, fs.SyncDir("/db"))
		},
		want: map[string]string{"/db/CURRENT": "v2", "/db/CURRENT.tmp": "<absent>"},
	}, {
		name: "remove without SyncDir is undone, with synced content",
		run: func(t *testing.T, fs *vfs.MemFS) {
			writeFile(t, fs, "/db/seg1", "old", true)
			must(t, fs.SyncDir("/db"))
			f, err := fs.OpenReadWrite("/db/seg1")
			must(t, err)
			_, err = f.Write([]byte("+unsynced"))
			must(t, err)
			must(t, fs.Remove("/db/seg1"))
		},
		want: map[string]string{"/db/seg1": "old"},
	}, {
		name: "remove with SyncDir sticks",
		run: func(t *testing.T, fs *vfs.MemFS) {
			writeFile(t, fs, "/db/seg1", "old", true)
			must(t, fs.SyncDir("/db"))
			must(t, fs.Remove("/db/seg1"))
			must(t, fs.SyncDir("/db"))
		},
		want: map[string]string{"/db/seg1": "<absent>"},
	}, {
		name: "unsynced truncate and overwrite are undone",
		run: func(t *testing.T, fs *vfs.MemFS) {
			writeFile(t, fs, "/db/a", "0123456789", true)
			must(t, fs.SyncDir("/db"))
			f, err := fs.Create("/db/a")
			must(t, err)
			_, err = f.Write([]byte("xy"))
			must(t, err)
		},
		want: map[string]string{"/db/a": "0123456789"},
	}, {
		name: "MkdirAll without parent SyncDir vanishes with its files",
		run: func(t *testing.T, fs *vfs.MemFS) {
			must(t, fs.MkdirAll("/db/sub", 0o755))
			writeFile(t, fs, "/db/sub/a", "data", true)
			must(t, fs.SyncDir("/db/sub"))
		},
		want: map[string]string{"/db/sub/a": "<absent>"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			fs := newDB(t)
			tc.run(t, fs)
			fs.Crash()
			for name, want := range tc.want {
				if got := readFile(t, fs, name); got != want {
					t.Errorf("%s after crash = %q, want %q", name, got, want)
				}
			}
		})
	}
}

func TestCrashStaleHandles(t *testing.T) {
	fs := newDB(t)
	f, err := fs.Create("/db/a")
	must(t, err)
	must(t, fs.SyncDir("/db"))
	fs.Crash()
	if _, err := f.Write([]byte("x")); !errors.Is(err, vfs.ErrCrashed) {
		t.Errorf("Write after crash: %v, want ErrCrashed", err)
	}
	if _, err := f.ReadAt(make([]byte, 1), 0); !errors.Is(err, vfs.ErrCrashed) {
		t.Errorf("ReadAt after crash: %v, want ErrCrashed", err)
	}
	if err := f.Sync(); !errors.Is(err, vfs.ErrCrashed) {
		t.Errorf("Sync after crash: %v, want ErrCrashed", err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("Close after crash: %v, want nil", err)
	}
	// A handle opened after the crash works.
	g, err := fs.OpenReadWrite("/db/a")
	must(t, err)
	_, err = g.Write([]byte("x"))
	must(t, err)
	must(t, g.Close())
}

func TestCrashKeepingPrefix(t *testing.T) {
	const synced, tail = "synced|", "0123456789abcdefghijklmnopqrstuvwxyz"
	run := func(seed uint64) (log, other string) {
		fs := newDB(t)
		f, err := fs.Create("/db/log")
		must(t, err)
		writeFile(t, fs, "/db/other", "keep", true)
		must(t, fs.SyncDir("/db"))
		_, err = f.Write([]byte(synced))
		must(t, err)
		must(t, f.Sync())
		_, err = f.Write([]byte(tail))
		must(t, err)
		g, err := fs.Create("/db/other") // truncation: not an append, reverts
		must(t, err)
		_, err = g.Write([]byte("kee"))
		must(t, err)
		fs.CrashKeepingPrefix(rand.New(rand.NewPCG(seed, 0)))
		return readFile(t, fs, "/db/log"), readFile(t, fs, "/db/other")
	}
	lengths := map[int]bool{}
	for seed := range uint64(50) {
		log, other := run(seed)
		if !strings.HasPrefix(synced+tail, log) || len(log) < len(synced) {
			t.Fatalf("seed %d: log %q is not synced content plus a prefix of the tail", seed, log)
		}
		if other != "keep" {
			t.Fatalf("seed %d: other = %q, want its synced content", seed, other)
		}
		if again, _ := run(seed); again != log {
			t.Fatalf("seed %d: not deterministic: %q then %q", seed, log, again)
		}
		lengths[len(log)] = true
	}
	if len(lengths) < 10 {
		t.Errorf("50 seeds gave only %d distinct torn lengths", len(lengths))
	}
}

// appendLog is a tiny log store: it creates /db/log durably and appends and
// syncs each record, returning how many records were acknowledged.
func appendLog(fs vfs.FS, recs []string) (acked int, err error) {
	f, err := fs.Create("/db/log")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if err := fs.SyncDir("/db"); err != nil {
		return 0, err
	}
	for i, r := range recs {
		if _, err := f.Write([]byte(r)); err != nil {
			return i, err
		}
		if err := f.Sync(); err != nil {
			return i, err
		}
	}
	return len(recs), nil
}

func TestInjectAtEveryK(t *testing.T) {
	recs := []string{"alpha;", "bravo;", "charlie;", "delta;"}
	for _, kinds := range []vfs.OpKind{vfs.OpAny, vfs.OpWrite, vfs.OpSync, vfs.OpWrite | vfs.OpSync} {
		clean := newDB(t)
		before := clean.Ops(kinds)
		if _, err := appendLog(clean, recs); err != nil {
			t.Fatal(err)
		}
		total := clean.Ops(kinds) - before
		if total == 0 {
			t.Fatalf("%v: scenario did no operations", kinds)
		}
		for k := range int(total) {
			t.Run(fmt.Sprintf("%v/k=%d", kinds, k), func(t *testing.T) {
				fs := newDB(t)
				base := fs.Ops(kinds)
				fs.InjectAfter(k, kinds, nil)
				acked, err := appendLog(fs, recs)
				if !errors.Is(err, vfs.ErrInjected) {
					t.Fatalf("err = %v, want ErrInjected", err)
				}
				if got := fs.Ops(kinds) - base; got != int64(k+1) {
					t.Fatalf("ran %d operations, want the scenario to stop at the failing one (%d)", got, k+1)
				}
				fs.Crash()
				got := readFile(t, fs, "/db/log")
				want := strings.Join(recs[:acked], "")
				if acked == 0 && got == "<absent>" {
					return // failed before the log's name was durable
				}
				if got != want {
					t.Fatalf("after crash log = %q, want the %d acknowledged records %q", got, acked, want)
				}
			})
		}
	}
}

func TestInjectedWriteIsTorn(t *testing.T) {
	for _, tc := range []struct {
		fault vfs.Fault
		wantN int
	}{
		{vfs.Fault{Ops: vfs.OpWrite}, 0},
		{vfs.Fault{Ops: vfs.OpWrite, Torn: true}, 5},
	} {
		fs := newDB(t)
		f, err := fs.Create("/db/a")
		must(t, err)
		fs.Inject(tc.fault)
		n, err := f.Write([]byte("0123456789"))
		if n != tc.wantN || !errors.Is(err, vfs.ErrInjected) {
			t.Errorf("%+v: Write = %d, %v; want %d, ErrInjected", tc.fault, n, err, tc.wantN)
		}
		if size, _ := f.Size(); size != int64(tc.wantN) {
			t.Errorf("%+v: size %d after torn write, want %d", tc.fault, size, tc.wantN)
		}
		// One-shot: the next write succeeds.
		if _, err := f.Write([]byte("x")); err != nil {
			t.Errorf("%+v: second write: %v", tc.fault, err)
		}
	}
}

func TestNoSpace(t *testing.T) {
	fs := newDB(t)
	f, err := fs.Create("/db/a")
	must(t, err)
	fs.Inject(vfs.Fault{Ops: vfs.OpWrite, After: 1, Err: vfs.ErrNoSpace, Sticky: true})
	_, err = f.Write([]byte("fits"))
	must(t, err)
	for range 3 {
		_, err = f.Write([]byte("does not fit"))
		if !errors.Is(err, syscall.ENOSPC) || !errors.Is(err, vfs.ErrNoSpace) {
			t.Fatalf("Write on a full disk: %v, want ENOSPC", err)
		}
		var pe *os.PathError
		if !errors.As(err, &pe) || pe.Path != "/db/a" {
			t.Fatalf("error %v does not name the file", err)
		}
	}
	// Other kinds are unaffected.
	must(t, f.Sync())
	fs.ClearFaults()
	_, err = f.Write([]byte("space again"))
	must(t, err)
	if got := readFile(t, fs, "/db/a"); got != "fitsspace again" {
		t.Errorf("content %q", got)
	}
}

func TestInjectOtherKinds(t *testing.T) {
	fs := newDB(t)
	writeFile(t, fs, "/db/a", "x", true)
	must(t, fs.SyncDir("/db"))
	for _, tc := range []struct {
		kind vfs.OpKind
		op   func() error
	}{
		{vfs.OpCreate, func() error { _, err := fs.Create("/db/b"); return err }},
		{vfs.OpOpen, func() error { _, err := fs.Open("/db/a"); return err }},
		{vfs.OpRename, func() error { return fs.Rename("/db/a", "/db/c") }},
		{vfs.OpRemove, func() error { return fs.Remove("/db/a") }},
		{vfs.OpSyncDir, func() error { return fs.SyncDir("/db") }},
		{vfs.OpMkdir, func() error { return fs.MkdirAll("/db/d", 0o755) }},
		{vfs.OpList, func() error { _, err := fs.List("/db"); return err }},
		{vfs.OpStat, func() error { _, err := fs.Stat("/db/a"); return err }},
	} {
		fs.InjectAfter(0, tc.kind, nil)
		if err := tc.op(); !errors.Is(err, vfs.ErrInjected) {
			t.Errorf("%v: %v, want ErrInjected", tc.kind, err)
		}
	}
	// Nothing changed.
	if names, err := fs.List("/db"); err != nil || !slices.Equal(names, []string{"a"}) {
		t.Errorf("List = %v, %v; want [a]", names, err)
	}
	f, err := fs.OpenReadWrite("/db/a")
	must(t, err)
	fs.InjectAfter(0, vfs.OpRead, nil)
	if _, err := f.ReadAt(make([]byte, 1), 0); !errors.Is(err, vfs.ErrInjected) {
		t.Errorf("ReadAt: %v, want ErrInjected", err)
	}
	fs.InjectAfter(0, vfs.OpTruncate, nil)
	if err := f.Truncate(0); !errors.Is(err, vfs.ErrInjected) {
		t.Errorf("Truncate: %v, want ErrInjected", err)
	}
	fs.InjectAfter(0, vfs.OpSync, nil)
	must(t, f.Truncate(0))
	if err := f.Sync(); !errors.Is(err, vfs.ErrInjected) {
		t.Errorf("Sync: %v, want ErrInjected", err)
	}
	fs.Crash() // the failed Sync synced nothing
	if got := readFile(t, fs, "/db/a"); got != "x" {
		t.Errorf("after failed Sync and crash: %q, want %q", got, "x")
	}
}

func TestFlipBit(t *testing.T) {
	fs := newDB(t)
	writeFile(t, fs, "/db/a", "AAAA", true)
	must(t, fs.SyncDir("/db"))
	must(t, fs.FlipBit("/db/a", 2, 0))
	f, err := fs.Open("/db/a")
	must(t, err)
	b := make([]byte, 4)
	if _, err := f.ReadAt(b, 0); err != nil || string(b) != "AA@A" {
		t.Errorf("ReadAt after flip = %q, %v; want %q", b, err, "AA@A")
	}
	fs.Crash() // media corruption survives a crash
	if got := readFile(t, fs, "/db/a"); got != "AA@A" {
		t.Errorf("after crash %q, want %q", got, "AA@A")
	}
	if err := fs.FlipBit("/db/a", 4, 0); err == nil {
		t.Error("FlipBit past the end succeeded")
	}
	if err := fs.FlipBit("/db/nope", 0, 0); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("FlipBit of a missing file: %v", err)
	}
}

func TestConcurrentReadAt(t *testing.T) {
	fs := newDB(t)
	w, err := fs.Create("/db/log")
	must(t, err)
	byteAt := func(off int64) byte { return byte(off*7 + off>>8) }
	const chunk, chunks = 64, 300
	var wg sync.WaitGroup
	errc := make(chan error, 9)
	wg.Go(func() {
		buf := make([]byte, chunk)
		for c := range int64(chunks) {
			for i := range buf {
				buf[i] = byteAt(c*chunk + int64(i))
			}
			if _, err := w.Write(buf); err != nil {
				errc <- err
				return
			}
		}
	})
	for r := range uint64(8) {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(r, 1))
			f, err := fs.Open("/db/log")
			if err != nil {
				errc <- err
				return
			}
			defer f.Close()
			buf := make([]byte, 16)
			for range 2000 {
				size, err := f.Size()
				if err != nil {
					errc <- err
					return
				}
				if size < int64(len(buf)) {
					continue
				}
				off := rng.Int64N(size - int64(len(buf)) + 1)
				if _, err := f.ReadAt(buf, off); err != nil {
					errc <- fmt.Errorf("ReadAt(%d) with size %d: %w", off, size, err)
					return
				}
				for i, b := range buf {
					if b != byteAt(off+int64(i)) {
						errc <- fmt.Errorf("reader %d: byte %d = %d, want %d", r, off+int64(i), b, byteAt(off+int64(i)))
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
}

// errClass reduces an error to what both file systems must agree on.
func errClass(err error) string {
	switch {
	case err == nil:
		return "ok"
	case err == io.EOF:
		return "EOF"
	case errors.Is(err, os.ErrNotExist):
		return "notexist"
	case errors.Is(err, os.ErrClosed):
		return "closed"
	default:
		return "error"
	}
}

// scenario exercises the FS under dir and returns a transcript.
func scenario(fs vfs.FS, dir string) []string {
	var out []string
	p := func(name string) string { return filepath.Join(dir, name) }
	logf := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	read := func(what string, f vfs.File, n int) {
		b := make([]byte, n)
		k, err := f.Read(b)
		logf("%s Read(%d) = %q %s", what, n, b[:k], errClass(err))
	}
	readAt := func(what string, f vfs.File, n int, off int64) {
		b := make([]byte, n)
		k, err := f.ReadAt(b, off)
		logf("%s ReadAt(%d, %d) = %q %s", what, n, off, b[:k], errClass(err))
	}
	write := func(what string, f vfs.File, s string) {
		k, err := f.Write([]byte(s))
		logf("%s Write(%q) = %d %s", what, s, k, errClass(err))
	}
	size := func(what string, f vfs.File) {
		n, err := f.Size()
		logf("%s Size = %d %s", what, n, errClass(err))
	}
	list := func(d string) {
		names, err := fs.List(p(d))
		logf("List(%s) = %v %s", d, names, errClass(err))
	}
	stat := func(name string) {
		n, err := fs.Stat(p(name))
		logf("Stat(%s) = %d %s", name, n, errClass(err))
	}

	_, err := fs.Create(p("missing/x"))
	logf("Create in missing dir: %s", errClass(err))
	logf("MkdirAll: %s", errClass(fs.MkdirAll(p("sub"), 0o755)))
	logf("MkdirAll again: %s", errClass(fs.MkdirAll(p("sub"), 0o755)))

	f, err := fs.Create(p("sub/a"))
	logf("Create: %s", errClass(err))
	write("c", f, "hello world")
	size("c", f)
	read("c", f, 4) // the shared offset is at the end
	readAt("c", f, 6, 5)
	readAt("c", f, 6, 8)
	readAt("c", f, 6, 20)
	readAt("c", f, 0, 20)
	_, err = f.ReadAt(make([]byte, 1), -1)
	logf("ReadAt negative: %s", errClass(err))
	logf("Truncate(5): %s", errClass(f.Truncate(5)))
	size("c", f)
	write("c", f, "!") // at offset 11: zero-fills the gap
	readAt("c", f, 12, 0)
	logf("Truncate(14): %s", errClass(f.Truncate(14)))
	readAt("c", f, 20, 0)
	logf("Truncate(12): %s", errClass(f.Truncate(12)))
	logf("Sync: %s", errClass(f.Sync()))
	logf("Close: %s", errClass(f.Close()))
	logf("Close again: %s", errClass(f.Close()))
	read("closed", f, 1)
	write("closed", f, "x")

	r, err := fs.Open(p("sub/a"))
	logf("Open: %s", errClass(err))
	read("r", r, 3)
	read("r", r, 100)
	read("r", r, 1)
	read("r", r, 0)
	write("r", r, "nope")
	logf("read-only Truncate: %s", errClass(r.Truncate(0)))
	logf("read-only Sync: %s", errClass(r.Sync()))
	logf("Close: %s", errClass(r.Close()))

	rw, err := fs.OpenReadWrite(p("sub/a"))
	logf("OpenReadWrite: %s", errClass(err))
	read("rw", rw, 2)
	write("rw", rw, "XY") // appends, offset moves to the end
	read("rw", rw, 1)
	readAt("rw", rw, 20, 0)
	logf("Truncate(3): %s", errClass(rw.Truncate(3)))
	write("rw", rw, "Z")
	readAt("rw", rw, 20, 0)
	logf("Close: %s", errClass(rw.Close()))
	stat("sub/a")
	stat("sub/nope")

	f, err = fs.Create(p("sub/a")) // truncates
	logf("Create existing: %s", errClass(err))
	size("c2", f)
	write("c2", f, "new")
	logf("Close: %s", errClass(f.Close()))

	f, err = fs.Create(p("sub/b"))
	logf("Create b: %s", errClass(err))
	write("b", f, "bee")
	list("sub")
	logf("Rename b->a: %s", errClass(fs.Rename(p("sub/b"), p("sub/a"))))
	list("sub")
	read("b after rename", f, 10) // the handle follows the file
	logf("Close: %s", errClass(f.Close()))
	logf("Rename missing: %s", errClass(fs.Rename(p("sub/nope"), p("sub/x"))))
	logf("Rename onto dir: %s", errClass(fs.Rename(p("sub/a"), p("sub"))))
	logf("Rename into missing dir: %s", errClass(fs.Rename(p("sub/a"), p("nodir/a"))))
	cat := func(name string) {
		g, err := fs.Open(p(name))
		if err != nil {
			logf("Open %s: %s", name, errClass(err))
			return
		}
		defer g.Close()
		b, err := io.ReadAll(g)
		logf("%s = %q %s", name, b, errClass(err))
	}
	cat("sub/a")

	h, err := fs.Open(p("sub/a"))
	logf("Open: %s", errClass(err))
	logf("Remove: %s", errClass(fs.Remove(p("sub/a"))))
	cat("sub/a")
	read("removed", h, 10) // an open handle outlives its name
	logf("Close: %s", errClass(h.Close()))
	logf("Remove again: %s", errClass(fs.Remove(p("sub/a"))))
	_, err = fs.Open(p("sub/a"))
	logf("Open missing: %s", errClass(err))
	_, err = fs.OpenReadWrite(p("sub/a"))
	logf("OpenReadWrite missing: %s", errClass(err))
	list("sub")
	list("")
	list("nodir")
	logf("SyncDir: %s", errClass(fs.SyncDir(p("sub"))))
	logf("SyncDir missing: %s", errClass(fs.SyncDir(p("nodir"))))
	logf("Remove empty dir: %s", errClass(fs.Remove(p("sub"))))
	list("")

	f, err = fs.Create(p("c"))
	logf("Create c: %s", errClass(err))
	logf("Close: %s", errClass(f.Close()))
	logf("MkdirAll through a file: %s", errClass(fs.MkdirAll(p("c/d"), 0o755)))
	_, err = fs.Create(p("c/x"))
	logf("Create under a file: %s", errClass(err))
	list("c")
	return out
}

func TestAgreesWithOS(t *testing.T) {
	dir := t.TempDir()
	want := scenario(vfs.Default, dir)
	mem := vfs.NewMem()
	must(t, mem.MkdirAll("/data", 0o755))
	got := scenario(mem, "/data")
	for i := range max(len(got), len(want)) {
		var g, w string
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			t.Errorf("step %d:\n  MemFS: %s\n  OS:    %s", i, g, w)
		}
	}
	if testing.Verbose() {
		t.Log("\n" + strings.Join(want, "\n"))
	}
}

func TestPaths(t *testing.T) {
	fs := vfs.NewMem()
	must(t, fs.MkdirAll("a/b", 0o755))
	writeFile(t, fs, "/a/./b/../b/f", "x", false)
	if got := readFile(t, fs, "a/b/f"); got != "x" {
		t.Errorf("relative and absolute paths disagree: %q", got)
	}
	names, err := fs.List("/")
	must(t, err)
	if !slices.Equal(names, []string{"a"}) {
		t.Errorf("List(/) = %v", names)
	}
	if err := fs.Rename("/a", "/a/b/c"); err == nil {
		t.Error("moved a directory into itself")
	}
	if err := fs.Rename("/a", "/a/b/f"); !errors.Is(err, syscall.ENOTDIR) {
		t.Errorf("Rename of a directory onto a file: %v, want ENOTDIR", err)
	}
}

func TestOpsCount(t *testing.T) {
	fs := newDB(t)
	f, err := fs.Create("/db/a")
	must(t, err)
	for range 3 {
		_, err := f.Write([]byte("x"))
		must(t, err)
	}
	must(t, f.Sync())
	if got := fs.Ops(vfs.OpWrite); got != 3 {
		t.Errorf("Ops(OpWrite) = %d, want 3", got)
	}
	if got := fs.Ops(vfs.OpWrite | vfs.OpSync | vfs.OpCreate); got != 5 {
		t.Errorf("Ops(write|sync|create) = %d, want 5", got)
	}
	if got, want := (vfs.OpWrite | vfs.OpSync).String(), "write|sync"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
}

// Example of a crash test: run a workload that fails at its k-th write,
// crash, and check that every acknowledged record survived.
func ExampleMemFS() {
	recs := []string{"a;", "b;", "c;"}
	clean := vfs.NewMem()
	clean.MkdirAll("/db", 0o755)
	clean.SyncDir("/")
	appendLog(clean, recs)
	writes := clean.Ops(vfs.OpWrite)

	for k := range int(writes) {
		fs := vfs.NewMem()
		fs.MkdirAll("/db", 0o755)
		fs.SyncDir("/")
		fs.InjectAfter(k, vfs.OpWrite, nil) // the k-th write fails (torn)
		acked, err := appendLog(fs, recs)
		fs.Crash() // drop everything not synced
		f, _ := fs.Open("/db/log")
		b, _ := io.ReadAll(f)
		f.Close()
		fmt.Printf("k=%d: %v; acked %d, survived %q, ok=%v\n", k, errors.Is(err, vfs.ErrInjected),
			acked, b, bytes.Equal(b, []byte(strings.Join(recs[:acked], ""))))
	}
	// Output:
	// k=0: true; acked 0, survived "", ok=true
	// k=1: true; acked 1, survived "a;", ok=true
	// k=2: true; acked 2, survived "a;b;", ok=true
}
