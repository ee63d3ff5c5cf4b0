package stream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tabuladb/tabula/replication/stream/streampb"
)

// The primary's side of an extent (see the package comment, "Appends"):
// an appender orders the appends and group-commits them in batches: it
// writes a batch locally and queues it for each secondary on the node's
// link to that secondary's node, then goes on with the next batch while
// its committer acknowledges each batch, in order, once it is durable
// locally (its own journal ticket, not the later batches') and on as many
// secondaries as the ack policy requires. Up to maxFlights batches are so
// in flight: a write does not wait for the sync of the batch before it.
// A link sends what every extent queued for its node as one batch on its
// ReplicateStream to that node, up to NodeOptions.ReplicateCalls batches
// in flight (sent in order, so the receiver writes each extent's data in
// offset order), and a slow node
// delays only the copies it holds: under AckQuorum the
// appenders go on without it, and once a queue passes MaxReplicaLag (or a
// Replicate fails) that secondary is dropped from its extent's ack set for
// good. Acknowledgements are in offset order because batches are.

// commitNotifyDelay is how long a sender waits, after its secondary's
// commit point fell behind the primary's with nothing more to replicate,
// before telling it the new commit length in a data-less Replicate.
const commitNotifyDelay = time.Millisecond

// appender group-commits the appends to one extent this node is primary
// of.
type appender struct {
	n        *Node
	ext      *Extent
	required int // copies (the primary's included) an acknowledgement needs

	mu sync.Mutex
	// Guarded by mu.
	queue      []*appendReq
	running    bool      // run is running
	flights    []*flight // written, in offset order, not yet acknowledged
	committing bool      // commitLoop is running
	err        error     // a batch failed: every later one fails
	secs       []*secondary
	committed  int64 // acknowledged length
	// handedOut is where the last batch queued for the secondaries ends:
	// a secondary rejoins holding exactly that much (rejoin.go).
	handedOut int64
	changed   chan struct{} // closed and replaced when a secondary's state changes
}

// secondary is an appender's view of one secondary.
type secondary struct {
	ref  ReplicaRef
	a    *appender
	link *link // to ref's node

	// Guarded by a.mu.
	pending []pendingRep
	queued  int64 // bytes in pending
	acked   int64 // the length it reported durable
	told    int64 // the commit length last sent to it
	failed  error // not nil: dropped from the ack set
	// rejoining: dropped, and a rejoiner is trying to bring it back
	// (rejoin.go); answering: the rejoiner's probe was answered, and it is
	// being sent what it missed.
	rejoining, answering bool
	since                time.Time // when it last left or rejoined the ack set
	// lastSent is when the link last sent it an item; keepalive asks the
	// link to tell it the commit point even if unchanged (keepalive.go).
	lastSent  time.Time
	keepalive bool

	listed bool // guarded by link.mu: on the link's ready list
}

type pendingRep struct {
	off int64
	raw []byte
}

// newAppender makes ext's appender; the caller holds n.mu.
func newAppender(n *Node, ext *Extent) *appender {
	cfg := ext.Config()
	a := &appender{n: n, ext: ext, required: cfg.Ack.Required(1 + len(cfg.Secondaries)), changed: make(chan struct{})}
	length := ext.Length()
	a.committed = ext.CommittedLength()
	a.handedOut = length
	for _, r := range cfg.Secondaries {
		a.secs = append(a.secs, &secondary{ref: r, a: a, link: n.linkForLocked(r.Addr), acked: length})
	}
	return a
}

// notifyLocked wakes the appender waiting for acknowledgements.
func (a *appender) notifyLocked() {
	close(a.changed)
	a.changed = make(chan struct{})
}

// kickLocked queues s on its link: it has data, or is behind on the
// commit point.
func (a *appender) kickLocked(s *secondary) {
	if s.failed != nil {
		return
	}
	s.link.queue(s)
}

