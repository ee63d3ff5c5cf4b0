package stream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/vfs"
	"github.com/tabuladb/tabula/replication/stream/streampb"
)

// NodeOptions configure an extent node. The zero value works apart from
// Dir.
type NodeOptions struct {
	// FS holds the replicas. Default vfs.Default.
	FS vfs.FS
	// Dir is the store directory (required).
	Dir string
	// Conns dials other nodes (secondaries, copy sources). Default: a cache
	// of the node's own, closed by Close.
	Conns *Conns
	// ReplicateTimeout bounds a primary's replication of one batch to one
	// secondary; past it the secondary is dropped from the extent's ack
	// set (with AckAll, the appends fail and the writer seals). It is the
	// floor: a link whose batches take longer to be answered waits longer
	// (the smoothed round trip plus four deviations, as TCP's
	// retransmission timeout, up to ReplicateTimeoutMax), so a busy
	// machine does not drop healthy secondaries. Default 5 s; a
	// partition's commit log wants ~100-200 ms, so a paused secondary does
	// not stall its writes for long.
	ReplicateTimeout time.Duration
	// ReplicateTimeoutMax caps the adaptive replicate timeout. Default 8×
	// ReplicateTimeout; equal to it, the timeout is fixed.
	ReplicateTimeoutMax time.Duration
	// MaxReplicaLag bounds, per secondary of an extent this node is
	// primary of, the bytes queued for it but not yet acknowledged by it.
	// Past it (a slow secondary under AckQuorum) the secondary is dropped
	// from the ack set and the append responses name it. Default 64 MiB.
	MaxReplicaLag int64
	// ReplicateCalls is how many batches a primary keeps in flight on its
	// ReplicateStream to one secondary node (or ReplicateBatch calls, to
	// a node without the stream, which writes each extent's data in
	// offset order whichever call it handles first). Default 1:
	// on a machine whose CPU is the limit more calls cost more than they
	// save (each carries fewer extents' data, and every call is CPU on
	// both sides); with CPU to spare, 2–4 take the wait for the call
	// before off a write's latency.
	ReplicateCalls int
	// ScrubInterval is the pause between background scrub passes over
	// every replica. Default 0: no background scrubber (call Scrub).
	ScrubInterval time.Duration
	// OnCorrupt, if set, is called for every replica a scrub pass finds
	// corrupt (from the scrubbing goroutine): the owner tells the stream
	// manager, which has it rebuilt from a good replica.
	OnCorrupt func(extent uint64, err error)
	// OnCorruptFragment, if set, is called for every fragment a scrub pass
	// finds corrupt: the owner tells the stream manager
	// (OpFragmentCorrupt), which has it rebuilt.
	OnCorruptFragment func(extent uint64, index int, err error)
	// Journal configures the node's journal (see the package comment,
	// "Journal"): every write of every extent of the node shares one
	// journal write and fsync. The zero value journals.
	Journal JournalOptions
	// Logger gets the node's logs. Default: discarded.
	Logger *slog.Logger
	// Now is the clock a fired replicate timeout is checked against (see
	// link.awaitStream). Default time.Now; tests move it to stand for a
	// node that was paused.
	Now func() time.Time
	// NoRejoin keeps a secondary dropped from an extent's ack set out of
	// it for the extent's life, as before rejoining existed (rejoin.go):
	// for tests that need a secondary to stay behind. Default false.
	NoRejoin bool
}

