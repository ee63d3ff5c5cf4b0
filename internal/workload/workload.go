package workload

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
)

// Options shape the load. Zero values take the defaults given.
type Options struct {
	// Duration of the measured phase. Default 10s.
	Duration time.Duration
	// Concurrency is the number of workers, each with one request in flight.
	// Default 16.
	Concurrency int
	// ReadPercent is the share of Gets; the rest are Puts. 0..100, default 90
	// (set NoReads for a write-only load).
	ReadPercent int
	// NoReads makes the load write-only (ReadPercent 0).
	NoReads bool
	// ValueSize is the size of written values in bytes. Default 100.
	ValueSize int
	// Keys is the number of distinct keys, chosen uniformly. Default 100000.
	Keys int
	// SkipPreload skips writing every key once before measuring.
	SkipPreload bool
	// Seed seeds the workers' random sources. Default 1.
	Seed uint64
}

// Validate says what is wrong with o.
func (o Options) Validate() error {
	var errs []error
	if o.ReadPercent < 0 || o.ReadPercent > 100 {
		errs = append(errs, fmt.Errorf("read percent %d is outside 0..100", o.ReadPercent))
	}
	if o.Concurrency < 0 || o.Concurrency > 4096 {
		errs = append(errs, fmt.Errorf("concurrency %d is outside 1..4096", o.Concurrency))
	}
	if o.ValueSize < 0 || o.ValueSize > api.MaxValueBytesLimit {
		errs = append(errs, fmt.Errorf("value size %d is outside 0..%d", o.ValueSize, api.MaxValueBytesLimit))
	}
	if o.Keys < 0 {
		errs = append(errs, fmt.Errorf("keys %d is negative", o.Keys))
	}
	if o.Duration < 0 {
		errs = append(errs, fmt.Errorf("duration %v is negative", o.Duration))
	}
	return errors.Join(errs...)
}

func (o Options) withDefaults() Options {
	if o.Duration == 0 {
		o.Duration = 10 * time.Second
	}
	if o.Concurrency == 0 {
		o.Concurrency = 16
	}
	if o.NoReads {
		o.ReadPercent = 0
	} else if o.ReadPercent == 0 {
		o.ReadPercent = 90
	}
	if o.ValueSize == 0 {
		o.ValueSize = 100
	}
	if o.Keys == 0 {
		o.Keys = 100000
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	return o
}

// Progress is a running snapshot, reported about once a second.
type Progress struct {
	Phase   string // "preload" or "run"
	Elapsed time.Duration
	Total   time.Duration // run phase length; preload: 0
	// Done counts operations that succeeded (run) or keys written
	// (preload); failed calls are in Errors only.
	Done uint64
	Of   uint64 // preload: keys to write; run: 0
	// Errors counts failed calls so far; TopError is the most common kind
	// of failure (ErrorKind.Kind) and TopErrorCount its count.
	Errors        uint64
	TopError      string
	TopErrorCount uint64
	// Rate is successful operations per second over the last interval.
	Rate float64
}

// ErrorKind is one kind of failure: its code and reason (or, for an error
// without a Tabula code, its text), how many calls failed so, and the
// first such error.
type ErrorKind struct {
	Kind    string
	Count   uint64
	Example error
}

// Result is the measured phase's outcome. Failed calls are counted apart:
// Ops, Reads, Writes, OpsPerSec and the latency quantiles are of calls
// that succeeded (a Get of an absent key succeeds, as a miss); Errors,
// ErrorKinds and ErrorP50/ErrorMax are of those that failed, whose
// instant refusals would otherwise pass for speed.
type Result struct {
	Ops, Reads, Writes, Misses uint64
	Elapsed                    time.Duration
	OpsPerSec                  float64
	P50, P99, P999, Max        time.Duration

	Errors             uint64
	ErrorKinds         []ErrorKind // most common first
	ErrorP50, ErrorMax time.Duration
	// FirstError is the first failed operation's error, if any.
	FirstError error
}

// Key is the workload's i-th key.
func Key(i int) []byte { return fmt.Appendf(nil, "wl-%012d", i) }

// Run preloads (unless told not to) and then runs the load for the duration,
// calling progress about once a second (progress may be nil).
func Run(ctx context.Context, t *client.Table, opts Options, progress func(Progress)) (Result, error) {
	if err := opts.Validate(); err != nil {
		return Result{}, err
	}
	opts = opts.withDefaults()
	value := make([]byte, opts.ValueSize)
	for i := range value {
		value[i] = byte('a' + i%26)
	}
	if !opts.SkipPreload {
		if err := preload(ctx, t, opts, value, progress); err != nil {
			return Result{}, err
		}
	}
	return run(ctx, t, opts, value, progress)
}

func preload(ctx context.Context, t *client.Table, opts Options, value []byte, progress func(Progress)) error {
	const batch = 500
	var done atomic.Uint64
	stop := report(ctx, "preload", 0, uint64(opts.Keys), &done, nil, nil, progress)
	defer stop()
	jobs := make(chan int)
	errc := make(chan error, opts.Concurrency)
	var wg sync.WaitGroup
	for w := 0; w < min(opts.Concurrency, 8); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			muts := make([]client.Mutation, 0, batch)
			for start := range jobs {
				muts = muts[:0]
				for i := start; i < min(start+batch, opts.Keys); i++ {
					muts = append(muts, client.Mutation{Key: Key(i), Value: value})
				}
				if err := t.BatchWrite(ctx, muts); err != nil {
					errc <- fmt.Errorf("preload keys %d..%d: %w", start, start+len(muts)-1, err)
					return
				}
				done.Add(uint64(len(muts)))
			}
		}()
	}
	var err error
