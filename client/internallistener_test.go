package client_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/testcluster"
	"github.com/tabuladb/tabula/tablemaster"
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

// TestMasterInternalListener: the master serves the cluster on a listener
// of its own too. Table servers learn it from their registration and send
// their heartbeats there, and a tenant is refused there even for a call it
// may make on the client listener.
func TestMasterInternalListener(t *testing.T) {
	var mu sync.Mutex
	beatsOn := map[string]int{} // local address -> heartbeats
	ctx := testCtx(t)
	tc, err := testcluster.Start(ctx, testcluster.Options{Servers: 3, Dir: t.TempDir(),
		MasterOptions: func(o *tablemaster.Options) {
			o.UnaryInterceptors = append(o.UnaryInterceptors, func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				if info.FullMethod == api.Master_Heartbeat_FullMethodName {
					if p, ok := peer.FromContext(ctx); ok && p.LocalAddr != nil {
						mu.Lock()
						beatsOn[p.LocalAddr.String()]++
						mu.Unlock()
					}
				}
				return h(ctx, req)
			})
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tc.Close() })
	internal := tc.Master(0).InternalAddr()
	if internal == "" || internal == tc.MasterAddr() {
		t.Fatalf("master internal address %q (client address %s); want a listener of its own", internal, tc.MasterAddr())
	}
	waitFor(t, 10*time.Second, "heartbeats on the master's internal listener", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return beatsOn[internal] >= 3
	})
	mu.Lock()
	onClient := beatsOn[tc.MasterAddr()]
	mu.Unlock()
	// Heartbeats move over after the first answers; later ones all go to
	// the internal listener.
	time.Sleep(500 * time.Millisecond)
	mu.Lock()
	if n := beatsOn[tc.MasterAddr()]; n != onClient {
		t.Errorf("heartbeats still reach the client listener: %d, then %d", onClient, n)
	}
	mu.Unlock()

	_, mc := newTenant(t, tc, "other", nil)
	resp, err := mc.CreateTenant(ctx, &api.CreateTenantRequest{Tenant: "outsider"})
	if err != nil {
		t.Fatal(err)
	}
	tenantCred := client.TenantCredential("outsider", 1, resp.GetTenant().GetKeys()[0])
	cc, err := grpc.NewClient(internal, append(tenantCred.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if _, err := api.NewMasterClient(cc).ListTables(ctx, &api.ListTablesRequest{Tenant: "outsider"}); api.CodeOf(err) != api.ErrorCode_ERROR_CODE_PERMISSION_DENIED {
		t.Fatalf("a tenant's ListTables on the master's internal listener: %v; want PERMISSION_DENIED", err)
	}
}