// Validate says what is wrong with o.
func (o NodeOptions) Validate() error {
	switch {
	case o.Dir == "":
		return errors.New("stream: NodeOptions.Dir is required")
	case o.ReplicateTimeout < 0:
		return fmt.Errorf("stream: NodeOptions.ReplicateTimeout %v is negative", o.ReplicateTimeout)
	case o.ReplicateTimeoutMax < 0 || (o.ReplicateTimeoutMax > 0 && o.ReplicateTimeoutMax < o.ReplicateTimeout):
		return fmt.Errorf("stream: NodeOptions.ReplicateTimeoutMax %v is below ReplicateTimeout %v", o.ReplicateTimeoutMax, o.ReplicateTimeout)
	case o.ReplicateCalls < 0:
		return fmt.Errorf("stream: NodeOptions.ReplicateCalls %d is negative", o.ReplicateCalls)
	case o.ScrubInterval < 0:
		return fmt.Errorf("stream: NodeOptions.ScrubInterval %v is negative", o.ScrubInterval)
	case o.Journal.FileBytes < 0:
		return fmt.Errorf("stream: NodeOptions.Journal.FileBytes %d is negative", o.Journal.FileBytes)
	}
	return nil
}

// Node is an extent node: the ExtentNode gRPC service over a Store. As the
// primary of an extent it orders appends, writes them locally and to the
// secondaries in parallel, and acknowledges them in offset order once
// enough replicas have them durably; concurrent appends to one extent are
// group-committed (one batch: one write per replica, one Replicate per
// secondary), and the writes of all the node's extents share the node's
// journal (one write and one fsync for everything queued). It is safe for
// concurrent use; Close stops its goroutines.
type Node struct {
	streampb.UnimplementedExtentNodeServer

	opts     NodeOptions
	store    *Store
	frags    *FragmentStore
	conns    *Conns
	ownConns bool
	log      *slog.Logger

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// streamsEnd ends every ReplicateStream this node serves and refuses
	// new ones (StopReplicateStreams).
	streamsCtx context.Context
	streamsEnd context.CancelFunc

	stats nodeCounters // stats.go

	mu sync.Mutex
	// Guarded by mu.
	appenders map[uint64]*appender
	links     map[string]*link // by secondary node address
	closed    bool
}

var _ streampb.ExtentNodeServer = (*Node)(nil)