feed:
	for start := 0; start < opts.Keys; start += batch {
		select {
		case jobs <- start:
		case err = <-errc:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errc:
		default:
		}
	}
	return err
}

// Latencies are recorded in ns from 1 ns to 1 minute with 3 significant
// digits (0.1% error), about 200 KB per histogram.
const (
	minLatency = 1
	maxLatency = int64(time.Minute)
	sigFigs    = 3
)

type worker struct {
	hist, errHist         *hdrhistogram.Histogram
	reads, writes, misses uint64
	firstErr              error
	// mu guards kinds, which the reporter reads once a second; a worker
	// takes it only when a call fails.
	mu    sync.Mutex
	kinds map[string]*ErrorKind
}

// kindOf names the kind of a failed call: its Tabula code and reason, or
// for an error without one (a context's end), its text.
func kindOf(err error) string {
	if d := api.DetailOf(err); d.GetCode() != api.ErrorCode_ERROR_CODE_UNSPECIFIED {
		return strings.TrimPrefix(d.GetCode().String(), "ERROR_CODE_") + " " + d.GetReason()
	}
	s := err.Error()
	if len(s) > 80 {
		s = s[:80] + "..."
	}
	return s
}

func (wk *worker) failed(err error) {
	if wk.firstErr == nil {
		wk.firstErr = err
	}
	k := kindOf(err)
	wk.mu.Lock()
	if e := wk.kinds[k]; e != nil {
		e.Count++
	} else {
		wk.kinds[k] = &ErrorKind{Kind: k, Count: 1, Example: err}
	}
	wk.mu.Unlock()
}

// errorKinds merges the workers' kinds, most common first.
func errorKinds(workers []*worker) []ErrorKind {
	all := map[string]*ErrorKind{}
	for _, wk := range workers {
		wk.mu.Lock()
		for k, e := range wk.kinds {
			if a := all[k]; a != nil {
				a.Count += e.Count
			} else {
				c := *e
				all[k] = &c
			}
		}
		wk.mu.Unlock()
	}
	out := make([]ErrorKind, 0, len(all))
	for _, e := range all {
		out = append(out, *e)
	}
	slices.SortFunc(out, func(a, b ErrorKind) int {
		if a.Count != b.Count {
			return cmp.Compare(b.Count, a.Count)
		}
		return strings.Compare(a.Kind, b.Kind)
	})
	return out
}

