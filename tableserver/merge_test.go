package tableserver_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
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

// mergeFixture starts servers and a point table t of two partitions (an
// ordered one, split at key-2, if storage ends in "/ordered").
func mergeFixture(t *testing.T, ctx context.Context, servers, replicas int, storage string, opts testcluster.Options) (*fixture, []*api.Partition) {
	t.Helper()
	kind, topts := api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 2, Replication: uint32(replicas), Storage: storage}
	if st, ok := strings.CutSuffix(storage, "/ordered"); ok {
		kind, topts = api.TableKind_TABLE_KIND_ORDERED, &api.TableOptions{Replication: uint32(replicas), Storage: st, SplitPoints: [][]byte{[]byte("key-2")}}
	}
	opts.Servers = servers
	c, err := testcluster.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	f := &fixture{c: c, conns: map[string]*grpc.ClientConn{}}
	f.master = api.NewMasterClient(f.dial(t, c.MasterAddr()))
	resp, err := f.master.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: "t", Kind: kind, Options: topts})
	if err != nil {
		t.Fatal(err)
	}
	return f, resp.GetMap().GetPartitions()
}

// owner is the partition of ps whose hash (or key) range holds k.
func owner(t *testing.T, ps []*api.Partition, k []byte) *api.Partition {
	t.Helper()
	h := keyspace.Hash(k)
	for _, p := range ps {
		if p.GetKeyStart() != nil || p.GetKeyEnd() != nil || len(ps) > 1 && ps[1].GetKeyStart() != nil {
			if bytes.Compare(k, p.GetKeyStart()) >= 0 && (len(p.GetKeyEnd()) == 0 || bytes.Compare(k, p.GetKeyEnd()) < 0) {
				return p
			}
			continue
		}
		if h >= p.GetStart() && h <= p.GetEnd() {
			return p
		}
	}
	t.Fatalf("no partition owns %q", k)
	return nil
}

// putKeys writes n keys through their partitions' primaries.
func (f *fixture) putKeys(t *testing.T, ctx context.Context, ps []*api.Partition, n int) [][]byte {
	t.Helper()
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "key-%d", i)
		p := owner(t, ps, keys[i])
		if _, err := eventually(t, func() (*api.PutResponse, error) {
			return f.server(t, p).Put(ctx, &api.PutRequest{Header: hdr(p), Key: keys[i], Value: keys[i]})
		}); err != nil {
			t.Fatalf("put %q: %v", keys[i], err)
		}
	}
	return keys
}

