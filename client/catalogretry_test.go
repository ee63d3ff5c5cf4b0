package client_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
)

// loseFirstReply is a client interceptor that sends the first call of
// method, runs between on success (another client acts while the reply is
// in flight), and reports the reply lost (UNAVAILABLE), as when the leader
// dies after committing the change.
func loseFirstReply(method string, between func()) grpc.DialOption {
	var done atomic.Bool
	return grpc.WithChainUnaryInterceptor(func(ctx context.Context, m string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, m, req, reply, cc, opts...)
		if m != method || err != nil || done.Swap(true) {
			return err
		}
		between()
		return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "test_reply_lost", "test: the reply was lost")
	})
}

// TestCreateRetriedAfterDropIsOnce: a CreateTable whose first attempt was
// applied but whose reply was lost is retried; someone dropped the table
// in between. The retry must not create it again: one call, one effect
// (the master nemesis found a create applied twice so).
func TestCreateRetriedAfterDropIsOnce(t *testing.T) {
	tc := startCluster(t, 1)
	ctx := testCtx(t)
	other := newClient(t, tc)
	opts := &api.TableOptions{Partitions: 1, Replication: 1, Storage: "memory"}
	c, err := client.New(ctx, client.Options{Masters: []string{tc.MasterAddr()}, Credential: tc.Credential(), Seed: testSeed,
		DialOptions: []grpc.DialOption{loseFirstReply("/tabula.v1.Master/CreateTable", func() {
			if err := other.DropTable(ctx, "once"); err != nil {
				t.Errorf("drop between the attempts: %v", err)
			}
		})}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.CreateTable(ctx, "once", api.TableKind_TABLE_KIND_POINT, opts); err != nil {
		t.Fatalf("create with a lost reply: %v", err)
	}
	_, err = other.DescribeTable(ctx, "once")
	wantCode(t, "describe after create, drop, retried create", err, api.ErrorCode_ERROR_CODE_NOT_FOUND)
	// A new call is a new request: it creates.
	if _, err := c.CreateTable(ctx, "once", api.TableKind_TABLE_KIND_POINT, opts); err != nil {
		t.Fatal(err)
	}
	if _, err := other.DescribeTable(ctx, "once"); err != nil {
		t.Fatal(err)
	}
}

// TestDropRetriedAfterCreateIsOnce: the same for DropTable: a retried drop
// whose first attempt was applied does not drop the table someone created
// again in between.
func TestDropRetriedAfterCreateIsOnce(t *testing.T) {
	tc := startCluster(t, 1)
	ctx := testCtx(t)
	other := newClient(t, tc)
	opts := &api.TableOptions{Partitions: 1, Replication: 1, Storage: "memory"}
	if _, err := other.CreateTable(ctx, "once", api.TableKind_TABLE_KIND_POINT, opts); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(ctx, client.Options{Masters: []string{tc.MasterAddr()}, Credential: tc.Credential(), Seed: testSeed,
		DialOptions: []grpc.DialOption{loseFirstReply("/tabula.v1.Master/DropTable", func() {
			if _, err := other.CreateTable(ctx, "once", api.TableKind_TABLE_KIND_POINT, opts); err != nil {
				t.Errorf("create between the attempts: %v", err)
			}
		})}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.DropTable(ctx, "once"); err != nil {
		t.Fatalf("drop with a lost reply: %v", err)
	}
	if _, err := other.DescribeTable(ctx, "once"); err != nil {
		t.Fatalf("the table created after the drop was applied is gone: %v", err)
	}
}

// TestMasterAddressTakenBySomethingElse: a master's address answered by
// a gRPC server without the master API (the master is down and another
// process took its port) counts as that master being unavailable: the
// client goes on to the next one instead of failing every call.
func TestMasterAddressTakenBySomethingElse(t *testing.T) {
	tc := startCluster(t, 1)
	ctx := testCtx(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	other := grpc.NewServer() // serves nothing
	go func() { _ = other.Serve(lis) }()
	defer other.Stop()
	c := newClient(t, tc, lis.Addr().String(), tc.MasterAddr())
	if _, err := c.ListServers(ctx); err != nil {
		t.Fatalf("list servers with the first master address taken: %v", err)
	}
	if _, err := c.CreateTable(ctx, "t", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 1, Replication: 1, Storage: "memory"}); err != nil {
		t.Fatalf("create table with the first master address taken: %v", err)
	}
}
