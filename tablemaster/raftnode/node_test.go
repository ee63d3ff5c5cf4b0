package raftnode

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tabuladb/tabula/engines/vfs"
	"go.uber.org/goleak"
)

// sumSM is a state machine for Node tests: it adds up uint64 entries. Safe
// for the test goroutine to read while the node applies.
type sumSM struct {
	mu           sync.Mutex
	sum, count   uint64
	last         uint64 // index of the last entry applied
	restoredFrom uint64 // index of the last snapshot restored
}

func (m *sumSM) Apply(index uint64, data []byte) any {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sum += binary.BigEndian.Uint64(data)
	m.count++
	m.last = index
	return m.sum
}

func (m *sumSM) Snapshot() ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, m.sum), m.count), m.last), nil
}

func (m *sumSM) Restore(data []byte) error {
	if len(data) != 24 {
		return fmt.Errorf("bad snapshot of %d bytes", len(data))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sum, m.count, m.last = binary.BigEndian.Uint64(data), binary.BigEndian.Uint64(data[8:]), binary.BigEndian.Uint64(data[16:])
	m.restoredFrom = m.last
	return nil
}

func (m *sumSM) restored() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.restoredFrom
}

func (m *sumSM) state() (sum, count uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sum, m.count
}

func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// checkLeaks checks, after every other cleanup, that the test left no
// goroutine behind.
func checkLeaks(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		<-tick.C
	}
}

func leaderOf(nodes map[uint64]*Node) *Node {
	for _, n := range nodes {
		if n != nil && n.Status().IsLeader {
			return n
		}
	}
	return nil
}

// memCluster runs Nodes over a Network whose virtual time a pump goroutine
// advances with the real clock.
type memCluster struct {
	net   *Network
	fss   map[uint64]*vfs.MemFS
	nodes map[uint64]*Node
	sms   map[uint64]*sumSM
	stop  chan struct{}
	done  chan struct{}
}

func newMemCluster(t *testing.T, members int) *memCluster {
	c := &memCluster{net: NewNetwork(1), fss: map[uint64]*vfs.MemFS{}, nodes: map[uint64]*Node{}, sms: map[uint64]*sumSM{}, stop: make(chan struct{}), done: make(chan struct{})}
	c.net.SetFaults(NetworkFaults{MaxDelay: time.Millisecond})
	go func() {
		defer close(c.done)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-c.stop:
				return
			case <-tick.C:
				c.net.Advance(time.Millisecond)
			}
		}
	}()
	peers := map[uint64]string{}
	for id := uint64(1); id <= uint64(members); id++ {
		peers[id] = fmt.Sprintf("mem-%d", id)
	}
	for id := range peers {
		c.start(t, id, peers)
	}
	t.Cleanup(c.close)
	return c
}

