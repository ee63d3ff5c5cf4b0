package tableserver_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/testcluster"
	"github.com/tabuladb/tabula/tableserver"
)

// syncBuffer is a log sink tests read while servers write it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestNewReplicaCopies: when a secondary's server dies, the replica that
// replaces it copies a snapshot from the primary (throttled, while writes
// go on, so the snapshot holds effects of later records) and applies the
// log from the snapshot's LSN; once in sync it holds exactly the primary's
// state: every overwritten, deleted and expiring key as the primary has it.
func TestNewReplicaCopies(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	logs := &syncBuffer{}
	c, err := testcluster.Start(ctx, testcluster.Options{Servers: 4,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		// A slow copy: the writes below overlap it.
		ServerOptions: func(i int, o *tableserver.Options) { o.RepairBandwidth = 64 << 10 },
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
	pc := f.server(t, p)
	const keys = 1500
	key := func(i int) []byte { return fmt.Appendf(nil, "key-%04d", i) }
	val := func(i, gen int) []byte { return bytes.Repeat(fmt.Appendf(nil, "%d/%d.", i, gen), 12) }
	for i := range keys {
		if _, err := eventually(t, func() (*api.PutResponse, error) {
			return pc.Put(ctx, &api.PutRequest{Header: hdr(p), Key: key(i), Value: val(i, 0)})
		}); err != nil {
			t.Fatal(err)
		}
	}
	// Kill a secondary: the master replaces it on the fourth server.
	var victim string
	for _, r := range p.GetReplicas() {
		if r.GetRole() == api.ReplicaRole_REPLICA_ROLE_SECONDARY {
			victim = r.GetServerId()
			break
		}
	}
	ids := c.ServerIDs()
	spare := ""
	for _, id := range ids {
		if !slices.ContainsFunc(p.GetReplicas(), func(r *api.Replica) bool { return r.GetServerId() == id }) {
			spare = id
		}
	}
	if err := c.KillServer(slices.Index(ids, victim)); err != nil {
		t.Fatal(err)
	}
	// Writes go on during the copy: overwrites, deletes, short TTLs.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var lastLSN uint64
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(1, 2))
		for gen := 1; ; gen++ {
			select {
			case <-stop:
				return
			default:
			}
			i := rng.IntN(keys)
			var lsn uint64
			var err error
			switch rng.IntN(4) {
			case 0:
				var d *api.DeleteResponse
				d, err = pc.Delete(ctx, &api.DeleteRequest{Header: hdr(p), Key: key(i)})
				lsn = d.GetLsn()
			case 1:
				var r *api.PutResponse
				r, err = pc.Put(ctx, &api.PutRequest{Header: hdr(p), Key: key(i), Value: val(i, gen), TtlMs: 200})
				lsn = r.GetLsn()
			default:
				var r *api.PutResponse
				r, err = pc.Put(ctx, &api.PutRequest{Header: hdr(p), Key: key(i), Value: val(i, gen)})
				lsn = r.GetLsn()
			}
			if err == nil {
				lastLSN = max(lastLSN, lsn)
			}
			time.Sleep(time.Millisecond)
		}
	})
	var newAddr string
	var newP *api.Partition // the map entry once the new replica is in sync
	deadline := time.Now().Add(60 * time.Second)
	sawCopying := false
	for newAddr == "" {
		if time.Now().After(deadline) {
			close(stop)
			wg.Wait()
			t.Fatalf("no in-sync replica on %s after a minute; logs:\n%s", spare, logs.String())
		}
		d, err := f.master.DescribeTable(ctx, &api.DescribeTableRequest{Tenant: api.DefaultTenant, Name: "t"})
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range d.GetReplicas() {
			if st.GetServerId() != spare {
				continue
			}
			switch st.GetState() {
			case api.ReplicaState_REPLICA_STATE_COPYING:
				sawCopying = true
			case api.ReplicaState_REPLICA_STATE_IN_SYNC:
				for _, r := range d.GetMap().GetPartitions()[0].GetReplicas() {
					if r.GetServerId() == spare {
						newAddr = r.GetAddr()
						newP = d.GetMap().GetPartitions()[0]
					}
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	p = newP
	if !sawCopying {
		t.Errorf("the new replica was never reported copying")
	}
	if !strings.Contains(logs.String(), "copied a snapshot") {
		t.Fatalf("the new replica did not copy a snapshot; logs:\n%s", logs.String())
	}
	// Compare every key: the primary (strong) and the new replica at the
	// last write's LSN, once every short TTL has run out (an expiry
	// between the two reads would differ).
	time.Sleep(300 * time.Millisecond)
	pc = f.server(t, p)
	nc := api.NewTableServerClient(f.dial(t, newAddr))
	h := hdr(p)
	h.ReadAny, h.MinLsn = true, lastLSN
	for i := range keys {
		want, err := pc.Get(ctx, &api.GetRequest{Header: hdr(p), Key: key(i)})
		if err != nil {
			t.Fatal(err)
		}
		got, err := eventually(t, func() (*api.GetResponse, error) { return nc.Get(ctx, &api.GetRequest{Header: h, Key: key(i)}) })
		if err != nil {
			t.Fatalf("key %d at the new replica: %v", i, err)
		}
		if got.GetFound() != want.GetFound() || !bytes.Equal(got.GetValue(), want.GetValue()) || got.GetExpiresUnixMs() != want.GetExpiresUnixMs() {
			t.Fatalf("key %d: primary %v, new replica %v", i, want, got)
		}
	}
}
