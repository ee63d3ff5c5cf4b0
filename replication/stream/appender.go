package stream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tabuladb/tabula/replication/stream/streampb"
)

// The primary's side of an extent (see the package comment, "Appends"):
// an appender orders the appends and group-commits them, one batch at a
// time: it writes the batch locally, hands it to one sender per secondary,
// syncs, and acknowledges the batch once it is durable locally and on as
// many secondaries as the ack policy requires. Each sender replicates its
// secondary's queue in order, one Replicate in flight, so a slow
// secondary delays only itself: under AckQuorum the appender goes on
// without it, and once its queue passes MaxReplicaLag (or a Replicate
// fails) it is dropped from the ack set for good. Acknowledgements are in
// offset order because batches are.

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
	queue     []*appendReq
	running   bool
	secs      []*secondary
	committed int64         // acknowledged length
	changed   chan struct{} // closed and replaced when a secondary's state changes
}

// secondary is an appender's view of one secondary.
type secondary struct {
	ref  ReplicaRef
	wake chan struct{} // 1-buffered: data was queued

	// Guarded by the appender's mu.
	pending []pendingRep
	queued  int64 // bytes in pending
	acked   int64 // the length it reported durable
	told    int64 // the commit length last sent to it
	failed  error // not nil: dropped from the ack set
	running bool
}

type pendingRep struct {
	off int64
	raw []byte
}

func newAppender(n *Node, ext *Extent) *appender {
	cfg := ext.Config()
	a := &appender{n: n, ext: ext, required: cfg.Ack.Required(1 + len(cfg.Secondaries)), changed: make(chan struct{})}
	length := ext.Length()
	a.committed = ext.CommittedLength()
	for _, r := range cfg.Secondaries {
		a.secs = append(a.secs, &secondary{ref: r, wake: make(chan struct{}, 1), acked: length})
	}
	return a
}

// notifyLocked wakes the appender waiting for acknowledgements.
func (a *appender) notifyLocked() {
	close(a.changed)
	a.changed = make(chan struct{})
}

// kickLocked makes s's sender run: it starts one, or wakes the running one.
func (a *appender) kickLocked(s *secondary) {
	if s.failed != nil {
		return
	}
	if s.running {
		select {
		case s.wake <- struct{}{}:
		default:
		}
		return
	}
	s.running = true
	a.n.wg.Add(1)
	go a.runSender(s)
}

// dropLocked drops s from the ack set.
func (a *appender) dropLocked(s *secondary, err error) {
	if s.failed != nil {
		return
	}
	s.failed = err
	s.pending, s.queued = nil, 0
	a.n.log.Warn("secondary dropped from the ack set", "extent", a.ext.ID(), "node", s.ref.Node, "err", err)
	a.notifyLocked()
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
		a.mu.Unlock()
		a.commit(batch)
	}
}

// commit appends one batch locally, hands it to the senders, syncs, waits
// for enough secondaries and completes the batch's requests.
func (a *appender) commit(batch []*appendReq) {
	var entries []EntryData
	for _, r := range batch {
		entries = append(entries, r.entries...)
	}
	fail := func(err error) {
		for _, r := range batch {
			r.done <- appendResult{err: err}
		}
	}
	if a.n.ctx.Err() != nil {
		fail(ErrClosed)
		return
	}
	ext := a.ext
	locs, start, raw, err := ext.AppendEntries(entries)
	if err != nil {
		fail(err)
		return
	}
	end := start + int64(len(raw))
	a.mu.Lock()
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
	a.mu.Unlock()
	if err := ext.Sync(); err != nil {
		fail(err)
		return
	}
	a.mu.Lock()
	for {
		have, live := 1, 1
		for _, s := range a.secs {
			if s.failed == nil {
				live++
				if s.acked >= end {
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
			fail(err)
			return
		}
		ch := a.changed
		a.mu.Unlock()
		select {
		case <-ch:
		case <-a.n.ctx.Done():
			fail(ErrClosed)
			return
		}
		a.mu.Lock()
	}
	a.committed = end
	ext.setCommitted(end)
	dropped := a.droppedLocked()
	for _, s := range a.secs {
		if s.told < end {
			a.kickLocked(s)
		}
	}
	a.mu.Unlock()
	i := 0
	for _, r := range batch {
		r.done <- appendResult{locs: locs[i : i+len(r.entries)], end: end, dropped: dropped}
		i += len(r.entries)
	}
}

// maxReplicate is how many bytes one Replicate of queued batches carries
// at most (a single larger batch goes alone).
const maxReplicate = 4 << 20

// runSender replicates s's queue in order, and tells s the commit length
// once it fell behind and nothing more came within commitNotifyDelay.
func (a *appender) runSender(s *secondary) {
	defer a.n.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	a.mu.Lock()
	defer a.mu.Unlock()
	for {
		if s.failed != nil || a.n.ctx.Err() != nil {
			s.running = false
			return
		}
		if len(s.pending) > 0 {
			off := s.pending[0].off
			data := s.pending[0].raw
			k := 1
			if len(data) < maxReplicate && len(s.pending) > 1 {
				data = append([]byte(nil), data...)
				for k < len(s.pending) && len(data)+len(s.pending[k].raw) <= maxReplicate {
					data = append(data, s.pending[k].raw...)
					k++
				}
			}
			commit := a.committed
			a.mu.Unlock()
			end, err := a.n.replicate(a.ext.ID(), s.ref.Addr, off, data, commit)
			a.mu.Lock()
			if err != nil {
				a.dropLocked(s, err)
				continue
			}
			if s.failed != nil {
				continue
			}
			clear(s.pending[:k])
			s.pending = s.pending[k:]
			s.queued -= int64(len(data))
			s.acked = max(s.acked, end)
			s.told = max(s.told, commit)
			a.notifyLocked()
			continue
		}
		if s.told >= a.committed {
			s.running = false
			return
		}
		// Behind on the commit point with nothing to send: wait a moment
		// for more data (which carries the commit length), else tell it.
		select {
		case <-s.wake:
		default:
		}
		a.mu.Unlock()
		timer.Reset(commitNotifyDelay)
		woke := false
		select {
		case <-s.wake:
			woke = true
		case <-timer.C:
		case <-a.n.ctx.Done():
		}
		timer.Stop() // Go ≥ 1.23: no stale tick is received after Stop
		a.mu.Lock()
		if woke || len(s.pending) > 0 || s.failed != nil || a.n.ctx.Err() != nil {
			continue
		}
		commit, off := a.committed, s.acked
		a.mu.Unlock()
		_, err := a.n.replicate(a.ext.ID(), s.ref.Addr, off, nil, commit)
		a.mu.Lock()
		if err != nil {
			a.dropLocked(s, err)
			continue
		}
		s.told = max(s.told, commit)
	}
}

// replicate sends one Replicate (data, or only the commit length) to the
// secondary at addr and returns the length it reports durable.
func (n *Node) replicate(extent uint64, addr string, off int64, raw []byte, commit int64) (int64, error) {
	c, err := n.conns.Node(addr)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(n.ctx, n.opts.ReplicateTimeout)
	defer cancel()
	resp, err := c.Replicate(ctx, &streampb.ReplicateRequest{Extent: extent, Offset: off, Data: raw, CommitLength: commit})
	if err != nil {
		return 0, fmt.Errorf("replicate to %s: %w", addr, fromStatus(err))
	}
	return resp.CommitLength, nil
}
