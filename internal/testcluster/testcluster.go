package testcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/auth"
	"github.com/tabuladb/tabula/tablemaster"
	"github.com/tabuladb/tabula/tableserver"

	_ "github.com/tabuladb/tabula/engines/ordered" // the engines a cluster serves
	_ "github.com/tabuladb/tabula/engines/point"
)

// Options configure a Cluster. The zero value is a 3-server cluster in a
// temporary directory with fast failure detection.
type Options struct {
	// Servers is the number of table servers. Default 3.
	Servers int
	// Masters is the number of masters: 1 (the default) runs a single
	// master; more run a raft group of that many members (ids 1..n),
	// member 1 on MasterListen, the others on free ports.
	Masters int
	// Dir holds the master's and servers' data. Default: a new temporary
	// directory, removed by Close.
	Dir string
	// MasterListen is the master's listen address. Default "127.0.0.1:0".
	MasterListen string
	// Logger receives every part's logs. Default: discarded.
	Logger *slog.Logger
	// HeartbeatInterval, LeaseDuration and DeadAfter go to the master.
	// Defaults 50ms, 500ms, 1.5s: failures are noticed quickly in tests.
	HeartbeatInterval time.Duration
	LeaseDuration     time.Duration
	DeadAfter         time.Duration
	// ReplaceAfter goes to the master (tablemaster.Options.ReplaceAfter).
	// Default: replace a dead server's replicas at once, as tests of
	// replacement want.
	ReplaceAfter time.Duration
	// ServerOptions, when set, adjusts server i's options before it opens.
	ServerOptions func(i int, o *tableserver.Options)
	// MasterOptions, when set, adjusts the master's options.
	MasterOptions func(o *tablemaster.Options)
	// CredentialPath is where the cluster credential file is kept (read,
	// or created if absent). Default: cluster.key in Dir.
	CredentialPath string
	// OneListener serves each table server's (and the master's) cluster
	// traffic on its client listener, without the internal listener they
	// get by default (tableserver.Options.InternalListener,
	// tablemaster.Master.ServeInternal).
	OneListener bool
	// NoAuth runs the cluster without authentication. By default it has a
	// cluster credential (CredentialPath, kept across restarts in Dir),
	// and every client must sign (Credential).
	NoAuth bool
}

// Cluster is a running in-process cluster.
type Cluster struct {
	opts   Options
	cred   auth.Credential // zero with NoAuth
	ownDir bool
	master *tablemaster.Master
	mAddr  string
	// members are the raft masters (Options.Masters > 1), by index.
	members []*member
	mu      sync.Mutex
	servers []*server // guarded by mu
	wg      sync.WaitGroup
	closed  bool // guarded by mu
}

type server struct {
	s    *tableserver.Server
	addr string
	dir  string
	dead bool
}

