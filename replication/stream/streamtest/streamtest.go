package streamtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tabuladb/tabula/engines/vfs"
	"github.com/tabuladb/tabula/replication/stream"
	"github.com/tabuladb/tabula/replication/stream/streampb"
)

// Seed returns the seed of a randomised test, from TABULA_SEED if set, and
// logs it so a failure can be rerun.
func Seed(t testing.TB) uint64 {
	t.Helper()
	seed := rand.Uint64()
	if s := os.Getenv("TABULA_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("TABULA_SEED=%q is not a uint64: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (rerun with TABULA_SEED=%d)", seed, seed)
	return seed
}

// WaitFor polls cond until it holds or timeout passes, then fails the
// test naming what it waited for.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		<-tick.C
	}
}

// Options configure a Cluster; the zero value works.
type Options struct {
	// FaultDomains is how many fault domains the nodes are spread over,
	// round robin. Default: one per node.
	FaultDomains int
	// Node is the template of every node's options (FS and Dir are set by
	// the cluster; OnCorrupt reports to the driver).
	Node stream.NodeOptions
	// Driver configures the driver.
	Driver stream.DriverOptions
	// Manager configures the manager.
	Manager stream.ManagerOptions
	// Dir, if set, puts node i's store on the real file system in
	// Dir/en-i (vfs.Default) instead of a MemFS: for measurements with
	// real fsyncs. Node.FS is then nil.
	Dir string
}

// Node is one extent node process of a Cluster.
type Node struct {
	ID, Addr, FaultDomain string
	// FS is the node's file system (nil with Options.Dir).
	FS *vfs.MemFS

	mu sync.Mutex
	// Guarded by mu.
	node        *stream.Node
	srv         *grpc.Server
	done        chan struct{} // closed when Serve returns
	pausedUntil time.Time     // Replicate calls wait until then
	held        chan struct{} // not nil: Replicate calls wait until it is closed (HoldReplicate)
	noStream    bool          // ReplicateStream answers Unimplemented
	batches     []int         // extents with data in each batch received (ReplicateBatch or ReplicateStream)
	inBatch     int           // batches being handled now
	mostInBatch int           // the most at once so far
	holding     int           // calls and batches waiting on held now
}

// ReplicateBatches returns, for every ReplicateBatch the node received so
// far, how many extents it carried data for.
func (n *Node) ReplicateBatches() []int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]int(nil), n.batches...)
}

// Holding is how many Replicate calls and stream batches HoldReplicate
// holds now: a test waits for it before it acts on a batch being held
// (the primary sent it, and timed it, already).
func (n *Node) Holding() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.holding
}

// MostReplicateBatches is the most ReplicateBatch calls the node was
// handling at once so far (held by PauseReplicate included).
func (n *Node) MostReplicateBatches() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.mostInBatch
}

// PauseReplicate makes node's Replicate handler hold every call (those in
// flight at their next arrival, new ones) until d from now, or until the
// call's context ends: a secondary that is stopped (SIGSTOP) or stalled
// on its disk, as its primary sees it.
func (n *Node) PauseReplicate(d time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.pausedUntil = time.Now().Add(d)
}

// HoldReplicate makes node's Replicate handler hold every call, as
// PauseReplicate does, until release is called (idempotent): a pause
// whose end the test decides, not a clock.
func (n *Node) HoldReplicate() (release func()) {
	ch := make(chan struct{})
	n.mu.Lock()
	n.held = ch
	n.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			n.mu.Lock()
			if n.held == ch {
				n.held = nil
			}
			n.mu.Unlock()
			close(ch)
		})
	}
}

// RefuseReplicateStream makes the node answer ReplicateStream as a node of
// an older version would, Unimplemented: its primaries must replicate to
// it with ReplicateBatch calls.
func (n *Node) RefuseReplicateStream() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.noStream = true
}

// intercept holds Replicate and ReplicateBatch calls while the node is
// paused.
func (n *Node) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if b, ok := req.(*streampb.ReplicateBatchRequest); ok {
		n.batchIn(b)
		defer n.batchOut()
	}
	if strings.HasSuffix(info.FullMethod, "/Replicate") || strings.HasSuffix(info.FullMethod, "/ReplicateBatch") {
		if err := n.holdIfPaused(ctx); err != nil {
			return nil, err
		}
	}
	return handler(ctx, req)
}

