package raftnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
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
)

// GRPCTransport is the Transport between members over gRPC (service
// api.Raft): one client stream per peer carrying batches of messages,
// reconnecting with a backoff capped at 1 s, and one stream per snapshot,
// sent in 1 MiB chunks. Register it on the member's grpc.Server.
//
// Safe for concurrent use. It owns one goroutine per peer and one per
// snapshot being sent; Close stops them and waits.
type GRPCTransport struct {
	id       uint64
	logger   *slog.Logger
	dialOpts []grpc.DialOption

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

// Register serves the api.Raft service of this member on s.
func (t *GRPCTransport) Register(s *grpc.Server) { api.RegisterRaftServer(s, raftServer{t: t}) }

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
	t      *GRPCTransport
	id     uint64
	addr   string
	conn   *grpc.ClientConn
	client api.RaftClient
	queue  chan raftpb.Message
	ctx    context.Context
	cancel context.CancelFunc
}

func (t *GRPCTransport) newPeer(id uint64, addr string) (*peer, error) {
	conn, err := grpc.NewClient(addr, t.dialOpts...)
	if err != nil {
		return nil, fmt.Errorf("raftnode: dial member %d at %s: %w", id, addr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &peer{t: t, id: id, addr: addr, conn: conn, client: api.NewRaftClient(conn), queue: make(chan raftpb.Message, peerQueue), ctx: ctx, cancel: cancel}
	t.wg.Add(1)
	go p.run()
	return p, nil
}

func (p *peer) stop() { p.cancel() }

// run streams the queued messages to the peer in batches, reopening the
// stream after a failure with a backoff capped at maxBackoff.
func (p *peer) run() {
	defer p.t.wg.Done()
	defer p.conn.Close()
	var stream grpc.ClientStreamingClient[api.RaftBatch, api.RaftSendResponse]
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
		var err error
		if stream == nil {
			stream, err = p.client.Send(p.ctx)
		}
		if err == nil {
			if err = stream.Send(batch); err != nil {
				// The stream is broken; its status says why.
				_, rerr := stream.CloseAndRecv()
				err = errors.Join(err, rerr)
			}
		}
		if err == nil {
			backoff = 50 * time.Millisecond
			continue
		}
		if p.ctx.Err() != nil {
			return
		}
		p.t.logger.Debug("raftnode: send to peer failed", "peer", p.id, "addr", p.addr, "err", err)
		stream = nil
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
	stream, err := p.client.SendSnapshot(ctx)
	if err != nil {
		return err
	}
	chunk := &api.RaftSnapshotChunk{Message: hb}
	for {
		n := min(len(data), snapChunk)
		chunk.Data = data[:n]
		data = data[n:]
		if err := stream.Send(chunk); err != nil {
			_, rerr := stream.CloseAndRecv()
			return errors.Join(err, rerr)
		}
		if len(data) == 0 {
			break
		}
		chunk = &api.RaftSnapshotChunk{}
	}
	_, err = stream.CloseAndRecv()
	return err
}

// raftServer is the receiving side: api.Raft.
type raftServer struct {
	api.UnimplementedRaftServer
	t *GRPCTransport
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
