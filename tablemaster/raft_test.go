package tablemaster

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/auth"
)

// member is one raft master of a test group.
type member struct {
	id     uint64
	addr   string
	dir    string
	m      *Master
	conn   *grpc.ClientConn
	c      api.MasterClient
	served chan error
	// key, when set, is the cluster key; the member then also serves an
	// internal listener (on a new free port at each start, iaddr).
	key     []byte
	iaddr   string
	iserved chan error
}

func (mb *member) start(t *testing.T, peers map[uint64]string) {
	t.Helper()
	m, err := Open(Options{DataDir: mb.dir, RaftID: mb.id, Peers: peers, HeartbeatInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
		LeaseDuration: 200 * time.Millisecond, DeadAfter: 400 * time.Millisecond, RaftTick: 20 * time.Millisecond, ClusterKey: mb.key})
	if err != nil {
		t.Fatal(err)
	}
	var lis net.Listener
	for i := 0; ; i++ { // the port was just closed: it may take a moment to be free again
		lis, err = net.Listen("tcp", mb.addr)
		if err == nil || i > 100 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	mb.m = m
	mb.served = make(chan error, 1)
	go func() { mb.served <- m.Serve(lis) }()
	if mb.key != nil {
		ilis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		mb.iaddr = ilis.Addr().String()
		mb.iserved = make(chan error, 1)
		go func() { mb.iserved <- m.ServeInternal(ilis, "") }()
	}
	if mb.conn == nil {
		cred := auth.Credential{}
		if mb.key != nil {
			cred = auth.Credential{Principal: auth.ClusterPrincipal, Key: mb.key}
		}
		mb.conn, err = grpc.NewClient(mb.addr, append(cred.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		mb.c = api.NewMasterClient(mb.conn)
	}
}

func (mb *member) stop(t *testing.T) {
	t.Helper()
	if mb.m == nil {
		return
	}
	if err := mb.m.Close(); err != nil {
		t.Errorf("close member %d: %v", mb.id, err)
	}
	if err := <-mb.served; err != nil {
		t.Errorf("serve member %d: %v", mb.id, err)
	}
	if mb.iserved != nil {
		if err := <-mb.iserved; err != nil {
			t.Errorf("serve member %d's internal listener: %v", mb.id, err)
		}
		mb.iserved = nil
	}
	mb.m = nil
}

func startGroup(t *testing.T, n int) []*member { return startGroupKey(t, n, nil) }

// startGroupKey starts n members with cluster key key; with a key each
// serves an internal listener too.
func startGroupKey(t *testing.T, n int, key []byte) []*member {
	t.Helper()
	peers := map[uint64]string{}
	var ms []*member
	for i := range n {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		mb := &member{id: uint64(i + 1), addr: lis.Addr().String(), dir: t.TempDir(), key: key}
		lis.Close()
		peers[mb.id] = mb.addr
		ms = append(ms, mb)
	}
	for _, mb := range ms {
		mb.start(t, peers)
	}
	t.Cleanup(func() {
		for _, mb := range ms {
			mb.stop(t)
			if mb.conn != nil {
				mb.conn.Close()
			}
		}
	})
	return ms
}

// leaderOf waits until a member of ms leads (and has caught up) and
// returns it.
func leaderOf(t *testing.T, ms []*member, timeout time.Duration) *member {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, mb := range ms {
			if mb.m != nil && mb.m.leads() {
				return mb
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no leader within %v", timeout)
	return nil
}

// TestRaftMasters: three masters on raft are one authority. Followers
// refuse changes naming the leader, every member applies the same
// catalog, the group survives its leader's loss (a new one leads within
// two seconds and has every table), and a member that comes back catches
// up.
func TestRaftMasters(t *testing.T) {
	ms := startGroup(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lead := leaderOf(t, ms, 10*time.Second)
	create := func(c api.MasterClient, name string) error {
		_, err := c.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: name, Kind: api.TableKind_TABLE_KIND_POINT,
			Options: &api.TableOptions{Partitions: 2, Replication: 1, Storage: "memory"}})
		return err
	}
	// The default tenant is created by the first leader.
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := create(lead.c, "t1")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("create on the leader: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, mb := range ms {
		if mb == lead {
			continue
		}
		err := create(mb.c, "t-follower")
		d := api.DetailOf(err)
		if d.GetReason() != "not_leader" || d.GetLeader() != lead.addr {
			t.Fatalf("create on follower %d: %v (leader %q, want %q)", mb.id, err, d.GetLeader(), lead.addr)
		}
		resp, err := mb.c.MasterMembers(ctx, &api.MasterMembersRequest{})
		if err != nil || !resp.GetReplicated() || len(resp.GetMembers()) != 3 {
			t.Fatalf("members from %d: %v, %v", mb.id, resp, err)
		}
	}
	// Every member applies the same catalog.
	want := lead.m.State().Version
	for _, mb := range ms {
		deadline := time.Now().Add(5 * time.Second)
		for mb.m.State().Version < want {
			if time.Now().After(deadline) {
				t.Fatalf("member %d at version %d, the leader at %d", mb.id, mb.m.State().Version, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if _, err := mb.m.State().Table(api.DefaultTenant, "t1"); err != nil {
			t.Fatalf("member %d: %v", mb.id, err)
		}
	}
	// The leader dies: another leads within 2 s, with the table.
	old := lead
	old.stop(t)
	t0 := time.Now()
	var rest []*member
	for _, mb := range ms {
		if mb != old {
			rest = append(rest, mb)
		}
	}
	lead = leaderOf(t, rest, 5*time.Second)
	if took := time.Since(t0); took > 2*time.Second {
		t.Errorf("new leader after %v", took)
	}
	if _, err := lead.m.State().Table(api.DefaultTenant, "t1"); err != nil {
		t.Fatalf("new leader %d lost the table: %v", lead.id, err)
	}
	for i := range 3 {
		if err := create(lead.c, fmt.Sprintf("t2-%d", i)); err != nil {
			t.Fatalf("create on the new leader: %v", err)
		}
	}
	// The old leader comes back and catches up.
	peers := map[uint64]string{}
	for _, mb := range ms {
		peers[mb.id] = mb.addr
	}
	old.start(t, peers)
	deadline = time.Now().Add(10 * time.Second)
	for {
		if _, err := old.m.State().Table(api.DefaultTenant, "t2-2"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the restarted member never caught up (version %d, leader's %d)", old.m.State().Version, lead.m.State().Version)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRaftMastersOnInternalListeners: masters named by their client
// addresses send raft to each other's internal listeners, signed with the
// cluster credential, and follow a member restarted on a new internal
// port; the group commits through it.
func TestRaftMastersOnInternalListeners(t *testing.T) {
	ms := startGroupKey(t, 3, auth.NewKey())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// sendsInternal waits until every member sends to every other it
	// talks to (followers talk to the leader) at its internal address.
	sendsInternal := func(lead *member) {
		t.Helper()
		for _, from := range ms {
			for _, to := range ms {
				if from == to || from.m == nil || to.m == nil || (from != lead && to != lead) {
					continue
				}
				deadline := time.Now().Add(10 * time.Second)
				for from.m.raft.transport.PeerAddr(to.id) != to.m.InternalAddr() {
					if time.Now().After(deadline) {
						t.Fatalf("member %d sends raft to member %d at %q, want its internal address %q (client address %s)",
							from.id, to.id, from.m.raft.transport.PeerAddr(to.id), to.m.InternalAddr(), to.addr)
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
		}
	}
	create := func(lead *member, name string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			_, err := lead.c.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: name, Kind: api.TableKind_TABLE_KIND_POINT,
				Options: &api.TableOptions{Partitions: 1, Replication: 1, Storage: "memory"}})
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("create %s on the leader: %v", name, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	lead := leaderOf(t, ms, 10*time.Second)
	create(lead, "t1")
	sendsInternal(lead)
	// The leader's member list says where its raft traffic goes: every
	// member's internal listener, its own included.
	resp, err := lead.c.MasterMembers(ctx, &api.MasterMembersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, mb := range resp.GetMembers() {
		for _, want := range ms {
			if want.id == mb.GetId() && mb.GetRaftAddr() != want.m.InternalAddr() {
				t.Fatalf("members: member %d's raft goes via %q, want its internal address %q", mb.GetId(), mb.GetRaftAddr(), want.m.InternalAddr())
			}
		}
	}
	// A follower restarts on a new internal port; the other follower
	// stops, so the group commits only through the restarted one.
	var x, y *member
	for _, mb := range ms {
		switch {
		case mb == lead:
		case x == nil:
			x = mb
		default:
			y = mb
		}
	}
	old := x.iaddr
	x.stop(t)
	create(lead, "t2")
	peers := map[uint64]string{}
	for _, mb := range ms {
		peers[mb.id] = mb.addr
	}
	x.start(t, peers)
	if x.iaddr == old {
		t.Logf("the restarted member got its old internal port %s again", old)
	}
	sendsInternal(lead)
	y.stop(t)
	lead = leaderOf(t, ms, 10*time.Second)
	create(lead, "t3")
	deadline := time.Now().Add(10 * time.Second)
	for _, mb := range []*member{lead, x} {
		for {
			if _, err := mb.m.State().Table(api.DefaultTenant, "t3"); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("member %d never applied t3", mb.id)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestRaftDirsNotMixed: a single master's directory is refused by a raft
// member, and a raft member's by a single master, each with an error that
// says what to do.
func TestRaftDirsNotMixed(t *testing.T) {
	dir := t.TempDir()
	m, err := Open(Options{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Options{DataDir: dir, RaftID: 1, Peers: map[uint64]string{1: "127.0.0.1:1"}}); err == nil {
		t.Fatal("a raft member opened a single master's directory")
	}
	dir2 := t.TempDir()
	m, err = Open(Options{DataDir: dir2, RaftID: 1, Peers: map[uint64]string{1: "127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Options{DataDir: dir2}); err == nil {
		t.Fatal("a single master opened a raft member's directory")
	}
}
