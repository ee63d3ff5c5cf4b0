package bulk

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/vfs"
)

// TestOverlayScanModel builds a random base and a chain of random deltas
// (changes, deletions of present and absent keys, puts again of deleted
// keys, new keys) and checks, for every version of the chain, that the
// overlay's Scan yields exactly the model — each live key once with its
// newest value — and agrees with AppendGet key by key.
func TestOverlayScanModel(t *testing.T) {
	seed := testSeed(t)
	r := rand.New(rand.NewPCG(seed, 11))
	dir := t.TempDir()
	ctx := context.Background()
	for round := range 4 {
		model := map[string][]byte{}
		var everKeys [][]byte
		base := randomRecords(r, 200+r.IntN(800), 16, round%2 == 1)
		for _, rec := range base {
			model[string(rec.Key)] = rec.Value
			everKeys = append(everKeys, rec.Key)
		}
		build := func(name string, recs []Record, spec PartitionSpec) *File {
			t.Helper()
			path := filepath.Join(dir, fmt.Sprintf("r%d-%s", round, name))
			if _, err := BuildPartition(ctx, path, recs, spec, PartitionOptions{}); err != nil {
				t.Fatal(err)
			}
			f, err := Open(vfs.Default, path, OpenOptions{NoMmap: r.IntN(2) == 0})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			return f
		}
		bf := build("v1", base, PartitionSpec{Version: 1})
		var deltas []*File
		for d := range 1 + r.IntN(4) {
			version := uint64(d + 2)
			var recs []Record
			seen := map[string]bool{}
			add := func(rec Record) {
				if seen[string(rec.Key)] {
					return
				}
				seen[string(rec.Key)] = true
				recs = append(recs, rec)
				if rec.Delete {
					delete(model, string(rec.Key))
				} else {
					model[string(rec.Key)] = rec.Value
				}
			}
			for range r.IntN(100) {
				k := everKeys[r.IntN(len(everKeys))]
				switch r.IntN(3) {
				case 0: // change, or put again a deleted key
					add(Record{Key: k, Value: []byte(fmt.Sprintf("v%d-%d", version, r.IntN(1000)))})
				case 1:
					add(Record{Key: k, Delete: true})
				case 2:
					add(Record{Key: k, Value: []byte{}}) // an empty value is a value
				}
			}
			for range r.IntN(5) {
				add(Record{Key: absentKey(r), Delete: true}) // deletes a key never there
			}
			for _, rec := range randomRecords(r, r.IntN(50), 16, false) {
				add(rec)
				everKeys = append(everKeys, rec.Key)
			}
			deltas = append(deltas, build(fmt.Sprintf("v%d", version), recs, PartitionSpec{Version: version, Delta: true, BaseVersion: version - 1}))
			ov, err := NewOverlay(bf, deltas...)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string][]byte{}
			err = ov.Scan(ctx, func(key, value []byte) error {
				if _, dup := got[string(key)]; dup {
					return fmt.Errorf("key %x scanned twice", key)
				}
				got[string(key)] = append([]byte{}, value...)
				v, ok, err := ov.AppendGet(nil, key)
				if err != nil || !ok || string(v) != string(value) {
					return fmt.Errorf("key %x: scan %x, get %x %v %v", key, value, v, ok, err)
				}
				return nil
			})
			if err != nil {
				t.Fatalf("round %d version %d: %v", round, version, err)
			}
			if len(got) != len(model) {
				t.Fatalf("round %d version %d: scanned %d keys, model has %d", round, version, len(got), len(model))
			}
			for k, v := range model {
				if g, ok := got[k]; !ok || string(g) != string(v) {
					t.Fatalf("round %d version %d: key %x scanned %x %v, model %x", round, version, k, g, ok, v)
				}
			}
			for _, k := range everKeys {
				v, ok, err := ov.AppendGet(nil, k)
				mv, mok := model[string(k)]
				if err != nil || ok != mok || string(v) != string(mv) {
					t.Fatalf("round %d version %d: get %x = %x %v %v, model %x %v", round, version, k, v, ok, err, mv, mok)
				}
			}
		}
	}
}

func TestOverlayScanStops(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	r := rand.New(rand.NewPCG(1, 2))
	path := filepath.Join(dir, "v1")
	if _, err := BuildPartition(ctx, path, randomRecords(r, 100, 8, false), PartitionSpec{Version: 1}, PartitionOptions{}); err != nil {
		t.Fatal(err)
	}
	dpath := filepath.Join(dir, "v2")
	if _, err := BuildPartition(ctx, dpath, randomRecords(r, 10, 8, false), PartitionSpec{Version: 2, Delta: true, BaseVersion: 1}, PartitionOptions{}); err != nil {
		t.Fatal(err)
	}
	bf, err := Open(vfs.Default, path, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	df, err := Open(vfs.Default, dpath, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ov, err := NewOverlay(bf, df)
	if err != nil {
		t.Fatal(err)
	}
	stop := errors.New("stop")
	n := 0
	if err := ov.Scan(ctx, func(_, _ []byte) error { n++; return stop }); err != stop || n != 1 {
		t.Fatalf("scan stopped with %v after %d", err, n)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := ov.Scan(cctx, func(_, _ []byte) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled scan: %v", err)
	}
	bf.Close()
	if err := ov.Scan(ctx, func(_, _ []byte) error { return nil }); !errors.Is(err, engines.ErrClosed) {
		t.Fatalf("scan of a closed layer: %v", err)
	}
	df.Close()
}
