package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tabuladb/tabula/api"
)

// DefaultRetryTimeout is Options.RetryTimeout when left zero: long enough to
// ride out a failover (lease expiry ~1 s plus re-placement), short enough
// that a dead cluster is reported.
const DefaultRetryTimeout = 15 * time.Second

// Options configure a Client. The zero value is invalid only for lack of
// Masters; every other field has a working default.
type Options struct {
	// Masters are the Table Master addresses (host:port), at least one.
	// Master calls go to one at a time and move on to the next when it is
	// unavailable.
	Masters []string
	// Tenant every call acts for. Default: the Credential's tenant, or
	// api.DefaultTenant with the cluster credential or none.
	Tenant string
	// Credential signs every request (HMAC-SHA256 over the method, the
	// principal, a timestamp, a nonce and the request; see
	// TenantCredential, ClusterCredential, ReadCredentialFile and
	// LoadProfile). A tenant's credential acts for that tenant only.
	Credential Credential
	// TLS, when set, dials every master and server over TLS with it (its
	// RootCAs: the cluster's certificate authority; nil RootCAs: the
	// system's). Nil: plaintext.
	TLS *tls.Config
	// Logger receives debug logs about retries, map refreshes and the map
	// watch. Default: discard.
	Logger *slog.Logger
	// RetryTimeout bounds how long one call keeps retrying retryable errors
	// (UNAVAILABLE, SERVER_BUSY, NOT_OWNER, STALE_EPOCH) when ctx has no
	// earlier deadline; it also bounds each unary RPC. Default 15s.
	RetryTimeout time.Duration
	// DialOptions are appended to the client's own: insecure transport
	// credentials (no TLS yet) and send/receive message limits of
	// api.MaxMessageBytes. Later options win, so a
	// grpc.WithTransportCredentials here replaces the insecure default.
	DialOptions []grpc.DialOption
	// Calls says how point calls (Get, Put, Delete, CompareAndSwap) go to
	// a server. Default CallsAuto: on the server's Calls stream, unless
	// DialOptions are given (then as RPCs of their own, so their
	// interceptors see every call).
	Calls CallMode
	// Seed seeds the client's backoff jitter. Default 0: a random seed
	// (logged at debug level so a run can be repeated).
	Seed uint64
}

// CallMode is how point calls go to a server (Options.Calls).
type CallMode int

const (
	// CallsAuto: CallsStream, or CallsUnary when Options.DialOptions are
	// given.
	CallsAuto CallMode = iota
	// CallsStream: every point call to a server goes on one long-lived
	// stream to it (TableServer.Calls), one message each way, answered
	// by id; the stream is signed once. It costs far less CPU per call
	// than an RPC per call, on both sides. A server without the stream
	// gets RPCs.
	CallsStream
	// CallsUnary: every point call is an RPC of its own.
	CallsUnary
)

// Validate explains what is wrong with o, if anything.
func (o Options) Validate() error {
	if len(o.Masters) == 0 {
		return ErrNoMasters
	}
	for i, m := range o.Masters {
		if m == "" {
			return fmt.Errorf("client: master address %d is empty", i)
		}
	}
	if o.Tenant != "" {
		if err := api.ValidateName("tenant", o.Tenant); err != nil {
			return fmt.Errorf("client: %w", err)
		}
	}
	if o.RetryTimeout < 0 {
		return fmt.Errorf("client: negative RetryTimeout %v", o.RetryTimeout)
	}
	if o.Calls < CallsAuto || o.Calls > CallsUnary {
		return fmt.Errorf("client: unknown Calls mode %d", o.Calls)
	}
	if !o.Credential.zero() {
		if err := o.Credential.auth().Validate(); err != nil {
			return fmt.Errorf("client: %w", err)
		}
		if p := o.Credential.Principal; p != ClusterPrincipal && o.Tenant != "" && o.Tenant != p {
			return fmt.Errorf("client: tenant %q's credential cannot act for tenant %q", p, o.Tenant)
		}
	}
	return nil
}