// OpenNode opens the node's store (recovering every replica and replaying
// the journal into them) and, with ScrubInterval, starts the scrubber. Register it on a grpc.Server made
// with ServerOptions.
func OpenNode(opts NodeOptions) (*Node, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.ReplicateTimeout == 0 {
		opts.ReplicateTimeout = 5 * time.Second
	}
	if opts.ReplicateTimeoutMax == 0 {
		opts.ReplicateTimeoutMax = maxTimeoutFactor * opts.ReplicateTimeout
	}
	if opts.ReplicateCalls == 0 {
		opts.ReplicateCalls = 1
	}
	if opts.MaxReplicaLag <= 0 {
		opts.MaxReplicaLag = 64 << 20
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	var st *Store
	var err error
	if opts.Journal.Disabled {
		st, err = OpenStore(opts.FS, opts.Dir)
	} else {
		st, err = OpenJournaledStore(opts.FS, opts.Dir, opts.Journal, opts.Logger)
	}
	if err != nil {
		return nil, err
	}
	frags, err := OpenFragmentStore(opts.FS, filepath.Join(opts.Dir, "fragments"))
	if err != nil {
		return nil, errors.Join(err, st.Close())
	}
	n := &Node{opts: opts, store: st, frags: frags, conns: opts.Conns, log: opts.Logger, appenders: map[uint64]*appender{}, links: map[string]*link{}}
	if n.conns == nil {
		n.conns, n.ownConns = NewConns(), true
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.streamsCtx, n.streamsEnd = context.WithCancel(n.ctx)
	if opts.ScrubInterval > 0 {
		n.wg.Add(1)
		go n.scrubLoop()
	}
	n.wg.Add(1)
	go n.keepaliveLoop()
	return n, nil
}

// Register registers the node's service on s.
func (n *Node) Register(s *grpc.Server) { streampb.RegisterExtentNodeServer(s, n) }

// Store is the node's store.
func (n *Node) Store() *Store { return n.store }

// Extent returns the node's replica of extent id (ErrNoExtent if it has
// none): what an in-process owner of the node (the table server hosting
// it) tails with WaitCommitted and ReadEntries. The replica may be
// replaced by a copy (Copy) or deleted: get it again after ErrClosed.
func (n *Node) Extent(id uint64) (*Extent, error) { return n.store.Get(id) }

// Fragments is the node's fragment store.
func (n *Node) Fragments() *FragmentStore { return n.frags }

// Close stops the scrubber and the appenders (failing queued appends),
// waits for them and closes the store. Idempotent.
func (n *Node) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	n.mu.Unlock()
	n.cancel()
	n.wg.Wait()
	err := errors.Join(n.store.Close(), n.frags.Close())
	if n.ownConns {
		err = errors.Join(err, n.conns.Close())
	}
	return err
}

// Create implements streampb.ExtentNodeServer.
func (n *Node) Create(_ context.Context, r *streampb.CreateRequest) (*streampb.CreateResponse, error) {
	cfg := ReplicaConfig{Primary: r.Primary, Ack: AckPolicy(r.Ack)}
	for _, s := range r.Secondaries {
		cfg.Secondaries = append(cfg.Secondaries, ReplicaRef{Node: s.Node, Addr: s.Addr})
	}
	ext, err := n.store.CreateReplica(r.Extent, cfg)
	if err != nil {
		return nil, toStatus(err)
	}
	if r.Primary {
		// The appender exists from the start, not from the first
		// append: its secondaries hear the commit point (keepalive.go)
		// on an extent nothing is written to yet.
		n.mu.Lock()
		if a := n.appenders[r.Extent]; (a == nil || a.ext != ext) && !n.closed {
			n.appenders[r.Extent] = newAppender(n, ext)
		}
		n.mu.Unlock()
	}
	return &streampb.CreateResponse{}, nil
}

type appendReq struct {
	entries []EntryData
	size    int64
	done    chan appendResult // buffered: the runner never blocks
}

type appendResult struct {
	locs    []EntryLoc
	end     int64
	dropped []string
	err     error
}

// Append implements streampb.ExtentNodeServer.
func (n *Node) Append(ctx context.Context, r *streampb.AppendRequest) (*streampb.AppendResponse, error) {
	wait, err := n.StartAppend(r)
	if err != nil {
		return nil, err
	}
	return wait(ctx)
}

// StartAppend is Append in two halves, for a caller in this process that
// keeps several appends to one extent in flight: it checks r and queues it
// behind the appends started before it (in the order of the calls, which
// is the order of the entries in the extent), and returns the wait for its
// outcome. Errors are gRPC statuses, as Append's. wait may be called once;
// a ctx that ends first leaves the append to land or fail on its own.
func (n *Node) StartAppend(r *streampb.AppendRequest) (wait func(context.Context) (*streampb.AppendResponse, error), err error) {
	ext, err := n.store.Get(r.Extent)
	if err != nil {
		return nil, toStatus(err)
	}
	if !ext.Info().Primary {
		return nil, toStatus(fmt.Errorf("append to extent %d: not its primary: %w", r.Extent, ErrRole))
	}
	if ext.version < fileVersion {
		return nil, toStatus(fmt.Errorf("append to extent %d: a primary of format version %d does not record its secondaries; seal the extent: %w", r.Extent, ext.version, ErrBroken))
	}
	if len(r.Secondaries) > 0 {
		var mine []string
		for _, s := range ext.cfg.Secondaries {
			mine = append(mine, s.Addr)
		}
		if !slices.Equal(mine, r.Secondaries) {
			return nil, toStatus(fmt.Errorf("append to extent %d naming secondaries %v: its secondaries are %v: %w", r.Extent, r.Secondaries, mine, ErrRole))
		}
	}
	req := &appendReq{done: make(chan appendResult, 1)}
	for i, en := range r.Entries {
		if len(en.Crcs) != len(en.Blocks) {
			return nil, toStatus(fmt.Errorf("entry %d: %d blocks, %d crcs: %w", i, len(en.Blocks), len(en.Crcs), engines.ErrCorrupt))
		}
		for j, b := range en.Blocks {
			if crc32c(b) != en.Crcs[j] {
				return nil, toStatus(fmt.Errorf("entry %d block %d: payload crc mismatch: %w", i, j, engines.ErrCorrupt))
			}
			req.size += int64(len(b))
		}
		req.entries = append(req.entries, EntryData{Seq: en.Seq, Blocks: en.Blocks})
	}
	if err := checkEntries(req.entries); err != nil {
		return nil, toStatus(err)
	}
	if err := n.enqueue(ext, req); err != nil {
		return nil, toStatus(err)
	}
	return func(ctx context.Context) (*streampb.AppendResponse, error) {
		select {
		case res := <-req.done:
			if res.err != nil {
				return nil, toStatus(res.err)
			}
			n.stats.appended(req.size)
			out := &streampb.AppendResponse{CommitLength: res.end, Dropped: res.dropped}
			for _, l := range res.locs {
				out.Entries = append(out.Entries, &streampb.EntryLocation{Offset: l.Offset, BlockSizes: l.Sizes})
			}
			return out, nil
		case <-ctx.Done():
			// The append may still land; the writer retries and readers
			// drop the duplicate by its sequence number.
			return nil, toStatus(ctx.Err())
		}
	}, nil
}

// Replicate implements streampb.ExtentNodeServer.
func (n *Node) Replicate(ctx context.Context, r *streampb.ReplicateRequest) (*streampb.ReplicateResponse, error) {
	ext, end, sp, err := n.replicateWrite(ctx, r)
	if err == nil && len(r.Data) > 0 {
		err = n.replicateSync(ext, sp, r)
	}
	if err != nil {
		return nil, toStatus(err)
	}
	return &streampb.ReplicateResponse{CommitLength: end}, nil
}

// ReplicateBatch implements streampb.ExtentNodeServer: every item is
// written, then synced (the journal makes that one fsync for all), and
// each answers alone. A primary keeps several batches in flight to a node:
// an item that overtook the one before it in its extent waits for it
// (waitWritten) and does not hold up the items of later calls meanwhile,
// since each call's writes are done before its syncs.
func (n *Node) ReplicateBatch(ctx context.Context, r *streampb.ReplicateBatchRequest) (*streampb.ReplicateBatchResponse, error) {
	b := n.replicateBatchWrite(ctx, r)
	n.replicateBatchSync(b)
	return b.out, nil
}

// batchWrite is a ReplicateBatch between its halves: the items written,
// their syncs to wait for.
type batchWrite struct {
	r    *streampb.ReplicateBatchRequest
	out  *streampb.ReplicateBatchResponse
	exts []*Extent // nil where there is nothing to sync
	sps  []syncPoint
}

// replicateBatchWrite writes every item of r (not yet durable).
func (n *Node) replicateBatchWrite(ctx context.Context, r *streampb.ReplicateBatchRequest) *batchWrite {
	b := &batchWrite{
		r:    r,
		out:  &streampb.ReplicateBatchResponse{Id: r.Id, Items: make([]*streampb.ReplicateResult, len(r.Items))},
		exts: make([]*Extent, len(r.Items)),
		sps:  make([]syncPoint, len(r.Items)),
	}
	for i, it := range r.Items {
		ext, end, sp, err := n.replicateWrite(ctx, it)
		b.out.Items[i] = replicateResult(end, err)
		if err == nil && len(it.Data) > 0 {
			b.exts[i], b.sps[i] = ext, sp
		}
	}
	return b
}

// replicateBatchSync makes b's writes durable, recording each item's
// outcome in b.out.
func (n *Node) replicateBatchSync(b *batchWrite) {
	for i, ext := range b.exts {
		if ext == nil {
			continue
		}
		if err := n.replicateSync(ext, b.sps[i], b.r.Items[i]); err != nil {
			b.out.Items[i] = replicateResult(0, err)
		}
	}
}

// ReplicateStream implements streampb.ExtentNodeServer: ReplicateBatch on
// one long-lived stream from a primary node. The batches arrive in the
// order the primary sent them, so each is written as it arrives, in
// stream order (an item whose data lies beyond its replica's length does
// not wait: nothing is coming before it); its syncs and its answer run on
// their own goroutine, so the next batch is written meanwhile and shares
// the journal's fsync. The stream ends when the primary closes or cancels
// it; StopReplicateStreams asks the primary to (an answer with id 0),
// and it does once its batches in flight are answered. The handler
// returns only after its last Recv and its last Send, as gRPC requires.
func (n *Node) ReplicateStream(st streampb.ExtentNode_ReplicateStreamServer) error {
	if n.streamsCtx.Err() != nil {
		return toStatus(fmt.Errorf("replicate stream: the node is shutting down: %w", ErrClosed))
	}
	var (
		sendMu  sync.Mutex
		ended   bool // guarded by sendMu: the handler is returning, Send is not allowed
		batches sync.WaitGroup
	)
	send := func(resp *streampb.ReplicateBatchResponse) {
		sendMu.Lock()
		defer sendMu.Unlock()
		if !ended {
			_ = st.Send(resp) // a failed Send ends the stream: Recv says so
		}
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-n.streamsCtx.Done():
			send(&streampb.ReplicateBatchResponse{}) // id 0: end the stream
		case <-done:
		}
	}()
	var err error
	for {
		r, rerr := st.Recv()
		if rerr != nil {
			if !errors.Is(rerr, io.EOF) {
				err = rerr // the primary cancelled it, or the transport broke
			}
			break
		}
		b := n.replicateBatchWrite(noWait, r)
		batches.Add(1)
		go func() {
			defer batches.Done()
			n.replicateBatchSync(b)
			send(b.out)
		}()
	}
	batches.Wait()
	sendMu.Lock()
	ended = true
	sendMu.Unlock()
	return err
}

