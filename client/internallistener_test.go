package client_test

import (
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
)

// TestInternalListener: table servers serve the cluster on a listener of
// their own. The master knows both addresses, the stream layer reaches
// every extent node at the internal one (so extent replication never
// shares the client port), replicated writes work through it, and a
// tenant is refused there even for a method it may call on the client
// listener.
func TestInternalListener(t *testing.T) {
	tc := startCluster(t, 3)
	ctx := testCtx(t)
	c := newClient(t, tc)
	servers, err := c.ListServers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	internal := map[string]string{}
	for _, s := range servers {
		if s.GetInternalAddr() == "" || s.GetInternalAddr() == s.GetAddr() {
			t.Fatalf("server %s: addr %s, internal addr %q; want a listener of its own", s.GetId(), s.GetAddr(), s.GetInternalAddr())
		}
		internal[s.GetId()] = s.GetInternalAddr()
	}
	nodes, err := c.Streams().Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.Addr != internal[n.ID] {
			t.Errorf("extent node %s at %s; want its internal address %s", n.ID, n.Addr, internal[n.ID])
		}
	}

	_, mc := newTenant(t, tc, "other", nil)
	resp, err := mc.CreateTenant(ctx, &api.CreateTenantRequest{Tenant: "outsider"})
	if err != nil {
		t.Fatal(err)
	}
	tenantCred := client.TenantCredential("outsider", 1, resp.GetTenant().GetKeys()[0])
	tn, err := client.New(ctx, client.Options{Masters: tc.MasterAddrs(), Seed: testSeed, Credential: tenantCred})
	if err != nil {
		t.Fatal(err)
	}
	defer tn.Close()
	if _, err := tn.CreateTable(ctx, "t", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 1, Replication: 3}); err != nil {
		t.Fatal(err)
	}
	tb := tn.Table("t")
	if err := tb.Put(ctx, []byte("k"), []byte("v")); err != nil {
		t.Fatalf("a replicated write: %v", err)
	}
	m, err := tb.Map(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p := m.GetPartitions()[0]
	primary := p.GetReplicas()[0].GetServerId()
	req := &api.GetRequest{Header: &api.RequestHeader{Tenant: "outsider", Table: "t", PartitionId: p.GetId(), Epoch: p.GetEpoch()}, Key: []byte("k")}
	dial := func(addr string, cred client.Credential) api.TableServerClient {
		cc, err := grpc.NewClient(addr, append(cred.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return api.NewTableServerClient(cc)
	}
	if _, err := dial(internal[primary], tenantCred).Get(ctx, req); api.CodeOf(err) != api.ErrorCode_ERROR_CODE_PERMISSION_DENIED {
		t.Fatalf("a tenant's Get on the internal listener: %v; want PERMISSION_DENIED", err)
	}
	var clientAddr string
	for _, s := range servers {
		if s.GetId() == primary {
			clientAddr = s.GetAddr()
		}
	}
	if r, err := dial(clientAddr, tenantCred).Get(ctx, req); err != nil || string(r.GetValue()) != "v" {
		t.Fatalf("the same Get on the client listener: %v, %v", r, err)
	}
	if r, err := dial(internal[primary], tc.Credential()).Get(ctx, req); err != nil || string(r.GetValue()) != "v" {
		t.Fatalf("the cluster credential on the internal listener: %v, %v", r, err)
	}
}