func (o Options) withDefaults() Options {
	if o.Tenant == "" && !o.Credential.zero() && o.Credential.Principal != ClusterPrincipal {
		o.Tenant = o.Credential.Principal
	}
	if o.Tenant == "" {
		o.Tenant = api.DefaultTenant
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.RetryTimeout == 0 {
		o.RetryTimeout = DefaultRetryTimeout
	}
	if o.Calls == CallsAuto {
		o.Calls = CallsStream
		if len(o.DialOptions) > 0 {
			o.Calls = CallsUnary
		}
	}
	if o.Seed == 0 {
		o.Seed = rand.Uint64() | 1
	}
	o.Masters = append([]string(nil), o.Masters...)
	return o
}

// Client is a connection to one Tabula cluster for one tenant: catalog calls
// go to the masters, data calls straight to the servers hosting each
// partition. A Client is safe for concurrent use and meant to be long-lived
// and shared: it caches one gRPC connection per server and one partition map
// per table in use (kept fresh by a background watch). Close releases both.
type Client struct {
	opts   Options
	log    *slog.Logger
	jitter *jitter
	pacers pacers // calls paced to servers that refused them over a rate (pace.go)

	// ctx is cancelled by Close; it stops the watch goroutines and cuts
	// in-flight calls short.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // the watch goroutines

	// master is the index in opts.Masters of the master tried first.
	master atomic.Uint32

	mu sync.Mutex // guards the fields below
	// closed is set by Close; no connection or goroutine starts after it.
	closed  bool
	conns   map[string]*grpc.ClientConn // by address
	servers map[string]*serverClient    // by address, over conns
	tables  map[string]*tableState      // by table name
}

// New makes a Client. It dials lazily: New does no I/O, so an unreachable
// cluster shows up as UNAVAILABLE errors from the first calls.
func New(ctx context.Context, opts Options) (*Client, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	c := &Client{
		opts:    opts,
		log:     opts.Logger,
		jitter:  newJitter(opts.Seed),
		conns:   make(map[string]*grpc.ClientConn),
		servers: make(map[string]*serverClient),
		tables:  make(map[string]*tableState),
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.log.Debug("tabula client", "masters", opts.Masters, "tenant", opts.Tenant, "seed", opts.Seed)
	return c, nil
}

// Close stops the background map watches, cuts in-flight calls short (they
// return ErrClosed) and closes every connection. It is idempotent; later calls
// return nil.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	conns := c.conns
	c.conns = nil
	c.mu.Unlock()

	c.cancel()
	c.wg.Wait()
	c.mu.Lock()
	servers := maps.Clone(c.servers)
	c.mu.Unlock()
	for _, s := range servers {
		if cs, ok := s.TableServerClient.(*callStub); ok {
			cs.close()
		}
	}
	var errs []error
	for addr, cc := range conns {
		if err := cc.Close(); err != nil {
			errs = append(errs, fmt.Errorf("client: close connection to %s: %w", addr, err))
		}
	}
	return errors.Join(errs...)
}

// Tenant is the tenant the client acts for.
func (c *Client) Tenant() string { return c.opts.Tenant }

// conn returns the cached connection to addr, making it on first use
// (grpc.NewClient does no I/O, so holding the mutex is fine).
func (c *Client) conn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	if cc, ok := c.conns[addr]; ok {
		return cc, nil
	}
	dopts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		api.FastReconnect(), api.Keepalive(),
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(api.MaxMessageBytes),
			grpc.MaxCallSendMsgSize(api.MaxMessageBytes),
		),
	}
	if !c.opts.Credential.zero() {
		dopts = append(dopts, c.opts.Credential.auth().DialOptions()...)
	}
	if c.opts.TLS != nil {
		dopts = append(dopts, grpc.WithTransportCredentials(credentials.NewTLS(c.opts.TLS)))
	}
	dopts = append(dopts, c.opts.DialOptions...)
	cc, err := grpc.NewClient(addr, dopts...)
	if err != nil {
		// A malformed address or dial option: not worth retrying.
		return nil, &permanentError{fmt.Errorf("client: connect to %s: %w", addr, err)}
	}
	c.conns[addr] = cc
	return cc, nil
}

