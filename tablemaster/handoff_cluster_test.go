package tablemaster_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/testcluster"
	"github.com/tabuladb/tabula/tablemaster"
)

// stall is a master-side fault: while on, one server's heartbeats hang
// (and fail when the server gives up on them) and its map watch delivers
// nothing — the old primary of a live handoff that is slow to hear of it.
type stall struct {
	target atomic.Pointer[string] // the stalled server's id; nil: none
	peers  sync.Map               // peer address -> server id, from heartbeats
	mu     sync.Mutex
	off    chan struct{} // closed when the stall ends
}

func newStall() *stall { return &stall{off: make(chan struct{})} }

func (s *stall) start(id string) {
	s.mu.Lock()
	s.off = make(chan struct{})
	s.mu.Unlock()
	s.target.Store(&id)
}

func (s *stall) stop() {
	s.target.Store(nil)
	s.mu.Lock()
	close(s.off)
	s.mu.Unlock()
}

// wait blocks while id is stalled; false if ctx ended first.
func (s *stall) wait(ctx context.Context, id string) bool {
	t := s.target.Load()
	if t == nil || *t != id {
		return true
	}
	s.mu.Lock()
	off := s.off
	s.mu.Unlock()
	select {
	case <-off:
		return true
	case <-ctx.Done():
		return false
	}
}

func peerOf(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok {
		return p.Addr.String()
	}
	return ""
}

func (s *stall) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if hb, ok := req.(*api.HeartbeatRequest); ok {
		s.peers.Store(peerOf(ctx), hb.GetServerId())
		if !s.wait(ctx, hb.GetServerId()) {
			return nil, api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "stalled", "heartbeat stalled by the test")
		}
	}
	return h(ctx, req)
}

func (s *stall) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if info.FullMethod == api.Master_WatchPartitionMap_FullMethodName {
		ss = &stalledStream{ServerStream: ss, s: s}
	}
	return h(srv, ss)
}

type stalledStream struct {
	grpc.ServerStream
	s *stall
}

func (w *stalledStream) SendMsg(m any) error {
	if id, ok := w.s.peers.Load(peerOf(w.Context())); ok && !w.s.wait(w.Context(), id.(string)) {
		return w.Context().Err()
	}
	return w.ServerStream.SendMsg(m)
}

type handoffCluster struct {
	c      *testcluster.Cluster
	master api.MasterClient
	conns  map[string]*grpc.ClientConn
}

func startHandoffCluster(t *testing.T, ctx context.Context, opts testcluster.Options, st *stall) *handoffCluster {
	t.Helper()
	opts.NoAuth, opts.OneListener = true, true // one connection per server to the master: its peer address names it
	if st != nil {
		opts.MasterOptions = func(o *tablemaster.Options) {
			o.UnaryInterceptors = append(o.UnaryInterceptors, st.unary)
			o.StreamInterceptors = append(o.StreamInterceptors, st.stream)
		}
	}
	c, err := testcluster.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	h := &handoffCluster{c: c, conns: map[string]*grpc.ClientConn{}}
	t.Cleanup(func() {
		if st != nil && st.target.Load() != nil {
			st.stop()
		}
		for _, cc := range h.conns {
			_ = cc.Close()
		}
		if err := c.Close(); err != nil {
			t.Errorf("close cluster: %v", err)
		}
	})
	h.master = api.NewMasterClient(h.dial(t, c.MasterAddr()))
	if _, err := h.master.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: "t", Kind: api.TableKind_TABLE_KIND_POINT,
		Options: &api.TableOptions{Partitions: 1, Replication: 3, Storage: "memory"}}); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *handoffCluster) dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	if cc := h.conns[addr]; cc != nil {
		return cc
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	h.conns[addr] = cc
	return cc
}