// StopReplicateStreams asks the primary of every ReplicateStream the node
// serves to end it once its batches in flight are answered, and refuses
// new streams, as a gRPC server's GracefulStop refuses new calls: a
// server that drains calls it first, since GracefulStop waits for every
// stream to end and primaries keep theirs open. A primary's later
// batches to the node fail, and those secondaries are dropped, as with
// refused calls. Idempotent; Close does it too.
func (n *Node) StopReplicateStreams() { n.streamsEnd() }

// noWait is a context already done: a write on a ReplicateStream never
// waits for data before it (see ReplicateStream).
var noWait = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

func replicateResult(end int64, err error) *streampb.ReplicateResult {
	if err == nil {
		return &streampb.ReplicateResult{CommitLength: end}
	}
	st, _ := status.FromError(toStatus(err))
	return &streampb.ReplicateResult{Code: uint32(st.Code()), Message: st.Message()}
}

// replicateWrite is a Replicate's first half: it writes r's data (not yet
// durable) and returns the replica's length after it and the write's sync
// point, or, for a request with only a commit length, records that and
// returns the length. Data beyond the replica's length waits, until ctx
// ends, for the data before it (a call in flight before this one).
func (n *Node) replicateWrite(ctx context.Context, r *streampb.ReplicateRequest) (*Extent, int64, syncPoint, error) {
	ext, err := n.store.Get(r.Extent)
	if err != nil {
		return nil, 0, syncPoint{}, err
	}
	if ext.Info().Primary {
		return nil, 0, syncPoint{}, fmt.Errorf("replicate to extent %d: it is the primary: %w", r.Extent, ErrRole)
	}
	if len(r.Data) == 0 {
		ext.setCommitted(r.CommitLength)
		return ext, ext.Length(), syncPoint{}, nil
	}
	ext.waitWritten(ctx, r.Offset)
	end, sp, err := ext.appendRaw(r.Offset, r.Data, true)
	if err != nil {
		return nil, 0, syncPoint{}, err
	}
	n.stats.replicated(len(r.Data))
	return ext, end, sp, nil
}