// dropLocked drops s from the ack set.
func (a *appender) dropLocked(s *secondary, err error) {
	if s.failed != nil {
		return
	}
	s.failed = err
	s.since = time.Now()
	s.pending, s.queued = nil, 0
	a.n.stats.drops.Add(1)
	a.n.log.Warn("secondary dropped from the ack set", "extent", a.ext.ID(), "node", s.ref.Node, "err", err)
	a.notifyLocked()
	a.startRejoinLocked(s)
}

// droppedLocked lists the node ids of the dropped secondaries.
func (a *appender) droppedLocked() []string {
	var out []string
	for _, s := range a.secs {
		if s.failed != nil {
			out = append(out, s.ref.Node)
		}
	}
	return out
}

// dropped lists the secondaries e's appender (if any) dropped.
func (n *Node) dropped(e *Extent) []string {
	n.mu.Lock()
	a := n.appenders[e.ID()]
	n.mu.Unlock()
	if a == nil || a.ext != e {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.droppedLocked()
}

// enqueue queues req on ext's appender, starting its runner if idle.
func (n *Node) enqueue(ext *Extent, req *appendReq) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	a := n.appenders[ext.ID()]
	if a == nil || a.ext != ext {
		a = newAppender(n, ext)
		n.appenders[ext.ID()] = a
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.queue = append(a.queue, req)
	if !a.running {
		a.running = true
		n.wg.Add(1)
		go a.run()
	}
	return nil
}

// run commits a's queue batch by batch until it is empty.
func (a *appender) run() {
	defer a.n.wg.Done()
	for {
		a.mu.Lock()
		// A bounded pipeline: while maxFlights batches wait for their
		// syncs and acknowledgements, the queue grows into a larger
		// next batch instead.
		for len(a.flights) >= maxFlights && a.err == nil && a.n.ctx.Err() == nil {
			ch := a.changed
			a.mu.Unlock()
			select {
			case <-ch:
			case <-a.n.ctx.Done():
			}
			a.mu.Lock()
		}
		var batch []*appendReq
		var size int64
		for len(a.queue) > 0 && (len(batch) == 0 || size+a.queue[0].size <= MaxAppendBytes) {
			size += a.queue[0].size
			batch = append(batch, a.queue[0])
			a.queue[0] = nil
			a.queue = a.queue[1:]
		}
		if len(batch) == 0 {
			a.running = false
			a.mu.Unlock()
			return
		}
		err := a.err
		a.mu.Unlock()
		if err == nil && a.n.ctx.Err() != nil {
			err = ErrClosed
		}
		if err != nil {
			failAppends(batch, err)
			continue
		}
		a.start(batch)
	}
}

// maxFlights is how many batches of one extent may be written and on
// their way to the secondaries at once, not yet acknowledged.
const maxFlights = 8

// flight is a batch written locally and queued for the secondaries,
// waiting for its sync and acknowledgements.
type flight struct {
	batch []*appendReq
	locs  []EntryLoc
	sync  syncPoint
	end   int64
}

func failAppends(batch []*appendReq, err error) {
	for _, r := range batch {
		r.done <- appendResult{err: err}
	}
}

// start writes one batch locally, hands it to the senders and to the
// committer. A batch that fails here fails every later one (a.err): none
// may be acknowledged after a gap.
func (a *appender) start(batch []*appendReq) {
	var entries []EntryData
	for _, r := range batch {
		entries = append(entries, r.entries...)
	}
	ext := a.ext
	locs, start, raw, sp, err := ext.appendEntries(entries)
	if err != nil {
		a.mu.Lock()
		if a.err == nil {
			a.err = err
		}
		a.mu.Unlock()
		failAppends(batch, err)
		return
	}
	end := start + int64(len(raw))
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range a.secs {
		if s.failed != nil {
			continue
		}
		if s.queued+int64(len(raw)) > a.n.opts.MaxReplicaLag && s.queued > 0 {
			a.dropLocked(s, fmt.Errorf("secondary %s is %d bytes behind (max %d)", s.ref.Node, s.queued, a.n.opts.MaxReplicaLag))
			continue
		}
		s.pending = append(s.pending, pendingRep{off: start, raw: raw})
		s.queued += int64(len(raw))
		a.kickLocked(s)
	}
	a.handedOut = end
	a.flights = append(a.flights, &flight{batch: batch, locs: locs, sync: sp, end: end})
	if !a.committing {
		a.committing = true
		a.n.wg.Add(1)
		go a.commitLoop()
	}
}

// commitLoop completes the batches in flight, in order, until there are
// none: each once it is durable locally and on enough secondaries. After
// one fails, every later one fails too (they follow a gap), and so does
// every batch after them (a.err).
func (a *appender) commitLoop() {
	defer a.n.wg.Done()
	var failed error
	for {
		a.mu.Lock()
		if len(a.flights) == 0 {
			a.committing = false
			a.mu.Unlock()
			return
		}
		f := a.flights[0]
		a.mu.Unlock()
		var dropped []string
		err := failed
		if err == nil {
			dropped, err = a.commit(f)
		}
		a.mu.Lock()
		a.flights[0] = nil
		a.flights = a.flights[1:]
		if err != nil {
			failed = err
			if a.err == nil {
				a.err = err
			}
		}
		a.notifyLocked() // room in the pipeline
		a.mu.Unlock()
		if err != nil {
			failAppends(f.batch, err)
			continue
		}
		i := 0
		for _, r := range f.batch {
			r.done <- appendResult{locs: f.locs[i : i+len(r.entries)], end: f.end, dropped: dropped}
			i += len(r.entries)
		}
	}
}

// commit waits until flight f is durable locally and on as many
// secondaries as the ack policy requires, and raises the commit point to
// its end.
func (a *appender) commit(f *flight) (dropped []string, err error) {
	if a.n.ctx.Err() != nil {
		return nil, ErrClosed
	}
	ext := a.ext
	if err := ext.syncTo(f.sync); err != nil {
		return nil, err
	}
	a.mu.Lock()
	for {
		have, live := 1, 1
		for _, s := range a.secs {
			if s.failed == nil {
				live++
				if s.acked >= f.end {
					have++
				}
			}
		}
		if have >= a.required {
			break
		}
		if live < a.required {
			var errs []error
			for _, s := range a.secs {
				if s.failed != nil {
					errs = append(errs, s.failed)
				}
			}
			a.mu.Unlock()
			err := fmt.Errorf("append to extent %d: %d of %d copies needed left: %w: %w", ext.ID(), live, a.required, ErrBroken, errors.Join(errs...))
			ext.Break(err)
			return nil, err
		}
		ch := a.changed
		a.mu.Unlock()
		select {
		case <-ch:
		case <-a.n.ctx.Done():
			return nil, ErrClosed
		}
		a.mu.Lock()
	}
	a.committed = max(a.committed, f.end)
	ext.setCommitted(f.end)
	dropped = a.droppedLocked()
	for _, s := range a.secs {
		if s.told < f.end {
			a.kickLocked(s)
		}
	}
	a.mu.Unlock()
	return dropped, nil
}

// maxReplicate is how many bytes one batch carries at most (a
// single larger batch of one extent goes alone).
const maxReplicate = 4 << 20

// link is the node's replication to one secondary node: every extent this
// node is primary of with a replica there queues its secondary on the link
// (kickLocked), and one sender goroutine sends everything queued as one
// batch on the link's ReplicateStream, with up to
// NodeOptions.ReplicateCalls of them in flight; a goroutine per batch
// waits for its answer. Many partitions' appends to one node so cost one
// message and one journal sync there, not one each.
type link struct {
	n     *Node
	addr  string
	wake  chan struct{} // 1-buffered: a secondary was queued
	slots chan struct{} // NodeOptions.ReplicateCalls-buffered: a call in flight holds one

	mu sync.Mutex
	// Guarded by mu (taken after an appender's mu, never before).
	ready   []*secondary // each at most once (secondary.listed)
	running bool

	rs         *replStream  // the open ReplicateStream (nil: none); used by the sender goroutine (run) only
	unaryUntil atomic.Int64 // Unix ns: until then the node gets ReplicateBatch calls (it had no ReplicateStream)

	rttMu sync.Mutex
	// Guarded by rttMu: the smoothed round trip of the link's batches and
	// its mean deviation (0: none answered yet), for timeout.
	srtt, rttvar time.Duration
}

// maxTimeoutFactor is NodeOptions.ReplicateTimeoutMax's default, times
// ReplicateTimeout: a secondary paused for longer is dropped (and rejoins
// after), whatever the round trips were.
const maxTimeoutFactor = 8

// timeout is how long a batch on the link may go unanswered before its
// secondaries are dropped: the smoothed round trip plus four mean
// deviations (TCP's retransmission timeout, RFC 6298), at least
// NodeOptions.ReplicateTimeout and at most ReplicateTimeoutMax.
func (l *link) timeout() time.Duration {
	floor := l.n.opts.ReplicateTimeout
	l.rttMu.Lock()
	rto := l.srtt + 4*l.rttvar
	l.rttMu.Unlock()
	return min(max(rto, floor), l.n.opts.ReplicateTimeoutMax)
}

// observeRTT folds one answered batch's round trip into the estimate.
func (l *link) observeRTT(r time.Duration) {
	l.rttMu.Lock()
	defer l.rttMu.Unlock()
	if l.srtt == 0 {
		l.srtt, l.rttvar = r, r/2
		return
	}
	d := l.srtt - r
	if d < 0 {
		d = -d
	}
	l.rttvar = (3*l.rttvar + d) / 4
	l.srtt = (7*l.srtt + r) / 8
}

// replStream is a link's ReplicateStream and the batches waiting on it.
type replStream struct {
	st     streampb.ExtentNode_ReplicateStreamClient
	cancel context.CancelFunc

	mu sync.Mutex
	// Guarded by mu.
	pending  map[uint64]chan replReply
	err      error // the stream failed: every batch after fails with it
	retiring bool  // the node asked to end it: no new batches; cancelled once none is pending
	nextID   uint64
}

// replReply is a batch's answer on a ReplicateStream.
type replReply struct {
	resp *streampb.ReplicateBatchResponse
	err  error
}

// linkForLocked returns the node's link to addr, creating it. The caller
// holds n.mu.
func (n *Node) linkForLocked(addr string) *link {
	l := n.links[addr]
	if l == nil {
		l = &link{n: n, addr: addr, wake: make(chan struct{}, 1), slots: make(chan struct{}, n.opts.ReplicateCalls)}
		n.links[addr] = l
	}
	return l
}

// queue lists s for the next batch, starting the sender if idle.
func (l *link) queue(s *secondary) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !s.listed {
		s.listed = true
		l.ready = append(l.ready, s)
	}
	if l.running {
		select {
		case l.wake <- struct{}{}:
		default:
		}
		return
	}
	l.running = true
	l.n.wg.Add(1)
	go l.run()
}

