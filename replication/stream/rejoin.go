package stream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tabuladb/tabula/replication/stream/streampb"
)

// A secondary dropped from an extent's ack set (a Replicate that failed
// or timed out: a paused process, a slow disk, a restart) is brought back
// by the primary, as raft's leader probes a follower and then replicates
// what it lacks: a rejoiner, one goroutine per dropped secondary, asks the
// secondary's node for its replica's length (a data-less Replicate, which
// also tells it the commit point), sends what lies between that length and
// the data the appender has handed to its secondaries (read back from the
// primary's own replica, whole entries, rejoinChunk at a time), and once
// the secondary holds exactly that, puts it back in the ack set under the
// appender's lock: every later batch is queued for it as for any other
// secondary, in offset order. It keeps trying, with backoff, while the
// secondary does not answer, and gives up when the extent is sealed,
// frozen or broken (the log moves to a new extent, which names its
// replicas afresh) or the secondary's replica is gone.
//
// The catch-up calls are unary ReplicateBatch calls of their own, not on
// the link's stream: they wait for their answers before the secondary
// rejoins, so nothing the link sends after it can overtake them.

const (
	// rejoinFirstWait is the wait before the first probe of a dropped
	// secondary; it doubles up to rejoinMaxWait while the secondary does
	// not answer. A secondary that answers again is probed within
	// rejoinMaxWait.
	rejoinFirstWait = 20 * time.Millisecond
	rejoinMaxWait   = 500 * time.Millisecond
	// rejoinCallTimeout bounds one catch-up call: generous, since nothing
	// waits on it (the secondary is out of the ack set meanwhile).
	rejoinCallTimeout = 2 * time.Second
	// rejoinChunk is how many bytes one catch-up call carries at most
	// (an entry larger than that goes alone).
	rejoinChunk = 1 << 20
)

// startRejoinLocked starts bringing dropped secondary s back into the ack
// set, unless that is under way. The caller holds a.mu.
func (a *appender) startRejoinLocked(s *secondary) {
	if s.rejoining || a.n.ctx.Err() != nil || a.n.opts.NoRejoin {
		return
	}
	s.rejoining = true
	a.n.wg.Add(1)
	go a.rejoin(s)
}

// rejoin runs the rejoiner of s until s is back in the ack set, or can no
// longer be brought back.
func (a *appender) rejoin(s *secondary) {
	defer a.n.wg.Done()
	wait := rejoinFirstWait
	timer := time.NewTimer(wait)
	defer timer.Stop()
	var lastErr error
	for {
		select {
		case <-a.n.ctx.Done():
			a.endRejoin(s)
			return
		case <-timer.C:
		}
		back, err := a.rejoinOnce(s)
		switch {
		case back:
			return
		case errors.Is(err, errRejoinOver):
			a.n.log.Info("secondary not brought back to the ack set", "extent", a.ext.ID(), "node", s.ref.Node, "err", err)
			a.endRejoin(s)
			return
		case err != nil && (lastErr == nil || err.Error() != lastErr.Error()):
			a.n.log.Debug("bringing a secondary back to the ack set; retrying", "extent", a.ext.ID(), "node", s.ref.Node, "err", err)
		}
		lastErr = err
		wait = min(wait*2, rejoinMaxWait)
		timer.Reset(wait)
	}
}

// errRejoinOver: the secondary cannot be brought back into this extent's
// ack set (the extent no longer takes appends, or its replica there is
// gone).
var errRejoinOver = errors.New("stream: rejoin over")

// endRejoin records that s's rejoiner stopped with s still dropped.
func (a *appender) endRejoin(s *secondary) {
	a.mu.Lock()
	s.rejoining, s.answering = false, false
	a.mu.Unlock()
}

// rejoinOnce probes s and sends it what it lacks; true once it is back in
// the ack set.
func (a *appender) rejoinOnce(s *secondary) (bool, error) {
	if err := a.rejoinable(); err != nil {
		return false, err
	}
	a.mu.Lock()
	committed := a.committed
	a.mu.Unlock()
	pos, err := a.rejoinCall(s, &streampb.ReplicateRequest{Extent: a.ext.ID(), CommitLength: committed})
	a.mu.Lock()
	s.answering = err == nil
	a.mu.Unlock()
	if err != nil {
		return false, err
	}
	for stalls := 0; ; {
		a.mu.Lock()
		if err := a.rejoinableLocked(); err != nil {
			a.mu.Unlock()
			return false, err
		}
		target, committed := a.handedOut, a.committed
		if pos == target {
			a.rejoinedLocked(s, pos)
			a.mu.Unlock()
			return true, nil
		}
		a.mu.Unlock()
		if pos > target {
			// Its replica holds more than this primary handed out: not
			// data of this primary's (a replica from another life of the
			// extent). It cannot rejoin; the seal sorts the replicas out.
			return false, fmt.Errorf("secondary %s holds %d bytes of extent %d, more than the %d its primary sent: %w", s.ref.Node, pos, a.ext.ID(), target, errRejoinOver)
		}
		raw, err := a.entriesFrom(pos, target)
		if err != nil {
			return false, err
		}
		if len(raw) == 0 {
			// Handed out but not yet durable here: a sync away.
			if stalls++; stalls > 1000 {
				return false, fmt.Errorf("extent %d: bytes %d-%d handed out are not durable after a second", a.ext.ID(), pos, target)
			}
			select {
			case <-time.After(time.Millisecond):
			case <-a.n.ctx.Done():
				return false, ErrClosed
			}
			continue
		}
		stalls = 0
		end, err := a.rejoinCall(s, &streampb.ReplicateRequest{Extent: a.ext.ID(), Offset: pos, Data: raw, CommitLength: committed})
		if err != nil {
			return false, err
		}
		a.mu.Lock()
		s.acked = max(s.acked, end)
		a.mu.Unlock()
		a.n.stats.rejoinBytes.Add(uint64(len(raw)))
		pos = end
	}
}

