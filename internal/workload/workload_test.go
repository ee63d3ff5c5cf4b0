package workload_test

import (
	"context"
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
