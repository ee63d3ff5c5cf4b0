package tableserver_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/testcluster"
	"github.com/tabuladb/tabula/tableserver"
)

// TestRetryAfterFailoverToSkewedClock: a CAS applied under a request id,
// then its primary dies and a replica whose clock runs 11 minutes ahead
// takes over (past the 10-minute window by the old primary's clock). The
// retry returns the first outcome and does not apply again; the id reused
// for another CAS is refused, before the failover and after it. Before,
// the new primary had dropped the outcome by its clock and swapped again.
func TestRetryAfterFailoverToSkewedClock(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	skews := make([]atomic.Int64, 3)
	c, err := testcluster.Start(ctx, testcluster.Options{Servers: 3, ServerOptions: func(i int, o *tableserver.Options) {
		o.Now = func() time.Time { return time.Now().Add(time.Duration(skews[i].Load())) }
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f := &fixture{c: c, conns: map[string]*grpc.ClientConn{}}
	f.master = api.NewMasterClient(f.dial(t, c.MasterAddr()))
	resp, err := f.master.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: "t", Kind: api.TableKind_TABLE_KIND_POINT,
		Options: &api.TableOptions{Partitions: 1, Replication: 3}})
	if err != nil {
		t.Fatal(err)
	}
	p := resp.GetMap().GetPartitions()[0]
	describe := func() *api.Partition {
		d, err := f.master.DescribeTable(ctx, &api.DescribeTableRequest{Tenant: api.DefaultTenant, Name: "t"})
		if err != nil {
			t.Fatal(err)
		}
		return d.GetMap().GetPartitions()[0]
	}
	// The secondaries' clocks run 11 minutes ahead of the primary's.
	old := primary(p).GetServerId()
	ids := c.ServerIDs()
	for _, r := range p.GetReplicas() {
		if r.GetServerId() != old {
			skews[slices.Index(ids, r.GetServerId())].Store(int64(11 * time.Minute))
		}
	}
	key := keyIn(0, 1)
	put := func(id, v string) uint64 {
		t.Helper()
		r, err := eventually(t, func() (*api.PutResponse, error) {
			p = describe()
			return f.server(t, p).Put(ctx, &api.PutRequest{Header: hdr(p), Key: key, Value: []byte(v), RequestId: id})
		})
		if err != nil {
			t.Fatalf("put %s: %v", id, err)
		}
		return r.GetLsn()
	}
	put("p1", "v1")
	cas := &api.CompareAndSwapRequest{Header: hdr(p), Key: key, ExpectExists: true, Expected: []byte("v1"), Value: []byte("v2"), RequestId: "c1"}
	first, err := f.server(t, p).CompareAndSwap(ctx, cas)
	if err != nil || !first.GetSwapped() {
		t.Fatalf("cas: %v, %v", first, err)
	}
	// The key goes back to v1: a CAS applied again would swap it.
	last := put("p2", "v1")
	reused := &api.CompareAndSwapRequest{Header: hdr(p), Key: key, ExpectExists: true, Expected: []byte("v1"), Value: []byte("v3"), RequestId: "c1"}
	if _, err := f.server(t, p).CompareAndSwap(ctx, reused); api.DetailOf(err).GetReason() != "request_id_reused" {
		t.Fatalf("the id reused for another CAS at the primary: %v; want request_id_reused", err)
	}
	// Every replica applied it all; then the primary dies.
	if primary(p).GetServerId() != old {
		t.Fatalf("the primary moved from %s before the test failed it over: %v", old, p.GetReplicas())
	}
	for _, r := range p.GetReplicas() {
		if r.GetServerId() == old {
			continue
		}
		h := hdr(p)
		h.ReadAny, h.MinLsn = true, last
		sc := api.NewTableServerClient(f.dial(t, r.GetAddr()))
		if _, err := eventually(t, func() (*api.GetResponse, error) { return sc.Get(ctx, &api.GetRequest{Header: h, Key: key}) }); err != nil {
			t.Fatalf("secondary %s: %v", r.GetServerId(), err)
		}
	}
	if err := c.KillServer(slices.Index(ids, old)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for primary(describe()).GetServerId() == old {
		if time.Now().After(deadline) {
			t.Fatal("no failover")
		}
		time.Sleep(20 * time.Millisecond)
	}
	again, err := eventually(t, func() (*api.CompareAndSwapResponse, error) {
		p = describe()
		cas.Header = hdr(p)
		return f.server(t, p).CompareAndSwap(ctx, cas)
	})
	if err != nil || !again.GetSwapped() || again.GetLsn() != first.GetLsn() {
		t.Fatalf("the CAS retried at the new primary (clock 11 minutes ahead): %v, %v; want the first outcome (LSN %d)", again, err, first.GetLsn())
	}
	g, err := f.server(t, p).Get(ctx, &api.GetRequest{Header: hdr(p), Key: key})
	if err != nil || string(g.GetValue()) != "v1" {
		t.Fatalf("after the retry: %v, %v; want v1 (the CAS applied once)", g, err)
	}
	reused.Header = hdr(p)
	if _, err := f.server(t, p).CompareAndSwap(ctx, reused); api.DetailOf(err).GetReason() != "request_id_reused" {
		t.Fatalf("the id reused for another CAS at the new primary: %v; want request_id_reused", err)
	}
}
