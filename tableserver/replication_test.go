package tableserver_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/testcluster"
)

// The replication contract at the server: writes carry LSNs that grow, a
// retried request id returns the first outcome without applying again,
// secondaries answer strong reads NOT_OWNER and read_any reads with the
// LSN they reflect, and min_lsn holds a read until the replica has it.
func TestReplicatedWrites(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := testcluster.Start(ctx, testcluster.Options{Servers: 3})
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
	if len(p.GetReplicas()) != 3 || p.GetLog().GetStream() == "" {
		t.Fatalf("partition %v: want 3 replicas and a log", p)
	}
	pc := f.server(t, p)
	key := keyIn(0, 1)
	put, err := eventually(t, func() (*api.PutResponse, error) {
		return pc.Put(ctx, &api.PutRequest{Header: hdr(p), Key: key, Value: []byte("v1"), RequestId: "r1"})
	})
	if err != nil || put.GetLsn() == 0 {
		t.Fatalf("put: %v, %v", put, err)
	}
	// A CAS, then its retry with the same id: the first outcome again.
	cas := &api.CompareAndSwapRequest{Header: hdr(p), Key: key, ExpectExists: true, Expected: []byte("v1"), Value: []byte("v2"), RequestId: "r2"}
	first, err := pc.CompareAndSwap(ctx, cas)
	if err != nil || !first.GetSwapped() || first.GetLsn() <= put.GetLsn() {
		t.Fatalf("cas: %v, %v", first, err)
	}
	again, err := pc.CompareAndSwap(ctx, cas)
	if err != nil || !again.GetSwapped() || again.GetLsn() != first.GetLsn() {
		t.Fatalf("retried cas: %v (first %v), %v", again, first, err)
	}
	// A request id used for another kind of write is refused.
	if _, err := pc.Delete(ctx, &api.DeleteRequest{Header: hdr(p), Key: key, RequestId: "r2"}); api.CodeOf(err) != api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT {
		t.Fatalf("request id reused for a delete: %v", err)
	}
	for _, r := range p.GetReplicas() {
		if r.GetRole() != api.ReplicaRole_REPLICA_ROLE_SECONDARY {
			continue
		}
		sc := api.NewTableServerClient(f.dial(t, r.GetAddr()))
		_, err := sc.Get(ctx, &api.GetRequest{Header: hdr(p), Key: key})
		for i := 0; i < 100 && api.DetailOf(err).GetReason() == "map_behind"; i++ {
			time.Sleep(20 * time.Millisecond) // the secondary has not applied the latest map yet
			_, err = sc.Get(ctx, &api.GetRequest{Header: hdr(p), Key: key})
		}
		if api.DetailOf(err).GetReason() != "not_primary" {
			t.Fatalf("strong read at a secondary: %v", err)
		}
		h := hdr(p)
		h.ReadAny, h.MinLsn = true, first.GetLsn()
		g, err := eventually(t, func() (*api.GetResponse, error) { return sc.Get(ctx, &api.GetRequest{Header: h, Key: key}) })
		if err != nil || string(g.GetValue()) != "v2" || g.GetLsn() < first.GetLsn() {
			t.Fatalf("read_any with min_lsn %d at %s: %v, %v", first.GetLsn(), r.GetServerId(), g, err)
		}
		h.MinLsn = first.GetLsn() + 1000
		if _, err := sc.Get(ctx, &api.GetRequest{Header: h, Key: key}); api.DetailOf(err).GetReason() != "behind_min_lsn" {
			t.Fatalf("read_any beyond the applied LSN: %v", err)
		}
	}
}
