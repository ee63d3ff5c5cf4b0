package tablemaster

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabuladb/tabula/api"
)

func TestLeaseGate(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	ms := time.Millisecond
	g := RaftLeaseGate(1000*ms, 500*ms)
	for _, tc := range []struct {
		name string
		got  bool
		want bool
	}{
		{"takeover counts from start plus the election timeout", g.TakeoverHeard(t0).Equal(t0.Add(500 * ms)), true},
		{"dead after DeadAfter of silence", g.Dead(t0, t0.Add(1001*ms)), true},
		{"not dead at DeadAfter", g.Dead(t0, t0.Add(1000*ms)), false},
		{"never heard is dead", g.Dead(time.Time{}, t0), true},
		{"grants within Confirm of a confirmation", g.MayGrant(t0, t0.Add(500*ms)), true},
		{"no grant past Confirm", g.MayGrant(t0, t0.Add(501*ms)), false},
		{"no grant unconfirmed", g.MayGrant(time.Time{}, t0), false},
		{"a single master grants unconfirmed", LeaseGate{DeadAfter: time.Second}.MayGrant(time.Time{}, t0), true},
		{"defaults are safe", RaftLeaseGate(DefaultDeadAfter, 500*ms).Check(DefaultLeaseDuration) == nil, true},
		{"single master defaults are safe", LeaseGate{DeadAfter: DefaultDeadAfter}.Check(DefaultLeaseDuration) == nil, true},
		{"no margin for clock error", LeaseGate{DeadAfter: 1005 * ms}.Check(1000*ms) == nil, false},
		{"a confirmation window the takeover does not cover", LeaseGate{DeadAfter: 5 * time.Second, Takeover: 100 * ms, Confirm: 200 * ms}.Check(ms) == nil, false},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	if err := (Options{DataDir: "x", LeaseDuration: time.Second, DeadAfter: 1005 * time.Millisecond}).Validate(); err == nil {
		t.Error("Validate accepts DeadAfter 1005ms over a 1s lease: no margin for clocks 1% off")
	}
}

// TestPausedLeaderRenewsNoLease: a leader cut off from its quorum for
// longer than an election timeout by its clock — as after a SIGSTOP,
// which its raft ticks do not see, so it still believes it leads —
// renews no lease: a later leader may have moved the partitions of the
// servers it would renew. Before LeaseGate.MayGrant it answered the
// heartbeat with a lease on its stale map (the lease simulation found
// it: two primaries served one partition).
func TestPausedLeaderRenewsNoLease(t *testing.T) {
	clk := newFakeClock()
	peers := map[uint64]string{}
	var ms []*member
	for i := range 3 {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		mb := &member{id: uint64(i + 1), addr: lis.Addr().String(), dir: t.TempDir()}
		lis.Close()
		peers[mb.id] = mb.addr
		ms = append(ms, mb)
	}
	for _, mb := range ms {
		// A 1 s election timeout: the leader cannot step down (CheckQuorum)
		// within the moments this test needs. No liveness checks: the
		// fake clock's jump must not declare the server dead.
		m, err := Open(Options{DataDir: mb.dir, RaftID: mb.id, Peers: peers, Logger: slog.New(slog.DiscardHandler), Now: clk.Now,
			HeartbeatInterval: time.Hour, LeaseDuration: 200 * time.Millisecond, DeadAfter: 400 * time.Millisecond, RaftTick: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		lis, err := net.Listen("tcp", mb.addr)
		if err != nil {
			t.Fatal(err)
		}
		mb.m, mb.served = m, make(chan error, 1)
		go func() { mb.served <- m.Serve(lis) }()
		if mb.conn, err = grpc.NewClient(mb.addr, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
			t.Fatal(err)
		}
		mb.c = api.NewMasterClient(mb.conn)
	}
	t.Cleanup(func() {
		for _, mb := range ms {
			mb.stop(t)
			mb.conn.Close()
		}
	})
	l := leaderOf(t, ms, 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reg, err := l.c.RegisterServer(ctx, &api.RegisterServerRequest{Addr: "10.0.0.1:1", Incarnation: 1})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := l.c.Heartbeat(ctx, &api.HeartbeatRequest{ServerId: reg.ServerId}); err != nil || resp.LeaseMs == 0 || resp.Reregister {
		t.Fatalf("heartbeat to a confirmed leader: %v, %v", resp, err)
	}
	for _, mb := range ms {
		if mb != l {
			mb.stop(t)
		}
	}
	// The leader's clock jumps past the confirmation window: it was paused.
	clk.Advance(2 * time.Second)
	resp, err := l.c.Heartbeat(ctx, &api.HeartbeatRequest{ServerId: reg.ServerId})
	if err == nil {
		t.Fatalf("a leader without its quorum for 2 s by its clock renewed a lease: %v", resp)
	}
	if d := api.DetailOf(err); d.GetReason() != "leadership_unconfirmed" && d.GetReason() != "not_leader" {
		t.Fatalf("heartbeat refused with %v, want UNAVAILABLE leadership_unconfirmed", err)
	}
	if _, err := l.c.RegisterServer(ctx, &api.RegisterServerRequest{ServerId: reg.ServerId, Addr: "10.0.0.1:1", Incarnation: 1}); err == nil {
		t.Fatal("a leader without its quorum renewed a lease through a registration")
	}
}
