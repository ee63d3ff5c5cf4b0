package workload_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/testcluster"
	"github.com/tabuladb/tabula/internal/workload"
)

func TestRunAgainstCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := testcluster.Start(ctx, testcluster.Options{Servers: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := client.New(ctx, client.Options{Masters: []string{c.MasterAddr()}, Credential: c.Credential()})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.CreateTable(ctx, "w", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 4, Replication: 1}); err != nil {
		t.Fatal(err)
	}
	var phases []string
	res, err := workload.Run(ctx, cl.Table("w"), workload.Options{
		Duration: 1500 * time.Millisecond, Concurrency: 4, ReadPercent: 50, ValueSize: 32, Keys: 3000,
	}, func(p workload.Progress) {
		if len(phases) == 0 || phases[len(phases)-1] != p.Phase {
			phases = append(phases, p.Phase)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Ops == 0 || res.Errors != 0 || res.Misses != 0 || res.Reads == 0 || res.Writes == 0 {
		t.Fatalf("result %+v (first error %v)", res, res.FirstError)
	}
	if res.P50 <= 0 || res.P50 > res.P99 || res.P99 > res.P999 || res.P999 > res.Max {
		t.Fatalf("quantiles out of order: %+v", res)
	}
	if len(phases) == 0 || phases[len(phases)-1] != "run" {
		t.Fatalf("progress phases %v", phases)
	}
	// The preload wrote every key.
	for i := 0; i < 3000; i += 299 {
		if _, err := cl.Table("w").Get(ctx, workload.Key(i)); err != nil {
			t.Fatalf("key %d after preload: %v", i, err)
		}
	}
}

// Failed calls are counted apart (issue 32, item 4): with every Put
// refused (a value over the table's limit) and every Get a miss, ops/s and
// the latency quantiles are the Gets', the failures are counted, live and
// at the end, by kind, with their own (instant) latency.
func TestRunCountsFailuresApart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := testcluster.Start(ctx, testcluster.Options{Servers: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := client.New(ctx, client.Options{Masters: []string{c.MasterAddr()}, Credential: c.Credential()})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.CreateTable(ctx, "w", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 2, Replication: 1, MaxValueBytes: 64}); err != nil {
		t.Fatal(err)
	}
	var live []workload.Progress
	res, err := workload.Run(ctx, cl.Table("w"), workload.Options{
		Duration: 1500 * time.Millisecond, Concurrency: 2, ReadPercent: 50, ValueSize: 100, Keys: 1000, SkipPreload: true,
	}, func(p workload.Progress) { live = append(live, p) })
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors == 0 || res.Writes != 0 || res.Reads == 0 || res.Misses != res.Reads || res.Ops != res.Reads {
		t.Fatalf("result %+v: want every Put failed and counted apart, every Get a miss", res)
	}
	if len(res.ErrorKinds) != 1 || res.ErrorKinds[0].Count != res.Errors || !strings.HasPrefix(res.ErrorKinds[0].Kind, "INVALID_ARGUMENT") {
		t.Fatalf("error kinds %+v (of %d errors)", res.ErrorKinds, res.Errors)
	}
	if res.FirstError == nil || res.ErrorP50 <= 0 || res.ErrorP50 >= res.P50 {
		t.Fatalf("failed calls' p50 %v, the Gets' %v: the refusals are client-side, so faster", res.ErrorP50, res.P50)
	}
	if wantRate := float64(res.Ops) / res.Elapsed.Seconds(); res.OpsPerSec != wantRate {
		t.Fatalf("ops/s %v, want the successful calls' %v", res.OpsPerSec, wantRate)
	}
	if len(live) == 0 {
		t.Fatal("no progress reported")
	}
	last := live[len(live)-1]
	if last.Phase != "run" || last.Errors == 0 || !strings.HasPrefix(last.TopError, "INVALID_ARGUMENT") || last.TopErrorCount != last.Errors || last.Done > res.Ops {
		t.Fatalf("live progress %+v: want the errors counted and named, Done only the successes", last)
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, o := range []workload.Options{{ReadPercent: 101}, {ReadPercent: -1}, {Concurrency: -1}, {ValueSize: -1}, {Keys: -1}, {Duration: -time.Second}} {
		if err := o.Validate(); err == nil {
			t.Errorf("%+v validated", o)
		}
	}
	if err := (workload.Options{}).Validate(); err != nil {
		t.Errorf("zero options: %v", err)
	}
}
