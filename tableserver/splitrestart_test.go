package tableserver_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/keyspace"
	"github.com/tabuladb/tabula/internal/testcluster"
	"github.com/tabuladb/tabula/tablemaster"
	"github.com/tabuladb/tabula/tableserver"
)

// TestSplitRestart: a replica of a partition (its only one, the primary,
// or a secondary of three) stops in the middle of its split, at
// Options.OnSplit's crash points, and is restarted. After the SPLIT marker it must report the split from the
// children it finds on disk (else the master never replaces the parent);
// before the marker it must split again, from the log or at the record
// its engine already applied. Either way the children end up serving
// every key written before the split, and writes.
func TestSplitRestart(t *testing.T) {
	for _, replicas := range []int{1, 3} {
		for _, committed := range []bool{true, false} {
			t.Run(fmt.Sprintf("replicas=%d/committed=%v", replicas, committed), func(t *testing.T) { testSplitRestart(t, replicas, committed) })
		}
	}
}

// testSplitRestart stops the split on the primary (one replica) or on a
// secondary (three), and checks the children on the restarted server.
func testSplitRestart(t *testing.T, replicas int, committed bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var armed atomic.Bool
	armed.Store(true)
	var victim atomic.Int64
	hit := make(chan uint64, 1)
	c, err := testcluster.Start(ctx, testcluster.Options{Servers: replicas,
		// The victim secondary must split (not be left to a copy) however
		// loaded the machine is.
		MasterOptions: func(o *tablemaster.Options) { o.SplitAllWait = time.Minute },
		ServerOptions: func(i int, o *tableserver.Options) {
			o.OnSplit = func(rctx context.Context, pid, lsn uint64, at bool) {
				if at != committed || victim.Load() != int64(i) || !armed.CompareAndSwap(true, false) {
					return
				}
				hit <- lsn
				<-rctx.Done() // the crash: the server is killed here
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f := &fixture{c: c, conns: map[string]*grpc.ClientConn{}}
	f.master = api.NewMasterClient(f.dial(t, c.MasterAddr()))
	resp, err := f.master.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: "t", Kind: api.TableKind_TABLE_KIND_POINT,
		Options: &api.TableOptions{Partitions: 1, Replication: uint32(replicas), Storage: "ssd"}})
	if err != nil {
		t.Fatal(err)
	}
	p := resp.GetMap().GetPartitions()[0]
	victimID := primary(p).GetServerId()
	for _, r := range p.GetReplicas() {
		if r.GetRole() == api.ReplicaRole_REPLICA_ROLE_SECONDARY {
			victimID = r.GetServerId()
			break
		}
	}
	vi := slices.Index(c.ServerIDs(), victimID)
	if vi < 0 {
		t.Fatalf("no server %s in %v", victimID, c.ServerIDs())
	}
	victim.Store(int64(vi))
	pc := f.server(t, p)
	keys := make([][]byte, 40)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "key-%d", i)
		if _, err := eventually(t, func() (*api.PutResponse, error) {
			return pc.Put(ctx, &api.PutRequest{Header: hdr(p), Key: keys[i], Value: keys[i]})
		}); err != nil {
			t.Fatalf("put %q: %v", keys[i], err)
		}
	}
	if _, err := f.master.SplitPartition(ctx, &api.SplitPartitionRequest{Tenant: api.DefaultTenant, Table: "t", Index: 0}); err != nil {
		t.Fatalf("split: %v", err)
	}
	select {
	case lsn := <-hit:
		t.Logf("stopped the split at LSN %d (committed %v)", lsn, committed)
	case <-ctx.Done():
		m, err := f.master.GetPartitionMap(context.Background(), &api.GetPartitionMapRequest{Tenant: api.DefaultTenant, Table: "t"})
		t.Fatalf("the split never reached its crash point on %s; the map: %v %v", victimID, m.GetMap().GetPartitions(), err)
	}
	if err := c.KillServer(vi); err != nil {
		t.Fatal(err)
	}
	if err := c.RestartServer(ctx, vi); err != nil {
		t.Fatal(err)
	}
	var kids []*api.Partition
	for {
		m, err := f.master.GetPartitionMap(ctx, &api.GetPartitionMapRequest{Tenant: api.DefaultTenant, Table: "t"})
		if err != nil {
			t.Fatal(err)
		}
		if ps := m.GetMap().GetPartitions(); len(ps) == 2 && ps[0].GetLog() != nil && ps[1].GetLog() != nil {
			kids = ps
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the map never replaced the parent by its children: %v", m.GetMap().GetPartitions())
		case <-time.After(20 * time.Millisecond):
		}
	}
	owner := func(k []byte) *api.Partition {
		h := keyspace.Hash(k)
		for _, p := range kids {
			if h >= p.GetStart() && h <= p.GetEnd() {
				return p
			}
		}
		t.Fatalf("no child owns %q", k)
		return nil
	}
	for _, k := range keys {
		kp := owner(k)
		g, err := eventually(t, func() (*api.GetResponse, error) {
			return f.server(t, kp).Get(ctx, &api.GetRequest{Header: hdr(kp), Key: k})
		})
		if err != nil || string(g.GetValue()) != string(k) {
			t.Fatalf("get %q from child %d: %v, %v", k, kp.GetId(), g, err)
		}
	}
	// The restarted server's replicas of the children hold every key
	// (read_any reads them there, primary or secondary).
	for _, k := range keys {
		kp := owner(k)
		var addr string
		for _, r := range kp.GetReplicas() {
			if r.GetServerId() == victimID {
				addr = r.GetAddr()
			}
		}
		if addr == "" {
			t.Fatalf("child %d has no replica on the restarted server %s", kp.GetId(), victimID)
		}
		h := hdr(kp)
		h.ReadAny = true
		g, err := eventually(t, func() (*api.GetResponse, error) {
			return api.NewTableServerClient(f.dial(t, addr)).Get(ctx, &api.GetRequest{Header: h, Key: k})
		})
		if err != nil || string(g.GetValue()) != string(k) {
			t.Fatalf("read_any %q from child %d on %s: %v, %v", k, kp.GetId(), victimID, g, err)
		}
	}
	for _, kp := range kids {
		if _, err := eventually(t, func() (*api.PutResponse, error) {
			return f.server(t, kp).Put(ctx, &api.PutRequest{Header: hdr(kp), Key: keyInRange(kp), Value: []byte("after")})
		}); err != nil {
			t.Fatalf("put to child %d: %v", kp.GetId(), err)
		}
	}
}

// keyInRange is a key whose hash falls in p's range.
func keyInRange(p *api.Partition) []byte {
	for j := 0; ; j++ {
		k := fmt.Appendf(nil, "after-%d", j)
		if h := keyspace.Hash(k); h >= p.GetStart() && h <= p.GetEnd() {
			return k
		}
	}
}
