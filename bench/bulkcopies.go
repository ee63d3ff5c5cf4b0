package main

import (
	"context"
	"fmt"
	"io"
	"math"
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
	"github.com/tabuladb/tabula/engines/bulk"
	"github.com/tabuladb/tabula/internal/testcluster"
)

// bulkCopies is bulkswitch's "copies" section: one hot bulk partition with
// three serving copies on a cluster of four servers. Readers Get random
// keys; how the reads spread over the copies (from the copies' read
// counters), then reads while the server of one copy is killed (failed
// reads, p99 against steady) and the time until a replacement copy on the
// fourth server has the version loaded.
func bulkCopies(ctx context.Context, w io.Writer, dir string, keys, readers int, phase time.Duration) error {
	tc, err := testcluster.Start(ctx, testcluster.Options{Servers: 4, Dir: filepath.Join(dir, "copies")})
	if err != nil {
		return err
	}
	defer tc.Close()
	c, err := client.New(ctx, client.Options{Credential: tc.Credential(), Masters: []string{tc.MasterAddr()}})
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.CreateTable(ctx, "hot", api.TableKind_TABLE_KIND_BULK, &api.TableOptions{Partitions: 1, Replication: 3}); err != nil {
		return err
	}
	tb := c.Table("hot")
	key := benchBulkKey
	p, err := benchBuildTSV(ctx, dir, "hot", 1, 1, keys, func(int) string { return strings.Repeat("v", 64) })
	if err != nil {
		return err
	}
	if err := tb.PublishBulk(ctx, p, client.PublishOptions{}); err != nil {
		return err
	}

	// reads per copy (server id), as the servers last reported them.
	readsByCopy := func() (map[string]uint64, error) {
		d, err := c.DescribeTable(ctx, "hot")
		if err != nil {
			return nil, err
		}
		out := map[string]uint64{}
		for _, st := range d.GetReplicas() {
			out[st.GetServerId()] = st.GetReads()
		}
		return out, nil
	}
	var (
		stop    atomic.Bool
		killed  atomic.Bool
		failed  atomic.Int64
		firstMu sync.Mutex
		first   error // guarded by firstMu
		mu      sync.Mutex
		steady  []time.Duration // guarded by mu
		after   []time.Duration // guarded by mu
		wg      sync.WaitGroup
	)
	for g := range readers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 11))
			var st, af []time.Duration
			for !stop.Load() {
				k := killed.Load()
				t0 := time.Now()
				_, err := tb.Get(ctx, []byte(key(r.IntN(keys))))
				d := time.Since(t0)
				if err != nil {
					failed.Add(1)
					firstMu.Lock()
					if first == nil {
						first = err
					}
					firstMu.Unlock()
					continue
				}
				if k {
					af = append(af, d)
				} else {
					st = append(st, d)
				}
			}
			mu.Lock()
			steady, after = append(steady, st...), append(after, af...)
			mu.Unlock()
		})
	}
	halt := func() {
		stop.Store(true)
		wg.Wait()
	}
	before, err := readsByCopy()
	if err != nil {
		halt()
		return err
	}
	time.Sleep(phase)
	// The counters arrive with the servers' full heartbeats (every half
	// second): wait for two.
	time.Sleep(1200 * time.Millisecond)
	now, err := readsByCopy()
	if err != nil {
		halt()
		return err
	}
	var ids []string
	total := 0.0
	for id := range now {
		ids = append(ids, id)
		total += float64(now[id] - before[id])
	}
	slices.Sort(ids)
	maxDev := 0.0
	for i, id := range ids {
		share := float64(now[id]-before[id]) / total
		maxDev = max(maxDev, math.Abs(share-1.0/3)/(1.0/3))
		fmt.Fprintf(w, "figure bulkcopies_share_copy%d %.3f (server %s, %d reads)\n", i, share, id, now[id]-before[id])
	}
	fmt.Fprintf(w, "figure bulkcopies_share_max_deviation %.1f %% of a third (target ≤ 10)\n", 100*maxDev)

	// Kill the server of the primary copy.
	m, err := tb.Map(ctx)
	if err != nil {
		halt()
		return err
	}
	victim := m.GetPartitions()[0].GetReplicas()[0].GetServerId()
	failedBefore := failed.Load()
	killedAt := time.Now()
	killed.Store(true)
	if err := tc.KillServer(slices.Index(tc.ServerIDs(), victim)); err != nil {
		halt()
		return err
	}
	var replaced time.Duration
	for replaced == 0 && time.Since(killedAt) < time.Minute {
		time.Sleep(50 * time.Millisecond)
		d, err := c.DescribeTable(ctx, "hot")
		if err != nil {
			continue
		}
		reps := d.GetMap().GetPartitions()[0].GetReplicas()
		if len(reps) != 3 || slices.ContainsFunc(reps, func(r *api.Replica) bool { return r.GetServerId() == victim }) {
			continue
		}
		loaded := 0
		for _, st := range d.GetReplicas() {
			for _, l := range st.GetBulkLoaded() {
				if l.GetVersion() == 1 {
					loaded++
				}
			}
		}
		if loaded == 3 {
			replaced = time.Since(killedAt)
		}
	}
	time.Sleep(phase / 2)
	halt()
	pct := func(ds []time.Duration, p float64) float64 {
		if len(ds) == 0 {
			return 0
		}
		slices.Sort(ds)
		return float64(ds[min(len(ds)-1, int(p*float64(len(ds))))].Microseconds())
	}
	fmt.Fprintf(w, "figure bulkcopies_failed_reads_after_kill %d (of %d reads after the kill; target 0)\n", failed.Load()-failedBefore, len(after))
	fmt.Fprintf(w, "figure bulkcopies_get_p99_steady %.0f us (%d reads)\n", pct(steady, 0.99), len(steady))
	fmt.Fprintf(w, "figure bulkcopies_get_p99_after_kill %.0f us\n", pct(after, 0.99))
	if replaced == 0 {
		fmt.Fprintf(w, "note: no replacement copy loaded within a minute of the kill\n")
	} else {
		fmt.Fprintf(w, "figure bulkcopies_replacement_loaded_seconds %.2f s\n", replaced.Seconds())
	}
	if failed.Load() > 0 {
		firstMu.Lock()
		fmt.Fprintf(w, "note: first failed read: %v\n", first)
		firstMu.Unlock()
	}
	return nil
}

