package coproc_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tabuladb/tabula/coproc"
	"github.com/tabuladb/tabula/engines"
)

func hostileRuntime(t *testing.T, opts coproc.Options) (*coproc.Runtime, coproc.ModuleKey) {
	r := newRuntime(t, opts)
	k := key("hostile")
	compile(t, r, k, hostile)
	return r, k
}

// TestRunawayStoppedAtDeadline: a guest looping forever is stopped within
// 5 ms of its deadline, also when the host forces a garbage collection
// across the deadline.
func TestRunawayStoppedAtDeadline(t *testing.T) {
	r, k := hostileRuntime(t, coproc.Options{})
	p := primary(newEngine(t))
	for _, gc := range []bool{false, true} {
		for _, method := range []string{"spin", "spin_host"} {
			t.Run(fmt.Sprintf("%s/gc=%v", method, gc), func(t *testing.T) {
				measure := func(spin func(deadline time.Time), warm func()) (p50, worst time.Duration) {
					var lates []time.Duration
					for i := 0; i < 10; i++ {
						warm()
						deadline := time.Now().Add(20 * time.Millisecond)
						var wg sync.WaitGroup
						if gc {
							// Force a collection that spans the deadline.
							wg.Add(1)
							go func() {
								defer wg.Done()
								time.Sleep(time.Until(deadline) - 2*time.Millisecond)
								runtime.GC()
							}()
						}
						spin(deadline)
						lates = append(lates, time.Since(deadline))
						wg.Wait()
					}
					slices.Sort(lates)
					return lates[5], lates[9]
				}
				// Warm an instance first: this measures the stop, not an
				// instantiation inside the deadline.
				warm := func() {
					if _, err := r.Call(context.Background(), k, "ok", coproc.CallRequest{Partition: p}); err != nil {
						t.Fatal(err)
					}
				}
				guest := func(deadline time.Time) {
					_, err := r.Call(context.Background(), k, method, coproc.CallRequest{Partition: p, Deadline: deadline})
					if !errors.Is(err, coproc.ErrDeadline) || !errors.Is(err, context.DeadlineExceeded) {
						t.Fatalf("%s: %v", method, err)
					}
				}
				// The machine's own floor: a Go loop stopped by the same
				// kind of deadline.
				native := func(deadline time.Time) {
					ctx, cancel := context.WithDeadline(context.Background(), deadline)
					defer cancel()
					for ctx.Err() == nil {
						for i := 0; i < 100; i++ {
							spinSink += uint64(i)
						}
					}
				}
				// The test machine is shared (2 cores, often loaded), so a
				// measurement that fails is repeated, and the limits are on
				// top of the machine's own floor measured alongside (how
				// late a native Go loop stops): the median must be within
				// 5 ms of it and no call may run on unbounded.
				const limit, bound = 5 * time.Millisecond, 50 * time.Millisecond
				for attempt := 1; ; attempt++ {
					p50, worst := measure(guest, warm)
					b50, bworst := measure(native, func() {})
					t.Logf("%s gc=%v: stopped after the deadline by p50 %v, worst %v (a native Go loop: %v, %v)", method, gc, p50, worst, b50, bworst)
					if p50 <= limit+b50 && worst <= bound+bworst || raceEnabled {
						break
					}
					if attempt == 3 {
						if b50 > limit || bworst > bound {
							t.Skipf("machine overloaded: a native Go loop stops p50 %v, worst %v late", b50, bworst)
						}
						t.Fatalf("stopped p50 %v, worst %v after the deadline, limit %v", p50, worst, limit)
					}
				}
			})
		}
	}
	// The module still serves, on fresh instances.
	res, err := r.Call(context.Background(), k, "ok", coproc.CallRequest{Partition: p})
	if err != nil || string(res.Output) != "ok" {
		t.Fatalf("after: %q %v", res.Output, err)
	}
	if s := r.Stats(); s.Timeouts < 40 || s.InstancesDiscarded < 40 {
		t.Fatalf("stats %+v", s)
	}
}

func TestMemoryBomb(t *testing.T) {
	r, k := hostileRuntime(t, coproc.Options{MemoryLimitPages: 256}) // 16 MiB
	p := primary(newEngine(t))
	start := time.Now()
	_, err := r.Call(context.Background(), k, "membomb", coproc.CallRequest{Partition: p, Deadline: time.Now().Add(10 * time.Second)})
	if !errors.Is(err, coproc.ErrMemoryLimit) {
		t.Fatalf("membomb: %v", err)
	}
	t.Logf("membomb stopped after %v: %v", time.Since(start), err)
	if s := r.Stats(); s.MemoryLimits != 1 || s.InstancesDiscarded != 1 {
		t.Fatalf("stats %+v", s)
	}
	if res, err := r.Call(context.Background(), k, "ok", coproc.CallRequest{Partition: p}); err != nil || string(res.Output) != "ok" {
		t.Fatalf("after: %v", err)
	}
}