// server returns the stub for the table server at addr (its Gets
// coalesce), making it and its connection on first use.
func (c *Client) server(addr string) (api.TableServerClient, error) {
	cc, err := c.conn(addr)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.servers[addr]
	if !ok {
		var ts api.TableServerClient = api.NewTableServerClient(cc)
		limit := maxGetsInFlight
		if c.opts.Calls == CallsStream {
			ts, limit = newCallStub(ts, c.ctx), maxStreamGetsInFlight
		}
		s = &serverClient{TableServerClient: ts, gets: getCoalescer{ts: ts, base: c.ctx, limit: limit}}
		c.servers[addr] = s
	}
	return s, nil
}

// inflight is the number of this client's calls to server addr under way.
func (c *Client) inflight(addr string) int64 {
	c.mu.Lock()
	s := c.servers[addr]
	c.mu.Unlock()
	if s == nil {
		return 0
	}
	return s.inflight.Load()
}

// callCtx bounds one call: its retries end at the earlier of ctx's deadline
// and now+RetryTimeout, and Close cuts it short. bounded also puts that
// deadline on the returned context (so every RPC of the call is bounded);
// streams that may legitimately run longer pass false.
func (c *Client) callCtx(ctx context.Context, bounded bool) (context.Context, time.Time, context.CancelFunc) {
	deadline := time.Now().Add(c.opts.RetryTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	var cancel context.CancelFunc
	if bounded {
		ctx, cancel = context.WithDeadline(ctx, deadline)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	stop := context.AfterFunc(c.ctx, cancel)
	return ctx, deadline, func() { stop(); cancel() }
}

// pause waits before the next retry. It reports false, without waiting, when
// the wait would run past the deadline, and false when ctx ends first.
func pause(ctx context.Context, deadline time.Time, d time.Duration) bool {
	if !time.Now().Add(d).Before(deadline) {
		return false
	}
	return sleepCtx(ctx, d)
}

// giveUp builds the error of a call that stopped retrying.
func (c *Client) giveUp(ctx context.Context, what string, last error) error {
	if c.ctx.Err() != nil {
		return fmt.Errorf("%s: %w", what, ErrClosed)
	}
	ctxErr := ctx.Err()
	if ctxErr == nil {
		// The next wait would have run past the deadline.
		ctxErr = context.DeadlineExceeded
	}
	return wrapCall(what, ctxErr, last)
}

// endedByDeadline reports whether err is only the call running out of time,
// which says less than the error that made it retry until then.
func endedByDeadline(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return true
	}
	code := status.Code(err)
	return code == codes.DeadlineExceeded || code == codes.Canceled
}

// notAMaster reports an answer from something at a master's address that
// does not serve the master API (gRPC's own UNIMPLEMENTED, with no Tabula
// error detail): a master that is down and whose port another process
// took. Another master may answer.
func notAMaster(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unimplemented {
		return false
	}
	for _, d := range st.Details() {
		if _, ok := d.(*api.ErrorDetail); ok {
			return false
		}
	}
	return true
}

// masterRequestIDKey is the gRPC metadata key of a catalog change's
// request id: tablemaster.RequestIDHeader.
const masterRequestIDKey = "tabula-request-id"

// withMasterRequestID names a catalog change with a fresh request id, sent
// on every attempt of the call: the master applies a retried change once
// (a create whose reply was lost, retried after someone dropped the
// table, does not create it again).
func withMasterRequestID(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, masterRequestIDKey, newRequestID())
}

