package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/testcluster"
)

// bulkRollout is bulkswitch's "rollout" section: a bulk table of parts
// partitions × 3 copies on four servers (one spare row) under BatchGet
// readers; each round is a steady phase, then the publish of a new
// version, which rolls out row by row (an extra copy of each partition
// loads it, the row switches, the oldest row leaves, three times). It
// reports per round the rollout's time (all of the publish, and its rows
// once every file was stored), BatchGet p99 during it ÷ p99 in the
// steady phase before, and failed or mixed reads; then the medians.
func bulkRollout(ctx context.Context, w io.Writer, dir string, parts, keys, readers, rounds int, phase time.Duration) error {
	tc, err := testcluster.Start(ctx, testcluster.Options{Servers: 4, Dir: filepath.Join(dir, "rollout")})
	if err != nil {
		return err
	}
	defer tc.Close()
	c, err := client.New(ctx, client.Options{Credential: tc.Credential(), Masters: []string{tc.MasterAddr()}})
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.CreateTable(ctx, "model", api.TableKind_TABLE_KIND_BULK, &api.TableOptions{Partitions: uint32(parts), Replication: 3}); err != nil {
		return err
	}
	tb := c.Table("model")
	key := benchBulkKey
	build := func(v int) (client.BulkPublish, error) {
		return benchBuildTSV(ctx, dir, fmt.Sprintf("r%d", v), parts, uint64(v), keys, func(i int) string {
			return fmt.Sprintf("v%d:%s", v, strings.Repeat("x", 62))
		})
	}
	p, err := build(1)
	if err != nil {
		return err
	}
	if err := tb.PublishBulk(ctx, p, client.PublishOptions{}); err != nil {
		return err
	}

	// phase: 0 before the first round, then 3k+1 in round k's steady
	// phase, 3k+2 while its files are stored, 3k+3 during its rows.
	type sample struct {
		d     time.Duration
		phase int32
	}
	var (
		stop      atomic.Bool
		cur       atomic.Int32
		mu        sync.Mutex
		samples   []sample
		failed    atomic.Int64
		mixed     atomic.Int64
		firstMu   sync.Mutex
		firstFail string
		wg        sync.WaitGroup
	)
	for g := range readers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 13))
			ks := make([][]byte, 64)
			var local []sample
			for !stop.Load() {
				for i := range ks {
					ks[i] = []byte(key(r.IntN(keys)))
				}
				ph := cur.Load()
				t0 := time.Now()
				res, err := tb.BatchGet(ctx, ks)
				d := time.Since(t0)
				if err != nil {
					failed.Add(1)
					firstMu.Lock()
					if firstFail == "" {
						firstFail = err.Error()
					}
					firstMu.Unlock()
					continue
				}
				local = append(local, sample{d, ph})
				tag := ""
				for _, x := range res {
					tg, _, _ := strings.Cut(string(x.Value), ":")
					if !x.Found || (tag != "" && tg != tag) {
						mixed.Add(1)
						break
					}
					tag = tg
				}
			}
			mu.Lock()
			samples = append(samples, local...)
			mu.Unlock()
		})
	}
	halt := func() {
		stop.Store(true)
		wg.Wait()
	}
	var totals, rowTimes []time.Duration
	for k := range rounds {
		v := k + 2
		p, err := build(v) // before the steady phase: not measured
		if err != nil {
			halt()
			return err
		}
		cur.Store(int32(3*k + 1))
		time.Sleep(phase)
		cur.Store(int32(3*k + 2))
		start := time.Now()
		var storedAt atomic.Int64
		err = tb.PublishBulk(ctx, p, client.PublishOptions{Progress: func(pp client.PublishProgress) {
			if pp.Stored == pp.Partitions && storedAt.Load() == 0 {
				storedAt.Store(int64(time.Since(start)))
				cur.Store(int32(3*k + 3))
			}
		}})
		total := time.Since(start)
		if err != nil {
			halt()
			return fmt.Errorf("round %d: publish version %d: %w", k, v, err)
		}
		totals = append(totals, total)
		rowTimes = append(rowTimes, total-time.Duration(storedAt.Load()))
	}
	cur.Store(int32(3*rounds + 1))
	time.Sleep(phase / 4)
	halt()

	byPhase := map[int32][]time.Duration{}
	for _, s := range samples {
		byPhase[s.phase] = append(byPhase[s.phase], s.d)
	}
	pct := func(ds []time.Duration, q float64) time.Duration {
		if len(ds) == 0 {
			return 0
		}
		slices.Sort(ds)
		return ds[min(len(ds)-1, int(q*float64(len(ds))))]
	}
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }
	var ratios, storeRatios []float64
	for k := range rounds {
		st, sto, du := byPhase[int32(3*k+1)], byPhase[int32(3*k+2)], byPhase[int32(3*k+3)]
		s99, st99, d99 := pct(st, 0.99), pct(sto, 0.99), pct(du, 0.99)
		ratio, sratio := 0.0, 0.0
		if s99 > 0 {
			ratio, sratio = float64(d99)/float64(s99), float64(st99)/float64(s99)
		}
		ratios, storeRatios = append(ratios, ratio), append(storeRatios, sratio)
		fmt.Fprintf(w, "round %d: version %d served %v after its publish (rows %v after the files were stored); BatchGet64 p99 steady %.0f us (%d calls), storing %.0f us (%d calls, %.2fx), rows %.0f us (%d calls, %.2fx)\n",
			k+1, k+2, totals[k].Round(time.Millisecond), rowTimes[k].Round(time.Millisecond), us(s99), len(st), us(st99), len(sto), sratio, us(d99), len(du), ratio)
	}
	medDur := func(ds []time.Duration) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[len(s)/2]
	}
	slices.Sort(ratios)
	slices.Sort(storeRatios)
	fmt.Fprintf(w, "figure bulkrollout_seconds %.2f s (median of %d rollouts of %d partitions x 3 rows, %d records; publish to serving)\n", medDur(totals).Seconds(), rounds, parts, keys)
	fmt.Fprintf(w, "figure bulkrollout_rows_seconds %.2f s (after every file was stored)\n", medDur(rowTimes).Seconds())
	fmt.Fprintf(w, "figure bulkrollout_p99_rows_over_steady %.2f (median; the rollout's rows; target <= 1.2)\n", ratios[len(ratios)/2])
	fmt.Fprintf(w, "figure bulkrollout_p99_storing_over_steady %.2f (median; the publisher writing the files into streams)\n", storeRatios[len(storeRatios)/2])
	fmt.Fprintf(w, "figure bulkrollout_failed_reads %d (target 0)\n", failed.Load())
	fmt.Fprintf(w, "figure bulkrollout_mixed_reads %d (target 0)\n", mixed.Load())
	if firstFail != "" {
		fmt.Fprintf(w, "note: first failed read: %s\n", firstFail)
	}
	return nil
}
