package bulk_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/bulk"
	"github.com/tabuladb/tabula/engines/enginetest"
	"github.com/tabuladb/tabula/internal/keyspace"
)

// loader is the conformance suite's LoadFunc for the bulk engine: each
// snapshot becomes a version built with BuildPartition and loaded through
// Stage, as a table server loads an upload. Up to two snapshots in a row
// after a full version are built as deltas over the one before (changed
// keys and deletions), so the suite reads overlays too.
type loader struct {
	dir   string
	mu    sync.Mutex
	state map[*bulk.Engine]*loadState
}

type loadState struct {
	prev  map[string]string
	chain []uint64 // the serving version's chain, base first
}

func newLoader(t *testing.T) *loader {
	return &loader{dir: t.TempDir(), state: map[*bulk.Engine]*loadState{}}
}

func (l *loader) load(e engines.Engine, recs []engines.Record) error {
	be, ok := e.(*bulk.Engine)
	if !ok {
		return fmt.Errorf("not a *bulk.Engine: %T", e)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.state[be]
	if st == nil {
		st = &loadState{}
		l.state[be] = st
	}
	snap := map[string]string{}
	for _, r := range recs {
		snap[string(r.Key)] = string(r.Value)
	}
	version := uint64(1)
	if n := len(st.chain); n > 0 {
		version = st.chain[n-1] + 1
	}
	spec := bulk.PartitionSpec{Version: version}
	var build []bulk.Record
	chain := []uint64{version}
	if st.prev != nil && len(st.chain) < 3 {
		for k, v := range snap {
			if old, ok := st.prev[k]; !ok || old != v {
				build = append(build, bulk.Record{Key: []byte(k), Value: []byte(v)})
			}
		}
		for k := range st.prev {
			if _, ok := snap[k]; !ok {
				build = append(build, bulk.Record{Key: []byte(k), Delete: true})
			}
		}
		if len(build) > 0 {
			spec.Delta, spec.BaseVersion = true, st.chain[len(st.chain)-1]
			chain = append(slices.Clone(st.chain), version)
		}
	}
	if !spec.Delta {
		build = build[:0]
		for _, r := range recs {
			build = append(build, bulk.Record{Key: r.Key, Value: r.Value})
		}
	}
	path := filepath.Join(l.dir, fmt.Sprintf("%p-v%d.bulk", be, version))
	ctx := context.Background()
	info, err := bulk.BuildPartition(ctx, path, build, spec, bulk.PartitionOptions{})
	if err != nil {
		return err
	}
	defer os.Remove(path)
	// Retain the new version beside the serving one, stage and load it,
	// then serve it (dropping what its chain does not need).
	be.Retain(append(slices.Clone(st.chain), version), be.Serving())
	stage, err := be.Stage(version, uint64(info.FileBytes), info.CRC, 0)
	if err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return errors.Join(err, stage.Abort())
	}
	defer f.Close()
	if _, err := io.Copy(stage, f); err != nil {
		return errors.Join(err, stage.Abort())
	}
	if _, err := stage.Finish(ctx); err != nil {
		return err
	}
	be.Retain(chain, version)
	st.prev, st.chain = snap, chain
	return nil
}

