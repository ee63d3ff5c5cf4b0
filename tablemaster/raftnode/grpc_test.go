package raftnode

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/tabuladb/tabula/engines/vfs"
	"google.golang.org/grpc"
)

// grpcMember is one member on a real gRPC server on 127.0.0.1.
type grpcMember struct {
	id   uint64
	addr string
	dir  string
	srv  *grpc.Server
	tr   *GRPCTransport
	node *Node
	sm   *sumSM
	done chan struct{}
	// leads receives the terms at which this member became leader.
	leads chan uint64
}

func (m *grpcMember) start(t *testing.T, peers map[uint64]string) {
	t.Helper()
	lis, err := net.Listen("tcp", m.addr)
	if err != nil {
		t.Fatal(err)
	}
	m.addr = lis.Addr().String()
	m.srv = grpc.NewServer()
	m.tr = NewGRPCTransport(m.id, nil)
	m.tr.Register(m.srv)
	m.done = make(chan struct{})
	go func() {
		defer close(m.done)
		_ = m.srv.Serve(lis)
	}()
	m.sm = &sumSM{}
	if peers != nil {
		peers[m.id] = m.addr
	}
	m.leads = make(chan uint64, 16)
	m.node, err = Start(Options{
		ID: m.id, Dir: m.dir, FS: vfs.Default, StateMachine: m.sm, Transport: m.tr, Peers: peers,
		SnapshotEvery: 20, KeepEntries: 5,
		OnLeaderChange: func(lc LeaderChange) {
			if lc.IsLeader {
				m.leads <- lc.Term
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
}

func (m *grpcMember) stop() {
	if m.node == nil {
		return
	}
	_ = m.node.Close()
	m.srv.Stop()
	<-m.done
	_ = m.tr.Close()
	m.node = nil
}

// TestGRPCCluster runs three members over real gRPC: proposals, a killed
// leader replaced within about 2 s, proposals on the new leader, and the
// old leader restarted and caught up by snapshot.
func TestGRPCCluster(t *testing.T) {
	checkLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	members := map[uint64]*grpcMember{}
	// Listen first, so every member knows every address.
	peers := map[uint64]string{}
	for id := uint64(1); id <= 3; id++ {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		peers[id] = lis.Addr().String()
		_ = lis.Close()
		members[id] = &grpcMember{id: id, addr: peers[id], dir: t.TempDir()}
	}
	for _, m := range members {
		p := map[uint64]string{}
		for id, a := range peers {
			p[id] = a
		}
		m.start(t, p)
	}
	t.Cleanup(func() {
		for _, m := range members {
			m.stop()
		}
	})
	leader := func() *grpcMember {
		for _, m := range members {
			if m.node != nil && m.node.Status().IsLeader {
				return m
			}
		}
		return nil
	}
	waitFor(t, 5*time.Second, "a leader", func() bool { return leader() != nil })
	var want uint64
	propose := func(n int) {
		t.Helper()
		for range n {
			want++
			if _, _, err := leader().node.Propose(ctx, u64(want)); err != nil {
				t.Fatal(err)
			}
		}
	}
	propose(30)
	old := leader()
	for _, m := range members {
		if m == old {
			continue
		}
		var nl *NotLeaderError
		if _, _, err := m.node.Propose(ctx, u64(1)); !errors.As(err, &nl) || nl.LeaderAddr != old.addr {
			t.Fatalf("propose on follower: %v, want NotLeaderError naming %s", err, old.addr)
		}
	}

	oldTerm := old.node.Status().Term
	if got := <-old.leads; got != oldTerm {
		t.Fatalf("leader notified of term %d, leads at %d", got, oldTerm)
	}
	old.stop()
	killed := time.Now()
	waitFor(t, 5*time.Second, "a new leader", func() bool { return leader() != nil })
	failover := time.Since(killed)
	t.Logf("new leader %d after %v", leader().id, failover)
	if failover > 3*time.Second {
		t.Errorf("failover took %v, want about 2 s at most", failover)
	}
	select {
	case term := <-leader().leads:
		if term <= oldTerm {
			t.Fatalf("new leader notified of term %d, not past %d", term, oldTerm)
		}
	default:
		t.Fatal("new leader was not notified")
	}
	propose(60) // past several snapshots: the log the old leader needs is gone

	old.start(t, nil)
	own := old.sm.restored() // its own latest snapshot, restored by Start
	waitFor(t, 10*time.Second, "the restarted member to catch up", func() bool {
		sum, _ := old.sm.state()
		return sum == want*(want+1)/2
	})
	if got := old.sm.restored(); got <= own {
		t.Fatalf("restarted member last restored a snapshot at %d, its own from before; want one from the leader", got)
	}
	if err := old.node.ReadIndex(ctx); err != nil {
		t.Fatal(err)
	}
	st := old.node.Status()
	if st.IsLeader || st.Leader == 0 || st.LeaderAddr != leader().addr || len(st.Members) != 3 {
		t.Fatalf("restarted member's status %+v", st)
	}
}
