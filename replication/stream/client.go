package stream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/replication/stream/streampb"
)

// ManagerClient is what a Client needs from the stream manager. Driver
// implements it in-process; the master will over gRPC.
type ManagerClient interface {
	// Stream returns the stream's extents and their replicas.
	Stream(ctx context.Context, name string) (StreamInfo, error)
	// Extent returns one extent's replicas.
	Extent(ctx context.Context, id uint64) (ExtentPlacement, error)
	// OpenWriter bumps the stream's writer epoch, fencing older writers.
	OpenWriter(ctx context.Context, name string) (StreamInfo, error)
	// SealAndAllocate seals extent (0: none) at the commit length its
	// reachable replicas agree on and makes sure the stream ends with an
	// open extent on healthy nodes.
	SealAndAllocate(ctx context.Context, name string, epoch, extent uint64) (StreamInfo, error)
	// ReportCorrupt tells the manager a replica failed a checksum.
	ReportCorrupt(ctx context.Context, extent uint64, node string) error
}

var _ ManagerClient = (*Driver)(nil)

// ClientOptions configure a Client; the zero value works.
type ClientOptions struct {
	// Conns dials extent nodes. Default: the client's own, closed by
	// Close.
	Conns *Conns
	// AppendTimeout bounds one append RPC to a primary; past it the client
	// seals the extent and continues on a new one. Default 5 s.
	AppendTimeout time.Duration
	// MaxSeals is how many seal-and-continue rounds one append may go
	// through before it fails. Default 8.
	MaxSeals int
	// OnSeal, if set, is called after a failed append was sealed away and
	// succeeded on the new extent, with the time from the failure to that
	// success (the seal-and-continue latency).
	OnSeal func(stream string, sealed, next uint64, took time.Duration)
	// FragmentTimeout bounds a read of one fragment of a coded extent;
	// past it the client reads the fragment's local group and rebuilds
	// the bytes (a reconstruction read). Default 250 ms.
	FragmentTimeout time.Duration
	// Logger gets the client's logs. Default: discarded.
	Logger *slog.Logger
}

// Client appends to and reads streams. One Client is the single writer of
// the streams it appends to (opening a stream for writing fences earlier
// writers); it assigns sequence numbers 1, 2, ... in stream order, and
// concurrent Appends to one stream are batched into one request, one in
// flight per stream. It is safe for concurrent use; Close stops its
// goroutines.
type Client struct {
	mgr      ManagerClient
	conns    *Conns
	ownConns bool
	opts     ClientOptions
	lg       *slog.Logger
	rr       atomic.Uint64 // read replica rotation

	reconstructions atomic.Int64

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu sync.Mutex
	// Guarded by mu.
	writers map[string]*writer
	closed  bool
}

