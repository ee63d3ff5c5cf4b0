package raftnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tabuladb/tabula/api"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// Limits of the gRPC transport. gRPC refuses messages over 4 MiB by
// default; raft's MsgApp carries at most 1 MiB of entries (plus one entry
// if that is larger), so a batch stops growing past batchBytes.
const (
	batchBytes    = 2 << 20
	batchMessages = 256
	peerQueue     = 4096
	snapChunk     = 1 << 20
	maxBackoff    = time.Second
	// whereTimeout bounds one Where call: it is a small unary call, and the
	// peer's messages wait while it runs.
	whereTimeout = time.Second
	// relearnEvery is how often a peer whose raft traffic stays on its
	// membership address is asked again where it takes it (one small call:
	// a member that opened its internal listener after answering, or an
	// internal address that failed and may answer again).
	relearnEvery = 5 * time.Second
	// internalFailures is how many attempts on an internal address may fail
	// in a row, each right after the peer named it, before the peer's
	// traffic falls back to its membership address until the next
	// relearnEvery (an internal port closed between masters).
	internalFailures = 2
)

// GRPCTransport is the Transport between members over gRPC (service
// api.Raft): one client stream per peer carrying batches of messages,
// reconnecting with a backoff capped at 1 s, and one stream per snapshot,
// sent in 1 MiB chunks. Register it on each of the member's grpc.Servers
// (the master's client and internal listeners).
//
// Membership addresses are the members' client addresses. Raft traffic
// does not stay there: before each (re)connection a peer is asked, at its
// membership address, where it takes raft traffic (Where: its id and
// SetInternalAddr's address), and Send and SendSnapshot streams go to its
// internal listener, away from client load. They stay on the membership
// address while the peer has no internal listener, does not answer Where
// (an older member), answers as another member, or its internal address
// fails twice in a row right after it named it (a port closed between
// masters); such a peer is asked again every 5 s. A send that fails on the
// internal address makes the next connection ask again, so a member
// restarted on a new internal port is followed. PeerAddr says which
// address each peer's traffic uses; changes are logged at Info.
//
// Safe for concurrent use. It owns one goroutine per peer and one per
// snapshot being sent; Close stops them and waits.
type GRPCTransport struct {
	id       uint64
	logger   *slog.Logger
	dialOpts []grpc.DialOption
	// internalAddr is what Where answers (SetInternalAddr; nil: none).
	internalAddr atomic.Pointer[string]

	mu sync.Mutex
	// Guarded by mu.
	handler Handler
	peers   map[uint64]*peer
	closed  bool

	wg sync.WaitGroup
}

var _ Transport = (*GRPCTransport)(nil)

// NewGRPCTransport returns the transport of member id. dialOpts are added
// to the defaults (plaintext, fast reconnect).
func NewGRPCTransport(id uint64, logger *slog.Logger, dialOpts ...grpc.DialOption) *GRPCTransport {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &GRPCTransport{
		id: id, logger: logger, peers: map[uint64]*peer{},
		dialOpts: append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), api.FastReconnect(), api.Keepalive()}, dialOpts...),
	}
}

// Register serves the api.Raft service of this member on s. A member
// registers it on every listener it serves: peers ask Where at its
// membership address and send raft messages to its internal one.
func (t *GRPCTransport) Register(s *grpc.Server) { api.RegisterRaftServer(s, raftServer{t: t}) }

// SetInternalAddr sets the address this member takes raft traffic on, as
// peers are told by Where: its internal listener's advertised address ("":
// none, peers use its membership address). Peers learn a change when they
// next reconnect or re-ask.
func (t *GRPCTransport) SetInternalAddr(addr string) { t.internalAddr.Store(&addr) }

// InternalAddr is the address SetInternalAddr set ("": none).
func (t *GRPCTransport) InternalAddr() string {
	if p := t.internalAddr.Load(); p != nil {
		return *p
	}
	return ""
}

// PeerAddr is the address raft traffic to member id uses now: its internal
// address once learned, else its membership address; "" for a member this
// transport does not send to.
func (t *GRPCTransport) PeerAddr(id uint64) string {
	t.mu.Lock()
	p, ok := t.peers[id]
	t.mu.Unlock()
	if !ok {
		return ""
	}
	via, _ := p.target()
	return via
}

// Attach implements Transport.
func (t *GRPCTransport) Attach(h Handler) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.handler = h
}

func (t *GRPCTransport) currentHandler() Handler {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.handler
}

// SetPeer implements Transport.
func (t *GRPCTransport) SetPeer(id uint64, addr string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || id == t.id {
		return
	}
	if p, ok := t.peers[id]; ok {
		if p.addr == addr {
			return
		}
		p.stop()
	}
	p, err := t.newPeer(id, addr)
	if err != nil {
		t.logger.Error("raftnode: peer address refused", "peer", id, "addr", addr, "err", err)
		delete(t.peers, id)
		return
	}
	t.peers[id] = p
}