// masterCall runs fn against a master, retrying UNAVAILABLE on the next
// master (at once while there are untried ones, then with backoff) and
// SERVER_BUSY after its retry-after, until the call's deadline.
func (c *Client) masterCall(ctx context.Context, what string, fn func(ctx context.Context, mc api.MasterClient) error) error {
	ctx, deadline, cancel := c.callCtx(ctx, true)
	defer cancel()
	n := uint32(len(c.opts.Masters))
	var last error
	for attempt, fresh := 0, 0; ; attempt++ {
		idx := c.master.Load() % n
		addr := c.opts.Masters[idx]
		cc, err := c.conn(addr)
		if err == nil {
			// One master gets at most masterAttemptTimeout of the call when
			// there are others to try: a stopped one must not hold it all.
			actx, acancel := ctx, context.CancelFunc(func() {})
			if n > 1 {
				actx, acancel = context.WithTimeout(ctx, masterAttemptTimeout)
			}
			err = fn(actx, api.NewMasterClient(cc))
			acancel()
		}
		if err == nil {
			return nil
		}
		if perm := (*permanentError)(nil); errors.As(err, &perm) {
			return fmt.Errorf("%s: %w", what, perm.err)
		}
		if errors.Is(err, ErrClosed) || c.ctx.Err() != nil {
			return c.giveUp(ctx, what, err)
		}
		if last == nil || !endedByDeadline(ctx, err) {
			last = err
		}
		d := api.DetailOf(err)
		if notAMaster(err) {
			d = &api.ErrorDetail{Code: api.ErrorCode_ERROR_CODE_UNAVAILABLE, Reason: "not_a_master"}
		}
		var wait time.Duration
		switch d.GetCode() {
		case api.ErrorCode_ERROR_CODE_UNAVAILABLE:
			next := (idx + 1) % n
			if leader := d.GetLeader(); leader != "" {
				// A follower of a raft group named its leader.
				for k, a := range c.opts.Masters {
					if a == leader {
						next = uint32(k)
					}
				}
			}
			c.master.CompareAndSwap(idx, next)
			// Try each other master once at once: a dead master should
			// cost one failed dial, not a backoff.
			if fresh < int(n)-1 {
				fresh++
				if ctx.Err() == nil {
					continue
				}
			} else {
				fresh = 0
				wait = c.jitter.backoff(attempt, backoffBase, masterBackoffCap)
			}
		case api.ErrorCode_ERROR_CODE_SERVER_BUSY:
			wait = max(c.jitter.backoff(attempt, backoffBase, masterBackoffCap), time.Duration(d.GetRetryAfterMs())*time.Millisecond)
		default:
			return fmt.Errorf("%s: %w", what, withSentinel(err))
		}
		c.log.Debug("tabula: retrying master call", "op", what, "master", addr, "wait", wait, "err", err)
		if !pause(ctx, deadline, wait) {
			return c.giveUp(ctx, what, last)
		}
	}
}

// Table kinds, for CreateTable: short names of the api's.
const (
	PointTable   = api.TableKind_TABLE_KIND_POINT   // hashed keys: Get, Put, CompareAndSwap, BatchWrite
	OrderedTable = api.TableKind_TABLE_KIND_ORDERED // keys in order, split by range: ScanRange
	BulkTable    = api.TableKind_TABLE_KIND_BULK    // read-only versions, published whole
)