// replicateSync is a Replicate's second half: the data durable, the
// commit length recorded.
func (n *Node) replicateSync(ext *Extent, sp syncPoint, r *streampb.ReplicateRequest) error {
	if err := ext.syncTo(sp); err != nil {
		return err
	}
	ext.setCommitted(r.CommitLength)
	return nil
}

// Read implements streampb.ExtentNodeServer.
func (n *Node) Read(_ context.Context, r *streampb.ReadRequest) (*streampb.ReadResponse, error) {
	ext, err := n.store.Get(r.Extent)
	if err != nil {
		return nil, toStatus(err)
	}
	raw, end, sealed, err := ext.Read(r.Offset, min(max(r.Length, 0), MaxAppendBytes))
	if err != nil {
		return nil, toStatus(err)
	}
	return &streampb.ReadResponse{Data: raw, End: end, Sealed: sealed}, nil
}

// CommitLength implements streampb.ExtentNodeServer.
func (n *Node) CommitLength(_ context.Context, r *streampb.CommitLengthRequest) (*streampb.CommitLengthResponse, error) {
	ext, err := n.store.Get(r.Extent)
	if err != nil {
		return nil, toStatus(err)
	}
	if r.Freeze {
		length, seq, sealed, err := ext.Freeze()
		if err != nil {
			return nil, toStatus(err)
		}
		return &streampb.CommitLengthResponse{Length: length, LastSeq: seq, Sealed: sealed}, nil
	}
	info := ext.Info()
	return &streampb.CommitLengthResponse{Length: info.Length, LastSeq: info.LastSeq, Sealed: info.Sealed}, nil
}