func openEngine(t *testing.T, opts engines.Options) engines.Engine {
	opts.Dir, opts.Partitions = t.TempDir(), 1
	opts.Logger = slog.New(slog.DiscardHandler)
	e, err := engines.Open(engines.KindBulk, opts)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestConformance(t *testing.T) {
	enginetest.RunReadOnly(t, openEngine, newLoader(t).load)
}

// fixture builds version files of partition 1 of 2 for the tests below.
type fixture struct {
	t   *testing.T
	dir string
}

type built struct {
	path string
	info bulk.PartitionInfo
}

func (fx fixture) build(version, base uint64, partition int, recs ...bulk.Record) built {
	fx.t.Helper()
	path := filepath.Join(fx.dir, fmt.Sprintf("v%d-p%d.bulk", version, partition))
	spec := bulk.PartitionSpec{Partition: partition, Partitions: 2, Version: version, Delta: base != 0, BaseVersion: base}
	// Keys of any partition: BuildPartition does not route.
	info, err := bulk.BuildPartition(context.Background(), path, recs, spec, bulk.PartitionOptions{})
	if err != nil {
		fx.t.Fatal(err)
	}
	return built{path, info}
}

// key returns name, suffixed until it routes to partition 1 of 2 (the
// engines' partition in these tests).
func key(name string) string { return keyIn(1, name) }

func keyIn(p int, name string) string {
	for i := 0; ; i++ {
		k := fmt.Sprintf("%s.%d", name, i)
		if keyspace.Index(keyspace.Hash([]byte(k)), 2) == p {
			return k
		}
	}
}

func put(k, v string) bulk.Record { return bulk.Record{Key: []byte(key(k)), Value: []byte(v)} }

func get(e *bulk.Engine, k string) ([]byte, error) {
	v, _, err := e.Get([]byte(key(k)))
	return v, err
}

// stage writes b's file through Stage and finishes it.
func stage(t *testing.T, e *bulk.Engine, version uint64, b built) (*bulk.Version, error) {
	t.Helper()
	data, err := os.ReadFile(b.path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := e.Stage(version, uint64(len(data)), b.info.CRC, 0)
	if err != nil {
		return nil, err
	}
	if _, err := s.Write(data); err != nil {
		t.Fatal(err)
	}
	return s.Finish(context.Background())
}

func newEngine(t *testing.T, dir string) *bulk.Engine {
	t.Helper()
	e, err := bulk.OpenEngine(nil, engines.Options{Dir: dir, Partition: 1, Partitions: 2, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func TestVersions(t *testing.T) {
	fx := fixture{t, t.TempDir()}
	e := newEngine(t, t.TempDir())
	if _, err := e.Version(0); !errors.Is(err, bulk.ErrNoVersion) {
		t.Fatalf("serving version of a new engine: %v, want ErrNoVersion", err)
	}
	e.Retain([]uint64{1, 2}, 0)
	if _, err := stage(t, e, 1, fx.build(1, 0, 1, put("a", "1"), put("b", "1"))); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Version(2); !errors.Is(err, bulk.ErrVersionNotLoaded) {
		t.Fatalf("retained version not loaded: %v, want ErrVersionNotLoaded", err)
	}
	if _, err := e.Version(9); !errors.Is(err, bulk.ErrVersionNotLoaded) {
		t.Fatalf("version newer than every retained one: %v, want ErrVersionNotLoaded", err)
	}
	// A delta over 1 that changes a and deletes b.
	if _, err := stage(t, e, 2, fx.build(2, 1, 1, put("a", "2"), bulk.Record{Key: []byte(key("b")), Delete: true})); err != nil {
		t.Fatal(err)
	}
	e.Retain([]uint64{1, 2}, 2)
	if got := e.Loaded(); len(got) != 2 || got[1].Version != 2 || got[1].Base != 1 {
		t.Fatalf("loaded %+v", got)
	}
	v1, err := e.Version(1)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := get(e, "a"); err != nil || string(v) != "2" {
		t.Fatalf("serving a = %q, %v; want 2", v, err)
	}
	if _, err := get(e, "b"); !errors.Is(err, engines.ErrNotFound) {
		t.Fatalf("serving b (deleted by the delta): %v", err)
	}
	if v, ok, err := v1.AppendGet(nil, []byte(key("b"))); err != nil || !ok || string(v) != "1" {
		t.Fatalf("version 1 b = %q, %v, %v", v, ok, err)
	}
	// Retire 1 and 2 for a new full version 3: a holder of version 1 now
	// reads VERSION_GONE, naming the serving version.
	e.Retain([]uint64{1, 2, 3}, 2)
	if _, err := stage(t, e, 3, fx.build(3, 0, 1, put("c", "3"))); err != nil {
		t.Fatal(err)
	}
	e.Retain([]uint64{3}, 3)
	var gone *bulk.VersionGoneError
	if _, _, err := v1.AppendGet(nil, []byte(key("a"))); !errors.As(err, &gone) || gone.Version != 1 || gone.Current != 3 {
		t.Fatalf("read of an unloaded version: %v, want a VersionGoneError of 1 (current 3)", err)
	}
	if _, err := e.Version(1); !errors.As(err, &gone) || !errors.Is(err, bulk.ErrVersionGone) {
		t.Fatalf("lookup of a retired version: %v", err)
	}
	names, _ := os.ReadDir(e.Dir())
	if len(names) != 1 {
		t.Fatalf("directory after retiring 1 and 2 holds %d files, want 1", len(names))
	}
}

func TestRestartReloads(t *testing.T) {
	fx := fixture{t, t.TempDir()}
	dir := t.TempDir()
	e := newEngine(t, dir)
	e.Retain([]uint64{1, 2}, 0)
	for _, b := range []struct {
		v, base uint64
		r       bulk.Record
	}{{1, 0, put("k", "1")}, {2, 1, put("k", "2")}} {
		if _, err := stage(t, e, b.v, fx.build(b.v, b.base, 1, b.r)); err != nil {
			t.Fatal(err)
		}
	}
	e.Retain([]uint64{1, 2}, 2)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = newEngine(t, dir)
	if _, err := get(e, "k"); !errors.Is(err, engines.ErrNotFound) {
		t.Fatalf("get before the first Retain: %v", err)
	}
	e.Retain([]uint64{1, 2}, 2) // 2 is a delta: its base loads first
	if v, err := get(e, "k"); err != nil || string(v) != "2" {
		t.Fatalf("after restart k = %q, %v; want 2", v, err)
	}
	// A retained delta keeps its base loaded, retained or not.
	e.Retain([]uint64{2}, 2)
	if v, err := get(e, "k"); err != nil || string(v) != "2" {
		t.Fatalf("delta without its base retained: k = %q, %v; want 2", v, err)
	}
}

func TestStageErrors(t *testing.T) {
	fx := fixture{t, t.TempDir()}
	e := newEngine(t, t.TempDir())
	e.Retain([]uint64{1, 2, 3}, 0)
	b := fx.build(1, 0, 1, put("a", "1"))
	data, err := os.ReadFile(b.path)
	if err != nil {
		t.Fatal(err)
	}
	size := uint64(len(data))

	// Interrupted, then resumed from what was kept.
	s, err := e.Stage(1, size, b.info.CRC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Stage(1, size, b.info.CRC, 0); !errors.Is(err, bulk.ErrStageBusy) {
		t.Fatalf("second stage of a version: %v, want ErrStageBusy", err)
	}
	if _, err := s.Write(data[:100]); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := e.StagedBytes(1); got != 100 {
		t.Fatalf("staged bytes %d, want 100", got)
	}
	var off *bulk.StageOffsetError
	if _, err := e.Stage(1, size, b.info.CRC, 101); !errors.As(err, &off) || off.Held != 100 {
		t.Fatalf("stage past the bytes held: %v", err)
	}
	s, err = e.Stage(1, size, b.info.CRC, 100)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write(append(slices.Clone(data[100:]), 'x')); !errors.Is(err, bulk.ErrStageTooLong) {
		t.Fatalf("write past the size: %v", err)
	}
	if _, err := s.Write(data[100:]); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Finish(context.Background()); err != nil {
		t.Fatal(err)
	}

	// A file whose CRC is not the one announced, and one of another
	// partition: refused and deleted; the served versions untouched.
	if _, err := stage(t, e, 2, built{b.path, bulk.PartitionInfo{CRC: b.info.CRC ^ 1}}); !errors.Is(err, bulk.ErrChecksum) {
		t.Fatalf("stage with a wrong CRC: %v, want ErrChecksum", err)
	}
	other := fx.build(2, 0, 0, bulk.Record{Key: []byte(keyIn(0, "a")), Value: []byte("x")})
	if _, err := stage(t, e, 2, other); !errors.Is(err, bulk.ErrRefused) {
		t.Fatalf("stage of another partition's file: %v, want ErrRefused", err)
	}
	// A delta whose base is not loaded (yet: not the file's fault).
	if _, err := stage(t, e, 3, fx.build(3, 2, 1, put("a", "y"))); !errors.Is(err, bulk.ErrBaseNotLoaded) || errors.Is(err, bulk.ErrRefused) {
		t.Fatalf("stage of a delta over an absent base: %v, want ErrBaseNotLoaded", err)
	}
	// A version no longer retained when it finishes.
	if _, err := stage(t, e, 7, fx.build(7, 0, 1, put("a", "7"))); !errors.Is(err, bulk.ErrVersionGone) {
		t.Fatalf("stage of an unretained version: %v, want ErrVersionGone", err)
	}
	names, _ := os.ReadDir(e.Dir())
	if len(names) != 1 {
		t.Fatalf("directory holds %v, want only version 1's file", names)
	}
	e.Retain([]uint64{1, 2, 3}, 1)
	if v, err := get(e, "a"); err != nil || !bytes.Equal(v, []byte("1")) {
		t.Fatalf("a = %q, %v", v, err)
	}
}