// take empties the ready list; with none ready it marks the sender
// stopped (under the same lock, so a later queue starts a new one).
func (l *link) take() []*secondary {
	l.mu.Lock()
	defer l.mu.Unlock()
	list := l.ready
	l.ready = nil
	for _, s := range list {
		s.listed = false
	}
	if len(list) == 0 {
		l.running = false
	}
	return list
}

// linkItem is one secondary's part of a batch.
type linkItem struct {
	s         *secondary
	keepalive bool // a commit notice the keepalive asked for
	k         int  // pending batches included
	off       int64
	data      []byte
	commit    int64
}

// run sends the link's queued work until there is none, in up to
// NodeOptions.ReplicateCalls calls at once: while they are all in flight, what queues
// meanwhile waits for one to end and goes as one larger batch. A batch
// with only commit lengths waits commitNotifyDelay first for data to carry
// them.
func (l *link) run() {
	defer l.n.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	waited := false
	for {
		slot := false
		select {
		case l.slots <- struct{}{}:
			slot = true
		case <-l.n.ctx.Done():
		}
		release := func() {
			if slot {
				<-l.slots
			}
		}
		list := l.take()
		if len(list) == 0 {
			release()
			return
		}
		if l.n.ctx.Err() != nil {
			release()
			continue // take drains; appenders fail their own appends
		}
		items, hasData := l.gather(list)
		if len(items) == 0 {
			release()
			continue
		}
		if !hasData && !waited {
			// Behind on commit points only: wait a moment for data, else
			// tell them.
			l.unsend(items)
			release()
			select {
			case <-l.wake:
			default:
			}
			timer.Reset(commitNotifyDelay)
			select {
			case <-l.wake:
			case <-timer.C:
			case <-l.n.ctx.Done():
			}
			timer.Stop() // Go ≥ 1.23: no stale tick is received after Stop
			waited = true
			continue
		}
		waited = false
		wait := l.begin(items)
		l.n.wg.Add(1)
		go func() {
			defer l.n.wg.Done()
			defer release()
			wait()
		}()
	}
}