// CreateTable creates the table name of the given kind in the client's
// tenant; nil opts takes every default. It returns the new table's partition
// map (also cached for the table's handle). Every attempt carries the
// call's request id, so a call retried after a lost reply takes effect once
// and reports success (with a nil map if the table was dropped since).
// A table of that name already there is an error matching
// ErrAlreadyExists.
func (c *Client) CreateTable(ctx context.Context, name string, kind api.TableKind, opts *api.TableOptions) (*api.PartitionMap, error) {
	what := fmt.Sprintf("client: create table %q", name)
	if err := api.ValidateName("name", name); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if kind == api.TableKind_TABLE_KIND_UNSPECIFIED {
		return nil, fmt.Errorf("%s: %w", what, api.InvalidArgument("kind", "kind_unspecified", 0, "table kind is unspecified"))
	}
	if opts == nil {
		opts = &api.TableOptions{}
	}
	var resp *api.CreateTableResponse
	err := c.masterCall(withMasterRequestID(ctx), what, func(ctx context.Context, mc api.MasterClient) error {
		var err error
		resp, err = mc.CreateTable(ctx, &api.CreateTableRequest{Tenant: c.opts.Tenant, Name: name, Kind: kind, Options: opts})
		return err
	})
	if err != nil {
		return nil, err
	}
	if m := resp.GetMap(); m != nil {
		c.state(name).store(m)
	}
	return resp.GetMap(), nil
}

// DropTable drops the table name and everything in it. Like CreateTable,
// a call retried after a lost reply takes effect once.
func (c *Client) DropTable(ctx context.Context, name string) error {
	what := fmt.Sprintf("client: drop table %q", name)
	if err := api.ValidateName("name", name); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	err := c.masterCall(withMasterRequestID(ctx), what, func(ctx context.Context, mc api.MasterClient) error {
		_, err := mc.DropTable(ctx, &api.DropTableRequest{Tenant: c.opts.Tenant, Name: name})
		return err
	})
	c.mu.Lock()
	ts := c.tables[name]
	c.mu.Unlock()
	if ts != nil {
		ts.forget()
	}
	return err
}

// ListTables lists the tenant's tables.
func (c *Client) ListTables(ctx context.Context) ([]*api.Table, error) {
	var resp *api.ListTablesResponse
	err := c.masterCall(ctx, "client: list tables", func(ctx context.Context, mc api.MasterClient) error {
		var err error
		resp, err = mc.ListTables(ctx, &api.ListTablesRequest{Tenant: c.opts.Tenant})
		return err
	})
	return resp.GetTables(), err
}

// DescribeTable returns the table's partition map and the latest status of
// each replica.
func (c *Client) DescribeTable(ctx context.Context, name string) (*api.DescribeTableResponse, error) {
	what := fmt.Sprintf("client: describe table %q", name)
	if err := api.ValidateName("name", name); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	var resp *api.DescribeTableResponse
	err := c.masterCall(ctx, what, func(ctx context.Context, mc api.MasterClient) error {
		var err error
		resp, err = mc.DescribeTable(ctx, &api.DescribeTableRequest{Tenant: c.opts.Tenant, Name: name})
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// ListServers lists the cluster's table servers.
func (c *Client) ListServers(ctx context.Context) ([]*api.ServerInfo, error) {
	var resp *api.ListServersResponse
	err := c.masterCall(ctx, "client: list servers", func(ctx context.Context, mc api.MasterClient) error {
		var err error
		resp, err = mc.ListServers(ctx, &api.ListServersRequest{})
		return err
	})
	return resp.GetServers(), err
}

// fetchMap asks a master for the table's current partition map.
func (c *Client) fetchMap(ctx context.Context, table string) (*api.PartitionMap, error) {
	var resp *api.GetPartitionMapResponse
	err := c.masterCall(ctx, fmt.Sprintf("client: get partition map of %q", table), func(ctx context.Context, mc api.MasterClient) error {
		var err error
		resp, err = mc.GetPartitionMap(ctx, &api.GetPartitionMapRequest{Tenant: c.opts.Tenant, Table: table})
		return err
	})
	if err != nil {
		return nil, err
	}
	if resp.GetMap() == nil || len(resp.GetMap().GetPartitions()) == 0 {
		return nil, fmt.Errorf("client: get partition map of %q: %w", table,
			unavailable("empty_map", "the master returned no partitions"))
	}
	return resp.GetMap(), nil
}
