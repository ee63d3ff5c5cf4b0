package raftnode

import (
	"container/heap"
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// NetworkFaults are the faults a Network applies to every message.
type NetworkFaults struct {
	// DropRate is the probability that a message is lost.
	DropRate float64
	// MinDelay and MaxDelay bound a message's delay, drawn uniformly;
	// different delays reorder messages.
	MinDelay, MaxDelay time.Duration
}

// Network is an in-memory network between members, for tests. It runs on
// virtual time: Send queues a message with a delivery time drawn from a
// seeded source, and Advance delivers, in order, the messages that are due.
// Given the same seed and the same calls, it drops, delays and reorders
// the same messages. Links can be cut (Partition, Cut) and healed. A
// MsgSnap ends with a ReportSnapshot to its sender, delivered as a message
// is, never from inside Send.
//
// Network is safe for concurrent use. Handlers are called from Advance's
// goroutine, without the network's lock held.
type Network struct {
	mu       sync.Mutex
	rng      *rand.Rand
	faults   NetworkFaults
	now      time.Duration
	seq      uint64
	queue    flightQueue
	handlers map[uint64]Handler
	cut      map[[2]uint64]bool
	sent     uint64
	dropped  uint64
}

// NewNetwork returns a network with no faults, drawing from seed.
func NewNetwork(seed uint64) *Network {
	return &Network{
		rng:      rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		handlers: map[uint64]Handler{},
		cut:      map[[2]uint64]bool{},
	}
}

// SetFaults replaces the faults applied to messages sent from now on.
func (n *Network) SetFaults(f NetworkFaults) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.faults = f
}

// Endpoint returns member id's Transport on the network.
func (n *Network) Endpoint(id uint64) Transport { return endpoint{n, id} }

// Cut cuts the link between a and b, both ways: messages on it are lost,
// those in flight included.
func (n *Network) Cut(a, b uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut[[2]uint64{a, b}], n.cut[[2]uint64{b, a}] = true, true
}

// Partition cuts every link between members of different groups.
func (n *Network) Partition(groups ...[]uint64) {
	for i, g := range groups {
		for _, h := range groups[i+1:] {
			for _, a := range g {
				for _, b := range h {
					n.Cut(a, b)
				}
			}
		}
	}
}

// Heal restores every link.
func (n *Network) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.cut)
}

// Now is the network's virtual time.
func (n *Network) Now() time.Duration {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.now
}

// Stats returns how many messages were sent and how many lost.
func (n *Network) Stats() (sent, dropped uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.sent, n.dropped
}

// Advance moves virtual time forward by d, delivering every message due
// by then in delivery order. It returns how many it delivered.
func (n *Network) Advance(d time.Duration) int {
	n.mu.Lock()
	until := n.now + d
	n.mu.Unlock()
	delivered := 0
	for {
		n.mu.Lock()
		if len(n.queue) == 0 || n.queue[0].at > until {
			n.now = until
			n.mu.Unlock()
			return delivered
		}
		f := heap.Pop(&n.queue).(*flight)
		n.now = f.at
		lost := n.cut[[2]uint64{f.from, f.to}] && !f.report
		h := n.handlers[f.to]
		if lost {
			n.dropped++
		}
		n.mu.Unlock()
		switch {
		case f.report:
			if h != nil {
				h.ReportSnapshot(f.m.To, f.failed)
			}
		case lost || h == nil:
			if f.m.Type == raftpb.MsgSnap {
				n.report(f.m, true)
			}
		default:
			delivered++
			if err := h.Step(context.Background(), f.m); err != nil && f.m.Type == raftpb.MsgSnap {
				n.report(f.m, true)
			} else if f.m.Type == raftpb.MsgSnap {
				n.report(f.m, false)
			}
		}
	}
}

// report queues the outcome of snapshot message m to its sender.
func (n *Network) report(m raftpb.Message, failed bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.pushLocked(&flight{from: m.To, to: m.From, m: raftpb.Message{From: m.From, To: m.To}, report: true, failed: failed}, n.faults.MinDelay)
}

func (n *Network) pushLocked(f *flight, delay time.Duration) {
	n.seq++
	f.at, f.seq = n.now+delay, n.seq
	heap.Push(&n.queue, f)
}

type endpoint struct {
	n  *Network
	id uint64
}

func (e endpoint) Attach(h Handler) {
	e.n.mu.Lock()
	defer e.n.mu.Unlock()
	if h == nil {
		delete(e.n.handlers, e.id)
	} else {
		e.n.handlers[e.id] = h
	}
}

func (e endpoint) Send(msgs []raftpb.Message) {
	n := e.n
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, m := range msgs {
		n.sent++
		f := n.faults
		if n.cut[[2]uint64{e.id, m.To}] || (f.DropRate > 0 && n.rng.Float64() < f.DropRate) {
			n.dropped++
			if m.Type == raftpb.MsgSnap {
				n.pushLocked(&flight{from: m.To, to: e.id, m: raftpb.Message{From: e.id, To: m.To}, report: true, failed: true}, f.MinDelay)
			}
			continue
		}
		delay := f.MinDelay
		if f.MaxDelay > f.MinDelay {
			delay += time.Duration(n.rng.Int64N(int64(f.MaxDelay - f.MinDelay)))
		}
		n.pushLocked(&flight{from: e.id, to: m.To, m: m}, delay)
	}
}

func (e endpoint) SetPeer(uint64, string) {}
func (e endpoint) RemovePeer(uint64)      {}

// flight is a message (or a snapshot report) in flight.
type flight struct {
	at       time.Duration
	seq      uint64
	from, to uint64
	m        raftpb.Message
	report   bool // a ReportSnapshot(m.To, failed) for m.From
	failed   bool
}

type flightQueue []*flight

func (q flightQueue) Len() int { return len(q) }
func (q flightQueue) Less(i, j int) bool {
	return q[i].at < q[j].at || (q[i].at == q[j].at && q[i].seq < q[j].seq)
}
func (q flightQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *flightQueue) Push(x any)   { *q = append(*q, x.(*flight)) }
func (q *flightQueue) Pop() any {
	old := *q
	f := old[len(old)-1]
	*q = old[:len(old)-1]
	return f
}
