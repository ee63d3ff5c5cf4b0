package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/testcluster"
	"github.com/tabuladb/tabula/tableserver"
)

func init() {
	register(suite{
		name:  "bulkswitch",
		about: "bulk version switch: time per replica to apply a switch, and BatchGet latency and failures while versions switch (in-process cluster, real gRPC)",
		run:   runBulkSwitch,
	})
}

func runBulkSwitch(w io.Writer, args []string) error {
	fs := flag.NewFlagSet("bulkswitch", flag.ContinueOnError)
	keys := fs.Int("keys", 200_000, "records per version")
	parts := fs.Int("partitions", 8, "table partitions")
	servers := fs.Int("servers", 3, "table servers")
	switches := fs.Int("switches", 10, "version switches (rollbacks between two versions; each rolls the version out again from its streams)")
	readers := fs.Int("readers", 2, "goroutines issuing BatchGets of 64 keys")
	sections := fs.String("sections", "switch,copies,rollout", "sections: switch (version switches under BatchGets), copies (a hot partition's reads over its 3 serving copies, and a copy's server killed), rollout (row-by-row rollouts of new versions under BatchGets)")
	rolloutRounds := fs.Int("rollout-rounds", 5, "rollout: rollouts measured (each after a steady phase)")
	rolloutPhase := fs.Duration("rollout-phase", 3*time.Second, "rollout: length of each steady phase")
	copyKeys := fs.Int("copies-keys", 100_000, "copies: records of the hot partition")
	copyReaders := fs.Int("copies-readers", 4, "copies: goroutines issuing Gets")
	copyPhase := fs.Duration("copies-phase", 5*time.Second, "copies: length of the steady phase (the phase after the kill is half of it, past the replacement)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	secs := clSet(*sections)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "tabula-bench-bulkswitch-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if secs["copies"] {
		if err := bulkCopies(ctx, w, dir, *copyKeys, *copyReaders, *copyPhase); err != nil {
			return fmt.Errorf("copies: %w", err)
		}
	}
	if secs["rollout"] {
		if err := bulkRollout(ctx, w, dir, *parts, *keys, *readers, *rolloutRounds, *rolloutPhase); err != nil {
			return fmt.Errorf("rollout: %w", err)
		}
	}
	if !secs["switch"] {
		return nil
	}

	var (
		applyMu  sync.Mutex
		applies  []time.Duration
		counting atomic.Bool
	)
	tc, err := testcluster.Start(ctx, testcluster.Options{
		Servers: *servers, Dir: filepath.Join(dir, "cluster"),
		ServerOptions: func(_ int, o *tableserver.Options) {
			o.OnMapApplied = func(_ uint64, took time.Duration) {
				if counting.Load() {
					applyMu.Lock()
					applies = append(applies, took)
					applyMu.Unlock()
				}
			}
		},
	})
	if err != nil {
		return err
	}
	defer tc.Close()
	c, err := client.New(ctx, client.Options{Credential: tc.Credential(), Masters: []string{tc.MasterAddr()}})
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.CreateTable(ctx, "model", api.TableKind_TABLE_KIND_BULK, &api.TableOptions{Partitions: uint32(*parts)}); err != nil {
		return err
	}
	tb := c.Table("model")
	key := benchBulkKey
	for v := 1; v <= 2; v++ {
		p, err := benchBuildTSV(ctx, dir, fmt.Sprintf("v%d", v), *parts, uint64(v), *keys, func(i int) string {
			return fmt.Sprintf("v%d:%s:%s", v, key(i), strings.Repeat("x", 64-22))
		})
		if err != nil {
			return err
		}
		start := time.Now()
		if err := tb.PublishBulk(ctx, p, client.PublishOptions{}); err != nil {
			return err
		}
		fmt.Fprintf(w, "figure bulkswitch_publish_v%d_ms %.1f ms (%d records, %d partitions, %d servers)\n", v, float64(time.Since(start).Microseconds())/1000, *keys, *parts, *servers)
	}

	// Readers: BatchGets of 64 random keys; every answer must come from one
	// version.
	type sample struct {
		d         time.Duration
		switching bool
	}
	var (
		stop      atomic.Bool
		switching atomic.Bool
		mu        sync.Mutex
		samples   []sample
		failed    atomic.Int64
		mixed     atomic.Int64
		wg        sync.WaitGroup
	)
	for g := range *readers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 7))
			ks := make([][]byte, 64)
			var local []sample
			for !stop.Load() {
				for i := range ks {
					ks[i] = []byte(key(r.IntN(*keys)))
				}
				sw := switching.Load()
				t0 := time.Now()
				res, err := tb.BatchGet(ctx, ks)
				d := time.Since(t0)
				if err != nil {
					failed.Add(1)
					continue
				}
				local = append(local, sample{d, sw})
				tag := ""
				for _, x := range res {
					tg, _, _ := strings.Cut(string(x.Value), ":")
					if !x.Found || (tag != "" && tg != tag) {
						mixed.Add(1)
					}
					tag = tg
				}
			}
			mu.Lock()
			samples = append(samples, local...)
			mu.Unlock()
		})
	}
	time.Sleep(2 * time.Second) // steady state: no switches
	switching.Store(true)
	counting.Store(true)
	for i := range *switches {
		v := uint64(1 + i%2)
		if err := tb.BulkRollback(ctx, v); err != nil {
			stop.Store(true)
			wg.Wait()
			return fmt.Errorf("switch %d to version %d: %w", i, v, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	counting.Store(false)
	switching.Store(false)
	stop.Store(true)
	wg.Wait()

	var steady, during []time.Duration
	for _, s := range samples {
		if s.switching {
			during = append(during, s.d)
		} else {
			steady = append(steady, s.d)
		}
	}
	pct := func(ds []time.Duration, p float64) time.Duration {
		if len(ds) == 0 {
			return 0
		}
		slices.Sort(ds)
		return ds[min(len(ds)-1, int(p*float64(len(ds))))]
	}
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }
	applyMu.Lock()
	ap := slices.Clone(applies)
	applyMu.Unlock()
	fmt.Fprintf(w, "figure bulkswitch_switches %d\n", *switches)
	fmt.Fprintf(w, "figure bulkswitch_apply_per_replica_p50 %.1f us (%d map applies on %d servers)\n", us(pct(ap, 0.5)), len(ap), *servers)
	fmt.Fprintf(w, "figure bulkswitch_apply_per_replica_p99 %.1f us\n", us(pct(ap, 0.99)))
	fmt.Fprintf(w, "figure bulkswitch_apply_per_replica_max %.1f us\n", us(pct(ap, 1)))
	fmt.Fprintf(w, "figure bulkswitch_batchget64_steady_p50 %.1f us (%d calls)\n", us(pct(steady, 0.5)), len(steady))
	fmt.Fprintf(w, "figure bulkswitch_batchget64_steady_p99 %.1f us\n", us(pct(steady, 0.99)))
	fmt.Fprintf(w, "figure bulkswitch_batchget64_switching_p50 %.1f us (%d calls)\n", us(pct(during, 0.5)), len(during))
	fmt.Fprintf(w, "figure bulkswitch_batchget64_switching_p99 %.1f us\n", us(pct(during, 0.99)))
	fmt.Fprintf(w, "figure bulkswitch_failed_reads %d\n", failed.Load())
	fmt.Fprintf(w, "figure bulkswitch_mixed_or_missing_values %d\n", mixed.Load())
	if s, d := pct(steady, 0.99), pct(during, 0.99); s > 0 {
		fmt.Fprintf(w, "ratio switching/steady batchget64_p99 %.2f\n", float64(d)/float64(s))
	}
	return nil
}