func run(ctx context.Context, t *client.Table, opts Options, value []byte, progress func(Progress)) (Result, error) {
	var ops, errs atomic.Uint64
	// The run ends by the clock, not by runCtx.Err(): a call's own derived
	// deadline can fire a moment before runCtx's timer, and a loop that
	// waited for runCtx would count those instant failures as errors.
	start := time.Now()
	end := start.Add(opts.Duration)
	runCtx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	workers := make([]*worker, opts.Concurrency)
	for w := range workers {
		workers[w] = &worker{hist: hdrhistogram.New(minLatency, maxLatency, sigFigs),
			errHist: hdrhistogram.New(minLatency, maxLatency, sigFigs), kinds: map[string]*ErrorKind{}}
	}
	stop := report(runCtx, "run", opts.Duration, 0, &ops, &errs, func() (string, uint64) {
		if errs.Load() == 0 {
			return "", 0
		}
		if k := errorKinds(workers); len(k) > 0 {
			return k[0].Kind, k[0].Count
		}
		return "", 0
	}, progress)
	var wg sync.WaitGroup
	for w, wk := range workers {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(opts.Seed, seed))
			for runCtx.Err() == nil && time.Now().Before(end) {
				key := Key(r.IntN(opts.Keys))
				read := r.IntN(100) < opts.ReadPercent
				t0 := time.Now()
				var err error
				miss := false
				if read {
					_, err = t.Get(runCtx, key)
					if errors.Is(err, client.ErrKeyNotFound) {
						miss, err = true, nil
					}
				} else {
					err = t.Put(runCtx, key, value)
				}
				if !time.Now().Before(end) || runCtx.Err() != nil {
					break // the run ended mid-call: do not count it
				}
				took := min(int64(time.Since(t0)), maxLatency) // clamped: never out of range
				if err != nil {
					_ = wk.errHist.RecordValue(took)
					wk.failed(err)
					errs.Add(1)
					continue
				}
				_ = wk.hist.RecordValue(took)
				ops.Add(1)
				switch {
				case miss:
					wk.misses++
					wk.reads++
				case read:
					wk.reads++
				default:
					wk.writes++
				}
			}
		}(uint64(w) + 1)
	}
	wg.Wait()
	elapsed := time.Since(start)
	stop()
	var res Result
	all := hdrhistogram.New(minLatency, maxLatency, sigFigs)
	failed := hdrhistogram.New(minLatency, maxLatency, sigFigs)
	for _, wk := range workers {
		all.Merge(wk.hist)
		failed.Merge(wk.errHist)
		res.Reads += wk.reads
		res.Writes += wk.writes
		res.Misses += wk.misses
		if res.FirstError == nil {
			res.FirstError = wk.firstErr
		}
	}
	res.Ops = uint64(all.TotalCount())
	res.Errors = uint64(failed.TotalCount())
	res.ErrorKinds = errorKinds(workers)
	res.Elapsed = elapsed
	res.OpsPerSec = float64(res.Ops) / elapsed.Seconds()
	q := func(p float64) time.Duration { return time.Duration(all.ValueAtQuantile(p)) }
	res.P50, res.P99, res.P999, res.Max = q(50), q(99), q(99.9), time.Duration(all.Max())
	if res.Errors > 0 {
		res.ErrorP50, res.ErrorMax = time.Duration(failed.ValueAtQuantile(50)), time.Duration(failed.Max())
	}
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	return res, nil
}

// report calls progress once a second until stop is called or ctx ends;
// top (may be nil) names the most common error so far.
func report(ctx context.Context, phase string, total time.Duration, of uint64, done, errs *atomic.Uint64, top func() (string, uint64), progress func(Progress)) (stop func()) {
	if progress == nil {
		return func() {}
	}
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		start, last, lastN := time.Now(), time.Now(), uint64(0)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				return
			case <-ctx.Done():
				return
			case now := <-tick.C:
				n := done.Load()
				p := Progress{Phase: phase, Elapsed: now.Sub(start), Total: total, Done: n, Of: of,
					Rate: float64(n-lastN) / now.Sub(last).Seconds()}
				if errs != nil {
					p.Errors = errs.Load()
				}
				if top != nil {
					p.TopError, p.TopErrorCount = top()
				}
				progress(p)
				last, lastN = now, n
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(quit); wg.Wait() }) }
}
