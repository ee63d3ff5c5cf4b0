package ordered

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/enginetest"
)

func openMem(t *testing.T, clock *enginetest.Clock) *Engine {
	t.Helper()
	e, err := Open(engines.Options{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return e
}

func rangeKeys(t *testing.T, e *Engine, lo, hi string, reverse bool) string {
	t.Helper()
	var lb, hb []byte
	if lo != "" {
		lb = []byte(lo)
	}
	if hi != "" {
		hb = []byte(hi)
	}
	var got []string
	err := e.Range(lb, hb, reverse, func(r engines.Record) error {
		if string(r.Value) != "v"+string(r.Key) {
			return fmt.Errorf("key %q has value %q", r.Key, r.Value)
		}
		got = append(got, string(r.Key))
		return nil
	})
	if err != nil {
		t.Fatalf("range [%q, %q) reverse %v: %v", lo, hi, reverse, err)
	}
	return strings.Join(got, ",")
}

func TestRange(t *testing.T) {
	clock := enginetest.NewClock()
	e := openMem(t, clock)
	var batch []engines.Mutation
	for _, k := range []string{"d", "a", "c", "b", "e", "ba", "b\x00", "f"} {
		batch = append(batch, engines.Mutation{Key: []byte(k), Value: []byte("v" + k)})
	}
	// An expired record and one about to expire sit inside the ranges.
	batch = append(batch,
		engines.Mutation{Key: []byte("bb"), Value: []byte("vbb"), ExpiresAt: clock.Now()},
		engines.Mutation{Key: []byte("cc"), Value: []byte("vcc"), ExpiresAt: clock.Now() + 10})
	if err := e.Apply(batch); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		lo, hi   string // "" is unbounded
		fwd, rev string
	}{
		{"", "", "a,b,b\x00,ba,c,cc,d,e,f", "f,e,d,cc,c,ba,b\x00,b,a"},
		{"b", "d", "b,b\x00,ba,c,cc", "cc,c,ba,b\x00,b"},
		{"b\x00", "c", "b\x00,ba", "ba,b\x00"},
		{"", "c", "a,b,b\x00,ba", "ba,b\x00,b,a"},
		{"d", "", "d,e,f", "f,e,d"},
		{"bz", "bzz", "", ""},
		{"c", "c", "", ""},
		{"d", "b", "", ""},
		{"g", "", "", ""},
	}
	for _, tc := range tests {
		if got := rangeKeys(t, e, tc.lo, tc.hi, false); got != tc.fwd {
			t.Errorf("range [%q, %q) = %q; want %q", tc.lo, tc.hi, got, tc.fwd)
		}
		if got := rangeKeys(t, e, tc.lo, tc.hi, true); got != tc.rev {
			t.Errorf("reverse range [%q, %q) = %q; want %q", tc.lo, tc.hi, got, tc.rev)
		}
	}
	clock.Advance(10) // cc expires
	if got := rangeKeys(t, e, "c", "d", false); got != "c" {
		t.Errorf("range [c, d) after cc expired = %q; want c", got)
	}
	if got := rangeKeys(t, e, "c", "d", true); got != "c" {
		t.Errorf("reverse range [c, d) after cc expired = %q; want c", got)
	}
}

func TestRangeStopsAndCloses(t *testing.T) {
	clock := enginetest.NewClock()
	e := openMem(t, clock)
	for i := range 10 {
		k := fmt.Sprintf("k%d", i)
		if err := e.Apply([]engines.Mutation{{Key: []byte(k), Value: []byte("v" + k)}}); err != nil {
			t.Fatal(err)
		}
	}
	stop := errors.New("stop")
	for _, reverse := range []bool{false, true} {
		var seen []string
		err := e.Range(nil, nil, reverse, func(r engines.Record) error {
			seen = append(seen, string(r.Key))
			if len(seen) == 3 {
				return stop
			}
			return nil
		})
		want := "k0,k1,k2"
		if reverse {
			want = "k9,k8,k7"
		}
		if !errors.Is(err, stop) || strings.Join(seen, ",") != want {
			t.Fatalf("range reverse %v = %v after %v; want fn's error after %s", reverse, err, seen, want)
		}
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Range(nil, nil, false, func(engines.Record) error { return nil }); !errors.Is(err, engines.ErrClosed) {
		t.Fatalf("range after close: %v; want ErrClosed", err)
	}
}

// TestRangeConcurrentWrites has writers rewrite all keys in one batch each,
// with one version, while readers range over them in both orders. A range
// reads one point-in-time view, so it sees every key once, in order, all
// of one version.
func TestRangeConcurrentWrites(t *testing.T) {
	const keys, writers, readers = 100, 2, 2
	rounds := 300
	if raceEnabled {
		rounds = 60
	}
	e := openMem(t, enginetest.NewClock())
	key := func(i int) []byte { return []byte(fmt.Sprintf("k%03d", i)) }
	write := func(version string) error {
		batch := make([]engines.Mutation, keys)
		for i := range batch {
			batch[i] = engines.Mutation{Key: key(i), Value: []byte(version)}
		}
		return e.Apply(batch)
	}
	if err := write("init"); err != nil {
		t.Fatal(err)
	}
	var (
		wg, rwg sync.WaitGroup
		done    atomic.Bool
		failed  atomic.Pointer[string]
		changed atomic.Int64
	)
	fail := func(format string, args ...any) {
		s := fmt.Sprintf(format, args...)
		failed.CompareAndSwap(nil, &s)
	}
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !done.Load() && failed.Load() == nil; i++ {
				if err := write(fmt.Sprintf("w%d-%d", w, i)); err != nil {
					fail("writer %d: %v", w, err)
				}
			}
		}()
	}
	for r := range readers {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			last := ""
			for i := 0; i < rounds && failed.Load() == nil; i++ {
				reverse := (i+r)%2 == 1
				lo, hi := key(10+i%20), key(60+i%40)
				var prev []byte
				version, n := "", 0
				err := e.Range(lo, hi, reverse, func(rec engines.Record) error {
					if prev != nil && (bytes.Compare(rec.Key, prev) <= 0) != reverse {
						return fmt.Errorf("key %q after %q (reverse %v)", rec.Key, prev, reverse)
					}
					prev = append(prev[:0], rec.Key...)
					if version == "" {
						version = string(rec.Value)
					} else if string(rec.Value) != version {
						return fmt.Errorf("key %q has version %q, the range began at %q", rec.Key, rec.Value, version)
					}
					n++
					return nil
				})
				if err != nil {
					fail("reader %d: %v", r, err)
					return
				}
				if want := 50 + i%40 - i%20; n != want {
					fail("reader %d: range [%s, %s) saw %d keys; want %d", r, lo, hi, n, want)
					return
				}
				if version != last {
					changed.Add(1)
				}
				last = version
			}
		}()
	}
	// Readers stop by count; writers when the readers are done.
	rwg.Wait()
	done.Store(true)
	wg.Wait()
	if s := failed.Load(); s != nil {
		t.Fatal(*s)
	}
	if changed.Load() < 2 {
		t.Fatalf("ranges saw %d versions: the writers did not overlap them", changed.Load())
	}
}