// Start starts the master and the servers and returns once every server has
// registered with the master.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	if opts.Servers == 0 {
		opts.Servers = 3
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		if os.Getenv("TABULA_TEST_LOG") != "" {
			// Debugging a test: every part's logs on stderr.
			opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
		}
	}
	if opts.MasterListen == "" {
		opts.MasterListen = "127.0.0.1:0"
	}
	if opts.HeartbeatInterval == 0 {
		opts.HeartbeatInterval = 50 * time.Millisecond
	}
	if opts.LeaseDuration == 0 {
		opts.LeaseDuration = 500 * time.Millisecond
	}
	if opts.DeadAfter == 0 {
		opts.DeadAfter = 1500 * time.Millisecond
	}
	if opts.ReplaceAfter == 0 {
		opts.ReplaceAfter = -1
	}
	c := &Cluster{opts: opts}
	if opts.Dir == "" {
		dir, err := os.MkdirTemp("", "tabula-cluster-*")
		if err != nil {
			return nil, fmt.Errorf("testcluster: %w", err)
		}
		c.opts.Dir, c.ownDir = dir, true
	}
	if !opts.NoAuth {
		cred, _, err := auth.LoadOrCreateClusterCredential(c.CredentialPath())
		if err != nil {
			if c.ownDir {
				_ = os.RemoveAll(c.opts.Dir)
			}
			return nil, fmt.Errorf("testcluster: cluster credential: %w", err)
		}
		c.cred = cred
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Close())
		}
	}()
	if opts.Masters > 1 {
		if err := c.startMembers(); err != nil {
			return nil, err
		}
	} else if err := c.startMaster(); err != nil {
		return nil, err
	}
	for i := 0; i < opts.Servers; i++ {
		if _, err := c.AddServer(ctx); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (c *Cluster) startMaster() error {
	mo := tablemaster.Options{
		DataDir:           filepath.Join(c.opts.Dir, "master"),
		Logger:            c.opts.Logger.With("part", "master"),
		HeartbeatInterval: c.opts.HeartbeatInterval,
		LeaseDuration:     c.opts.LeaseDuration,
		DeadAfter:         c.opts.DeadAfter,
		ReplaceAfter:      c.opts.ReplaceAfter,
	}
	mo.ClusterKey = c.cred.Key
	if c.opts.MasterOptions != nil {
		c.opts.MasterOptions(&mo)
	}
	m, err := tablemaster.Open(mo)
	if err != nil {
		return fmt.Errorf("testcluster: open master: %w", err)
	}
	lis, err := net.Listen("tcp", c.opts.MasterListen)
	if err != nil {
		return errors.Join(fmt.Errorf("testcluster: master listen: %w", err), m.Close())
	}
	c.master, c.mAddr = m, lis.Addr().String()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		if err := m.Serve(lis); err != nil {
			c.opts.Logger.Error("master stopped", "err", err)
		}
	}()
	if !c.opts.OneListener {
		// The master's own internal listener, as tabula master has by
		// default: servers learn it from their registration.
		host, _, _ := net.SplitHostPort(c.mAddr)
		ilis, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return fmt.Errorf("testcluster: master internal listen: %w", err)
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			if err := m.ServeInternal(ilis, ""); err != nil {
				c.opts.Logger.Error("master internal listener stopped", "err", err)
			}
		}()
	}
	return nil
}

// AddServer starts one more table server and waits for it to register. It
// returns the server's index.
func (c *Cluster) AddServer(ctx context.Context) (int, error) {
	c.mu.Lock()
	i := len(c.servers)
	c.servers = append(c.servers, &server{dir: filepath.Join(c.opts.Dir, fmt.Sprintf("server-%d", i)), dead: true})
	c.mu.Unlock()
	return i, c.startServer(ctx, i)
}

func (c *Cluster) startServer(ctx context.Context, i int) error {
	c.mu.Lock()
	sv := c.servers[i]
	c.mu.Unlock()
	so := tableserver.Options{
		Masters:     c.MasterAddrs(),
		DataDir:     sv.dir,
		FaultDomain: fmt.Sprintf("fd-%d", i),
		Logger:      c.opts.Logger.With("part", fmt.Sprintf("server-%d", i)),
		ClusterKey:  c.cred.Key,
	}
	if !c.opts.OneListener {
		ilis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("testcluster: server %d internal listen: %w", i, err)
		}
		so.InternalListener = ilis
	}
	if c.opts.ServerOptions != nil {
		c.opts.ServerOptions(i, &so)
	}
	s, err := tableserver.Open(so)
	if err != nil {
		if so.InternalListener != nil {
			_ = so.InternalListener.Close()
		}
		return fmt.Errorf("testcluster: open server %d: %w", i, err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return errors.Join(fmt.Errorf("testcluster: server %d listen: %w", i, err), s.Close())
	}
	c.mu.Lock()
	sv.s, sv.addr, sv.dead = s, lis.Addr().String(), false
	c.mu.Unlock()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		if err := s.Serve(lis); err != nil {
			c.opts.Logger.Error("server stopped", "server", i, "err", err)
		}
	}()
	if err := s.WaitRegistered(ctx); err != nil {
		return fmt.Errorf("testcluster: server %d did not register: %w", i, err)
	}
	return nil
}

// MasterAddr is the master's address (the first member's, with a raft
// group).
func (c *Cluster) MasterAddr() string {
	if len(c.members) > 0 {
		return c.members[0].addr
	}
	return c.mAddr
}

