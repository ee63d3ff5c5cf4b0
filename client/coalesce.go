package client

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tabuladb/tabula/api"
)

// maxGetsInFlight is how many Get calls (single or coalesced) the client
// has out to one server at a time; Gets past it wait and go together in
// the next MultiGet. One server call costs about the same CPU on both
// sides whether it carries one Get or dozens, so under concurrency this
// multiplies read throughput, while a lone Get goes out at once.
const maxGetsInFlight = 2

// maxStreamGetsInFlight is maxGetsInFlight for Gets on the Calls stream:
// a Get there costs a message, not an RPC, so coalescing them gains
// little and holding them back costs latency; only a flood is batched.
const maxStreamGetsInFlight = 64

// serverClient is the client's stub for one table server: every method is
// the generated one, except Get, which coalesces.
type serverClient struct {
	api.TableServerClient
	gets getCoalescer
	// inflight counts this client's calls to the server under way
	// (Table.call's attempts): replicaFor prefers the less busy of two
	// copies.
	inflight atomic.Int64
}

// Get implements api.TableServerClient.
func (s *serverClient) Get(ctx context.Context, req *api.GetRequest, opts ...grpc.CallOption) (*api.GetResponse, error) {
	if len(opts) > 0 {
		return s.TableServerClient.Get(ctx, req, opts...)
	}
	return s.gets.get(ctx, req)
}

// getCoalescer sends one server's Gets: up to maxGetsInFlight calls at a
// time, the Gets that arrive meanwhile queued and sent together in one
// MultiGet when a call returns. Each Get still gets exactly the reply or
// error it would have alone. A server that does not know MultiGet
// (Unimplemented) gets single Gets from then on.
type getCoalescer struct {
	ts      api.TableServerClient
	base    context.Context // the client's: Close cuts batches short
	limit   int             // calls in flight at most: maxGetsInFlight or maxStreamGetsInFlight
	noMulti atomic.Bool

	mu sync.Mutex
	// Guarded by mu.
	inflight int
	queue    []*pendingGet
}

type pendingGet struct {
	ctx  context.Context
	req  *api.GetRequest
	done chan getResult // 1-buffered
}

type getResult struct {
	resp *api.GetResponse
	err  error
}

func (c *getCoalescer) get(ctx context.Context, req *api.GetRequest) (*api.GetResponse, error) {
	if c.noMulti.Load() {
		return c.ts.Get(ctx, req)
	}
	c.mu.Lock()
	if c.inflight < c.limit {
		c.inflight++
		c.mu.Unlock()
		resp, err := c.ts.Get(ctx, req)
		c.finish()
		return resp, err
	}
	p := &pendingGet{ctx: ctx, req: req, done: make(chan getResult, 1)}
	c.queue = append(c.queue, p)
	c.mu.Unlock()
	select {
	case r := <-p.done:
		return r.resp, r.err
	case <-ctx.Done():
		// The batch may still carry it; its result is dropped.
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// finish ends one call: with Gets queued, the next batch goes out.
func (c *getCoalescer) finish() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inflight--
	if len(c.queue) == 0 || c.inflight >= c.limit {
		return
	}
	n := min(len(c.queue), api.MaxBatchKeys)
	batch := append([]*pendingGet(nil), c.queue[:n]...)
	clear(c.queue[:n])
	c.queue = c.queue[n:]
	if len(c.queue) == 0 {
		c.queue = nil
	}
	c.inflight++
	go c.send(batch)
}

// send sends one batch (alone if only one is still waiting) and hands out
// the results; then it finishes, starting the next batch if any.
func (c *getCoalescer) send(batch []*pendingGet) {
	defer c.finish()
	live := batch[:0]
	var deadline time.Time
	unbounded := false
	for _, p := range batch {
		if err := p.ctx.Err(); err != nil {
			continue // its caller has returned
		}
		live = append(live, p)
		if d, ok := p.ctx.Deadline(); !ok {
			unbounded = true
		} else if d.After(deadline) {
			deadline = d
		}
	}
	switch len(live) {
	case 0:
		return
	case 1:
		p := live[0]
		resp, err := c.ts.Get(p.ctx, p.req)
		p.done <- getResult{resp, err}
		return
	}
	// The batch outlives any one caller that gives up: it ends at the
	// latest deadline among them (every Get of the SDK has one).
	ctx, cancel := context.WithCancel(c.base)
	if !unbounded {
		ctx, cancel = context.WithDeadline(c.base, deadline)
	}
	defer cancel()
	req := &api.MultiGetRequest{Gets: make([]*api.GetRequest, len(live))}
	for i, p := range live {
		req.Gets[i] = p.req
	}
	resp, err := c.ts.MultiGet(ctx, req)
	if status.Code(err) == codes.Unimplemented {
		c.noMulti.Store(true)
		c.alone(live)
		return
	}
	if err == nil && len(resp.GetResults()) != len(live) {
		err = status.Errorf(codes.Internal, "client: MultiGet answered %d of %d gets", len(resp.GetResults()), len(live))
	}
	if err != nil {
		for _, p := range live {
			p.done <- getResult{err: err}
		}
		return
	}
	var again []*pendingGet
	for i, p := range live {
		r := resp.GetResults()[i]
		if len(r.GetStatus()) == 0 {
			p.done <- getResult{resp: r.GetResponse()}
			continue
		}
		var st spb.Status
		if uerr := proto.Unmarshal(r.GetStatus(), &st); uerr != nil {
			p.done <- getResult{err: status.Errorf(codes.Internal, "client: undecodable status of a MultiGet result: %v", uerr)}
			continue
		}
		gerr := status.ErrorProto(&st)
		if api.DetailOf(gerr).GetReason() == "multiget_reply_budget" {
			again = append(again, p)
			continue
		}
		p.done <- getResult{err: gerr}
	}
	c.alone(again)
}

// alone sends each Get by itself, in parallel.
func (c *getCoalescer) alone(ps []*pendingGet) {
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := c.ts.Get(p.ctx, p.req)
			p.done <- getResult{resp, err}
		}()
	}
	wg.Wait()
}