// Seal implements streampb.ExtentNodeServer.
func (n *Node) Seal(_ context.Context, r *streampb.SealRequest) (*streampb.SealResponse, error) {
	ext, err := n.store.Get(r.Extent)
	if err != nil {
		return nil, toStatus(err)
	}
	seq, err := ext.Seal(r.Length)
	if err != nil {
		return nil, toStatus(err)
	}
	return &streampb.SealResponse{LastSeq: seq}, nil
}

// fetchChunk is how much a Fetch message carries (whole blocks, so a
// 4 MiB block goes alone).
const fetchChunk = 1 << 20

// Fetch implements streampb.ExtentNodeServer.
func (n *Node) Fetch(r *streampb.FetchRequest, s grpc.ServerStreamingServer[streampb.FetchChunk]) error {
	ext, err := n.store.Get(r.Extent)
	if err != nil {
		return toStatus(err)
	}
	info := ext.Info()
	if !info.Sealed {
		return toStatus(fmt.Errorf("fetch extent %d: %w", r.Extent, ErrNotSealed))
	}
	var off int64
	for {
		raw, _, _, err := ext.Read(off, fetchChunk)
		if err != nil {
			return toStatus(err)
		}
		if len(raw) == 0 && off > 0 {
			return nil
		}
		if err := s.Send(&streampb.FetchChunk{Offset: off, Data: raw, SealedLength: info.Length}); err != nil {
			return err
		}
		if len(raw) == 0 {
			return nil
		}
		off += int64(len(raw))
	}
}

// Copy implements streampb.ExtentNodeServer.
func (n *Node) Copy(ctx context.Context, r *streampb.CopyRequest) (*streampb.CopyResponse, error) {
	var errs []error
	for _, addr := range r.Sources {
		err := n.copyFrom(ctx, r.Extent, addr, r.Length)
		if err == nil {
			n.mu.Lock()
			delete(n.appenders, r.Extent)
			n.mu.Unlock()
			return &streampb.CopyResponse{}, nil
		}
		errs = append(errs, fmt.Errorf("from %s: %w", addr, err))
	}
	if len(errs) == 0 {
		return nil, toStatus(fmt.Errorf("copy extent %d: no sources: %w", r.Extent, ErrUnavailable))
	}
	return nil, toStatus(fmt.Errorf("copy extent %d: %w", r.Extent, errors.Join(errs...)))
}