// unsend lists the secondaries of items, which hold commit lengths only,
// again without waking the sender (which is the caller).
func (l *link) unsend(items []linkItem) {
	for _, it := range items {
		if it.keepalive {
			// Not sent after all: the next gather must still send it,
			// though the commit point did not move.
			a := it.s.a
			a.mu.Lock()
			it.s.keepalive = true
			a.mu.Unlock()
		}
		l.requeue(it.s)
	}
}

// requeue lists s again without waking the sender (which is the caller).
func (l *link) requeue(s *secondary) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !s.listed {
		s.listed = true
		l.ready = append(l.ready, s)
	}
}

// gather builds the items of one batch from list, up to maxReplicate
// bytes; a secondary whose data did not fit is queued again.
func (l *link) gather(list []*secondary) (items []linkItem, hasData bool) {
	budget := maxReplicate
	for _, s := range list {
		a := s.a
		a.mu.Lock()
		if s.failed != nil {
			a.mu.Unlock()
			continue
		}
		it := linkItem{s: s, commit: a.committed}
		if len(s.pending) > 0 && (budget > 0 || len(items) == 0) {
			it.off, it.data, it.k = s.pending[0].off, s.pending[0].raw, 1
			if len(it.data) < budget && len(s.pending) > 1 {
				it.data = append([]byte(nil), it.data...)
				for it.k < len(s.pending) && len(it.data)+len(s.pending[it.k].raw) <= budget {
					it.data = append(it.data, s.pending[it.k].raw...)
					it.k++
				}
			}
			// Off the queue now: the next call carries what follows
			// (queued counts it until it is delivered).
			clear(s.pending[:it.k])
			s.pending = s.pending[it.k:]
			budget -= len(it.data)
			hasData = true
			if len(s.pending) > 0 {
				l.requeue(s)
			}
		} else if len(s.pending) > 0 {
			l.requeue(s)
		}
		if it.k == 0 {
			if s.told >= it.commit && !s.keepalive {
				a.mu.Unlock()
				continue
			}
			it.off = s.acked
		}
		it.keepalive = s.keepalive && it.k == 0
		s.keepalive = false
		s.lastSent = time.Now()
		a.mu.Unlock()
		items = append(items, it)
	}
	return items, hasData
}

