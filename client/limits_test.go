package client_test

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/coproc"
	"github.com/tabuladb/tabula/internal/testcluster"
	"github.com/tabuladb/tabula/tableserver"
)

// TestCoprocLimitsEndToEnd, over gRPC on a one-server cluster whose
// coprocessor deadline cap is 300 ms: a spinning guest asked to run for a
// minute is stopped at the cap, and its tenant is charged the CPU time; a
// token reused with other input is refused and changes nothing; a token
// over the server's limit is refused.
func TestCoprocLimitsEndToEnd(t *testing.T) {
	const capDeadline = 300 * time.Millisecond
	cache := os.Getenv("TABULA_COPROC_TEST_CACHE")
	if cache == "" {
		uc, err := os.UserCacheDir()
		if err != nil {
			uc = t.TempDir()
		}
		cache = filepath.Join(uc, "tabula", "coproc-test-wazero")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tc, err := testcluster.Start(ctx, testcluster.Options{Servers: 1, Dir: t.TempDir(),
		ServerOptions: func(_ int, o *tableserver.Options) { o.CoprocCacheDir, o.CoprocMaxDeadline = cache, capDeadline }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tc.Close(); err != nil {
			t.Errorf("close cluster: %v", err)
		}
	})
	c := newClient(t, tc)
	tb := createTable(t, c, "lim", &api.TableOptions{Partitions: 1})
	deploy := func(name, dir string) {
		v, err := tb.DeployCoprocBytes(ctx, name, buildModule(t, dir))
		if err != nil {
			t.Fatal(err)
		}
		if err := tb.WaitCoprocLive(ctx, name, v); err != nil {
			t.Fatal(err)
		}
	}
	deploy("hostile", "examples/hostile")
	deploy("counter", "examples/counter_add")

	// The deadline cap.
	cpu0 := tc.Server(0).CoprocCPU()[api.DefaultTenant]
	t0 := time.Now()
	_, err = tb.Invoke(ctx, "hostile", "spin", client.Invocation{Keys: [][]byte{[]byte("k")}, Timeout: time.Minute})
	took := time.Since(t0)
	if d := api.DetailOf(err); d.GetReason() != "guest_deadline" || !strings.Contains(err.Error(), "caps a call's deadline at 300ms") {
		t.Fatalf("spin with a one-minute timeout: %v", err)
	}
	t.Logf("spin asked for 1m stopped after %v (cap %v)", took, capDeadline)
	if took < capDeadline || took > capDeadline+5*time.Second {
		t.Fatalf("spin stopped after %v, want about %v", took, capDeadline)
	}
	if spent := tc.Server(0).CoprocCPU()[api.DefaultTenant] - cpu0; spent < capDeadline*9/10 || spent > took {
		t.Fatalf("tenant charged %v for a spin of %v", spent, took)
	}

	// A token bound to its input.
	add := func(token string, delta int64) (int64, error) {
		out, err := tb.Invoke(ctx, "counter", "add", client.Invocation{Keys: [][]byte{[]byte("c")}, Input: le64(delta), IdempotencyToken: token})
		if err != nil {
			return 0, err
		}
		return int64(binary.LittleEndian.Uint64(out)), nil
	}
	if got, err := add("tok", 5); err != nil || got != 5 {
		t.Fatalf("first add: %d %v", got, err)
	}
	if got, err := add("tok", 5); err != nil || got != 5 {
		t.Fatalf("retried add: %d %v", got, err)
	}
	_, err = add("tok", 7)
	if d := api.DetailOf(err); d.GetCode() != api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT || d.GetReason() != "token_reused" || !strings.Contains(err.Error(), "other input") {
		t.Fatalf("token reused with other input: %v", err)
	}
	if v, err := tb.Get(ctx, []byte("c")); err != nil || int64(binary.LittleEndian.Uint64(v)) != 5 {
		t.Fatalf("counter after the refused reuse: %v %v", v, err)
	}

	// The server's own bound on a token (the SDK stops at 64 bytes; a
	// raw caller is held to coproc.MaxTokenBytes).
	cc, err := grpc.NewClient(tc.MasterAddr(), append(tc.Credential().DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	mr, err := api.NewMasterClient(cc).GetPartitionMap(ctx, &api.GetPartitionMapRequest{Tenant: api.DefaultTenant, Table: "lim"})
	if err != nil {
		t.Fatal(err)
	}
	p := mr.GetMap().GetPartitions()[0]
	sc, err := grpc.NewClient(tc.ServerAddrs()[0], append(tc.Credential().DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	_, err = api.NewTableServerClient(sc).Invoke(ctx, &api.InvokeRequest{
		Header: &api.RequestHeader{Tenant: api.DefaultTenant, Table: "lim", PartitionId: p.GetId(), Epoch: p.GetEpoch()},
		Name:   "counter", Method: "add", Input: le64(1), Keys: [][]byte{[]byte("c")},
		IdempotencyToken: strings.Repeat("t", coproc.MaxTokenBytes+1),
	})
	if d := api.DetailOf(err); d.GetReason() != "token_too_long" || d.GetLimit() != coproc.MaxTokenBytes {
		t.Fatalf("over-long token: %v", err)
	}
	if v, err := tb.Get(ctx, []byte("c")); err != nil || int64(binary.LittleEndian.Uint64(v)) != 5 {
		t.Fatalf("counter after the refused token: %v %v", v, err)
	}
}