func TestHostileCallsFailClearly(t *testing.T) {
	r, k := hostileRuntime(t, coproc.Options{MaxOutputBytes: 8 << 20})
	e := newEngine(t)
	p := primary(e)
	ctx := context.Background()
	for _, tc := range []struct {
		method string
		want   error
		text   string
	}{
		{"bigout", coproc.ErrOutputTooLarge, "more than 8388608 bytes"},
		{"badptr", coproc.ErrGuestFault, "outside guest memory"},
		{"badlen", coproc.ErrGuestFault, "outside guest memory"},
		{"put_then_trap", coproc.ErrGuestFault, "outside guest memory"},
		{"put_then_spin", coproc.ErrDeadline, ""},
		{"exit", coproc.ErrTrap, "hostile: exiting"},
		{"panic", coproc.ErrGuestFailed, "panic: boom"},
	} {
		// Warm an instance, so that the deadline measures the guest only.
		if _, err := r.Call(ctx, k, "ok", coproc.CallRequest{Partition: p}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		if tc.want == coproc.ErrDeadline {
			deadline = time.Now().Add(100 * time.Millisecond)
		}
		res, err := r.Call(ctx, k, tc.method, coproc.CallRequest{Partition: p, Deadline: deadline})
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%s: got %v, want %v containing %q", tc.method, err, tc.want, tc.text)
		}
		if res.Writes != 0 {
			t.Errorf("%s: %d writes", tc.method, res.Writes)
		}
	}
	for _, k := range []string{"trap-key", "spin-key"} {
		if _, _, err := e.Get([]byte(k)); !errors.Is(err, engines.ErrNotFound) {
			t.Errorf("%s: a failed call's write applied: %v", k, err)
		}
	}
	// Sleeping an hour takes no time: the guest's clock is virtual.
	start := time.Now()
	res, err := r.Call(ctx, k, "sleep", coproc.CallRequest{Partition: p})
	if err != nil || !strings.HasPrefix(string(res.Output), "1h0m0") || time.Since(start) > time.Second {
		t.Errorf("sleep: %q %v after %v", res.Output, err, time.Since(start))
	}
	// Log spam is rate-limited: 2000 lines, at most the burst get through.
	before := r.Stats().LogLinesDropped
	if _, err := r.Call(ctx, k, "logspam", coproc.CallRequest{Partition: p}); err != nil {
		t.Fatal(err)
	}
	if dropped := r.Stats().LogLinesDropped - before; dropped < 1900 {
		t.Errorf("dropped %d log lines of 2000", dropped)
	}
}

// TestServerServesDuringHostileCalls: plain engine Gets keep their latency
// while hostile guests spin, bomb memory and flood output.
func TestServerServesDuringHostileCalls(t *testing.T) {
	if testing.Short() {
		t.Skip("slow")
	}
	r, k := hostileRuntime(t, coproc.Options{MemoryLimitPages: 256})
	e := newEngine(t)
	var batch []engines.Mutation
	for i := 0; i < 10000; i++ {
		batch = append(batch, engines.Mutation{Key: []byte(fmt.Sprintf("key%d", i)), Value: []byte("value")})
	}
	if err := e.(engines.Writer).Apply(batch); err != nil {
		t.Fatal(err)
	}
	p := primary(e)
	measure := func(d time.Duration) (p50, p99 time.Duration) {
		var lat []time.Duration
		for end := time.Now().Add(d); time.Now().Before(end); {
			start := time.Now()
			if _, _, err := e.Get([]byte(fmt.Sprintf("key%d", len(lat)%10000))); err != nil {
				t.Error(err)
				return
			}
			lat = append(lat, time.Since(start))
			time.Sleep(100 * time.Microsecond) // a request rate, not a busy loop
		}
		slices.Sort(lat)
		return lat[len(lat)/2], lat[len(lat)*99/100]
	}
	b50, b99 := measure(300 * time.Millisecond)

	var stop atomic.Bool
	var wg sync.WaitGroup
	for _, method := range []string{"spin", "membomb", "bigout"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				_, err := r.Call(context.Background(), k, method, coproc.CallRequest{Partition: p, Deadline: time.Now().Add(50 * time.Millisecond)})
				if err == nil {
					t.Errorf("%s succeeded", method)
				}
			}
		}()
	}
	d50, d99 := measure(time.Second)
	for i := 0; i < 2 && d99 > 10*time.Millisecond; i++ {
		d50, d99 = measure(time.Second) // a shared machine: measure again
	}
	stop.Store(true)
	wg.Wait()
	a50, a99 := measure(300 * time.Millisecond)
	t.Logf("plain Get p50/p99: before %v/%v, during hostile calls %v/%v, after %v/%v", b50, b99, d50, d99, a50, a99)
	// Two cores shared with three runaway guests: a Get may wait for a
	// scheduling slice, never for a guest to finish (50 ms).
	if limit := 10 * time.Millisecond; d99 > limit && !raceEnabled {
		t.Fatalf("p99 during hostile calls %v over %v", d99, limit)
	}
	if res, err := r.Call(context.Background(), k, "ok", coproc.CallRequest{Partition: p}); err != nil || string(res.Output) != "ok" {
		t.Fatalf("after: %v", err)
	}
	t.Logf("stats %+v", r.Stats())
}

var spinSink uint64

// TestCallerCancelStopsGuest: a caller that gives up (a client cancelling
// its request) stops the guest long before the call's own deadline.
func TestCallerCancelStopsGuest(t *testing.T) {
	r, k := hostileRuntime(t, coproc.Options{})
	p := primary(newEngine(t))
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	_, err := r.Call(ctx, k, "spin", coproc.CallRequest{Partition: p, Deadline: time.Now().Add(10 * time.Second)})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("spin with its caller cancelled: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the guest ran %v after its caller cancelled at 50ms", took)
	}
	if res, err := r.Call(context.Background(), k, "ok", coproc.CallRequest{Partition: p}); err != nil || string(res.Output) != "ok" {
		t.Fatalf("after: %v", err)
	}
}
