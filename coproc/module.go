package coproc

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/tabuladb/tabula/coproc/abi"
)

// module is one compiled module key with its pool of instances.
type module struct {
	rt       *Runtime
	key      ModuleKey
	man      Manifest
	compiled wazero.CompiledModule
	pool     *pool
	logs     *logLimiter
}

func newModule(r *Runtime, key ModuleKey, man Manifest, compiled wazero.CompiledModule) *module {
	m := &module{rt: r, key: key, man: man, compiled: compiled}
	m.pool = newPool(m, r.opts.PoolSize, r.opts.MaxWaiters)
	m.logs = newLogLimiter(r, key)
	return m
}

func (m *module) close(ctx context.Context) error {
	m.pool.close()
	return m.compiled.Close(ctx)
}

// instance is one instantiated module. It serves one call at a time; the
// pool hands it from call to call, which orders its fields' accesses.
type instance struct {
	m        *module
	mod      api.Module
	reserve  api.Function
	handlers map[string]api.Function
	stack    []uint64
	// inPtr, inCap: the input buffer the guest last reserved (inCap 0:
	// none yet).
	inPtr, inCap uint32
	// cc is the call context reused from call to call (nil: make one).
	cc *callCtx

	// cur is the call being served (nil during instantiation).
	cur *callState
	// clock: a virtual monotonic clock that only sleeps advance, so a guest
	// sees deterministic time (wall time is the call's Now plus the virtual
	// time slept during the call).
	mono      int64
	monoStart int64
	wallBase  int64
	rand      *rand.ChaCha8
	seeded    bool // rand is seeded for the current call
	stdout    *guestWriter
	stderr    *guestWriter
}

// newInstance instantiates the module, runs _initialize if exported, and
// resolves the ABI exports.
func (m *module) newInstance(ctx context.Context) (*instance, error) {
	// The Go runtime refuses a zero nanotime: start the virtual clock at 1s.
	in := &instance{m: m, handlers: make(map[string]api.Function), stack: make([]uint64, 1), mono: 1e9}
	in.rand = rand.NewChaCha8(m.man.Digest)
	in.wallBase = m.rt.opts.Now().UnixNano()
	in.stdout = &guestWriter{in: in, stream: "stdout"}
	in.stderr = &guestWriter{in: in, stream: "stderr"}
	cfg := wazero.NewModuleConfig().
		WithName(""). // anonymous: many instances of one module coexist
		WithStdout(in.stdout).
		WithStderr(in.stderr).
		WithRandSource(randReader{in}).
		WithWalltime(in.walltime, 1).
		WithNanotime(in.nanotime, 1).
		WithNanosleep(in.nanosleep).
		WithOsyield(func() {})
	if _, ok := m.compiled.ExportedFunctions()["_initialize"]; ok {
		cfg = cfg.WithStartFunctions("_initialize")
	} else {
		cfg = cfg.WithStartFunctions()
	}
	// Instantiation runs guest code (_initialize): bound it like a call.
	ictx, cancel := context.WithTimeout(ctx, m.rt.opts.DefaultTimeout)
	defer cancel()
	mod, err := m.rt.wrt.InstantiateModule(ictx, m.compiled, cfg)
	if err != nil {
		if tail := in.stderr.tail(); tail != "" {
			err = fmt.Errorf("%w (stderr: %s)", err, tail)
		}
		return nil, err
	}
	in.mod = mod
	in.reserve = mod.ExportedFunction(abi.ReserveExport)
	if in.reserve == nil {
		mod.Close(ctx)
		return nil, fmt.Errorf("no %s export", abi.ReserveExport)
	}
	m.rt.stats.created.Add(1)
	return in, nil
}

func (in *instance) handler(name string) api.Function {
	f, ok := in.handlers[name]
	if !ok {
		f = in.mod.ExportedFunction(name)
		in.handlers[name] = f
	}
	return f
}

func (in *instance) close() {
	in.m.rt.stats.discarded.Add(1)
	// A closed module's Close is a no-op; the error of closing a trapped
	// module says nothing useful.
	_ = in.mod.Close(context.Background())
}

// beginCall points the instance's clock, randomness and output at st.
func (in *instance) beginCall(st *callState) {
	in.cur = st
	in.monoStart = in.mono
	in.wallBase = st.now.UnixNano()
	in.seeded = false
}

// seed seeds the guest's randomness from the call's request id, on the
// first read of a call (most calls read none).
func (in *instance) seed() {
	if in.seeded || in.cur == nil {
		return
	}
	in.seeded = true
	in.rand.Seed(sha256.Sum256(append([]byte(in.cur.requestID), in.m.man.Digest[:]...)))
}

func (in *instance) endCall() {
	in.stdout.flush()
	in.stderr.flush()
	in.cur = nil
}

func (in *instance) walltime() (int64, int32) {
	t := in.wallBase + (in.mono - in.monoStart)
	return t / 1e9, int32(t % 1e9)
}

// nanotime advances by 1ns per reading so that a guest waiting for time to
// pass (a spin on the clock) progresses, deterministically.
func (in *instance) nanotime() int64 {
	in.mono++
	return in.mono
}

// nanosleep advances the virtual clock instead of sleeping: a guest's
// time.Sleep returns at once, deterministically, and never holds the
// server's thread.
func (in *instance) nanosleep(ns int64) {
	if ns > 0 {
		in.mono += ns
	}
}

