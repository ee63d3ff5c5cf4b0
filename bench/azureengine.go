package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/ordered"
)

// The azure suite's engine workload: the ordered engine alone against
// pebble used directly, the overhead of our layer over the LSM it runs
// on. Both keep their files in a temporary directory with pebble's WAL
// off (the ordered engine's, as in a replicated partition, where the
// commit log is the durable record), bloom filters of 10 bits per key,
// the same keys and values, the same goroutines.

const azEngineKeys = 100_000

func azEngineKey(i int) []byte { return fmt.Appendf(nil, "p%03d\x00\x01r%06d", i%100, i) }

// azEngineCompare runs put, get and 100-record range reads on both and
// prints ratio lines ordered/pebble.
func azEngineCompare(ctx context.Context, out io.Writer, dir string, cfg *clConfig) error {
	edir, pdir := filepath.Join(dir, "engine-ordered"), filepath.Join(dir, "engine-pebble")
	defer os.RemoveAll(edir)
	defer os.RemoveAll(pdir)
	e, err := ordered.Open(engines.Options{Dir: edir, Storage: ordered.StorageSSD, Replayable: true})
	if err != nil {
		return err
	}
	defer e.Close()
	po := &pebble.Options{DisableWAL: true}
	for i := range po.Levels {
		po.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	db, err := pebble.Open(pdir, po)
	if err != nil {
		return err
	}
	defer db.Close()
	fmt.Fprintf(out, "# engine: engines/ordered vs cockroachdb/pebble direct, WAL off in both, %d keys preloaded, %d-byte values\n", azEngineKeys, cfg.valueSize)
	val := make([]byte, cfg.valueSize)
	for i := 0; i < azEngineKeys; i += 1000 {
		muts := make([]engines.Mutation, 0, 1000)
		b := db.NewBatch()
		for j := i; j < i+1000 && j < azEngineKeys; j++ {
			muts = append(muts, engines.Mutation{Key: azEngineKey(j), Value: val})
			if err := b.Set(azEngineKey(j), val, nil); err != nil {
				return err
			}
		}
		if err := e.Apply(muts); err != nil {
			return err
		}
		if err := b.Commit(pebble.NoSync); err != nil {
			return err
		}
	}
	errStop := errors.New("enough")
	workloads := []struct {
		name    string
		ordered clOp
		pebble  clOp
	}{
		{"engine-put",
			func(ctx context.Context, rng *rand.Rand, v []byte) error {
				return e.Apply([]engines.Mutation{{Key: azEngineKey(rng.IntN(azEngineKeys)), Value: v}})
			},
			func(ctx context.Context, rng *rand.Rand, v []byte) error {
				return db.Set(azEngineKey(rng.IntN(azEngineKeys)), v, pebble.NoSync)
			}},
		{"engine-get",
			func(ctx context.Context, rng *rand.Rand, _ []byte) error {
				_, _, err := e.Get(azEngineKey(rng.IntN(azEngineKeys)))
				return err
			},
			func(ctx context.Context, rng *rand.Rand, _ []byte) error {
				v, closer, err := db.Get(azEngineKey(rng.IntN(azEngineKeys)))
				if err != nil {
					return err
				}
				_ = append([]byte(nil), v...) // the copy a caller needs past Close
				return closer.Close()
			}},
		{"engine-range100",
			func(ctx context.Context, rng *rand.Rand, _ []byte) error {
				n := 0
				err := e.Range(azEngineKey(rng.IntN(azEngineKeys-200)), nil, false, func(engines.Record) error {
					if n++; n == 100 {
						return errStop
					}
					return nil
				})
				if errors.Is(err, errStop) {
					return nil
				}
				return err
			},
			func(ctx context.Context, rng *rand.Rand, _ []byte) error {
				it, err := db.NewIter(&pebble.IterOptions{LowerBound: azEngineKey(rng.IntN(azEngineKeys - 200))})
				if err != nil {
					return err
				}
				n := 0
				for ok := it.First(); ok && n < 100; ok = it.Next() {
					_ = append([]byte(nil), it.Value()...)
					n++
				}
				return it.Close()
			}},
	}
	for _, w := range workloads {
		res, err := clCompare(ctx, out, w.name, []clContender{{name: "ordered", op: w.ordered}, {name: "pebble", op: w.pebble}}, cfg)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "ratio ordered/pebble %s %.2f\n", w.name, res["ordered"][0]/res["pebble"][0])
	}
	return nil
}