// interceptStream does for the batches of a ReplicateStream what
// intercept does for ReplicateBatch calls: each is held at its arrival
// while the node is paused (holding the stream's later batches too, as a
// stopped process would), then counted until its answer.
func (n *Node) interceptStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if !strings.HasSuffix(info.FullMethod, "/ReplicateStream") {
		return handler(srv, ss)
	}
	n.mu.Lock()
	refuse := n.noStream
	n.mu.Unlock()
	if refuse {
		return status.Errorf(codes.Unimplemented, "unknown method %s", info.FullMethod)
	}
	return handler(srv, &heldStream{ServerStream: ss, n: n})
}

// heldStream is a ReplicateStream seen through interceptStream.
type heldStream struct {
	grpc.ServerStream
	n *Node
}

func (h *heldStream) RecvMsg(m any) error {
	if err := h.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if err := h.n.holdIfPaused(h.Context()); err != nil {
		return err // the batch is never handled: not counted
	}
	if b, ok := m.(*streampb.ReplicateBatchRequest); ok {
		h.n.batchIn(b)
	}
	return nil
}

func (h *heldStream) SendMsg(m any) error {
	if b, ok := m.(*streampb.ReplicateBatchResponse); ok && b.GetId() != 0 { // id 0 asks the primary to end the stream
		h.n.batchOut()
	}
	return h.ServerStream.SendMsg(m)
}

// batchIn counts a batch arriving; batchOut, its answer leaving.
func (n *Node) batchIn(b *streampb.ReplicateBatchRequest) {
	k := 0
	for _, it := range b.Items {
		if len(it.Data) > 0 {
			k++
		}
	}
	n.mu.Lock()
	n.batches = append(n.batches, k)
	n.inBatch++
	n.mostInBatch = max(n.mostInBatch, n.inBatch)
	n.mu.Unlock()
}

func (n *Node) batchOut() {
	n.mu.Lock()
	n.inBatch--
	n.mu.Unlock()
}