// rejoinable says whether a dropped secondary can still rejoin the extent.
func (a *appender) rejoinable() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.rejoinableLocked()
}

func (a *appender) rejoinableLocked() error {
	if a.err != nil {
		return fmt.Errorf("extent %d: an append failed (%v): %w", a.ext.ID(), a.err, errRejoinOver)
	}
	if info := a.ext.Info(); info.Sealed || info.Frozen || info.Broken {
		return fmt.Errorf("extent %d is sealed or being sealed: %w", a.ext.ID(), errRejoinOver)
	}
	if a.n.ctx.Err() != nil {
		return ErrClosed
	}
	return nil
}

// rejoinedLocked puts s back in the ack set, holding pos bytes: exactly
// what the appender handed out, so the next batch is queued for it at
// its length. The caller holds a.mu.
func (a *appender) rejoinedLocked(s *secondary, pos int64) {
	out := time.Since(s.since)
	s.failed = nil
	s.rejoining, s.answering = false, false
	s.since = time.Now()
	s.pending, s.queued = nil, 0
	s.acked = max(s.acked, pos)
	a.n.stats.rejoins.Add(1)
	a.n.log.Info("secondary back in the ack set", "extent", a.ext.ID(), "node", s.ref.Node, "out", out.Round(time.Millisecond), "length", pos)
	a.notifyLocked()
	if s.told < a.committed {
		a.kickLocked(s)
	}
}

// rejoinCall sends one catch-up item to s's node and returns the length
// of its replica after it.
func (a *appender) rejoinCall(s *secondary, item *streampb.ReplicateRequest) (int64, error) {
	c, err := a.n.conns.Node(s.ref.Addr)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(a.n.ctx, rejoinCallTimeout)
	defer cancel()
	resp, err := c.ReplicateBatch(ctx, &streampb.ReplicateBatchRequest{Items: []*streampb.ReplicateRequest{item}})
	if err != nil {
		return 0, fmt.Errorf("probe %s: %w", s.ref.Addr, fromStatus(err))
	}
	if len(resp.Items) != 1 {
		return 0, fmt.Errorf("probe %s: %d results for 1 item: %w", s.ref.Addr, len(resp.Items), ErrBadRange)
	}
	r := resp.Items[0]
	if r.Code != 0 {
		err := fromStatus(status.Error(codes.Code(r.Code), r.Message))
		if errors.Is(err, ErrSealed) || errors.Is(err, ErrFrozen) || errors.Is(err, ErrBroken) || errors.Is(err, ErrRole) {
			err = fmt.Errorf("%w: %w", err, errRejoinOver)
		}
		return 0, fmt.Errorf("replicate extent %d to %s: %w", a.ext.ID(), s.ref.Addr, err)
	}
	return r.CommitLength, nil
}

// entriesFrom reads the primary's replica from pos towards to: whole
// entries, about rejoinChunk bytes (an entry larger goes alone), durable
// ones only (none yet: no data).
func (a *appender) entriesFrom(pos, to int64) ([]byte, error) {
	for limit := int64(rejoinChunk); ; limit = MaxAppendBytes + MaxAppendBytes/8 {
		raw, _, _, err := a.ext.Read(pos, min(limit, to-pos))
		if err != nil {
			return nil, fmt.Errorf("read extent %d at %d to catch a secondary up: %w", a.ext.ID(), pos, err)
		}
		cut := entryEnd(raw, a.ext.ID(), pos)
		if cut > 0 || len(raw) == 0 || limit > rejoinChunk {
			return raw[:cut], nil
		}
		// One entry larger than the chunk: read it whole.
	}
}

// entryEnd is how many bytes of raw, blocks read at off, end at an entry
// boundary.
func entryEnd(raw []byte, extent uint64, off int64) int {
	cut := 0
	_ = DecodeBlocks(raw, extent, off, func(o int64, _ uint64, cont bool, p []byte) error {
		if !cont {
			cut = int(o-off) + int(blockSize(len(p)))
		}
		return nil
	})
	return cut
}