// mergedChild waits until the map shows one partition with its log.
func (f *fixture) mergedChild(t *testing.T, ctx context.Context) *api.Partition {
	t.Helper()
	for {
		m, err := f.master.GetPartitionMap(ctx, &api.GetPartitionMapRequest{Tenant: api.DefaultTenant, Table: "t"})
		if err != nil {
			t.Fatal(err)
		}
		if ps := m.GetMap().GetPartitions(); len(ps) == 1 && ps[0].GetLog().GetExtent() != 0 {
			return ps[0]
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the map never replaced the parents by their child: %v", m.GetMap().GetPartitions())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// checkChild reads every key from every replica of the merged child and
// writes to it.
func (f *fixture) checkChild(t *testing.T, ctx context.Context, c *api.Partition, keys [][]byte) {
	t.Helper()
	for _, r := range c.GetReplicas() {
		h := hdr(c)
		h.ReadAny = true
		cl := api.NewTableServerClient(f.dial(t, r.GetAddr()))
		for _, k := range keys {
			g, err := eventually(t, func() (*api.GetResponse, error) { return cl.Get(ctx, &api.GetRequest{Header: h, Key: k}) })
			if err != nil || string(g.GetValue()) != string(k) {
				t.Fatalf("read_any %q from child %d on %s: %v, %v", k, c.GetId(), r.GetServerId(), g, err)
			}
		}
	}
	if _, err := eventually(t, func() (*api.PutResponse, error) {
		return f.server(t, c).Put(ctx, &api.PutRequest{Header: hdr(c), Key: []byte("after"), Value: []byte("after")})
	}); err != nil {
		t.Fatalf("put to child %d: %v", c.GetId(), err)
	}
}

// TestMergePartitions: two partitions on different servers with different
// primaries merge: the master aligns them (moves, primary transfer), each
// primary appends its merge record, every server merges the two engines,
// and the child serves every key from every replica, takes writes, and
// still knows a write's request id from before the merge (its retry
// returns the first outcome and applies nothing).
func TestMergePartitions(t *testing.T) {
	for _, storage := range []string{"ssd", "memory", "ssd/ordered"} {
		t.Run(strings.ReplaceAll(storage, "/", "-"), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			f, ps := mergeFixture(t, ctx, 3, 2, storage, testcluster.Options{})
			keys := f.putKeys(t, ctx, ps, 40)
			k0 := keys[0]
			p0 := owner(t, ps, k0)
			first, err := f.server(t, p0).Put(ctx, &api.PutRequest{Header: hdr(p0), Key: k0, Value: []byte("first"), RequestId: "req-merge-1"})
			if err != nil {
				t.Fatal(err)
			}
			resp, err := f.master.MergePartitions(ctx, &api.MergePartitionsRequest{Tenant: api.DefaultTenant, Table: "t", Index: 0, Wait: true})
			if err != nil {
				t.Fatalf("merge: %v", err)
			}
			if !resp.GetDone() || resp.GetChild().GetMergeLeft() != ps[0].GetId() || resp.GetChild().GetMergeRight() != ps[1].GetId() {
				t.Fatalf("merge answered %v", resp)
			}
			c := f.mergedChild(t, ctx)
			if c.GetStart() != ps[0].GetStart() || c.GetEnd() != ps[1].GetEnd() || len(c.GetKeyStart()) != 0 || len(c.GetKeyEnd()) != 0 ||
				c.GetEpoch() <= max(ps[0].GetEpoch(), ps[1].GetEpoch()) {
				t.Fatalf("child %v", c)
			}
			// The request id outcome survived: the retry answers the first
			// LSN and does not apply again (the value written since stays).
			if _, err := eventually(t, func() (*api.PutResponse, error) {
				return f.server(t, c).Put(ctx, &api.PutRequest{Header: hdr(c), Key: k0, Value: k0})
			}); err != nil {
				t.Fatal(err)
			}
			again, err := f.server(t, c).Put(ctx, &api.PutRequest{Header: hdr(c), Key: k0, Value: []byte("first"), RequestId: "req-merge-1"})
			if err != nil || again.GetLsn() != first.GetLsn() {
				t.Fatalf("retried write after the merge: %v, %v; first LSN %d", again, err, first.GetLsn())
			}
			f.checkChild(t, ctx, c, keys)
		})
	}
}

// TestMergeRestart: a server stops in the middle of its merge, at
// Options.OnMerge's crash points, and is restarted. After the MERGED
// marker it must report the merge from the merged engine on disk; before
// it, it must merge again from the parents. Either way the child serves
// every key written before the merge, and writes.
func TestMergeRestart(t *testing.T) {
	for _, replicas := range []int{1, 3} {
		for _, committed := range []bool{true, false} {
			t.Run(fmt.Sprintf("replicas=%d/committed=%v", replicas, committed), func(t *testing.T) { testMergeRestart(t, replicas, committed) })
		}
	}
}

func testMergeRestart(t *testing.T, replicas int, committed bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hit := make(chan int, 1)
	armed := make(chan struct{}, 1)
	armed <- struct{}{}
	victim := replicas - 1 // the only server, or a secondary's as a rule
	var again atomic.Int32 // the victim's merges after the crash
	f, ps := mergeFixture(t, ctx, replicas, replicas, "ssd", testcluster.Options{
		MasterOptions: func(o *tablemaster.Options) { o.SplitAllWait = time.Minute },
		ServerOptions: func(i int, o *tableserver.Options) {
			o.OnMerge = func(rctx context.Context, child uint64, at bool) {
				if at != committed || i != victim {
					return
				}
				select {
				case <-armed:
				default:
					again.Add(1)
					return
				}
				hit <- i
				<-rctx.Done() // the crash: the server is killed here
			}
		}})
	keys := f.putKeys(t, ctx, ps, 40)
	if _, err := f.master.MergePartitions(ctx, &api.MergePartitionsRequest{Tenant: api.DefaultTenant, Table: "t", Index: 0}); err != nil {
		t.Fatalf("merge: %v", err)
	}
	select {
	case <-hit:
	case <-ctx.Done():
		m, err := f.master.GetPartitionMap(context.Background(), &api.GetPartitionMapRequest{Tenant: api.DefaultTenant, Table: "t"})
		t.Fatalf("the merge never reached its crash point; the map: %v %v", m.GetMap().GetPartitions(), err)
	}
	if err := f.c.KillServer(victim); err != nil {
		t.Fatal(err)
	}
	if err := f.c.RestartServer(ctx, victim); err != nil {
		t.Fatal(err)
	}
	c := f.mergedChild(t, ctx)
	f.checkChild(t, ctx, c, keys)
	// After the marker the restarted server takes the merged engine as
	// it is; before it, it merges again (the only server: with three,
	// the master may finish the merge with the two live ones while the
	// victim is down, and the victim copies the child).
	if n := again.Load(); committed && n != 0 || !committed && n == 0 && replicas == 1 {
		t.Fatalf("the restarted server merged %d more times (committed %v)", n, committed)
	}
}
