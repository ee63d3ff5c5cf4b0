package testcluster

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"time"

	"github.com/tabuladb/tabula/tablemaster"
)

// member is one master of a raft group.
type member struct {
	id   uint64
	addr string
	dir  string
	m    *tablemaster.Master // nil while stopped; guarded by Cluster.mu
}

var errNotRunning = errors.New("testcluster: master is not running")

// startMembers starts Options.Masters raft masters. With a fixed
// MasterListen port P, member i+1 listens on P+i (a raft group records
// its members' addresses: a restart on the same directory needs the
// same ones); with port 0, on free ports.
func (c *Cluster) startMembers() error {
	peers := map[uint64]string{}
	host, port, err := net.SplitHostPort(c.opts.MasterListen)
	if err != nil {
		return fmt.Errorf("testcluster: master listen address %q: %w", c.opts.MasterListen, err)
	}
	base, _ := strconv.Atoi(port)
	for i := range c.opts.Masters {
		addr := net.JoinHostPort(host, "0")
		if base != 0 {
			addr = net.JoinHostPort(host, strconv.Itoa(base+i))
		}
		lis, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("testcluster: master %d listen: %w", i+1, err)
		}
		mb := &member{id: uint64(i + 1), addr: lis.Addr().String(), dir: filepath.Join(c.opts.Dir, fmt.Sprintf("master-%d", i+1))}
		lis.Close()
		peers[mb.id] = mb.addr
		c.members = append(c.members, mb)
	}
	for i := range c.members {
		if err := c.startMember(i, peers); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) startMember(i int, peers map[uint64]string) error {
	mb := c.members[i]
	mo := tablemaster.Options{
		DataDir:           mb.dir,
		Logger:            c.opts.Logger.With("part", fmt.Sprintf("master-%d", mb.id)),
		HeartbeatInterval: c.opts.HeartbeatInterval,
		LeaseDuration:     c.opts.LeaseDuration,
		DeadAfter:         c.opts.DeadAfter,
		ReplaceAfter:      c.opts.ReplaceAfter,
		RaftID:            mb.id,
		Peers:             peers,
		ClusterKey:        c.cred.Key,
	}
	if c.opts.MasterOptions != nil {
		c.opts.MasterOptions(&mo)
	}
	m, err := tablemaster.Open(mo)
	if err != nil {
		return fmt.Errorf("testcluster: open master %d: %w", mb.id, err)
	}
	var lis net.Listener
	for try := 0; ; try++ { // a restarted member's port may take a moment to free
		lis, err = net.Listen("tcp", mb.addr)
		if err == nil || try == 100 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return errors.Join(fmt.Errorf("testcluster: master %d listen: %w", mb.id, err), m.Close())
	}
	c.mu.Lock()
	mb.m = m
	c.mu.Unlock()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		if err := m.Serve(lis); err != nil {
			c.opts.Logger.Error("master stopped", "member", mb.id, "err", err)
		}
	}()
	return nil
}

// Masters is the number of masters (1 without raft).
func (c *Cluster) Masters() int { return max(1, len(c.members)) }

// Master returns master i (the only one without raft; raft member i+1
// with), or nil while it is stopped.
func (c *Cluster) Master(i int) *tablemaster.Master {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.members) == 0 {
		if i != 0 {
			return nil
		}
		return c.master
	}
	if i < 0 || i >= len(c.members) {
		return nil
	}
	return c.members[i].m
}

// KillMaster stops raft master i abruptly (a crash: what it acknowledged
// is in its raft log).
func (c *Cluster) KillMaster(i int) error {
	if i < 0 || i >= len(c.members) {
		return fmt.Errorf("testcluster: no raft master %d", i)
	}
	c.mu.Lock()
	m := c.members[i].m
	c.members[i].m = nil
	c.mu.Unlock()
	if m == nil {
		return errNotRunning
	}
	return m.Close()
}

// RestartMaster starts raft master i again on its data directory and
// address.
func (c *Cluster) RestartMaster(i int) error {
	if i < 0 || i >= len(c.members) {
		return fmt.Errorf("testcluster: no raft master %d", i)
	}
	c.mu.Lock()
	running := c.members[i].m != nil
	c.mu.Unlock()
	if running {
		return fmt.Errorf("testcluster: raft master %d is running", i)
	}
	peers := map[uint64]string{}
	for _, mb := range c.members {
		peers[mb.id] = mb.addr
	}
	return c.startMember(i, peers)
}

// Leader is the index of the raft master that leads, or -1 (none, or a
// single master).
func (c *Cluster) Leader() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, mb := range c.members {
		if mb.m != nil && mb.m.Leads() {
			return i
		}
	}
	return -1
}