func (n *Node) copyFrom(ctx context.Context, extent uint64, addr string, length int64) error {
	c, err := n.conns.Node(addr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := c.Fetch(ctx, &streampb.FetchRequest{Extent: extent})
	if err != nil {
		return fromStatus(err)
	}
	return n.store.Install(extent, length, func(put func(int64, []byte) error) error {
		for {
			ch, err := s.Recv()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return fromStatus(err)
			}
			if ch.SealedLength != length {
				return fmt.Errorf("source sealed at %d, want %d: %w", ch.SealedLength, length, ErrSealConflict)
			}
			if err := put(ch.Offset, ch.Data); err != nil {
				return err
			}
		}
	})
}

// Delete implements streampb.ExtentNodeServer.
func (n *Node) Delete(_ context.Context, r *streampb.DeleteRequest) (*streampb.DeleteResponse, error) {
	n.mu.Lock()
	delete(n.appenders, r.Extent)
	n.mu.Unlock()
	if err := n.store.Delete(r.Extent); err != nil {
		return nil, toStatus(err)
	}
	return &streampb.DeleteResponse{}, nil
}

// Stat implements streampb.ExtentNodeServer.
func (n *Node) Stat(context.Context, *streampb.StatRequest) (*streampb.StatResponse, error) {
	out := &streampb.StatResponse{}
	for _, id := range n.store.List() {
		e, err := n.store.Get(id)
		if err != nil {
			continue // deleted meanwhile
		}
		info := e.Info()
		out.UsedBytes += info.Length
		out.Extents = append(out.Extents, &streampb.ExtentStat{
			Extent: id, Length: info.Length, Sealed: info.Sealed, Corrupt: info.Corrupt,
			Primary: info.Primary, LastSeq: info.LastSeq, CommittedLength: e.CommittedLength(), Dropped: n.dropped(e),
		})
	}
	for _, f := range n.frags.List() {
		out.UsedBytes += f.Size
		out.Fragments = append(out.Fragments, &streampb.FragmentStat{Extent: f.Extent, Index: uint32(f.Index), Size: f.Size, Crc: f.CRC, Corrupt: f.Corrupt})
	}
	return out, nil
}

// Scrub re-verifies every block of every replica once and returns the ids
// of the corrupt ones, calling OnCorrupt for each. It stops early, with
// what it found so far, when ctx is done.
func (n *Node) Scrub(ctx context.Context) []uint64 {
	var bad []uint64
	for _, id := range n.store.List() {
		e, err := n.store.Get(id)
		if err != nil {
			continue
		}
		err = e.Scrub(func() bool { return ctx.Err() != nil })
		if err == nil && e.Info().Corrupt {
			err = fmt.Errorf("extent %d marked corrupt by an earlier read: %w", id, engines.ErrCorrupt)
		}
		if !errors.Is(err, engines.ErrCorrupt) {
			continue
		}
		n.log.Warn("scrub found a corrupt replica", "extent", id, "err", err)
		bad = append(bad, id)
		if n.opts.OnCorrupt != nil {
			n.opts.OnCorrupt(id, err)
		}
	}
	n.ScrubFragments(ctx)
	return bad
}

// ScrubFragments re-verifies every fragment (every chunk and the whole
// CRC) once and returns the corrupt ones, calling OnCorruptFragment for
// each. Scrub calls it after the replicas.
func (n *Node) ScrubFragments(ctx context.Context) []FragmentRef {
	var bad []FragmentRef
	for _, f := range n.frags.List() {
		if ctx.Err() != nil {
			break
		}
		err := n.frags.Scrub(f.Extent, f.Index)
		if !errors.Is(err, engines.ErrCorrupt) {
			continue
		}
		n.log.Warn("scrub found a corrupt fragment", "extent", f.Extent, "index", f.Index, "err", err)
		bad = append(bad, FragmentRef{Extent: f.Extent, Index: f.Index})
		if n.opts.OnCorruptFragment != nil {
			n.opts.OnCorruptFragment(f.Extent, f.Index, err)
		}
	}
	return bad
}

func (n *Node) scrubLoop() {
	defer n.wg.Done()
	t := time.NewTimer(n.opts.ScrubInterval)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
			n.Scrub(n.ctx)
			t.Reset(n.opts.ScrubInterval)
		}
	}
}
