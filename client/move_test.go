package client_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/testcluster"
)

// TestMoveAndDrain: a replica moved to another server, and a drained
// server's every replica, move with their data while clients write: no
// request fails, every acknowledged write is there after, and the drained
// server holds nothing.
func TestMoveAndDrain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tc, err := testcluster.Start(ctx, testcluster.Options{Servers: 4, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	c := newClient(t, tc)
	tbl := createTable(t, c, "mv", &api.TableOptions{Partitions: 2, Replication: 3})
	cc, err := grpc.NewClient(tc.MasterAddr(), append(tc.Credential().DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	master := api.NewMasterClient(cc)
	var (
		mu     sync.Mutex
		latest = map[string][]byte{}
		failed atomic.Int64
		acked  atomic.Int64
		first  atomic.Value
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k, v := fmt.Sprintf("w%d-%d", w, i%100), fmt.Appendf(nil, "%d", i)
				if err := tbl.Put(ctx, []byte(k), v); err != nil {
					failed.Add(1)
					first.CompareAndSwap(nil, err.Error())
					continue
				}
				mu.Lock()
				latest[k] = v
				mu.Unlock()
				acked.Add(1)
			}
		})
	}
	describe := func() []*api.Partition {
		d, err := master.DescribeTable(ctx, &api.DescribeTableRequest{Tenant: api.DefaultTenant, Name: "mv"})
		if err != nil {
			t.Fatal(err)
		}
		return d.GetMap().GetPartitions()
	}
	hosts := func(p *api.Partition, id string) bool {
		return slices.ContainsFunc(p.GetReplicas(), func(r *api.Replica) bool { return r.GetServerId() == id })
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s: %v", what, describe())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// Writes under way, acknowledged on every partition's replicas.
	writes := func(n int64) {
		t.Helper()
		from := acked.Load()
		wait(fmt.Sprintf("%d more writes", n), func() bool { return acked.Load() >= from+n })
	}
	writes(100)
	// Move partition 0's primary to the server it does not use.
	p0 := describe()[0]
	var spare string
	for _, id := range tc.ServerIDs() {
		if !hosts(p0, id) {
			spare = id
		}
	}
	resp, err := master.MovePartition(ctx, &api.MovePartitionRequest{Tenant: api.DefaultTenant, Table: "mv", Index: 0, To: spare})
	if err != nil {
		t.Fatal(err)
	}
	wait("the move of partition 0", func() bool {
		p := describe()[0]
		return !hosts(p, resp.GetFrom()) && hosts(p, spare) && len(p.GetReplicas()) == 3
	})
	if primary := describe()[0].GetReplicas()[0]; primary.GetServerId() != spare || primary.GetRole() != api.ReplicaRole_REPLICA_ROLE_PRIMARY {
		t.Fatalf("the moved primary's replica is not primary on %s: %v", spare, describe()[0].GetReplicas())
	}
	// Drain the server partition 1's primary is on.
	victim := describe()[1].GetReplicas()[0].GetServerId()
	if _, err := master.DrainServer(ctx, &api.DrainServerRequest{ServerId: victim}); err != nil {
		t.Fatal(err)
	}
	wait("the drain", func() bool {
		for _, p := range describe() {
			if hosts(p, victim) || len(p.GetReplicas()) != 3 {
				return false
			}
		}
		return true
	})
	writes(100) // on the new replica sets
	close(stop)
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d writes failed during the moves (first: %v)", failed.Load(), first.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	for k, v := range latest {
		got, err := tbl.Get(ctx, []byte(k))
		if err != nil || !bytes.Equal(got, v) {
			t.Fatalf("%s: %q, %v; want %q", k, got, err, v)
		}
	}
}