// benchBulkKey is the i-th key of the bulk suites' tables.
func benchBulkKey(i int) string { return fmt.Sprintf("%016x", uint64(i)*0x9e3779b97f4a7c15) }

// benchBuildTSV writes records benchBulkKey(i) -> value(i), i < n, as a
// TSV under dir and builds it into version of a table of parts partitions
// (dir/name), ready to publish.
func benchBuildTSV(ctx context.Context, dir, name string, parts int, version uint64, n int, value func(int) string) (client.BulkPublish, error) {
	in := filepath.Join(dir, name+".tsv")
	var sb strings.Builder
	for i := range n {
		fmt.Fprintf(&sb, "%s\t%s\n", benchBulkKey(i), value(i))
	}
	if err := os.WriteFile(in, []byte(sb.String()), 0o644); err != nil {
		return client.BulkPublish{}, err
	}
	out := filepath.Join(dir, name)
	if _, err := bulk.BuildTable(ctx, []string{in}, out, bulk.BuildOptions{Partitions: parts, Version: version}); err != nil {
		return client.BulkPublish{}, err
	}
	dv, err := bulk.DescribeDir(ctx, out, parts)
	if err != nil {
		return client.BulkPublish{}, err
	}
	p := client.BulkPublish{Version: dv.Version}
	for _, f := range dv.Files {
		p.Files = append(p.Files, client.BulkFile{Path: f.Path, Size: uint64(f.FileBytes), CRC32C: f.CRC, Records: f.Records})
	}
	return p, nil
}