// RemovePeer implements Transport.
func (t *GRPCTransport) RemovePeer(id uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p, ok := t.peers[id]; ok {
		p.stop()
		delete(t.peers, id)
	}
}

// Send implements Transport: it queues each message on its peer's stream,
// or its snapshot sender, and drops it if the queue is full.
func (t *GRPCTransport) Send(msgs []raftpb.Message) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, m := range msgs {
		p, ok := t.peers[m.To]
		if !ok {
			if m.Type == raftpb.MsgSnap {
				t.reportLocked(func(h Handler) { h.ReportSnapshot(m.To, true) })
			}
			continue
		}
		if m.Type == raftpb.MsgSnap {
			t.wg.Add(1)
			go func() {
				defer t.wg.Done()
				p.sendSnapshot(m)
			}()
			continue
		}
		select {
		case p.queue <- m:
		default:
			t.reportLocked(func(h Handler) { h.ReportUnreachable(m.To) })
		}
	}
}

// reportLocked calls f on the handler from a new goroutine: Send runs on
// the node's goroutine, which the handler's methods wait for.
func (t *GRPCTransport) reportLocked(f func(Handler)) {
	if t.handler == nil || t.closed {
		return
	}
	h := t.handler
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		f(h)
	}()
}

// Close stops every peer's goroutines and closes their connections.
// Idempotent.
func (t *GRPCTransport) Close() error {
	t.mu.Lock()
	t.closed = true
	for id, p := range t.peers {
		p.stop()
		delete(t.peers, id)
	}
	t.handler = nil
	t.mu.Unlock()
	t.wg.Wait()
	return nil
}

// peer is the sending side towards one member.
type peer struct {
	t    *GRPCTransport
	id   uint64
	addr string // the membership address
	// conn reaches addr: Where, and raft traffic while via is addr.
	conn   *grpc.ClientConn
	queue  chan raftpb.Message
	ctx    context.Context
	cancel context.CancelFunc

	// stale is set when a send failed (or before the first): the next
	// connection asks Where first.
	stale atomic.Bool

	mu sync.Mutex
	// Guarded by mu; written only by run, read by snapshot senders too.
	via     string           // where raft traffic goes: addr or the peer's internal address
	viaConn *grpc.ClientConn // to via when via is not addr (else nil)
	client  api.RaftClient   // on viaConn, or conn

	// Owned by run.
	learnedAt time.Time // when Where was last asked
	// failedVia and failures count the connections to an internal
	// address that could not be opened, in a row, each right after Where
	// named it; failedAt is the last.
	failedVia string
	failures  int
	failedAt  time.Time
	named     bool // via was named by the Where just asked, not tried yet
}

