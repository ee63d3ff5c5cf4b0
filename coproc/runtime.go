package coproc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// Options configure a Runtime. The zero value works; each field documents
// its default.
type Options struct {
	// CacheDir keeps compiled machine code across processes (wazero's
	// compilation cache), so a restarted server does not recompile its
	// modules. Empty: compile in memory only. The directory is created.
	CacheDir string
	// PoolSize bounds the instances of one module key (tenant, table, name,
	// version). Default: 4.
	PoolSize int
	// MaxConcurrency bounds the guest calls executing at once in the whole
	// runtime. Go cannot preempt a goroutine running guest code until it
	// has run a 10 ms time slice, so guests on every P would delay the
	// server's own goroutines by that much; leaving one P to the server
	// keeps a plain Get fast while guests spin. Default: GOMAXPROCS-1, at
	// least 1.
	MaxConcurrency int
	// MaxWaiters bounds the calls waiting for an instance of one module key;
	// one more is refused with ErrBusy. Default: 4 × PoolSize.
	MaxWaiters int
	// DefaultTimeout is a call's deadline when neither CallRequest.Deadline
	// nor the context sets an earlier one. Default: 1s (at most
	// MaxDeadline).
	DefaultTimeout time.Duration
	// MaxDeadline caps every call's and merge's deadline: a later
	// CallRequest.Deadline is cut to MaxDeadline from the call's start, so
	// one spinning guest holds an execution slot at most this long.
	// Default: DefaultMaxDeadline (30s).
	MaxDeadline time.Duration
	// MemoryLimitPages caps each instance's linear memory in 64 KiB pages.
	// Default: 512 (32 MiB). A Go guest needs about 40 pages to start.
	MemoryLimitPages uint32
	// MaxModuleBytes bounds a module's size. Default: DefaultMaxModuleBytes (32 MiB).
	MaxModuleBytes int
	// MaxInputBytes bounds a call's input (and a merge's encoded partials).
	// Default: 1 MiB.
	MaxInputBytes int
	// MaxOutputBytes bounds what a call emits. Default: 4 MiB.
	MaxOutputBytes int
	// MaxWriteBytes and MaxWrites bound the keys and values a call stages.
	// Defaults: 4 MiB and 10000.
	MaxWriteBytes int
	MaxWrites     int
	// MaxKeyBytes bounds one key a guest passes. Default: 64 KiB.
	MaxKeyBytes int
	// LogRate is the log lines per second a module key may write (log,
	// stdout, stderr), with bursts of LogBurst; the rest are dropped and
	// counted in Stats. Defaults: 10 and 20.
	LogRate  float64
	LogBurst int
	// IdempotencyTTL is how long an idempotency record lives. Default: 24h.
	IdempotencyTTL time.Duration
	// MaxConflictRetries is how often a call whose commit conflicts is run
	// again before Call returns ErrConflict. Default: 3.
	MaxConflictRetries int
	// Now is the clock for CallRequest.Now's default and the log limiter.
	// Default: time.Now.
	Now func() time.Time
	// Logger receives guest logs and the runtime's events. Default: slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns o with zero fields set to their defaults.
func (o Options) WithDefaults() Options {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.PoolSize, 4)
	def(&o.MaxWaiters, 4*o.PoolSize)
	def(&o.MaxConcurrency, max(1, runtime.GOMAXPROCS(0)-1))
	def(&o.MaxModuleBytes, DefaultMaxModuleBytes)
	def(&o.MaxInputBytes, 1<<20)
	def(&o.MaxOutputBytes, 4<<20)
	def(&o.MaxWriteBytes, 4<<20)
	def(&o.MaxWrites, 10000)
	def(&o.MaxKeyBytes, 64<<10)
	def(&o.LogBurst, 20)
	def(&o.MaxConflictRetries, 3)
	if o.DefaultTimeout == 0 {
		o.DefaultTimeout = time.Second
	}
	if o.MaxDeadline == 0 {
		o.MaxDeadline = DefaultMaxDeadline
	}
	o.DefaultTimeout = min(o.DefaultTimeout, o.MaxDeadline)
	if o.MemoryLimitPages == 0 {
		o.MemoryLimitPages = 512
	}
	if o.LogRate == 0 {
		o.LogRate = 10
	}
	if o.IdempotencyTTL == 0 {
		o.IdempotencyTTL = 24 * time.Hour
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Validate explains what is wrong with o (after defaults).
func (o Options) Validate() error {
	var errs []error
	if o.PoolSize < 0 || o.MaxWaiters < 0 || o.MaxConcurrency < 0 || o.MaxInputBytes < 0 || o.MaxOutputBytes < 0 ||
		o.MaxWriteBytes < 0 || o.MaxWrites < 0 || o.MaxKeyBytes < 0 || o.MaxModuleBytes < 0 ||
		o.LogBurst < 0 || o.MaxConflictRetries < 0 || o.DefaultTimeout < 0 || o.MaxDeadline < 0 || o.LogRate < 0 || o.IdempotencyTTL < 0 {
		errs = append(errs, errors.New("coproc: negative limit in options"))
	}
	if o.MemoryLimitPages > 65536 {
		errs = append(errs, fmt.Errorf("coproc: MemoryLimitPages %d over the wasm32 maximum 65536", o.MemoryLimitPages))
	}
	return errors.Join(errs...)
}

// ModuleKey names one deployed module version on one table. Instances are
// pooled per key, so they are never shared across tenants or tables.
type ModuleKey struct {
	Tenant, Table, Name string
	Version             uint64
}

func (k ModuleKey) String() string {
	return fmt.Sprintf("%s/%s/%s@%d", k.Tenant, k.Table, k.Name, k.Version)
}

// Stats are a Runtime's counters since it was created.
type Stats struct {
	Modules            int
	Calls              uint64 // guest runs (a conflict retry counts again)
	GuestErrors        uint64 // non-zero handler returns
	Traps              uint64
	Timeouts           uint64
	MemoryLimits       uint64
	Busy               uint64
	Replays            uint64 // calls answered from an idempotency record
	Conflicts          uint64
	Commits            uint64
	InstancesCreated   uint64
	InstancesDiscarded uint64
	LogLinesDropped    uint64
}

// Runtime compiles, pools and calls coprocessor modules. There is one per
// table server. Safe for concurrent use.
type Runtime struct {
	opts Options
	wrt  wazero.Runtime
	// exec holds a token per guest call executing (Options.MaxConcurrency).
	exec  chan struct{}
	cache wazero.CompilationCache
	// wd stops calls at their deadlines.
	wd *watchdog
	// cpu is the execution time per tenant (TenantCPU).
	cpu tenantCPU
	// realClock: Options.Now is time.Now.
	realClock bool

	mu struct {
		sync.Mutex
		// Guarded by mu.
		modules map[ModuleKey]*module
		closed  bool
	}
	stats struct {
		calls, guestErrors, traps, timeouts, memoryLimits, busy, replays,
		conflicts, commits, created, discarded, logDropped atomic.Uint64
	}
}

// New creates a Runtime: a wazero compiler runtime that closes a module when
// its call's context is done, caps each instance's memory, and hosts the
// tabula and (filtered, see ABI.md) WASI modules.
func New(ctx context.Context, opts Options) (*Runtime, error) {
	realClock := opts.Now == nil
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	cfg := wazero.NewRuntimeConfigCompiler().
		WithCloseOnContextDone(true).
		WithMemoryLimitPages(opts.MemoryLimitPages).
		WithDebugInfoEnabled(false)
	r := &Runtime{opts: opts, exec: make(chan struct{}, opts.MaxConcurrency), realClock: realClock}
	if opts.CacheDir != "" {
		if err := os.MkdirAll(opts.CacheDir, 0o755); err != nil {
			return nil, fmt.Errorf("coproc: create cache dir: %w", err)
		}
		cache, err := wazero.NewCompilationCacheWithDir(opts.CacheDir)
		if err != nil {
			return nil, fmt.Errorf("coproc: open compilation cache %s: %w", opts.CacheDir, err)
		}
		r.cache = cache
		cfg = cfg.WithCompilationCache(cache)
	}
	r.wrt = wazero.NewRuntimeWithConfig(ctx, cfg)
	r.wd = newWatchdog(watchdogTick)
	r.mu.modules = make(map[ModuleKey]*module)
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, r.wrt); err != nil {
		return nil, errors.Join(fmt.Errorf("coproc: instantiate WASI: %w", err), r.close(ctx))
	}
	if err := instantiateHost(ctx, r.wrt); err != nil {
		return nil, errors.Join(fmt.Errorf("coproc: instantiate host module: %w", err), r.close(ctx))
	}
	return r, nil
}

// Options returns the runtime's options with defaults applied.
func (r *Runtime) Options() Options { return r.opts }

// Validate is the package's Validate with the runtime's MaxModuleBytes.
func (r *Runtime) Validate(wasm []byte) (Manifest, error) {
	return validate(wasm, r.opts.MaxModuleBytes)
}

// Compile validates wasm, compiles it to machine code and instantiates one
// instance (running _initialize), so that a module that cannot start is
// refused at deploy, and registers it under key. Compiling again under a
// key with the same content is a no-op; other content is ErrDigestMismatch.
// It may take seconds (a Go guest is ~2 MB): call it at deploy, never on a
// request path. On error nothing changes.
func (r *Runtime) Compile(ctx context.Context, key ModuleKey, wasm []byte) (Manifest, error) {
	if key.Tenant == "" || key.Table == "" || key.Name == "" {
		return Manifest{}, fmt.Errorf("coproc: compile %v: tenant, table and name are required", key)
	}
	man, err := r.Validate(wasm)
	if err != nil {
		return man, fmt.Errorf("compile %v: %w", key, err)
	}
	if m, err := r.lookup(key); err == nil {
		if m.man.Digest != man.Digest {
			return man, fmt.Errorf("compile %v (digest %.12s): %w (digest %.12s)", key, man.DigestHex(), ErrDigestMismatch, m.man.DigestHex())
		}
		return m.man, nil
	} else if errors.Is(err, ErrClosed) {
		return man, err
	}
	compiled, err := r.wrt.CompileModule(ctx, wasm)
	if err != nil {
		return man, fmt.Errorf("compile %v: %w: %w", key, ErrInvalidModule, err)
	}
	m := newModule(r, key, man, compiled)
	inst, err := m.newInstance(ctx)
	if err != nil {
		return man, errors.Join(fmt.Errorf("compile %v: instantiate: %w: %w", key, ErrInvalidModule, err), compiled.Close(ctx))
	}
	m.pool.put(inst)

	r.mu.Lock()
	if r.mu.closed {
		r.mu.Unlock()
		m.close(ctx)
		return man, ErrClosed
	}
	if old, ok := r.mu.modules[key]; ok {
		// A concurrent Compile won; keep its module.
		r.mu.Unlock()
		m.close(ctx)
		if old.man.Digest != man.Digest {
			return man, fmt.Errorf("compile %v: %w", key, ErrDigestMismatch)
		}
		return old.man, nil
	}
	r.mu.modules[key] = m
	r.mu.Unlock()
	return man, nil
}

// Warm starts instances of the module under key until n are idle or its
// pool is full, so that calls arriving together do not each pay an
// instance's start (a Go guest's runtime initialisation) inside their
// deadlines. It returns how many it started.
func (r *Runtime) Warm(ctx context.Context, key ModuleKey, n int) (int, error) {
	m, err := r.lookup(key)
	if err != nil {
		return 0, err
	}
	started := 0
	for len(m.pool.idle) < n {
		select {
		case m.pool.slots <- struct{}{}:
		default:
			return started, nil // the pool is full
		}
		in, err := m.pool.instantiate(ctx)
		if err != nil {
			return started, err
		}
		started++
		m.pool.release(in)
	}
	return started, nil
}

// Manifest returns the manifest of the module compiled under key.
func (r *Runtime) Manifest(key ModuleKey) (Manifest, error) {
	m, err := r.lookup(key)
	if err != nil {
		return Manifest{}, err
	}
	return m.man, nil
}

// Keys lists the compiled module keys.
func (r *Runtime) Keys() []ModuleKey {
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := make([]ModuleKey, 0, len(r.mu.modules))
	for k := range r.mu.modules {
		keys = append(keys, k)
	}
	return keys
}

// Evict forgets the module under key: idle instances are closed at once,
// instances in use when their call ends, and the compiled code when no
// other key shares it. Calls that already hold an instance finish; new
// calls get ErrModuleNotFound. Evicting an absent key is a no-op.
func (r *Runtime) Evict(ctx context.Context, key ModuleKey) error {
	r.mu.Lock()
	m, ok := r.mu.modules[key]
	delete(r.mu.modules, key)
	r.mu.Unlock()
	if !ok {
		return nil
	}
	return m.close(ctx)
}

func (r *Runtime) lookup(key ModuleKey) (*module, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mu.closed {
		return nil, ErrClosed
	}
	m, ok := r.mu.modules[key]
	if !ok {
		return nil, fmt.Errorf("%w: %v", ErrModuleNotFound, key)
	}
	return m, nil
}

// Stats returns the runtime's counters.
func (r *Runtime) Stats() Stats {
	r.mu.Lock()
	n := len(r.mu.modules)
	r.mu.Unlock()
	s := &r.stats
	return Stats{
		Modules: n, Calls: s.calls.Load(), GuestErrors: s.guestErrors.Load(), Traps: s.traps.Load(),
		Timeouts: s.timeouts.Load(), MemoryLimits: s.memoryLimits.Load(), Busy: s.busy.Load(),
		Replays: s.replays.Load(), Conflicts: s.conflicts.Load(), Commits: s.commits.Load(),
		InstancesCreated: s.created.Load(), InstancesDiscarded: s.discarded.Load(),
		LogLinesDropped: s.logDropped.Load(),
	}
}

// Close evicts every module and releases the wazero runtime and cache. It
// is idempotent. Calls in flight are stopped (their modules are closed).
func (r *Runtime) Close(ctx context.Context) error {
	r.mu.Lock()
	if r.mu.closed {
		r.mu.Unlock()
		return nil
	}
	r.mu.closed = true
	mods := r.mu.modules
	r.mu.modules = nil
	r.mu.Unlock()
	var errs []error
	for _, m := range mods {
		errs = append(errs, m.close(ctx))
	}
	errs = append(errs, r.close(ctx))
	return errors.Join(errs...)
}

func (r *Runtime) close(ctx context.Context) error {
	err := r.wrt.Close(ctx)
	r.wd.close()
	if r.cache != nil {
		err = errors.Join(err, r.cache.Close(ctx))
	}
	return err
}
