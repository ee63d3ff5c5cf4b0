package tableserver_test

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabuladb/tabula/api"
	_ "github.com/tabuladb/tabula/engines/point"
	"github.com/tabuladb/tabula/tablemaster"
	"github.com/tabuladb/tabula/tableserver"
)

// proxy forwards TCP to target and can cut every connection (a network
// partition between a server and the master).
type proxy struct {
	lis    net.Listener
	target string
	mu     sync.Mutex
	cut    bool       // guarded by mu
	conns  []net.Conn // guarded by mu
	wg     sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{lis: lis, target: target}
	t.Cleanup(func() {
		_ = lis.Close()
		p.setCut(true)
		p.wg.Wait()
	})
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			if p.cut {
				p.mu.Unlock()
				c.Close()
				continue
			}
			d, err := net.Dial("tcp", target)
			if err != nil {
				p.mu.Unlock()
				c.Close()
				continue
			}
			p.conns = append(p.conns, c, d)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); _, _ = io.Copy(d, c); _ = d.Close() }()
			go func() { defer p.wg.Done(); _, _ = io.Copy(c, d); _ = c.Close() }()
		}
	}()
	return p
}

func (p *proxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for _, c := range p.conns {
			c.Close()
		}
		p.conns = nil
	}
}

// TestSplitBrainAfterReregister cuts a server off from the master until its
// partition is moved, heals the link, and checks the old owner acknowledges
// nothing for the moved partition at its old epoch: a server declared dead
// must not serve from its stale map after it registers again.
func TestSplitBrainAfterReregister(t *testing.T) {
	dir := t.TempDir()
	m, err := tablemaster.Open(tablemaster.Options{DataDir: filepath.Join(dir, "m"),
		HeartbeatInterval: 50 * time.Millisecond, LeaseDuration: 500 * time.Millisecond, DeadAfter: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	mlis, _ := net.Listen("tcp", "127.0.0.1:0")
	go func() { _ = m.Serve(mlis) }()
	defer m.Close()
	px := newProxy(t, mlis.Addr().String())

	start := func(name, master string) *tableserver.Server {
		s, err := tableserver.Open(tableserver.Options{Masters: []string{master}, DataDir: filepath.Join(dir, name), FaultDomain: name})
		if err != nil {
			t.Fatal(err)
		}
		lis, _ := net.Listen("tcp", "127.0.0.1:0")
		go func() { _ = s.Serve(lis) }()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.WaitRegistered(ctx); err != nil {
			t.Fatal(err)
		}
		return s
	}
	a := start("a", px.lis.Addr().String())
	defer a.Close()
	ctx := context.Background()
	mc, _ := grpc.NewClient(mlis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer mc.Close()
	master := api.NewMasterClient(mc)
	resp, err := master.CreateTable(ctx, &api.CreateTableRequest{Tenant: "default", Name: "t", Kind: api.TableKind_TABLE_KIND_POINT,
		Options: &api.TableOptions{Partitions: 1, Storage: "memory"}}) // memory: moved off a silent server at once
	if err != nil {
		t.Fatal(err)
	}
	old := resp.GetMap().GetPartitions()[0]
	t.Logf("partition %d epoch %d on %s", old.GetId(), old.GetEpoch(), old.GetReplicas()[0].GetAddr())
	b := start("b", mlis.Addr().String())
	defer b.Close()

	ac, _ := grpc.NewClient(a.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	bc, _ := grpc.NewClient(b.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer ac.Close()
	defer bc.Close()
	ats, bts := api.NewTableServerClient(ac), api.NewTableServerClient(bc)
	hdr := &api.RequestHeader{Tenant: "default", Table: "t", PartitionId: old.GetId(), Epoch: old.GetEpoch()}
	// wait until a serves
	for i := 0; ; i++ {
		if _, err := ats.Put(ctx, &api.PutRequest{Header: hdr, Key: []byte("k"), Value: []byte("v0")}); err == nil {
			break
		} else if i > 100 {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	px.setCut(true)
	// wait for master to move the partition to b
	var moved *api.Partition
	deadline := time.Now().Add(20 * time.Second)
	for {
		if time.Now().After(deadline) {
			t.Fatal("the partition was never moved off the cut-off server")
		}
		gm, err := master.GetPartitionMap(ctx, &api.GetPartitionMapRequest{Tenant: "default", Table: "t"})
		if err != nil {
			t.Fatal(err)
		}
		p := gm.GetMap().GetPartitions()[0]
		if p.GetEpoch() > old.GetEpoch() && len(p.GetReplicas()) > 0 {
			moved = p
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("moved: epoch %d on %s", moved.GetEpoch(), moved.GetReplicas()[0].GetAddr())
	newHdr := &api.RequestHeader{Tenant: "default", Table: "t", PartitionId: moved.GetId(), Epoch: moved.GetEpoch()}
	for i := 0; ; i++ {
		if _, err := bts.Put(ctx, &api.PutRequest{Header: newHdr, Key: []byte("k"), Value: []byte("from-b")}); err == nil {
			break
		} else if i > 200 {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	px.setCut(false)
	healed := time.Now()
	acked := 0
	var first, last time.Duration
	for time.Since(healed) < 3*time.Second {
		_, err := ats.Put(ctx, &api.PutRequest{Header: hdr, Key: []byte("k"), Value: []byte("from-a")})
		if err == nil {
			if acked == 0 {
				first = time.Since(healed)
			}
			last = time.Since(healed)
			acked++
		}
		time.Sleep(2 * time.Millisecond)
	}
	g, _ := bts.Get(ctx, &api.GetRequest{Header: newHdr, Key: []byte("k")})
	t.Logf("old owner a acknowledged %d writes at stale epoch %d (from %v to %v after heal) while b owns epoch %d; b has k=%q",
		acked, old.GetEpoch(), first, last, moved.GetEpoch(), g.GetValue())
	if acked > 0 {
		t.Errorf("split brain: a acknowledged %d writes for a partition the master moved to b", acked)
	}
}
