package tableserver_test

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/testcluster"
	"github.com/tabuladb/tabula/tablemaster"
)

// TestNewReplicaSkipsOldExtents: a new replica copies a snapshot past the
// log's first extent, which no server can serve any more (its files cut
// short everywhere, as when a seal kept only a replica whose server then
// drained and exited). It must get in sync from the later extents without
// reading the first. Before, its tailer read the log from the first extent
// and stayed CATCHING_UP for good (cmd/tabula TestRollingRestart).
func TestNewReplicaSkipsOldExtents(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	logs := &syncBuffer{}
	c, err := testcluster.Start(ctx, testcluster.Options{Servers: 4,
		Logger:       slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		ReplaceAfter: time.Hour, // the dead secondary is kept: this test moves it
		MasterOptions: func(o *tablemaster.Options) {
			o.TruncateInterval = time.Hour // the first extent stays in the log
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f := &fixture{c: c, conns: map[string]*grpc.ClientConn{}}
	f.master = api.NewMasterClient(f.dial(t, c.MasterAddr()))
	resp, err := f.master.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: "t", Kind: api.TableKind_TABLE_KIND_POINT,
		Options: &api.TableOptions{Partitions: 1, Replication: 3, Storage: "ssd"}})
	if err != nil {
		t.Fatal(err)
	}
	p := resp.GetMap().GetPartitions()[0]
	describe := func() *api.DescribeTableResponse {
		t.Helper()
		d, err := f.master.DescribeTable(ctx, &api.DescribeTableRequest{Tenant: api.DefaultTenant, Name: "t"})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	put := func(i int) {
		t.Helper()
		if _, err := eventually(t, func() (*api.PutResponse, error) {
			p = describe().GetMap().GetPartitions()[0]
			return f.server(t, p).Put(ctx, &api.PutRequest{Header: hdr(p), Key: fmt.Appendf(nil, "key-%03d", i), Value: []byte("v")})
		}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 50 {
		put(i)
	}
	first := describe().GetMap().GetPartitions()[0].GetLog().GetExtent()
	if first == 0 {
		t.Fatal("no open log extent after 50 writes")
	}
	// A secondary's server dies: the first extent is sealed and the log
	// continues on the other two.
	ids := c.ServerIDs()
	var victim, spare string
	for _, r := range p.GetReplicas() {
		if r.GetRole() == api.ReplicaRole_REPLICA_ROLE_SECONDARY {
			victim = r.GetServerId()
		}
	}
	for _, id := range ids {
		if !slices.ContainsFunc(p.GetReplicas(), func(r *api.Replica) bool { return r.GetServerId() == id }) {
			spare = id
		}
	}
	if err := c.KillServer(slices.Index(ids, victim)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for e := first; e == first || e == 0; e = describe().GetMap().GetPartitions()[0].GetLog().GetExtent() {
		if time.Now().After(deadline) {
			t.Fatalf("the log did not move past extent %d after %s died", first, victim)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Every copy of the first extent is cut short.
	name := fmt.Sprintf("%016x.ext", first)
	cut := 0
	err = filepath.WalkDir(c.Dir(), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != name {
			return err
		}
		cut++
		return os.Truncate(path, 0)
	})
	if err != nil || cut == 0 {
		t.Fatalf("cut extent %d's files: %d cut, err %v", first, cut, err)
	}
	for i := 50; i < 60; i++ {
		put(i)
	}
	// The dead secondary's replica moves to the spare server, which copies
	// a snapshot from the primary (past the first extent) and follows the
	// log.
	if _, err := f.master.MovePartition(ctx, &api.MovePartitionRequest{Tenant: api.DefaultTenant, Table: "t", Index: 0, From: victim, To: spare}); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(20 * time.Second)
	for {
		d := describe()
		moved := !slices.ContainsFunc(d.GetMap().GetPartitions()[0].GetReplicas(), func(r *api.Replica) bool { return r.GetServerId() == victim })
		var state api.ReplicaState
		for _, st := range d.GetReplicas() {
			if st.GetServerId() == spare {
				state = st.GetState()
			}
		}
		if moved && state == api.ReplicaState_REPLICA_STATE_IN_SYNC {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica on %s is %v (move done: %v) 20s after the move started; want in sync\nlogs:\n%s", spare, state, moved, tail(logs.String(), 40))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := 0
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '\n' {
			if lines++; lines > n {
				return s[i+1:]
			}
		}
	}
	return s
}