func (t *GRPCTransport) newPeer(id uint64, addr string) (*peer, error) {
	conn, err := grpc.NewClient(addr, t.dialOpts...)
	if err != nil {
		return nil, fmt.Errorf("raftnode: dial member %d at %s: %w", id, addr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &peer{t: t, id: id, addr: addr, conn: conn, client: api.NewRaftClient(conn), via: addr, queue: make(chan raftpb.Message, peerQueue), ctx: ctx, cancel: cancel}
	p.stale.Store(true) // ask Where before the first stream
	t.wg.Add(1)
	go p.run()
	return p, nil
}

func (p *peer) stop() { p.cancel() }

// target is where raft traffic to the peer goes now, and its client.
func (p *peer) target() (string, api.RaftClient) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.via, p.client
}

// closeConns closes the peer's connections; run calls it as it ends.
func (p *peer) closeConns() {
	p.mu.Lock()
	vc := p.viaConn
	p.viaConn = nil
	p.mu.Unlock()
	if vc != nil {
		_ = vc.Close()
	}
	_ = p.conn.Close()
}

// needLearn reports whether run should ask Where before the next batch:
// after a failure on the internal address, and every relearnEvery while
// the traffic stays on the membership address.
func (p *peer) needLearn(now time.Time) bool {
	if p.stale.Load() {
		return true
	}
	via, _ := p.target()
	return via == p.addr && now.Sub(p.learnedAt) >= relearnEvery
}

// learn asks the peer, at its membership address, where it takes raft
// traffic, and points the traffic there; anything but a usable answer
// keeps it on the membership address. It is asked lazily, before the
// stream that carries the first messages: followers never send to each
// other.
func (p *peer) learn() {
	p.stale.Store(false)
	p.learnedAt = time.Now()
	ctx, cancel := context.WithTimeout(p.ctx, whereTimeout)
	resp, err := api.NewRaftClient(p.conn).Where(ctx, &api.RaftWhereRequest{})
	cancel()
	if p.ctx.Err() != nil {
		return
	}
	via, why := p.addr, ""
	switch {
	case status.Code(err) == codes.Unimplemented:
		why = "the member does not say where (an older version)"
	case err != nil:
		// Unreachable, most likely: ask again before the next stream.
		p.stale.Store(true)
		why = "the member does not answer where: " + err.Error()
	case resp.GetId() != p.id:
		why = fmt.Sprintf("the member's address answers as member %d", resp.GetId())
	case resp.GetInternalAddr() == "":
		why = "the member has no internal listener"
	case resp.GetInternalAddr() == p.failedVia && p.failures >= internalFailures && p.learnedAt.Sub(p.failedAt) < relearnEvery:
		why = fmt.Sprintf("its internal address %s could not be reached %d times in a row", p.failedVia, p.failures)
	default:
		via = resp.GetInternalAddr()
	}
	p.named = via != p.addr
	p.point(via, why)
}

// point sends the peer's raft traffic to via from now on. Only run calls
// it, the only writer of via: it reads via without the lock.
func (p *peer) point(via, why string) {
	if via == p.via {
		return
	}
	var vc *grpc.ClientConn
	client := api.NewRaftClient(p.conn)
	if via != p.addr {
		var err error
		if vc, err = grpc.NewClient(via, p.t.dialOpts...); err != nil {
			why = fmt.Sprintf("its internal address %s does not parse: %v", via, err)
			via, vc = p.addr, nil
			if via == p.via {
				return
			}
		} else {
			client = api.NewRaftClient(vc)
		}
	}
	p.mu.Lock()
	old := p.viaConn
	p.via, p.viaConn, p.client = via, vc, client
	p.mu.Unlock()
	if old != nil {
		_ = old.Close() // a snapshot on it fails, is reported, and is sent again
	}
	if via == p.addr {
		p.t.logger.Info("raftnode: raft traffic to member uses its membership address", "peer", p.id, "addr", via, "why", why)
	} else {
		p.t.logger.Info("raftnode: raft traffic to member uses its internal address", "peer", p.id, "addr", via, "member_addr", p.addr)
	}
}

// failed notes a failed send on via (reported by run or a snapshot).
func (p *peer) failed(via string) {
	if via != p.addr {
		p.stale.Store(true)
	}
}

// run streams the queued messages to the peer in batches, reopening the
// stream after a failure with a backoff capped at maxBackoff; before each
// stream it asks the peer where to send (learn) when needed.
func (p *peer) run() {
	defer p.t.wg.Done()
	defer p.closeConns()
	var stream grpc.ClientStreamingClient[api.RaftBatch, api.RaftSendResponse]
	var streamVia string
	backoff := 50 * time.Millisecond
	for {
		var first raftpb.Message
		select {
		case <-p.ctx.Done():
			return
		case first = <-p.queue:
		}
		batch := &api.RaftBatch{}
		size := 0
		add := func(m raftpb.Message) {
			b, err := m.Marshal()
			if err != nil {
				p.t.logger.Error("raftnode: encode message", "err", err)
				return
			}
			batch.Messages = append(batch.Messages, b)
			size += len(b)
		}
		add(first)
	fill:
		for size < batchBytes && len(batch.Messages) < batchMessages {
			select {
			case m := <-p.queue:
				add(m)
			default:
				break fill
			}
		}
		if p.needLearn(time.Now()) {
			p.learn()
			if via, _ := p.target(); stream != nil && via != streamVia {
				// End the old stream cleanly: what it carried is
				// delivered.
				_, _ = stream.CloseAndRecv()
				stream = nil
			}
		}
		var err error
		opened := true
		if stream == nil {
			var client api.RaftClient
			streamVia, client = p.target()
			// Not WaitForReady: it fails at once when no connection can
			// be made, and only then.
			if stream, err = client.Send(p.ctx); err != nil {
				opened = false
			}
		}
		named := p.named
		p.named = false
		if err == nil {
			if err = stream.Send(batch); err != nil {
				// The stream is broken; its status says why.
				_, rerr := stream.CloseAndRecv()
				err = errors.Join(err, rerr)
			}
		}
		if err == nil {
			backoff = 50 * time.Millisecond
			if streamVia != p.addr {
				p.failedVia, p.failures = "", 0
			}
			continue
		}
		if p.ctx.Err() != nil {
			return
		}
		p.t.logger.Debug("raftnode: send to peer failed", "peer", p.id, "addr", streamVia, "err", err)
		stream = nil
		if streamVia != p.addr && !opened && named {
			// The member answered at its membership address, named this
			// one, and it cannot be reached.
			if p.failedVia != streamVia {
				p.failedVia, p.failures = streamVia, 0
			}
			p.failures++
			p.failedAt = time.Now()
		}
		// Ask again before the next stream: the member may be back, on
		// another internal port.
		p.stale.Store(true)
		if h := p.t.currentHandler(); h != nil {
			h.ReportUnreachable(p.id)
		}
		// Drop what queued up meanwhile: raft resends what still matters.
	drain:
		for {
			select {
			case <-p.queue:
			default:
				break drain
			}
		}
		timer := time.NewTimer(backoff)
		select {
		case <-p.ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// sendSnapshot streams MsgSnap m in chunks and reports the outcome to the
// handler, as raft requires.
func (p *peer) sendSnapshot(m raftpb.Message) {
	err := p.streamSnapshot(m)
	if err != nil {
		p.t.logger.Warn("raftnode: send snapshot failed", "peer", p.id, "index", m.Snapshot.Metadata.Index, "err", err)
	}
	if h := p.t.currentHandler(); h != nil {
		h.ReportSnapshot(p.id, err != nil)
	}
}

func (p *peer) streamSnapshot(m raftpb.Message) error {
	data := m.Snapshot.Data
	head := m
	snap := *m.Snapshot
	snap.Data = nil
	head.Snapshot = &snap
	hb, err := head.Marshal()
	if err != nil {
		return fmt.Errorf("encode snapshot message: %w", err)
	}
	ctx, cancel := context.WithCancel(p.ctx)
	defer cancel()
	via, client := p.target()
	stream, err := client.SendSnapshot(ctx)
	if err != nil {
		p.failed(via)
		return fmt.Errorf("to %s: %w", via, err)
	}
	chunk := &api.RaftSnapshotChunk{Message: hb}
	for {
		n := min(len(data), snapChunk)
		chunk.Data = data[:n]
		data = data[n:]
		if err := stream.Send(chunk); err != nil {
			_, rerr := stream.CloseAndRecv()
			p.failed(via)
			return fmt.Errorf("to %s: %w", via, errors.Join(err, rerr))
		}
		if len(data) == 0 {
			break
		}
		chunk = &api.RaftSnapshotChunk{}
	}
	if _, err = stream.CloseAndRecv(); err != nil {
		p.failed(via)
		return fmt.Errorf("to %s: %w", via, err)
	}
	return nil
}

// raftServer is the receiving side: api.Raft.
type raftServer struct {
	api.UnimplementedRaftServer
	t *GRPCTransport
}

// Where answers which member this is and where it takes raft traffic.
func (s raftServer) Where(context.Context, *api.RaftWhereRequest) (*api.RaftWhereResponse, error) {
	return &api.RaftWhereResponse{Id: s.t.id, InternalAddr: s.t.InternalAddr()}, nil
}

func (s raftServer) step(ctx context.Context, m raftpb.Message) error {
	if m.To != s.t.id {
		return status.Errorf(codes.FailedPrecondition, "raftnode: message for member %d reached member %d", m.To, s.t.id)
	}
	h := s.t.currentHandler()
	if h == nil {
		return status.Error(codes.Unavailable, "raftnode: member not running")
	}
	if err := h.Step(ctx, m); err != nil {
		return status.Errorf(codes.Unavailable, "raftnode: member %d: %v", s.t.id, err)
	}
	return nil
}

func (s raftServer) Send(stream grpc.ClientStreamingServer[api.RaftBatch, api.RaftSendResponse]) error {
	for {
		batch, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return stream.SendAndClose(&api.RaftSendResponse{})
		}
		if err != nil {
			return err
		}
		for _, b := range batch.Messages {
			var m raftpb.Message
			if err := m.Unmarshal(b); err != nil {
				return status.Errorf(codes.InvalidArgument, "raftnode: bad message: %v", err)
			}
			if err := s.step(stream.Context(), m); err != nil {
				return err
			}
		}
	}
}

func (s raftServer) SendSnapshot(stream grpc.ClientStreamingServer[api.RaftSnapshotChunk, api.RaftSnapshotResponse]) error {
	var m raftpb.Message
	var data []byte
	for first := true; ; first = false {
		c, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if first {
			if err := m.Unmarshal(c.Message); err != nil || m.Type != raftpb.MsgSnap || m.Snapshot == nil {
				return status.Errorf(codes.InvalidArgument, "raftnode: first snapshot chunk holds no snapshot message (%v)", err)
			}
		}
		if len(data)+len(c.Data) > maxRecordBytes {
			return status.Errorf(codes.ResourceExhausted, "raftnode: snapshot over %d bytes", maxRecordBytes)
		}
		data = append(data, c.Data...)
	}
	if m.Snapshot == nil {
		return status.Error(codes.InvalidArgument, "raftnode: empty snapshot stream")
	}
	m.Snapshot.Data = data
	if err := s.step(stream.Context(), m); err != nil {
		return err
	}
	return stream.SendAndClose(&api.RaftSnapshotResponse{})
}