// begin sends the batch of items (on the link's stream, in the order
// batches were gathered) and returns the wait for its answer, which
// delivers each item's outcome to its appender; the sender goroutine
// calls it, and the wait runs on a goroutine of its own.
func (l *link) begin(items []linkItem) (wait func()) {
	req := &streampb.ReplicateBatchRequest{Items: make([]*streampb.ReplicateRequest, len(items))}
	for i, it := range items {
		req.Items[i] = &streampb.ReplicateRequest{Extent: it.s.a.ext.ID(), Offset: it.off, Data: it.data, CommitLength: it.commit}
	}
	var (
		rs *replStream
		ch chan replReply
	)
	sent := time.Now()
	if sent.UnixNano() >= l.unaryUntil.Load() {
		var err error
		if rs, ch, err = l.sendOnStream(req); err != nil && status.Code(err) != codes.Unimplemented {
			return func() { l.deliver(items, nil, err) }
		}
		// Unimplemented: ch is nil, and the wait makes the unary call.
	}
	return func() {
		var resp *streampb.ReplicateBatchResponse
		var err error
		if ch != nil {
			resp, err = l.awaitStream(rs, ch)
		}
		if ch == nil || status.Code(err) == codes.Unimplemented {
			// A node without ReplicateStream (an older version): the
			// unary call, for unaryRetry (it may be upgraded meanwhile).
			resp, err = l.callUnary(req)
		}
		if err == nil {
			l.observeRTT(time.Since(sent))
		}
		l.deliver(items, resp, err)
	}
}