func (h *handoffCluster) describe(t *testing.T, ctx context.Context) *api.Partition {
	t.Helper()
	d, err := h.master.DescribeTable(ctx, &api.DescribeTableRequest{Tenant: api.DefaultTenant, Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	return d.GetMap().GetPartitions()[0]
}

func primaryOf(p *api.Partition) *api.Replica {
	for _, r := range p.GetReplicas() {
		if r.GetRole() == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
			return r
		}
	}
	return nil
}

func header(p *api.Partition) *api.RequestHeader {
	return &api.RequestHeader{Tenant: api.DefaultTenant, Table: "t", PartitionId: p.GetId(), Epoch: p.GetEpoch()}
}

// put writes key=value at the partition's primary by the master's map,
// retrying what a client retries; it returns the epoch that took it.
func (h *handoffCluster) put(t *testing.T, ctx context.Context, key, value string) uint64 {
	t.Helper()
	for {
		p := h.describe(t, ctx)
		if pr := primaryOf(p); pr != nil {
			_, err := api.NewTableServerClient(h.dial(t, pr.GetAddr())).Put(ctx, &api.PutRequest{Header: header(p), Key: []byte(key), Value: []byte(value)})
			if err == nil {
				return p.GetEpoch()
			}
			if c := api.CodeOf(err); c != api.ErrorCode_ERROR_CODE_UNAVAILABLE && c != api.ErrorCode_ERROR_CODE_NOT_OWNER && c != api.ErrorCode_ERROR_CODE_STALE_EPOCH {
				t.Fatalf("put %s: %v", key, err)
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("put %s: %v", key, ctx.Err())
		}
		nextPoll(ctx)
	}
}

// TestLiveHandoffNoStaleRead: the primary is drained while its heartbeats
// and map watch hang at the master. The new primary acknowledges a write
// of v2; a strong read at the old primary right after must not return v1.
// Before the handoff fence the new primary served as soon as it caught up,
// while the old one still held a lease on its old map: the read returned
// v1.
func TestLiveHandoffNoStaleRead(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st := newStall()
	// A long lease makes the old primary's window wide, so the old code
	// fails every time rather than when the machine is fast.
	h := startHandoffCluster(t, ctx, testcluster.Options{Servers: 3, LeaseDuration: 2 * time.Second, DeadAfter: 4 * time.Second}, st)
	h.put(t, ctx, "k", "v1")
	p := h.describe(t, ctx)
	old := primaryOf(p)
	// Every server has heartbeated (its peer is known) before the stall.
	for _, id := range h.c.ServerIDs() {
		for {
			known := false
			st.peers.Range(func(_, v any) bool { known = known || v == id; return !known })
			if known {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("server %s never heartbeated", id)
			}
			nextPoll(ctx)
		}
	}
	// And reported its replica in sync: a drain hands the primary role
	// at once only to a secondary known to hold the data (else the
	// draining server keeps it until its move hands it over).
	for {
		d, err := h.master.DescribeTable(ctx, &api.DescribeTableRequest{Tenant: api.DefaultTenant, Name: "t"})
		if err != nil {
			t.Fatal(err)
		}
		inSync := 0
		for _, r := range d.GetReplicas() {
			if r.GetState() == api.ReplicaState_REPLICA_STATE_IN_SYNC {
				inSync++
			}
		}
		if inSync == 3 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("replicas never all reported in sync: %v", d.GetReplicas())
		}
		nextPoll(ctx)
	}
	st.start(old.GetServerId())
	began := time.Now()
	if _, err := h.master.DrainServer(ctx, &api.DrainServerRequest{ServerId: old.GetServerId()}); err != nil {
		t.Fatal(err)
	}
	epoch := h.put(t, ctx, "k", "v2")
	acked := time.Since(began)
	if epoch <= p.GetEpoch() {
		t.Fatalf("v2 taken at epoch %d, not after the handoff from epoch %d", epoch, p.GetEpoch())
	}
	g, err := api.NewTableServerClient(h.dial(t, old.GetAddr())).Get(ctx, &api.GetRequest{Header: header(p), Key: []byte("k")})
	if err == nil && string(g.GetValue()) == "v1" {
		t.Fatalf("stale read: the old primary %s answered v1 at epoch %d after the new primary acknowledged v2 at epoch %d (%v after the drain)",
			old.GetServerId(), p.GetEpoch(), epoch, acked)
	}
	t.Logf("v2 acknowledged %v after the drain (old primary stalled); the old primary then answered %v, %v", acked.Round(time.Millisecond), g, err)
	st.stop()
	// The stalled server acknowledges its demotion now; nothing is left
	// fenced.
	for h.describe(t, ctx).GetHandoffFrom() != "" {
		nextPoll(ctx)
	}
}

// TestLiveHandoffUnavailability measures what a live handoff costs a
// writer: moves of the primary to another server (OpMoveDone), each
// timed from the last write the old primary took to the first the new one
// took. An old primary that hears of its demotion promptly lifts the
// fence within about a heartbeat.
func TestLiveHandoffUnavailability(t *testing.T) {
	moves := 20
	if testing.Short() {
		moves = 3
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// The product's timing: a heartbeat every 100 ms.
	h := startHandoffCluster(t, ctx, testcluster.Options{Servers: 4, HeartbeatInterval: tablemaster.DefaultHeartbeatInterval,
		LeaseDuration: tablemaster.DefaultLeaseDuration, DeadAfter: tablemaster.DefaultDeadAfter}, nil)
	h.put(t, ctx, "k", "v0")
	type ok struct {
		at    time.Time
		epoch uint64
	}
	var mu sync.Mutex
	var oks []ok
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // the writer
		defer close(done)
		cc := map[string]api.TableServerClient{}
		var p *api.Partition
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if p == nil {
				d, err := h.master.DescribeTable(ctx, &api.DescribeTableRequest{Tenant: api.DefaultTenant, Name: "t"})
				if err != nil {
					return
				}
				p = d.GetMap().GetPartitions()[0]
			}
			pr := primaryOf(p)
			if pr == nil {
				p = nil
				continue
			}
			c := cc[pr.GetAddr()]
			if c == nil {
				conn, err := grpc.NewClient(pr.GetAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
				if err != nil {
					return
				}
				defer conn.Close()
				c = api.NewTableServerClient(conn)
				cc[pr.GetAddr()] = c
			}
			cctx, ccancel := context.WithTimeout(ctx, time.Second)
			_, err := c.Put(cctx, &api.PutRequest{Header: header(p), Key: []byte("k"), Value: fmt.Appendf(nil, "v%d", i)})
			ccancel()
			if err == nil {
				mu.Lock()
				oks = append(oks, ok{time.Now(), p.GetEpoch()})
				mu.Unlock()
				continue
			}
			if api.CodeOf(err) != api.ErrorCode_ERROR_CODE_UNAVAILABLE {
				p = nil // a new map
			}
		}
	}()
	for {
		mu.Lock()
		n := len(oks)
		mu.Unlock()
		if n > 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the writer wrote nothing")
		}
		nextPoll(ctx)
	}
	var gaps []time.Duration
	for range moves {
		p := h.describe(t, ctx)
		from := primaryOf(p).GetServerId()
		if _, err := h.master.MovePartition(ctx, &api.MovePartitionRequest{Tenant: api.DefaultTenant, Table: "t", Index: 0, From: from}); err != nil {
			t.Fatal(err)
		}
		var q *api.Partition
		for {
			q = h.describe(t, ctx)
			if pr := primaryOf(q); pr != nil && pr.GetServerId() != from && q.GetHandoffFrom() == "" {
				break
			}
			nextPoll(ctx)
		}
		// Wait for the writer to land at the new epoch, then measure the
		// gap between the epochs.
		for {
			mu.Lock()
			n := len(oks)
			last := oks[n-1]
			mu.Unlock()
			if last.epoch >= q.GetEpoch() {
				break
			}
			nextPoll(ctx)
		}
		mu.Lock()
		i := slices.IndexFunc(oks, func(o ok) bool { return o.epoch >= q.GetEpoch() })
		gaps = append(gaps, oks[i].at.Sub(oks[i-1].at))
		mu.Unlock()
	}
	close(stop)
	<-done
	slices.Sort(gaps)
	p50, p99 := gaps[len(gaps)/2], gaps[len(gaps)-1]
	if len(gaps) >= 100 {
		p99 = gaps[len(gaps)*99/100]
	}
	t.Logf("live handoffs (moves of the primary): %d; write unavailability p50 %v, p99 %v (max %v); all: %v",
		len(gaps), p50.Round(time.Millisecond), p99.Round(time.Millisecond), gaps[len(gaps)-1].Round(time.Millisecond), gaps)
}

// nextPoll waits for the next look at a remote condition (one the test
// cannot be told of: another process's state), or until ctx, the test's
// deadline, ends; the caller checks ctx.
func nextPoll(ctx context.Context) {
	t := time.NewTimer(5 * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
