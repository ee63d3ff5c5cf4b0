package auth_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/auth"
	"github.com/tabuladb/tabula/internal/testcluster"
	_ "github.com/tabuladb/tabula/replication/stream/streampb"
)

// services are every gRPC service a master or table server serves.
var services = []string{"tabula.v1.Master", "tabula.v1.TableServer", "tabula.stream.v1.ExtentNode", "tabula.v1.Raft"}

// call invokes method on cc with a request of its input type, naming
// tenant wherever the request has a tenant, under metadata md; streams
// send the one request and read one reply.
func call(ctx context.Context, cc *grpc.ClientConn, m protoreflect.MethodDescriptor, full, tenant string, md metadata.MD) error {
	req := dynamicpb.NewMessage(m.Input())
	setTenant(req, tenant)
	ctx = metadata.NewOutgoingContext(ctx, md)
	if !m.IsStreamingClient() && !m.IsStreamingServer() {
		return cc.Invoke(ctx, full, req, dynamicpb.NewMessage(m.Output()))
	}
	st, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: m.IsStreamingServer(), ClientStreams: m.IsStreamingClient()}, full)
	if err != nil {
		return err
	}
	if err := st.SendMsg(req); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	_ = st.CloseSend()
	return st.RecvMsg(dynamicpb.NewMessage(m.Output()))
}

func setTenant(m protoreflect.Message, tenant string) {
	fs := m.Descriptor().Fields()
	if f := fs.ByName("tenant"); f != nil && f.Kind() == protoreflect.StringKind {
		m.Set(f, protoreflect.ValueOfString(tenant))
	}
	if f := fs.ByName("header"); f != nil && f.Kind() == protoreflect.MessageKind {
		setTenant(m.Mutable(f).Message(), tenant)
	}
	if f := fs.ByName("get"); f != nil && f.Kind() == protoreflect.MessageKind {
		// A call on the Calls stream: a Get, with an id.
		setTenant(m.Mutable(f).Message(), tenant)
		m.Set(fs.ByName("id"), protoreflect.ValueOfUint64(1))
	}
	if f := fs.ByName("gets"); f != nil && f.IsList() && f.Kind() == protoreflect.MessageKind {
		l := m.Mutable(f).List()
		e := l.NewElement()
		setTenant(e.Message(), tenant)
		l.Append(e)
	}
}

func signedMD(t *testing.T, c auth.Credential, full string, msg any, at time.Time) metadata.MD {
	kv, err := c.Sign(full, msg, at)
	if err != nil {
		t.Fatal(err)
	}
	return metadata.Pairs(kv...)
}

// TestEveryRPCRefusesOutsiders sends every RPC of every service to a real
// master and table server unsigned, wrongly signed, with a stale
// timestamp, as a tenant acting on another tenant or calling a
// cluster-only method, and replayed; each is refused and nothing changes.
func TestEveryRPCRefusesOutsiders(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tc, err := testcluster.Start(ctx, testcluster.Options{Servers: 1, Masters: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	admin, err := client.New(ctx, tc.ClientOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	// A victim tenant with a table, and the attacker, a tenant of its own.
	leader := tc.MasterAddrs()[tc.Leader()]
	cc, err := grpc.NewClient(leader, append(tc.Credential().DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	mc := api.NewMasterClient(cc)
	if _, err := mc.CreateTenant(ctx, &api.CreateTenantRequest{Tenant: "victim"}); err != nil {
		t.Fatal(err)
	}
	att, err := mc.CreateTenant(ctx, &api.CreateTenantRequest{Tenant: "attacker"})
	if err != nil {
		t.Fatal(err)
	}
	victim, err := client.New(ctx, client.Options{Masters: tc.MasterAddrs(), Tenant: "victim", Credential: tc.Credential()})
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close()
	if _, err := victim.CreateTable(ctx, "secrets", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 1, Replication: 1}); err != nil {
		t.Fatal(err)
	}
	tbl := victim.Table("secrets")
	if err := tbl.Put(ctx, []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	before := mapVersion(ctx, t, mc)

	attacker := auth.Credential{Principal: "attacker", KeyID: 1, Key: att.GetTenant().GetKeys()[0]}
	wrong := auth.Credential{Principal: "victim", KeyID: 1, Key: auth.NewKey()}
	targets := map[string]string{"tabula.v1.Master": leader, "tabula.v1.Raft": leader,
		"tabula.v1.TableServer": tc.ServerAddrs()[0], "tabula.stream.v1.ExtentNode": tc.ServerAddrs()[0]}
	refused := func(err error, want codesOf, what string) {
		t.Helper()
		if got := api.CodeOf(err); !want[got] {
			t.Errorf("%s: got %v (%v), want a refusal", what, got, err)
		}
	}
	unauth := codesOf{api.ErrorCode_ERROR_CODE_UNAUTHENTICATED: true}
	denied := codesOf{api.ErrorCode_ERROR_CODE_PERMISSION_DENIED: true}
	n := 0
	for _, svc := range services {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
		if err != nil {
			t.Fatalf("service %s: %v", svc, err)
		}
		conn, err := grpc.NewClient(targets[svc], grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ms := d.(protoreflect.ServiceDescriptor).Methods()
		for i := 0; i < ms.Len(); i++ {
			m := ms.Get(i)
			full := "/" + svc + "/" + string(m.Name())
			n++
			cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
			refused(call(cctx, conn, m, full, "victim", nil), unauth, full+" unsigned")
			stream := m.IsStreamingClient() || m.IsStreamingServer()
			msgFor := func(tenant string) any {
				if stream {
					return nil
				}
				req := dynamicpb.NewMessage(m.Input())
				setTenant(req, tenant)
				return req
			}
			refused(call(cctx, conn, m, full, "victim", signedMD(t, wrong, full, msgFor("victim"), time.Now())), unauth, full+" wrong key")
			refused(call(cctx, conn, m, full, "victim", signedMD(t, auth.Credential(tc.Credential()), full, msgFor("victim"), time.Now().Add(-20*time.Minute))), unauth, full+" stale")
			// As the attacker on the victim's tenant: authenticated (so
			// remembered) but denied; the same signature again is a replay.
			md := signedMD(t, attacker, full, msgFor("victim"), time.Now())
			first := call(cctx, conn, m, full, "victim", md)
			refused(first, denied, full+" as another tenant")
			refused(call(cctx, conn, m, full, "victim", md), unauth, full+" replayed")
			if auth.MethodAccess(full) == auth.Tenant && !strings.Contains(full, "DescribeTenant") {
				// A tenant signing with a wrong body (digest) is refused.
				md := signedMD(t, attacker, full, msgFor("attacker"), time.Now())
				if !stream {
					refused(call(cctx, conn, m, full, "victim", md), unauth, full+" body changed after signing")
				}
			}
			ccancel()
		}
	}
	if n < 60 {
		t.Fatalf("checked %d methods; the services have more", n)
	}
	if after := mapVersion(ctx, t, mc); after != before {
		t.Errorf("cluster map version %d → %d: a refused call changed something", before, after)
	}
	if v, err := tbl.Get(ctx, []byte("k")); err != nil || string(v) != "v" {
		t.Errorf("victim's key after the attack = %q, %v", v, err)
	}
}

type codesOf map[api.ErrorCode]bool

func mapVersion(ctx context.Context, t *testing.T, mc api.MasterClient) uint64 {
	t.Helper()
	resp, err := mc.GetPartitionMap(ctx, &api.GetPartitionMapRequest{Tenant: "victim", Table: "secrets"})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetMap().GetVersion()
}