type randReader struct{ in *instance }

func (r randReader) Read(p []byte) (int, error) {
	r.in.seed()
	n := len(p)
	for len(p) >= 8 {
		binary.LittleEndian.PutUint64(p, r.in.rand.Uint64())
		p = p[8:]
	}
	if len(p) > 0 {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], r.in.rand.Uint64())
		copy(p, b[:])
	}
	return n, nil
}

// pool bounds a module key's instances. slots holds one token per live
// instance (idle or in use); idle holds the instances not in use. A call
// takes an idle instance, or a slot to instantiate one, or waits for
// either; at most maxWaiters wait.
type pool struct {
	m          *module
	slots      chan struct{}
	idle       chan *instance
	waiters    atomic.Int32
	maxWaiters int32
	closed     atomic.Bool
	// refillDone is closed when the background refill in flight (if any) ends.
	refillDone atomic.Pointer[chan struct{}]
	refills    sync.WaitGroup
}

func newPool(m *module, size, maxWaiters int) *pool {
	return &pool{m: m, slots: make(chan struct{}, size), idle: make(chan *instance, size), maxWaiters: int32(maxWaiters)}
}

// put adds a fresh instance (holding no slot yet) to the idle set; it is
// only used for the instance Compile makes.
func (p *pool) put(in *instance) {
	p.slots <- struct{}{}
	p.idle <- in
}

// tryGet returns an idle instance, or nil when none is idle.
func (p *pool) tryGet() *instance {
	if p.closed.Load() {
		return nil
	}
	select {
	case in := <-p.idle:
		return in
	default:
		return nil
	}
}

// get returns an idle instance or a new one.
func (p *pool) get(ctx context.Context) (*instance, error) {
	for {
		if p.closed.Load() {
			return nil, fmt.Errorf("%w: %v (evicted)", ErrModuleNotFound, p.m.key)
		}
		select {
		case in := <-p.idle:
			return in, nil
		default:
		}
		refill := p.refillDone.Load()
		if refill != nil {
			// An instance is on its way: wait for it rather than start another.
			select {
			case in := <-p.idle:
				return in, nil
			case <-*refill:
				continue
			case <-ctx.Done():
				return nil, p.waitErr(ctx)
			}
		}
		select {
		case in := <-p.idle:
			return in, nil
		case p.slots <- struct{}{}:
			return p.instantiate(ctx)
		default:
		}
		if p.waiters.Add(1) > p.maxWaiters {
			p.waiters.Add(-1)
			p.m.rt.stats.busy.Add(1)
			return nil, fmt.Errorf("%w: %v: %d instances in use and %d calls waiting", ErrBusy, p.m.key, cap(p.slots), p.maxWaiters)
		}
		select {
		case in := <-p.idle:
			p.waiters.Add(-1)
			return in, nil
		case p.slots <- struct{}{}:
			p.waiters.Add(-1)
			return p.instantiate(ctx)
		case <-ctx.Done():
			p.waiters.Add(-1)
			return nil, p.waitErr(ctx)
		}
	}
}

func (p *pool) waitErr(ctx context.Context) error {
	p.m.rt.stats.busy.Add(1)
	return fmt.Errorf("%w: %v: no instance free before the deadline: %w", ErrBusy, p.m.key, ctx.Err())
}

func (p *pool) instantiate(ctx context.Context) (*instance, error) {
	in, err := p.m.newInstance(ctx)
	if err != nil {
		<-p.slots
		if ctx.Err() != nil {
			p.m.rt.stats.timeouts.Add(1)
			return nil, fmt.Errorf("%w: instantiating %v: %w", ErrDeadline, p.m.key, ctx.Err())
		}
		return nil, fmt.Errorf("instantiate %v: %w", p.m.key, err)
	}
	return in, nil
}

// refill instantiates one instance in the background after a discard, so
// that the next call finds one ready instead of paying the instantiation
// (a Go guest's runtime start, ~5 ms) inside its deadline. At most one
// refill runs per pool; Evict waits for it.
func (p *pool) refill() {
	if p.closed.Load() || len(p.idle) > 0 {
		return
	}
	done := make(chan struct{})
	if !p.refillDone.CompareAndSwap(nil, &done) {
		return
	}
	select {
	case p.slots <- struct{}{}:
	default:
		p.refillDone.Store(nil)
		close(done)
		return
	}
	p.refills.Add(1)
	go func() {
		defer p.refills.Done()
		defer close(done)
		defer p.refillDone.Store(nil)
		in, err := p.m.newInstance(context.Background())
		if err != nil {
			<-p.slots
			return
		}
		p.idle <- in
		if p.closed.Load() {
			p.drain()
		}
	}()
}

// release returns a healthy instance to the pool.
func (p *pool) release(in *instance) {
	if p.closed.Load() {
		p.discard(in)
		return
	}
	p.idle <- in
	if p.closed.Load() {
		p.drain()
	}
}

// discard closes an instance that trapped, timed out, ran out of memory or
// whose module was evicted, and frees its slot.
func (p *pool) discard(in *instance) {
	in.close()
	<-p.slots
	p.refill()
}

func (p *pool) close() {
	p.closed.Store(true)
	p.drain()
	p.refills.Wait()
	p.drain()
}

func (p *pool) drain() {
	for {
		select {
		case in := <-p.idle:
			p.discard(in)
		default:
			return
		}
	}
}