// sendOnStream sends req on the link's stream (opening one if there is
// none, or if it failed) and returns the stream and the channel its answer
// comes on.
func (l *link) sendOnStream(req *streampb.ReplicateBatchRequest) (*replStream, chan replReply, error) {
	ch := make(chan replReply, 1)
	rs := l.rs
	if rs != nil && !rs.add(req, ch) {
		rs = nil // it failed (its batches have their answer) or retires
	}
	if rs == nil {
		c, err := l.n.conns.Node(l.addr)
		if err != nil {
			return nil, nil, err
		}
		// Opening waits for a connection to the node (one reconnecting,
		// or a peer that accepts and never answers): the replicate
		// timeout bounds it, as it bounds a call.
		ctx, cancel := context.WithCancel(l.n.ctx)
		t := time.AfterFunc(l.n.opts.ReplicateTimeout, cancel)
		st, err := c.ReplicateStream(ctx)
		if !t.Stop() && err == nil {
			err = status.Errorf(codes.DeadlineExceeded, "opening the replicate stream took longer than the replicate timeout (%v)", l.n.opts.ReplicateTimeout)
		}
		if err != nil {
			cancel()
			l.rs = nil
			return nil, nil, err
		}
		rs = &replStream{st: st, cancel: cancel, pending: map[uint64]chan replReply{}}
		l.rs = rs
		l.n.wg.Add(1)
		go l.receive(rs)
		if !rs.add(req, ch) {
			// It failed at once (its receiver saw the error first).
			rs.mu.Lock()
			err := rs.err
			rs.mu.Unlock()
			if err == nil {
				err = status.Error(codes.Unavailable, "the node ended the replicate stream at once")
			}
			return nil, nil, err
		}
	}
	if err := rs.st.Send(req); err != nil {
		// The stream broke (io.EOF: Recv has why) or refused the
		// message: it ends, and every batch on it fails.
		if !errors.Is(err, io.EOF) {
			rs.fail(err)
		}
		rs.cancel()
	}
	return rs, ch, nil
}

// add numbers req and lists ch to get its answer; false if rs failed.
func (rs *replStream) add(req *streampb.ReplicateBatchRequest, ch chan replReply) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.err != nil || rs.retiring {
		return false
	}
	rs.nextID++
	req.Id = rs.nextID
	rs.pending[req.Id] = ch
	return true
}

// receive hands out rs's answers until it ends, then fails the batches
// still waiting on it.
func (l *link) receive(rs *replStream) {
	defer l.n.wg.Done()
	defer rs.cancel()
	for {
		resp, err := rs.st.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = status.Error(codes.Unavailable, "the node ended the replicate stream")
			}
			rs.fail(err)
			return
		}
		rs.mu.Lock()
		var ch chan replReply
		if resp.Id == 0 {
			// The node shuts down: the batches in flight get their
			// answers, new ones go on a new stream (which it refuses).
			rs.retiring = true
		} else {
			ch = rs.pending[resp.Id]
			delete(rs.pending, resp.Id)
		}
		idle := rs.retiring && len(rs.pending) == 0
		rs.mu.Unlock()
		if ch != nil {
			ch <- replReply{resp: resp}
		}
		if idle {
			rs.cancel() // Recv ends the loop
		}
	}
}