// MasterAddrs lists every master's address.
func (c *Cluster) MasterAddrs() []string {
	if len(c.members) == 0 {
		return []string{c.mAddr}
	}
	out := make([]string, len(c.members))
	for i, mb := range c.members {
		out[i] = mb.addr
	}
	return out
}

// Dir is where the cluster keeps its data.
func (c *Cluster) Dir() string { return c.opts.Dir }

// ServerAddrs lists the servers' addresses, by index (killed ones included).
func (c *Cluster) ServerAddrs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, len(c.servers))
	for i, s := range c.servers {
		out[i] = s.addr
	}
	return out
}

// Server is server i (nil before it first started), for calling its
// handlers in process.
func (c *Cluster) Server(i int) *tableserver.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i < 0 || i >= len(c.servers) {
		return nil
	}
	return c.servers[i].s
}

// ServerIDs lists the servers' master-assigned ids, by index.
func (c *Cluster) ServerIDs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, len(c.servers))
	for i, s := range c.servers {
		if s.s != nil {
			out[i] = s.s.ID()
		}
	}
	return out
}

// KillServer stops server i abruptly: no drain, no goodbye to the master,
// in-memory data gone. The master notices by the missing heartbeats.
func (c *Cluster) KillServer(i int) error {
	c.mu.Lock()
	if i < 0 || i >= len(c.servers) {
		c.mu.Unlock()
		return fmt.Errorf("testcluster: no server %d", i)
	}
	sv := c.servers[i]
	if sv.dead {
		c.mu.Unlock()
		return fmt.Errorf("testcluster: server %d is not running", i)
	}
	sv.dead = true
	c.mu.Unlock()
	return sv.s.Close()
}

// RestartServer starts server i again on its data directory (a new port).
// After KillServer the master admits the new process only once the killed
// one has been silent longer than its lease (Options.LeaseDuration): a live
// server id belongs to one process.
func (c *Cluster) RestartServer(ctx context.Context, i int) error {
	c.mu.Lock()
	if i < 0 || i >= len(c.servers) || !c.servers[i].dead {
		c.mu.Unlock()
		return fmt.Errorf("testcluster: server %d is not a stopped server", i)
	}
	c.mu.Unlock()
	return c.startServer(ctx, i)
}

// StopMaster stops the master abruptly; servers keep running (and, once
// their leases run out, stop serving). With a raft group it stops every
// member.
func (c *Cluster) StopMaster() error {
	if len(c.members) > 0 {
		var errs []error
		for i := range c.members {
			errs = append(errs, c.KillMaster(i))
		}
		return errors.Join(errs...)
	}
	return c.master.Close()
}

// Close stops every server, then the master. Idempotent.
func (c *Cluster) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	servers := append([]*server(nil), c.servers...)
	c.mu.Unlock()
	var errs []error
	for _, sv := range servers {
		if sv.s != nil {
			errs = append(errs, sv.s.Close())
		}
	}
	if c.master != nil {
		errs = append(errs, c.master.Close())
	}
	for i := range c.members {
		if err := c.KillMaster(i); err != nil && !errors.Is(err, errNotRunning) {
			errs = append(errs, err)
		}
	}
	c.wg.Wait()
	if c.ownDir {
		errs = append(errs, os.RemoveAll(c.opts.Dir))
	}
	return errors.Join(errs...)
}

// CredentialPath is where the cluster credential file is
// (Options.CredentialPath).
func (c *Cluster) CredentialPath() string {
	if c.opts.CredentialPath != "" {
		return c.opts.CredentialPath
	}
	return filepath.Join(c.opts.Dir, "cluster.key")
}

// Credential is the cluster credential every client of the cluster signs
// with (zero with NoAuth).
func (c *Cluster) Credential() client.Credential { return client.Credential(c.cred) }

// ClientOptions are client options for the cluster: its masters and its
// cluster credential.
func (c *Cluster) ClientOptions() client.Options {
	return client.Options{Masters: c.MasterAddrs(), Credential: c.Credential()}
}