func (c *memCluster) start(t *testing.T, id uint64, peers map[uint64]string) {
	if c.fss[id] == nil {
		c.fss[id] = vfs.NewMem()
	}
	c.sms[id] = &sumSM{}
	n, err := Start(Options{
		ID: id, Dir: "/raft", FS: c.fss[id], StateMachine: c.sms[id], Transport: c.net.Endpoint(id), Peers: peers,
		TickInterval: 5 * time.Millisecond, SnapshotEvery: 10, KeepEntries: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	c.nodes[id] = n
}

func (c *memCluster) close() {
	for _, n := range c.nodes {
		if n != nil {
			_ = n.Close()
		}
	}
	close(c.stop)
	<-c.done
}

func TestNodeProposeReadAndMembership(t *testing.T) {
	checkLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := newMemCluster(t, 3)
	waitFor(t, 5*time.Second, "a leader", func() bool { return leaderOf(c.nodes) != nil })
	l := leaderOf(c.nodes)
	for i := uint64(1); i <= 25; i++ {
		_, res, err := l.Propose(ctx, u64(i))
		if err != nil {
			t.Fatal(err)
		}
		if res.(uint64) != i*(i+1)/2 {
			t.Fatalf("result %v after %d", res, i)
		}
	}
	for id, n := range c.nodes {
		if n == l {
			continue
		}
		_, _, err := n.Propose(ctx, u64(1))
		var nl *NotLeaderError
		if !errors.As(err, &nl) || nl.LeaderID != l.Status().ID || nl.LeaderAddr != fmt.Sprintf("mem-%d", nl.LeaderID) {
			t.Fatalf("propose on follower %d: %v, want NotLeaderError naming %d", id, err, l.Status().ID)
		}
		if err := n.ReadIndex(ctx); err != nil {
			t.Fatal(err)
		}
		if sum, _ := c.sms[id].state(); sum != 325 {
			t.Fatalf("follower %d read sum %d after ReadIndex, want 325", id, sum)
		}
	}

	// A new member joins as a learner, catches up (by snapshot: the log
	// was compacted) and is promoted; then a founder is removed.
	if err := l.PromoteLearner(ctx, 4); !errors.Is(err, ErrUnknownMember) {
		t.Fatalf("promote of a non-member: %v", err)
	}
	c.start(t, 4, nil)
	if err := l.AddLearner(ctx, 4, "mem-4"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the learner to catch up", func() bool {
		err := l.PromoteLearner(ctx, 4)
		if err != nil && !errors.Is(err, ErrNotCaughtUp) {
			t.Fatal(err)
		}
		return err == nil
	})
	if c.sms[4].restored() == 0 {
		fi, _ := l.storage.FirstIndex()
		t.Fatalf("the new member caught up without a snapshot; the leader's log starts at %d", fi)
	}
	lid := l.Status().ID
	victim := uint64(1)
	if victim == lid {
		victim = 2
	}
	if err := l.RemoveMember(ctx, victim); err != nil {
		t.Fatal(err)
	}
	st := l.Status()
	want := map[uint64]bool{}
	for _, m := range st.Members {
		if m.Learner {
			t.Fatalf("member %d still a learner: %+v", m.ID, st.Members)
		}
		want[m.ID] = true
	}
	if len(want) != 3 || want[victim] || !want[4] {
		t.Fatalf("members %+v after removing %d", st.Members, victim)
	}
	waitFor(t, 5*time.Second, "the removed member to notice", func() bool { return c.nodes[victim].Status().Removed })

	// Leadership moves to the new member on request.
	if err := l.TransferLeadership(ctx, 4); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "member 4 to lead", func() bool { return c.nodes[4].Status().IsLeader })
	if _, _, err := c.nodes[4].Propose(ctx, u64(1000)); err != nil {
		t.Fatal(err)
	}
	if err := c.nodes[lid].ReadIndex(ctx); err != nil {
		t.Fatal(err)
	}
	if sum, _ := c.sms[lid].state(); sum != 1325 {
		t.Fatalf("old leader reads %d, want 1325", sum)
	}
}

func TestNodeRestartRecoversState(t *testing.T) {
	checkLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := newMemCluster(t, 3)
	waitFor(t, 5*time.Second, "a leader", func() bool { return leaderOf(c.nodes) != nil })
	for i := uint64(1); i <= 37; i++ {
		if _, _, err := leaderOf(c.nodes).Propose(ctx, u64(i)); err != nil {
			t.Fatal(err)
		}
	}
	// Crash every member at once (power loss: unsynced bytes go), restart.
	for id, n := range c.nodes {
		_ = n.Close()
		c.fss[id].Crash()
	}
	for id := range c.nodes {
		c.start(t, id, nil)
	}
	waitFor(t, 5*time.Second, "a leader after restart", func() bool { return leaderOf(c.nodes) != nil })
	if err := leaderOf(c.nodes).ReadIndex(ctx); err != nil {
		t.Fatal(err)
	}
	if sum, count := c.sms[leaderOf(c.nodes).Status().ID].state(); sum != 37*38/2 || count != 37 {
		t.Fatalf("after restart: sum %d of %d entries, want %d of 37", sum, count, 37*38/2)
	}
}

func TestNodeClosedCalls(t *testing.T) {
	checkLeaks(t)
	c := newMemCluster(t, 1)
	n := c.nodes[1]
	waitFor(t, 5*time.Second, "the single member to lead", func() bool { return n.Status().IsLeader })
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := n.Propose(context.Background(), u64(1)); !errors.Is(err, ErrStopped) {
		t.Fatalf("propose after close: %v", err)
	}
}
