package tableserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/testcluster"
	"github.com/tabuladb/tabula/replication/stream"
	"github.com/tabuladb/tabula/tablemaster"
	"github.com/tabuladb/tabula/tableserver"
)

// TestLogTruncated: a partition's commit log moves to a new extent as it
// fills, replicas flush and report how far, and the master deletes the
// extents every replica is past; a server restarted afterwards recovers
// from its engine and the kept log (a memory replica: copies a snapshot),
// and a replica placed afterwards copies a snapshot: every write is still
// there, and the log is trimmed again under the load that follows
// (bounded). For every engine that runs under a log: the ordered engine's
// reports need its Sync (a memtable flush), and a memory table's log,
// which was never trimmed, is trimmed below what every replica applied
// (its restarted or replacing replica copies a snapshot).
func TestLogTruncated(t *testing.T) {
	for _, tc := range []struct {
		kind    api.TableKind
		storage string
	}{
		{api.TableKind_TABLE_KIND_POINT, "ssd"},
		{api.TableKind_TABLE_KIND_POINT, "memory"},
		{api.TableKind_TABLE_KIND_ORDERED, "ssd"},
	} {
		t.Run(api.KindName(tc.kind)+"/"+tc.storage, func(t *testing.T) { testLogTruncated(t, tc.kind, tc.storage) })
	}
}

func testLogTruncated(t *testing.T, kind api.TableKind, storage string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts := testcluster.Options{Servers: 4,
		ServerOptions: func(i int, o *tableserver.Options) {
			o.LogExtentBytes = 32 << 10
			o.LogFlushInterval = 100 * time.Millisecond
		},
		MasterOptions: func(o *tablemaster.Options) { o.TruncateInterval = 200 * time.Millisecond },
	}
	c, err := testcluster.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f := &fixture{c: c, conns: map[string]*grpc.ClientConn{}}
	f.master = api.NewMasterClient(f.dial(t, c.MasterAddr()))
	resp, err := f.master.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: "t", Kind: kind,
		Options: &api.TableOptions{Partitions: 1, Replication: 3, Storage: storage}})
	if err != nil {
		t.Fatal(err)
	}
	p := resp.GetMap().GetPartitions()[0]
	streamInfoErr := func() (stream.StreamInfo, error) {
		var info stream.StreamInfo
		r, err := f.master.Stream(ctx, &api.StreamRequest{Op: api.StreamOp_STREAM_OP_GET, Stream: p.GetLog().GetStream()})
		if err == nil {
			err = json.Unmarshal(r.GetJson(), &info)
		}
		return info, err
	}
	streamInfo := func() stream.StreamInfo {
		t.Helper()
		info, err := streamInfoErr()
		if err != nil {
			t.Fatal(err)
		}
		return info
	}
	// The log's first extent, before any write.
	var first uint64
	deadline := time.Now().Add(10 * time.Second)
	for first == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the log has no extent")
		}
		if info, err := streamInfoErr(); err == nil && len(info.Extents) > 0 {
			first = info.Extents[0].ID
		}
		time.Sleep(10 * time.Millisecond)
	}
	const keys = 600
	stale := true // the map is asked again only after a failed put
	put := func(gen int) (last uint64) {
		for i := range keys {
			key := fmt.Appendf(nil, "k%04d", i)
			r, err := eventually(t, func() (*api.PutResponse, error) {
				if stale {
					d, err := f.master.DescribeTable(ctx, &api.DescribeTableRequest{Tenant: api.DefaultTenant, Name: "t"})
					if err != nil {
						return nil, err
					}
					p, stale = d.GetMap().GetPartitions()[0], false
				}
				r, err := f.server(t, p).Put(ctx, &api.PutRequest{Header: hdr(p), Key: key, Value: fmt.Appendf(nil, "%0100d", gen*keys+i)})
				stale = err != nil
				return r, err
			})
			if err != nil {
				t.Fatal(err)
			}
			last = max(last, r.GetLsn())
		}
		return last
	}
	put(1)
	waitFor(t, "the log truncated", func() (bool, string) {
		ext := streamInfo().Extents
		return ext[0].ID != first, fmt.Sprintf("%d extents, the first %d", len(ext), ext[0].ID)
	})
	// A secondary restarts, and a replica is replaced: both end with
	// every write, though the log no longer starts at LSN 1.
	ids := c.ServerIDs()
	var sec int
	for i, id := range ids {
		for _, r := range p.GetReplicas() {
			if r.GetServerId() == id && r.GetRole() == api.ReplicaRole_REPLICA_ROLE_SECONDARY {
				sec = i
			}
		}
	}
	if err := c.KillServer(sec); err != nil {
		t.Fatal(err)
	}
	put(2)
	if err := c.RestartServer(ctx, sec); err != nil {
		t.Fatal(err)
	}
	trimmed := streamInfo().Extents[0].ID
	last := put(3)
	// Under load the log keeps being trimmed: bounded.
	waitFor(t, "the log trimmed again after the restart", func() (bool, string) {
		ext := streamInfo().Extents
		return ext[0].ID != trimmed, fmt.Sprintf("%d extents, the first %d", len(ext), ext[0].ID)
	})
	d, err := f.master.DescribeTable(ctx, &api.DescribeTableRequest{Tenant: api.DefaultTenant, Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	p = d.GetMap().GetPartitions()[0]
	for _, r := range p.GetReplicas() {
		sc := api.NewTableServerClient(f.dial(t, r.GetAddr()))
		h := hdr(p)
		h.ReadAny, h.MinLsn = true, last
		for i := range keys {
			g, err := eventually(t, func() (*api.GetResponse, error) {
				return sc.Get(ctx, &api.GetRequest{Header: h, Key: fmt.Appendf(nil, "k%04d", i)})
			})
			if err != nil || string(g.GetValue()) != fmt.Sprintf("%0100d", 3*keys+i) {
				t.Fatalf("replica on %s, key %d: %q, %v", r.GetServerId(), i, g.GetValue(), err)
			}
		}
	}
}