// holdIfPaused waits out the node's pause and hold, or until ctx ends.
func (n *Node) holdIfPaused(ctx context.Context) error {
	n.mu.Lock()
	wait := time.Until(n.pausedUntil)
	held := n.held
	if held != nil {
		n.holding++
	}
	n.mu.Unlock()
	if held != nil {
		var err error
		select {
		case <-held:
		case <-ctx.Done():
			err = ctx.Err()
		}
		n.mu.Lock()
		n.holding--
		n.mu.Unlock()
		if err != nil {
			return err
		}
	}
	if wait <= 0 {
		return nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Node returns the running extent node, or nil if stopped.
func (n *Node) Node() *stream.Node {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.node
}

// Cluster is a stream-layer cluster in the test process.
type Cluster struct {
	t      testing.TB
	opts   Options
	Nodes  []*Node
	Log    *stream.LocalLog
	Driver *stream.Driver
}

// Start starts n extent nodes and registers them with a new manager.
func Start(t testing.TB, n int, opts Options) *Cluster {
	t.Helper()
	if opts.FaultDomains <= 0 {
		opts.FaultDomains = n
	}
	c := &Cluster{t: t, opts: opts, Log: stream.NewLocalLog(stream.NewManager(opts.Manager))}
	c.Driver = stream.NewDriver(c.Log, opts.Driver)
	for i := range n {
		nd := &Node{ID: fmt.Sprintf("en-%d", i), FaultDomain: fmt.Sprintf("fd-%d", i%opts.FaultDomains)}
		if opts.Dir == "" {
			nd.FS = vfs.NewMem()
		}
		c.Nodes = append(c.Nodes, nd)
		if err := c.startNode(nd, "127.0.0.1:0"); err != nil {
			c.Close()
			t.Fatal(err)
		}
		if _, err := c.Driver.Apply(context.Background(), stream.Command{Op: stream.OpAddNode, Node: nd.ID, Addr: nd.Addr, FaultDomain: nd.FaultDomain}); err != nil {
			c.Close()
			t.Fatal(err)
		}
	}
	return c
}

func (c *Cluster) startNode(nd *Node, addr string) error {
	o := c.opts.Node
	o.FS, o.Dir = nd.FS, "/extents"
	if c.opts.Dir != "" {
		o.FS, o.Dir = vfs.Default, filepath.Join(c.opts.Dir, nd.ID)
	}
	id := nd.ID
	o.OnCorrupt = func(extent uint64, _ error) {
		// Best effort, as a heartbeat would carry it.
		_ = c.Driver.ReportCorrupt(context.Background(), extent, id)
	}
	o.OnCorruptFragment = func(extent uint64, index int, _ error) {
		_ = c.Driver.ReportCorruptFragment(context.Background(), extent, index, id)
	}
	node, err := stream.OpenNode(o)
	if err != nil {
		return fmt.Errorf("open node %s: %w", nd.ID, err)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return errors.Join(fmt.Errorf("listen for node %s: %w", nd.ID, err), node.Close())
	}
	srv := grpc.NewServer(append(stream.ServerOptions(), grpc.UnaryInterceptor(nd.intercept), grpc.StreamInterceptor(nd.interceptStream))...)
	node.Register(srv)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	nd.mu.Lock()
	nd.node, nd.srv, nd.done, nd.Addr = node, srv, done, lis.Addr().String()
	nd.mu.Unlock()
	return nil
}

// detach takes node i's running node and server (nil if stopped) and
// marks it stopped; the caller shuts them down.
func (c *Cluster) detach(i int) (nd *Node, node *stream.Node, srv *grpc.Server, done chan struct{}) {
	nd = c.Nodes[i]
	nd.mu.Lock()
	defer nd.mu.Unlock()
	node, srv, done = nd.node, nd.srv, nd.done
	nd.node, nd.srv = nil, nil
	return nd, node, srv, done
}

// Stop kills node i's process: its server stops at once (connections
// drop, calls in flight fail) and the node closes. Its FS stays, with
// what was written; Crash it to drop what was not synced.
func (c *Cluster) Stop(i int) {
	nd, node, srv, done := c.detach(i)
	if srv == nil {
		return
	}
	srv.Stop()
	<-done
	if err := node.Close(); err != nil {
		c.t.Logf("close node %s: %v", nd.ID, err)
	}
}

// Drain shuts node i down as a draining server does: it ends the
// replication streams into it (stream.Node.StopReplicateStreams), then
// stops its gRPC server gracefully (calls in flight finish), then closes
// the node. It reports how long the graceful stop took, and fails if it
// took longer than timeout (the server is then stopped at once).
func (c *Cluster) Drain(i int, timeout time.Duration) (time.Duration, error) {
	nd, node, srv, done := c.detach(i)
	if srv == nil {
		return 0, fmt.Errorf("node %s is not running", nd.ID)
	}
	node.StopReplicateStreams()
	start := time.Now()
	stopped := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(stopped)
	}()
	var err error
	select {
	case <-stopped:
	case <-time.After(timeout):
		err = fmt.Errorf("node %s: the graceful stop took longer than %v", nd.ID, timeout)
		srv.Stop()
		<-stopped
	}
	took := time.Since(start)
	<-done
	if cerr := node.Close(); cerr != nil {
		c.t.Logf("close node %s: %v", nd.ID, cerr)
	}
	return took, err
}

// Restart starts node i again on its FS, at its old address if free.
func (c *Cluster) Restart(i int) error {
	nd := c.Nodes[i]
	if nd.Node() != nil {
		return fmt.Errorf("node %s is running", nd.ID)
	}
	return c.startNode(nd, nd.Addr)
}

// Index returns the index of the node with id, or -1.
func (c *Cluster) Index(id string) int {
	for i, nd := range c.Nodes {
		if nd.ID == id {
			return i
		}
	}
	return -1
}

// Manager calls fn with the manager's state.
func (c *Cluster) Manager(fn func(m *stream.Manager)) { c.Log.View(fn) }

// Close stops every node and the driver.
func (c *Cluster) Close() {
	for i := range c.Nodes {
		c.Stop(i)
	}
	if err := c.Driver.Close(); err != nil {
		c.t.Logf("close driver: %v", err)
	}
}
