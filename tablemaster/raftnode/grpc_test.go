package raftnode

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/engines/vfs"
	"google.golang.org/grpc"
)

// grpcMember is one member on a real gRPC server on 127.0.0.1, and with
// internal set a second one, its internal listener, as a master has.
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

	// internal: serve an internal listener too, on ilis if set (taken by
	// serve) or else a free port; iaddr is its address.
	internal bool
	ilis     net.Listener
	iaddr    string
	isrv     *grpc.Server
	idone    chan struct{}
	// Raft Send and SendSnapshot streams each listener took, over every
	// start.
	clientStreams, internalStreams atomic.Int64
}

// countRaftStreams counts the raft message streams a server takes.
func countRaftStreams(n *atomic.Int64) grpc.ServerOption {
	return grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if info.FullMethod == api.Raft_Send_FullMethodName || info.FullMethod == api.Raft_SendSnapshot_FullMethodName {
			n.Add(1)
		}
		return h(srv, ss)
	})
}

func (m *grpcMember) start(t *testing.T, peers map[uint64]string) {
	t.Helper()
	m.serve(t)
	m.startNode(t, peers)
}

// serve starts the member's listeners and its transport.
func (m *grpcMember) serve(t *testing.T) {
	t.Helper()
	lis, err := net.Listen("tcp", m.addr)
	if err != nil {
		t.Fatal(err)
	}
	m.addr = lis.Addr().String()
	m.srv = grpc.NewServer(countRaftStreams(&m.clientStreams))
	m.tr = NewGRPCTransport(m.id, nil)
	m.tr.Register(m.srv)
	m.done = make(chan struct{})
	go func() {
		defer close(m.done)
		_ = m.srv.Serve(lis)
	}()
	if !m.internal {
		return
	}
	ilis := m.ilis
	m.ilis = nil
	if ilis == nil {
		if ilis, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	m.iaddr = ilis.Addr().String()
	m.isrv = grpc.NewServer(countRaftStreams(&m.internalStreams))
	m.tr.Register(m.isrv)
	m.tr.SetInternalAddr(m.iaddr)
	m.idone = make(chan struct{})
	go func() {
		defer close(m.idone)
		_ = m.isrv.Serve(ilis)
	}()
}

// startNode starts the raft member on the transport serve made.
func (m *grpcMember) startNode(t *testing.T, peers map[uint64]string) {
	t.Helper()
	m.sm = &sumSM{}
	if peers != nil {
		peers[m.id] = m.addr
	}
	m.leads = make(chan uint64, 16)
	var err error
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
	if m.isrv != nil {
		m.isrv.Stop()
		<-m.idone
		m.isrv = nil
	}
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

// startGroup starts three members, those internal names with an internal
// listener, every listener serving before any member starts, so that no
// raft stream can reach a client listener before its member's internal
// address is known.
func startGroup(t *testing.T, internal func(id uint64) bool) map[uint64]*grpcMember {
	t.Helper()
	members, peers := serveGroup(t, internal)
	for _, m := range members {
		m.startNode(t, maps.Clone(peers))
	}
	return members
}

// serveGroup is startGroup's first half: three members serving their
// listeners (stopped at the test's end), their raft nodes not started;
// it returns them and their client addresses.
func serveGroup(t *testing.T, internal func(id uint64) bool) (map[uint64]*grpcMember, map[uint64]string) {
	t.Helper()
	members := map[uint64]*grpcMember{}
	peers := map[uint64]string{}
	for id := uint64(1); id <= 3; id++ {
		m := &grpcMember{id: id, addr: "127.0.0.1:0", dir: t.TempDir(), internal: internal(id)}
		m.serve(t)
		members[id] = m
		peers[id] = m.addr
	}
	t.Cleanup(func() {
		for _, m := range members {
			m.stop()
		}
	})
	return members, peers
}

func groupLeader(members map[uint64]*grpcMember) *grpcMember {
	for _, m := range members {
		if m.node != nil && m.node.Status().IsLeader {
			return m
		}
	}
	return nil
}

// proposeAll proposes n entries on the leader and waits until every
// running member applied them; want is the running total.
func proposeAll(ctx context.Context, t *testing.T, members map[uint64]*grpcMember, want *uint64, n int) {
	t.Helper()
	waitFor(t, 5*time.Second, "a leader", func() bool { return groupLeader(members) != nil })
	for range n {
		*want++
		if _, _, err := groupLeader(members).node.Propose(ctx, u64(*want)); err != nil {
			t.Fatal(err)
		}
	}
	sum := *want * (*want + 1) / 2
	for _, m := range members {
		if m.node == nil {
			continue
		}
		waitFor(t, 5*time.Second, fmt.Sprintf("member %d to apply %d entries", m.id, *want), func() bool {
			got, _ := m.sm.state()
			return got == sum
		})
	}
}

// raftAddr is where raft traffic to m should go: its internal listener if
// it has one.
func (m *grpcMember) raftAddr() string {
	if m.internal {
		return m.iaddr
	}
	return m.addr
}

// TestGRPCRaftOnInternalListeners: peers are named by their client
// addresses, yet raft messages go to each member's internal listener
// (none reach a client listener); a member without one is reached at its
// client address, and a group with none elects and commits as before.
func TestGRPCRaftOnInternalListeners(t *testing.T) {
	for _, tc := range []struct {
		name     string
		internal func(id uint64) bool
	}{
		{"all", func(uint64) bool { return true }},
		{"none", func(uint64) bool { return false }},
		{"mixed", func(id uint64) bool { return id != 3 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkLeaks(t)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			members := startGroup(t, tc.internal)
			var want uint64
			proposeAll(ctx, t, members, &want, 30)
			leader := groupLeader(members)
			for _, m := range members {
				for _, p := range members {
					// Followers send to the leader only.
					if p != m && (m == leader || p == leader) {
						waitFor(t, 5*time.Second, fmt.Sprintf("member %d to send to member %d at %s", m.id, p.id, p.raftAddr()), func() bool {
							return m.tr.PeerAddr(p.id) == p.raftAddr()
						})
					}
				}
			}
			for _, m := range members {
				c, i := m.clientStreams.Load(), m.internalStreams.Load()
				t.Logf("member %d: %d raft streams on its client listener, %d on its internal one", m.id, c, i)
				if m.internal && (c != 0 || i == 0) {
					t.Errorf("member %d with an internal listener took %d raft streams on its client listener and %d on its internal one; want 0 and some", m.id, c, i)
				}
				if !m.internal && c == 0 {
					t.Errorf("member %d without an internal listener took no raft stream on its client listener", m.id)
				}
			}
		})
	}
}

// TestGRPCRaftInternalRestart restarts a follower on a new internal port:
// the others learn it again, at its client address, and the group commits
// with it (the third member stopped) over the new internal listener.
func TestGRPCRaftInternalRestart(t *testing.T) {
	checkLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	members := startGroup(t, func(uint64) bool { return true })
	var want uint64
	proposeAll(ctx, t, members, &want, 10)
	leader := groupLeader(members)
	var x, y *grpcMember
	for _, m := range members {
		switch {
		case m == leader:
		case x == nil:
			x = m
		default:
			y = m
		}
	}
	oldAddr, oldStreams := x.iaddr, x.internalStreams.Load()
	// Listen on the new port before the old one closes: it differs.
	ilis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	x.stop()
	proposeAll(ctx, t, members, &want, 10)
	x.ilis = ilis
	x.serve(t)
	x.startNode(t, nil)
	if x.iaddr == oldAddr {
		t.Fatalf("restarted on the same internal address %s", oldAddr)
	}
	waitFor(t, 10*time.Second, fmt.Sprintf("the leader to send to member %d at its new internal address %s", x.id, x.iaddr), func() bool {
		return leader.tr.PeerAddr(x.id) == x.iaddr
	})
	proposeAll(ctx, t, members, &want, 10) // x catches up
	clientBefore := map[uint64]int64{}
	for _, m := range members {
		clientBefore[m.id] = m.clientStreams.Load()
	}
	y.stop()
	proposeAll(ctx, t, members, &want, 10) // a quorum needs x
	if x.internalStreams.Load() == oldStreams {
		t.Errorf("member %d's new internal listener took no raft stream", x.id)
	}
	for _, m := range []*grpcMember{leader, x} {
		if got := m.clientStreams.Load(); got != clientBefore[m.id] {
			t.Errorf("member %d's client listener took %d raft streams once every address was learned", m.id, got-clientBefore[m.id])
		}
	}
}

// TestGRPCRaftInternalUnreachable: a member names an internal address
// nobody answers at (a port closed between masters); the others fall back
// to its client address and the group commits.
func TestGRPCRaftInternalUnreachable(t *testing.T) {
	checkLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := lis.Addr().String()
	_ = lis.Close()
	members, peers := serveGroup(t, func(uint64) bool { return false })
	members[3].tr.SetInternalAddr(closed)
	for _, m := range members {
		m.startNode(t, maps.Clone(peers))
	}
	var want uint64
	proposeAll(ctx, t, members, &want, 5)
	// Make member 3 needed: with member 2 stopped, a leader among 1 and 3
	// commits only through the link between them.
	members[2].stop()
	proposeAll(ctx, t, members, &want, 5)
	if c := members[3].clientStreams.Load(); c == 0 {
		t.Errorf("member 3 took no raft stream on its client listener")
	}
	if got := members[1].tr.PeerAddr(3); got != members[3].addr {
		t.Errorf("member 1 sends to member 3 at %q, want its client address %s", got, members[3].addr)
	}
}