// NewClient returns a client of the streams mgr manages.
func NewClient(mgr ManagerClient, opts ClientOptions) *Client {
	if opts.AppendTimeout <= 0 {
		opts.AppendTimeout = 5 * time.Second
	}
	if opts.MaxSeals <= 0 {
		opts.MaxSeals = 8
	}
	if opts.FragmentTimeout <= 0 {
		opts.FragmentTimeout = 250 * time.Millisecond
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Client{mgr: mgr, conns: opts.Conns, opts: opts, lg: opts.Logger, writers: map[string]*writer{}}
	if c.conns == nil {
		c.conns, c.ownConns = NewConns(), true
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c
}

// Close fails queued appends, waits for the writers and closes the
// client's own connections. Idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
	if c.ownConns {
		return c.conns.Close()
	}
	return nil
}

// Location is where an entry or a block is: a range of an extent.
type Location struct {
	Extent uint64
	Offset int64
	Length int64
}

// AppendResult says where an append landed.
type AppendResult struct {
	// Seq is the entry's sequence number.
	Seq uint64
	// Location covers the whole entry; Blocks each block.
	Location Location
	Blocks   []Location
}

// writer is a client's appending end of one stream.
type writer struct {
	name string

	mu sync.Mutex
	// Guarded by mu.
	opened  bool
	info    StreamInfo
	nextSeq uint64
	queue   []*wreq
	running bool
}

type wreq struct {
	blocks [][]byte
	crcs   []uint32
	size   int64
	seq    uint64
	done   chan wres // buffered
}

type wres struct {
	res AppendResult
	err error
}

// Append appends blocks (each at most MaxBlockBytes) to stream as one
// atomic entry and returns its sequence number and location. When it
// returns nil the entry is durable on every replica of its extent. A
// failed or timed-out append may still have landed: a retry can duplicate
// it, and readers drop the duplicate by its sequence number (ReadStream
// does). The caller must not modify blocks until Append returns.
func (c *Client) Append(ctx context.Context, stream string, blocks ...[]byte) (AppendResult, error) {
	r := &wreq{blocks: blocks, crcs: make([]uint32, len(blocks)), done: make(chan wres, 1)}
	for i, b := range blocks {
		r.crcs[i] = crc32c(b)
		r.size += int64(len(b))
	}
	if err := checkEntries([]EntryData{{Blocks: blocks}}); err != nil {
		return AppendResult{}, err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return AppendResult{}, ErrClosed
	}
	w := c.writers[stream]
	if w == nil {
		w = &writer{name: stream}
		c.writers[stream] = w
	}
	w.mu.Lock()
	w.queue = append(w.queue, r)
	if !w.running {
		w.running = true
		c.wg.Add(1)
		go c.runWriter(w)
	}
	w.mu.Unlock()
	c.mu.Unlock()
	select {
	case res := <-r.done:
		return res.res, res.err
	case <-ctx.Done():
		return AppendResult{}, ctx.Err()
	}
}

// runWriter sends w's queue batch by batch until it is empty.
func (c *Client) runWriter(w *writer) {
	defer c.wg.Done()
	for {
		w.mu.Lock()
		if len(w.queue) == 0 {
			w.running = false
			w.mu.Unlock()
			return
		}
		opened := w.opened
		w.mu.Unlock()
		if !opened {
			if err := c.openWriter(w); err != nil {
				w.mu.Lock()
				for _, r := range w.queue {
					r.done <- wres{err: err}
				}
				w.queue = nil
				w.running = false
				w.mu.Unlock()
				return
			}
		}
		w.mu.Lock()
		var batch []*wreq
		var size int64
		for len(w.queue) > 0 && (len(batch) == 0 || size+w.queue[0].size <= MaxAppendBytes) {
			r := w.queue[0]
			w.queue[0] = nil
			w.queue = w.queue[1:]
			r.seq = w.nextSeq
			w.nextSeq++
			size += r.size
			batch = append(batch, r)
		}
		w.mu.Unlock()
		c.send(w, batch)
	}
}

// openWriter bumps the stream's writer epoch and seals its open extent
// (fencing any earlier writer), so this writer appends to an extent of its
// own and knows the last sequence number used.
func (c *Client) openWriter(w *writer) error {
	info, err := c.mgr.OpenWriter(c.ctx, w.name)
	if err != nil {
		return err
	}
	var open uint64
	if last := info.Last(); last != nil && !last.Sealed {
		open = last.ID
	}
	if info, err = c.mgr.SealAndAllocate(c.ctx, w.name, info.Epoch, open); err != nil {
		return err
	}
	var seq uint64
	for _, e := range info.Extents {
		seq = max(seq, e.LastSeq)
	}
	w.mu.Lock()
	w.info, w.nextSeq, w.opened = info, seq+1, true
	w.mu.Unlock()
	return nil
}

// send appends one batch to the stream's last extent; on failure it has
// the extent sealed and retries on the new one.
func (c *Client) send(w *writer, batch []*wreq) {
	req := &streampb.AppendRequest{}
	for _, r := range batch {
		req.Entries = append(req.Entries, &streampb.Entry{Seq: r.seq, Blocks: r.blocks, Crcs: r.crcs})
	}
	fail := func(err error) {
		for _, r := range batch {
			r.done <- wres{err: err}
		}
	}
	w.mu.Lock()
	info := w.info
	w.mu.Unlock()
	var failedAt time.Time
	var sealed uint64
	for round := 0; ; round++ {
		last := info.Last()
		if last == nil || last.Sealed || len(last.Replicas) == 0 {
			var err error
			if info, err = c.mgr.SealAndAllocate(c.ctx, w.name, info.Epoch, 0); err != nil {
				fail(err)
				return
			}
			continue
		}
		req.Extent = last.ID
		req.Secondaries = req.Secondaries[:0]
		for _, r := range last.Replicas[1:] {
			req.Secondaries = append(req.Secondaries, r.Addr)
		}
		resp, err := c.appendRPC(last.Replicas[0].Addr, req)
		if err == nil {
			if !failedAt.IsZero() && c.opts.OnSeal != nil {
				c.opts.OnSeal(w.name, sealed, last.ID, time.Since(failedAt))
			}
			for i, r := range batch {
				r.done <- wres{res: resultOf(r.seq, last.ID, resp.Entries[i])}
			}
			if len(resp.Dropped) > 0 {
				// Durable on enough replicas, but the primary dropped a
				// secondary: seal and continue on a healthy extent.
				c.lg.Info("primary dropped secondaries; sealing the extent", "stream", w.name, "extent", last.ID, "dropped", resp.Dropped)
				if next, err := c.mgr.SealAndAllocate(c.ctx, w.name, info.Epoch, last.ID); err != nil {
					c.lg.Warn("seal after a dropped secondary", "stream", w.name, "extent", last.ID, "err", err)
				} else {
					info = next
				}
			}
			w.mu.Lock()
			w.info = info
			w.mu.Unlock()
			return
		}
		if errors.Is(err, ErrTooLarge) || status.Code(err) == codes.InvalidArgument || c.ctx.Err() != nil {
			fail(err)
			return
		}
		if round >= c.opts.MaxSeals {
			fail(fmt.Errorf("append to %q: gave up after %d seals: %w", w.name, round, err))
			return
		}
		if failedAt.IsZero() {
			failedAt = time.Now()
		}
		c.lg.Info("append failed; sealing the extent", "stream", w.name, "extent", last.ID, "err", err)
		sealed = last.ID
		next, serr := c.mgr.SealAndAllocate(c.ctx, w.name, info.Epoch, last.ID)
		if serr != nil {
			if errors.Is(serr, ErrFenced) || c.ctx.Err() != nil {
				fail(serr)
				return
			}
			c.lg.Warn("seal failed", "stream", w.name, "extent", last.ID, "err", serr)
			continue // the next round fails fast on the same extent and seals again
		}
		info = next
	}
}

func (c *Client) appendRPC(addr string, req *streampb.AppendRequest) (*streampb.AppendResponse, error) {
	n, err := c.conns.Node(addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(c.ctx, c.opts.AppendTimeout)
	defer cancel()
	resp, err := n.Append(ctx, req)
	if err != nil {
		return nil, fromStatus(err)
	}
	if len(resp.Entries) != len(req.Entries) {
		return nil, fmt.Errorf("append to %s: %d locations for %d entries: %w", addr, len(resp.Entries), len(req.Entries), engines.ErrCorrupt)
	}
	return resp, nil
}

func resultOf(seq, extent uint64, l *streampb.EntryLocation) AppendResult {
	res := AppendResult{Seq: seq, Location: Location{Extent: extent, Offset: l.Offset}}
	off := l.Offset
	for _, s := range l.BlockSizes {
		res.Blocks = append(res.Blocks, Location{Extent: extent, Offset: off, Length: s})
		off += s
	}
	res.Location.Length = off - l.Offset
	return res
}

// Read reads the blocks at loc (a Location an append returned, or a
// block's), trying each replica until one returns them with good
// checksums. Replicas that return corrupt data are reported to the manager.
func (c *Client) Read(ctx context.Context, loc Location) ([][]byte, error) {
	p, err := c.mgr.Extent(ctx, loc.Extent)
	if err != nil {
		return nil, err
	}
	var out [][]byte
	decode := func(raw []byte) error {
		out = out[:0]
		return DecodeBlocks(raw, loc.Extent, loc.Offset, func(_ int64, _ uint64, _ bool, p []byte) error {
			out = append(out, p)
			return nil
		})
	}
	if !coded(p) {
		err = c.readReplicas(ctx, p, loc, decode)
		if err == nil || ctx.Err() != nil {
			return out, err
		}
		// The extent may have been coded (and its replicas deleted) since.
		var perr error
		if p, perr = c.mgr.Extent(ctx, loc.Extent); perr != nil || !coded(p) {
			return nil, err
		}
	}
	raw, err := c.readCoded(ctx, p, loc.Offset, loc.Length)
	if err != nil {
		return nil, err
	}
	if err := decode(raw); err != nil {
		return nil, fmt.Errorf("coded extent %d: %w", loc.Extent, err)
	}
	return out, nil
}

// readReplicas reads loc from p's replicas and hands the bytes to decode.
func (c *Client) readReplicas(ctx context.Context, p ExtentPlacement, loc Location, decode func([]byte) error) error {
	return c.tryReplicas(ctx, p, func(n streampb.ExtentNodeClient) error {
		resp, err := n.Read(ctx, &streampb.ReadRequest{Extent: loc.Extent, Offset: loc.Offset, Length: loc.Length})
		if err != nil {
			return fromStatus(err)
		}
		if int64(len(resp.Data)) != loc.Length {
			return fmt.Errorf("read %d bytes at %d of extent %d, want %d: %w", len(resp.Data), loc.Offset, loc.Extent, loc.Length, ErrBadRange)
		}
		return decode(resp.Data)
	})
}

// tryReplicas calls fn on the replicas of p, the good ones first, starting
// at a rotating one, until one succeeds; corrupt replicas are reported.
func (c *Client) tryReplicas(ctx context.Context, p ExtentPlacement, fn func(streampb.ExtentNodeClient) error) error {
	var good, rest []ReplicaAddr
	for _, r := range p.Replicas {
		if r.OK {
			good = append(good, r)
		} else {
			rest = append(rest, r)
		}
	}
	if len(good) > 1 {
		k := int(c.rr.Add(1) % uint64(len(good)))
		good = append(good[k:], good[:k]...)
	}
	order := append(good, rest...)
	if len(order) == 0 {
		return fmt.Errorf("extent %d has no replicas: %w", p.ID, ErrUnavailable)
	}
	var errs []error
	for _, r := range order {
		n, err := c.conns.Node(r.Addr)
		if err == nil {
			err = fn(n)
		}
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, engines.ErrCorrupt) {
			if rerr := c.mgr.ReportCorrupt(ctx, p.ID, r.Node); rerr != nil {
				c.lg.Warn("report corrupt replica", "extent", p.ID, "node", r.Node, "err", rerr)
			}
		}
		errs = append(errs, fmt.Errorf("replica on %s: %w", r.Node, err))
	}
	return fmt.Errorf("extent %d: %w: %w", p.ID, ErrUnavailable, errors.Join(errs...))
}

// readChunk is how much ReadStream asks one replica for at a time.
const readChunk = 4 << 20

// ReadStream reads stream from its first extent to the commit length of
// its last, calling fn for every entry in order and dropping entries whose
// sequence number is not above every one before it (duplicates of retried
// appends) since the last sequence restart (a concatenated source's first
// extent). The open last extent is read up to the smallest commit length
// of its reachable replicas. fn may keep the entry.
func (c *Client) ReadStream(ctx context.Context, stream string, fn func(Entry) error) error {
	info, err := c.mgr.Stream(ctx, stream)
	if err != nil {
		return err
	}
	var maxSeq uint64
	for _, p := range info.Extents {
		if p.SeqRestart {
			maxSeq = 0
		}
		end := p.Length
		if !p.Sealed {
			if end, err = c.commitLength(ctx, p); err != nil {
				return err
			}
		}
		if err := c.ReadExtent(ctx, p, 0, end, func(e Entry) error {
			if e.Seq != 0 && e.Seq <= maxSeq {
				return nil // a duplicate
			}
			maxSeq = max(maxSeq, e.Seq)
			return fn(e)
		}); err != nil {
			return err
		}
	}
	return nil
}

// ReadExtent reads the entries of extent p in [from, end) (from at an
// entry boundary, end at most its sealed or committed length), from any
// good replica or, for a coded extent, its fragments, calling fn for each
// in order; every block's CRC32C is checked. fn may keep the entry.
func (c *Client) ReadExtent(ctx context.Context, p ExtentPlacement, from, end int64, fn func(Entry) error) error {
	var err error
	asm := entryAssembler{extent: p.ID}
	for off := from; off < end; {
		var raw []byte
		if coded(p) {
			if raw, err = c.readCodedBlocks(ctx, p, off, readChunk, end); err != nil {
				return err
			}
		} else if err := c.tryReplicas(ctx, p, func(n streampb.ExtentNodeClient) error {
			resp, err := n.Read(ctx, &streampb.ReadRequest{Extent: p.ID, Offset: off, Length: min(readChunk, end-off)})
			if err != nil {
				return fromStatus(err)
			}
			if len(resp.Data) == 0 || off+int64(len(resp.Data)) > end {
				return fmt.Errorf("read of extent %d at %d returned %d bytes, end %d: %w", p.ID, off, len(resp.Data), end, ErrBadRange)
			}
			raw = resp.Data
			return DecodeBlocks(raw, p.ID, off, func(int64, uint64, bool, []byte) error { return nil })
		}); err != nil {
			// The extent may have been coded (its replicas deleted) since.
			np, perr := c.mgr.Extent(ctx, p.ID)
			if perr != nil || !coded(np) {
				return err
			}
			p = np
			if raw, err = c.readCodedBlocks(ctx, p, off, readChunk, end); err != nil {
				return err
			}
		}
		if err := DecodeBlocks(raw, p.ID, off, asm.block(fn)); err != nil {
			return err
		}
		off += int64(len(raw))
	}
	if asm.inside() {
		return fmt.Errorf("extent %d ends inside an entry at %d: %w", p.ID, end, engines.ErrCorrupt)
	}
	return nil
}

// commitLength is the smallest durable length among the reachable
// replicas of an open extent.
func (c *Client) commitLength(ctx context.Context, p ExtentPlacement) (int64, error) {
	end := int64(-1)
	var errs []error
	for _, r := range p.Replicas {
		n, err := c.conns.Node(r.Addr)
		if err == nil {
			var resp *streampb.CommitLengthResponse
			if resp, err = n.CommitLength(ctx, &streampb.CommitLengthRequest{Extent: p.ID}); err == nil {
				if end < 0 || resp.Length < end {
					end = resp.Length
				}
				continue
			}
		}
		errs = append(errs, fromStatus(err))
	}
	if end < 0 {
		return 0, fmt.Errorf("commit length of extent %d: %w: %w", p.ID, ErrUnavailable, errors.Join(errs...))
	}
	return end, nil
}