// fail ends rs with err: every batch waiting on it gets err.
func (rs *replStream) fail(err error) {
	rs.mu.Lock()
	if rs.err == nil {
		rs.err = err
	}
	pending := rs.pending
	rs.pending = map[uint64]chan replReply{}
	err = rs.err
	rs.mu.Unlock()
	for _, ch := range pending {
		ch <- replReply{err: err}
	}
}

// awaitStream waits for a batch's answer on rs, up to the link's
// timeout. A node that does not answer in time is
// stalled: the stream ends (failing every batch on it, whose answers
// would be as late) and the next batch opens another.
//
// A timer that fires late by more than half the timeout says this node,
// not the secondary, was silent (stopped, as by SIGSTOP, or starved of
// CPU): every timer fires at once when it runs again, and dropping every
// secondary then would punish them for its own pause. The secondary gets
// one more timeout, from now, to answer (at most lateExtensions times).
func (l *link) awaitStream(rs *replStream, ch chan replReply) (*streampb.ReplicateBatchResponse, error) {
	timeout := l.timeout()
	now := l.n.opts.Now
	if now == nil {
		now = time.Now
	}
	deadline := now().Add(timeout)
	t := time.NewTimer(timeout)
	defer t.Stop()
	for extended := 0; ; extended++ {
		select {
		case r := <-ch:
			return r.resp, r.err
		case <-t.C:
		}
		if fired := now(); fired.Sub(deadline) > timeout/2 && extended < lateExtensions {
			l.n.stats.lateTimeouts.Add(1)
			deadline = fired.Add(timeout)
			t.Reset(timeout)
			continue
		}
		rs.fail(status.Errorf(codes.DeadlineExceeded, "no answer within the replicate timeout (%v)", timeout))
		rs.cancel()
		r := <-ch // fail answered it, unless its answer came first
		return r.resp, r.err
	}
}

// lateExtensions bounds the extra waits a batch gets for timers that fired
// late: a node starved for good still drops a silent secondary.
const lateExtensions = 2

// unaryRetry is how long a link to a node that had no ReplicateStream
// makes ReplicateBatch calls before it tries the stream again.
const unaryRetry = time.Minute

// callUnary sends req as one ReplicateBatch call.
func (l *link) callUnary(req *streampb.ReplicateBatchRequest) (*streampb.ReplicateBatchResponse, error) {
	l.unaryUntil.Store(time.Now().Add(unaryRetry).UnixNano())
	c, err := l.n.conns.Node(l.addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(l.n.ctx, l.timeout())
	defer cancel()
	return c.ReplicateBatch(ctx, req)
}

// deliver hands each item's outcome to its appender.
func (l *link) deliver(items []linkItem, resp *streampb.ReplicateBatchResponse, err error) {
	if err == nil && len(resp.Items) != len(items) {
		err = fmt.Errorf("%d results for %d items: %w", len(resp.Items), len(items), ErrBadRange)
	}
	if err != nil {
		err = fmt.Errorf("replicate to %s: %w", l.addr, fromStatus(err))
	}
	for i, it := range items {
		ierr := err
		var end int64
		if ierr == nil {
			r := resp.Items[i]
			if r.Code != 0 {
				ierr = fmt.Errorf("replicate extent %d to %s: %w", it.s.a.ext.ID(), l.addr, fromStatus(status.Error(codes.Code(r.Code), r.Message)))
			}
			end = r.CommitLength
		}
		it.s.a.delivered(it, end, ierr)
	}
}

// delivered records the outcome of one item of a batch.
func (a *appender) delivered(it linkItem, end int64, err error) {
	s := it.s
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		if it.k == 0 && errors.Is(err, ErrNoExtent) {
			// A commit notice to a replica not created yet (the
			// replicas of a new extent are created in parallel): it
			// hears the next one.
			return
		}
		a.dropLocked(s, err)
		return
	}
	if s.failed != nil {
		return
	}
	if it.k > 0 {
		s.queued -= int64(len(it.data))
		s.acked = max(s.acked, end)
	}
	s.told = max(s.told, it.commit)
	a.notifyLocked()
	if len(s.pending) > 0 || s.told < a.committed {
		a.kickLocked(s)
	}
}
