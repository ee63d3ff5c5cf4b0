package enginetest

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/engines"
)

// OpenFunc opens a fresh, empty engine with opts (which carries the suite's
// clock).
type OpenFunc func(t *testing.T, opts engines.Options) engines.Engine

// Start is the fake clock's first reading, Unix milliseconds (2023-11-14).
const Start = int64(1_700_000_000_000)

// Clock is a fake clock for Options.Now, safe for concurrent use.
type Clock struct{ ms atomic.Int64 }

// NewClock returns a clock reading Start.
func NewClock() *Clock {
	c := &Clock{}
	c.ms.Store(Start)
	return c
}

// Now reads the clock.
func (c *Clock) Now() int64 { return c.ms.Load() }

// Advance moves the clock forward by ms.
func (c *Clock) Advance(ms int64) { c.ms.Add(ms) }

// Seed returns the seed for a randomised test: TABULA_SEED if set, else a
// random one. It logs it either way.
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

type env struct {
	t     *testing.T
	e     engines.Engine
	w     engines.Writer // nil for read-only engines
	clock *Clock
}

func newEnv(t *testing.T, open OpenFunc) *env {
	clock := NewClock()
	e := open(t, engines.Options{Now: clock.Now})
	t.Cleanup(func() {
		if err := e.Close(); err != nil && !errors.Is(err, engines.ErrClosed) {
			t.Errorf("close: %v", err)
		}
	})
	w, _ := e.(engines.Writer)
	return &env{t: t, e: e, w: w, clock: clock}
}

// Run runs the suite against the engines open makes.
func Run(t *testing.T, open OpenFunc) {
	probe := newEnv(t, open)
	writer := probe.w != nil
	if err := probe.e.Close(); err != nil {
		t.Fatalf("close probe engine: %v", err)
	}
	readOnly := []struct {
		name string
		fn   func(*env)
	}{
		{"GetMissing", testGetMissing},
		{"ScanEmpty", testScanEmpty},
		{"Close", testClose},
	}
	for _, tc := range readOnly {
		t.Run(tc.name, func(t *testing.T) { tc.fn(newEnv(t, open)) })
	}
	if !writer {
		t.Log("engine is not an engines.Writer: ran the read-only subset")
		return
	}
	writes := []struct {
		name string
		fn   func(*env)
	}{
		{"PutGetDelete", testPutGetDelete},
		{"Overwrite", testOverwrite},
		{"EmptyValue", testEmptyValue},
		{"ValuesAreCopies", testCopies},
		{"ApplyBatch", testApplyBatch},
		{"ApplyAllOrNothing", testApplyAllOrNothing},
		{"CompareAndSwap", testCAS},
		{"TTL", testTTL},
		{"ScanOnce", testScanOnce},
		{"ScanStops", testScanStops},
		{"Stats", testStats},
		{"ClosedWrites", testClosedWrites},
		{"BatchGet", testBatchGet},
		{"ConcurrentReadWrite", testConcurrentReadWrite},
		{"ConcurrentBatches", testConcurrentBatches},
		{"ConcurrentCAS", testConcurrentCAS},
		{"Model", testModel},
	}
	for _, tc := range writes {
		t.Run(tc.name, func(t *testing.T) { tc.fn(newEnv(t, open)) })
	}
}

func (v *env) put(key, value string) {
	v.t.Helper()
	if err := v.w.Apply([]engines.Mutation{{Key: []byte(key), Value: []byte(value)}}); err != nil {
		v.t.Fatalf("put %q: %v", key, err)
	}
}

// want checks that key holds value, or is absent if value is nil.
func (v *env) want(key string, value []byte) {
	v.t.Helper()
	got, _, err := v.e.Get([]byte(key))
	switch {
	case value == nil && errors.Is(err, engines.ErrNotFound):
	case value == nil:
		v.t.Fatalf("get %q = %q, %v; want ErrNotFound", key, got, err)
	case err != nil:
		v.t.Fatalf("get %q: %v; want %q", key, err, value)
	case !bytes.Equal(got, value):
		v.t.Fatalf("get %q = %q; want %q", key, got, value)
	}
}

func (v *env) scan() map[string]string {
	v.t.Helper()
	out := map[string]string{}
	err := v.e.Scan(func(r engines.Record) error {
		if _, dup := out[string(r.Key)]; dup {
			return fmt.Errorf("key %q seen twice", r.Key)
		}
		out[string(r.Key)] = string(r.Value)
		return nil
	})
	if err != nil {
		v.t.Fatalf("scan: %v", err)
	}
	return out
}

func testGetMissing(v *env) {
	if _, _, err := v.e.Get([]byte("absent")); !errors.Is(err, engines.ErrNotFound) {
		v.t.Fatalf("get of an absent key: %v, want ErrNotFound", err)
	}
}

func testScanEmpty(v *env) {
	if got := v.scan(); len(got) != 0 {
		v.t.Fatalf("scan of an empty engine saw %d records", len(got))
	}
}

func testClose(v *env) {
	if err := v.e.Close(); err != nil {
		v.t.Fatalf("close: %v", err)
	}
	if err := v.e.Close(); err != nil && !errors.Is(err, engines.ErrClosed) {
		v.t.Fatalf("second close: %v, want nil or ErrClosed", err)
	}
	if _, _, err := v.e.Get([]byte("k")); !errors.Is(err, engines.ErrClosed) {
		v.t.Fatalf("get after close: %v, want ErrClosed", err)
	}
	if err := v.e.Scan(func(engines.Record) error { return nil }); !errors.Is(err, engines.ErrClosed) {
		v.t.Fatalf("scan after close: %v, want ErrClosed", err)
	}
	_ = v.e.Stats() // must not panic
}

func testClosedWrites(v *env) {
	v.put("k", "v")
	if err := v.e.Close(); err != nil {
		v.t.Fatalf("close: %v", err)
	}
	if err := v.w.Apply([]engines.Mutation{{Key: []byte("k"), Value: []byte("x")}}); !errors.Is(err, engines.ErrClosed) {
		v.t.Fatalf("apply after close: %v, want ErrClosed", err)
	}
	if _, err := v.w.Delete([]byte("k")); !errors.Is(err, engines.ErrClosed) {
		v.t.Fatalf("delete after close: %v, want ErrClosed", err)
	}
	if _, err := v.w.CompareAndSwap(engines.CAS{Key: []byte("k")}); !errors.Is(err, engines.ErrClosed) {
		v.t.Fatalf("compare and swap after close: %v, want ErrClosed", err)
	}
	if bg, ok := v.e.(engines.BatchGetter); ok {
		keys := [][]byte{[]byte("k")}
		err := bg.GetBatch(keys, make([][]byte, 1), make([]int64, 1), make([]bool, 1))
		if !errors.Is(err, engines.ErrClosed) {
			v.t.Fatalf("get batch after close: %v, want ErrClosed", err)
		}
	}
}

func testPutGetDelete(v *env) {
	v.want("a", nil)
	v.put("a", "1")
	v.put("b", "2")
	v.want("a", []byte("1"))
	v.want("b", []byte("2"))
	existed, err := v.w.Delete([]byte("a"))
	if err != nil || !existed {
		v.t.Fatalf("delete a = %v, %v; want true, nil", existed, err)
	}
	v.want("a", nil)
	v.want("b", []byte("2"))
	existed, err = v.w.Delete([]byte("a"))
	if err != nil || existed {
		v.t.Fatalf("second delete a = %v, %v; want false, nil", existed, err)
	}
	v.put("a", "3")
	v.want("a", []byte("3"))
}

func testOverwrite(v *env) {
	for i := range 100 {
		v.put("k", strings.Repeat("x", i%13)+strconv.Itoa(i))
	}
	v.want("k", []byte(strings.Repeat("x", 99%13)+"99"))
	if got := v.scan(); len(got) != 1 {
		v.t.Fatalf("scan after 100 overwrites of one key saw %d records", len(got))
	}
}

func testEmptyValue(v *env) {
	v.put("empty", "")
	got, exp, err := v.e.Get([]byte("empty"))
	if err != nil || len(got) != 0 || exp != 0 {
		v.t.Fatalf("get of an empty value = %q, %d, %v; want empty, 0, nil", got, exp, err)
	}
	if got := v.scan(); len(got) != 1 || got["empty"] != "" {
		v.t.Fatalf("scan = %v; want the empty value", got)
	}
	existed, err := v.w.Delete([]byte("empty"))
	if err != nil || !existed {
		v.t.Fatalf("delete of an empty value = %v, %v; want true", existed, err)
	}
	v.want("empty", nil)
}

func testCopies(v *env) {
	val := []byte("value")
	key := []byte("key")
	if err := v.w.Apply([]engines.Mutation{{Key: key, Value: val}}); err != nil {
		v.t.Fatal(err)
	}
	val[0], key[0] = 'X', 'X' // the engine must have copied both
	v.want("key", []byte("value"))
	got, _, _ := v.e.Get([]byte("key"))
	got[0] = 'Y' // and hand out a copy
	v.want("key", []byte("value"))
}

func testApplyBatch(v *env) {
	v.put("gone", "x")
	batch := []engines.Mutation{
		{Key: []byte("a"), Value: []byte("1")},
		{Key: []byte("b"), Value: []byte("2")},
		{Key: []byte("gone"), Delete: true},
		{Key: []byte("a"), Value: []byte("1b")}, // last write of a key wins
		{Key: []byte("c"), Value: []byte("3")},
		{Key: []byte("c"), Delete: true},
	}
	if err := v.w.Apply(batch); err != nil {
		v.t.Fatalf("apply: %v", err)
	}
	v.want("a", []byte("1b"))
	v.want("b", []byte("2"))
	v.want("c", nil)
	v.want("gone", nil)
	if err := v.w.Apply(nil); err != nil {
		v.t.Fatalf("apply of an empty batch: %v", err)
	}
}

// testApplyAllOrNothing applies a batch with an empty key in it. An engine
// may reject empty keys (then nothing may change) or accept them (then
// everything must apply).
func testApplyAllOrNothing(v *env) {
	v.put("a", "old")
	batch := []engines.Mutation{
		{Key: []byte("a"), Value: []byte("new")},
		{Key: []byte("b"), Value: []byte("new")},
		{Key: []byte{}, Value: []byte("empty key")},
	}
	if err := v.w.Apply(batch); err != nil {
		v.t.Logf("batch with an empty key rejected: %v", err)
		v.want("a", []byte("old"))
		v.want("b", nil)
		return
	}
	v.t.Log("batch with an empty key accepted")
	v.want("a", []byte("new"))
	v.want("b", []byte("new"))
	v.want("", []byte("empty key"))
}

func testCAS(v *env) {
	cas := func(c engines.CAS, swapped, existed bool, current string) {
		v.t.Helper()
		res, err := v.w.CompareAndSwap(c)
		if err != nil {
			v.t.Fatalf("CAS %+v: %v", c, err)
		}
		if res.Swapped != swapped || res.Existed != existed || (existed && string(res.Current) != current) {
			v.t.Fatalf("CAS %+v = %+v (current %q); want swapped %v existed %v current %q",
				c, res, res.Current, swapped, existed, current)
		}
	}
	k := []byte("k")
	put := func(s string) engines.Mutation { return engines.Mutation{Value: []byte(s)} }
	del := engines.Mutation{Delete: true}

	// Expect absent, install a put: swaps when absent, not when present.
	cas(engines.CAS{Key: k, New: put("1")}, true, false, "")
	v.want("k", []byte("1"))
	cas(engines.CAS{Key: k, New: put("2")}, false, true, "1")
	v.want("k", []byte("1"))
	// Expect a value, install a put: swaps on the exact value only.
	cas(engines.CAS{Key: k, ExpectExists: true, ExpectedValue: []byte("x"), New: put("2")}, false, true, "1")
	cas(engines.CAS{Key: k, ExpectExists: true, ExpectedValue: []byte("1"), New: put("2")}, true, true, "1")
	v.want("k", []byte("2"))
	// Expect a value, install a delete.
	cas(engines.CAS{Key: k, ExpectExists: true, ExpectedValue: []byte("1"), New: del}, false, true, "2")
	cas(engines.CAS{Key: k, ExpectExists: true, ExpectedValue: []byte("2"), New: del}, true, true, "2")
	v.want("k", nil)
	// Expect a value of an absent key: no swap.
	cas(engines.CAS{Key: k, ExpectExists: true, ExpectedValue: []byte("2"), New: put("3")}, false, false, "")
	v.want("k", nil)
	// Expect absent, install a delete: swaps when absent (a no-op), not when present.
	cas(engines.CAS{Key: k, New: del}, true, false, "")
	v.want("k", nil)
	v.put("k", "4")
	cas(engines.CAS{Key: k, New: del}, false, true, "4")
	v.want("k", []byte("4"))
	// An empty value is present and differs from absence.
	v.put("e", "")
	cas(engines.CAS{Key: []byte("e"), New: put("x")}, false, true, "")
	cas(engines.CAS{Key: []byte("e"), ExpectExists: true, ExpectedValue: []byte{}, New: put("y")}, true, true, "")
	v.want("e", []byte("y"))
	// New.ExpiresAt is installed.
	cas(engines.CAS{Key: []byte("t"), New: engines.Mutation{Value: []byte("v"), ExpiresAt: Start + 10}}, true, false, "")
	if _, exp, err := v.e.Get([]byte("t")); err != nil || exp != Start+10 {
		v.t.Fatalf("get after CAS with expiry = %d, %v; want %d", exp, err, Start+10)
	}
}

func testTTL(v *env) {
	now := v.clock.Now()
	err := v.w.Apply([]engines.Mutation{
		{Key: []byte("short"), Value: []byte("s"), ExpiresAt: now + 100},
		{Key: []byte("long"), Value: []byte("l"), ExpiresAt: now + 10_000},
		{Key: []byte("never"), Value: []byte("n")},
	})
	if err != nil {
		v.t.Fatal(err)
	}
	if _, exp, err := v.e.Get([]byte("short")); err != nil || exp != now+100 {
		v.t.Fatalf("get short = %d, %v; want expiry %d", exp, err, now+100)
	}
	v.clock.Advance(99)
	v.want("short", []byte("s"))
	v.clock.Advance(1) // ExpiresAt <= Now: gone
	v.want("short", nil)
	v.want("long", []byte("l"))
	if got := v.scan(); len(got) != 2 || got["long"] != "l" || got["never"] != "n" {
		v.t.Fatalf("scan after expiry = %v; want long and never only", got)
	}
	// An expired key counts as absent for CAS and Delete.
	v.clock.Advance(10_000)
	res, err := v.w.CompareAndSwap(engines.CAS{Key: []byte("long"), New: engines.Mutation{Value: []byte("again")}})
	if err != nil || !res.Swapped || res.Existed {
		v.t.Fatalf("CAS expect-absent over an expired key = %+v, %v; want swapped, not existed", res, err)
	}
	v.want("long", []byte("again"))
	if err := v.w.Apply([]engines.Mutation{{Key: []byte("d"), Value: []byte("v"), ExpiresAt: v.clock.Now() + 1}}); err != nil {
		v.t.Fatal(err)
	}
	v.clock.Advance(1)
	if existed, err := v.w.Delete([]byte("d")); err != nil || existed {
		v.t.Fatalf("delete of an expired key = %v, %v; want false", existed, err)
	}
	// Overwriting an expired key brings it back.
	v.put("short", "s2")
	v.want("short", []byte("s2"))
	v.want("never", []byte("n"))
}

func testScanOnce(v *env) {
	const n = 5000
	want := map[string]string{}
	batch := make([]engines.Mutation, 0, 100)
	for i := range n {
		k, val := fmt.Sprintf("key-%05d", i), fmt.Sprintf("v%d", i*i)
		want[k] = val
		batch = append(batch, engines.Mutation{Key: []byte(k), Value: []byte(val)})
		if len(batch) == cap(batch) {
			if err := v.w.Apply(batch); err != nil {
				v.t.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	// Churn some: overwrite a tenth, delete a tenth.
	for i := 0; i < n; i += 10 {
		k := fmt.Sprintf("key-%05d", i)
		v.put(k, "over")
		want[k] = "over"
		d := fmt.Sprintf("key-%05d", i+5)
		if _, err := v.w.Delete([]byte(d)); err != nil {
			v.t.Fatal(err)
		}
		delete(want, d)
	}
	got := v.scan() // fails on a duplicate
	if len(got) != len(want) {
		v.t.Fatalf("scan saw %d records, want %d", len(got), len(want))
	}
	for k, val := range want {
		if got[k] != val {
			v.t.Fatalf("scan: %q = %q, want %q", k, got[k], val)
		}
	}
}

func testScanStops(v *env) {
	for i := range 10 {
		v.put(strconv.Itoa(i), "v")
	}
	checkScanStops(v)
}

// checkScanStops: a Scan of an engine holding 10 records stops at fn's
// first error and returns it.
func checkScanStops(v *env) {
	stop := errors.New("stop")
	calls := 0
	err := v.e.Scan(func(engines.Record) error {
		calls++
		if calls == 3 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || calls != 3 {
		v.t.Fatalf("scan returned %v after %d calls; want fn's error after 3", err, calls)
	}
}

func testStats(v *env) {
	s0 := v.e.Stats()
	if s0.Keys != 0 || s0.Bytes != 0 {
		v.t.Fatalf("stats of an empty engine: %+v", s0)
	}
	v.put("ab", "cde")     // 5 bytes
	v.put("fgh", "")       // 3 bytes
	v.put("ab", "xyzwvut") // overwrite: 9 bytes
	v.want("ab", []byte("xyzwvut"))
	v.want("nope", nil)
	s := v.e.Stats()
	if s.Keys != 2 || s.Bytes != 12 {
		v.t.Fatalf("stats after 2 keys of 12 bytes: %+v", s)
	}
	if s.Writes < 3 || s.Reads < 2 {
		v.t.Fatalf("stats count %d writes and %d reads; want at least 3 and 2", s.Writes, s.Reads)
	}
	if _, err := v.w.Delete([]byte("ab")); err != nil {
		v.t.Fatal(err)
	}
	if s := v.e.Stats(); s.Keys != 1 || s.Bytes != 3 {
		v.t.Fatalf("stats after delete: %+v; want 1 key of 3 bytes", s)
	}
	// Reserved keys (request outcomes and the like) count in Keys and,
	// apart, in ReservedKeys: clients' keys are the difference.
	r1, r2 := api.ReservedKeyPrefix+"req/1", api.ReservedKeyPrefix+"req/2"
	v.put(r1, "x")
	v.put(r2, "y")
	v.put(r1, "z") // an overwrite is not a new key
	if s := v.e.Stats(); s.Keys != 3 || s.ReservedKeys != 2 {
		v.t.Fatalf("stats with 2 reserved keys: %d keys, %d reserved; want 3 and 2", s.Keys, s.ReservedKeys)
	}
	if _, err := v.w.Delete([]byte(r2)); err != nil {
		v.t.Fatal(err)
	}
	if s := v.e.Stats(); s.Keys != 2 || s.ReservedKeys != 1 {
		v.t.Fatalf("stats after deleting a reserved key: %d keys, %d reserved; want 2 and 1", s.Keys, s.ReservedKeys)
	}
}

func testBatchGet(v *env) {
	bg, ok := v.e.(engines.BatchGetter)
	if !ok {
		v.t.Skip("engine is not an engines.BatchGetter")
	}
	v.put("a", "1")
	v.put("c", "")
	keys := [][]byte{[]byte("a"), []byte("b"), []byte("c"), []byte("a")}
	vals, exps, found := make([][]byte, 4), make([]int64, 4), make([]bool, 4)
	if err := bg.GetBatch(keys, vals, exps, found); err != nil {
		v.t.Fatal(err)
	}
	want := []struct {
		v     string
		found bool
	}{{"1", true}, {"", false}, {"", true}, {"1", true}}
	for i, w := range want {
		if found[i] != w.found || string(vals[i]) != w.v {
			v.t.Fatalf("GetBatch[%d] = %q, %v; want %q, %v", i, vals[i], found[i], w.v, w.found)
		}
	}
}

// ops scales the concurrent tests: the race detector makes each operation
// ~10x slower, and the suite should stay a few seconds under -race.
const ops = 3000

// testConcurrentReadWrite has writers put, overwrite and delete a small set
// of keys while readers get and scan them. Every value names its key, so a
// reader can tell a torn or misrouted record.
func testConcurrentReadWrite(v *env) {
	const keys, writers, readers = 64, 3, 3
	key := func(i int) []byte { return []byte(fmt.Sprintf("k%02d", i%keys)) }
	var wg sync.WaitGroup
	var failed atomic.Pointer[string]
	fail := func(format string, args ...any) {
		s := fmt.Sprintf(format, args...)
		failed.CompareAndSwap(nil, &s)
	}
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < ops && failed.Load() == nil; i++ {
				k := key(i*7 + w)
				var err error
				switch i % 5 {
				case 4:
					_, err = v.w.Delete(k)
				default:
					val := fmt.Sprintf("%s|w%d|%d|%s", k, w, i, strings.Repeat("p", i%50))
					err = v.w.Apply([]engines.Mutation{{Key: k, Value: []byte(val)}})
				}
				if err != nil {
					fail("writer %d: %v", w, err)
				}
			}
		}()
	}
	for r := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < ops && failed.Load() == nil; i++ {
				if r == 0 && i%100 == 0 {
					err := v.e.Scan(func(rec engines.Record) error {
						if !bytes.HasPrefix(rec.Value, append(bytes.Clone(rec.Key), '|')) {
							return fmt.Errorf("scan: key %q has value %q", rec.Key, rec.Value)
						}
						return nil
					})
					if err != nil {
						fail("%v", err)
					}
					continue
				}
				k := key(i*13 + r)
				val, _, err := v.e.Get(k)
				if errors.Is(err, engines.ErrNotFound) {
					continue
				}
				if err != nil || !bytes.HasPrefix(val, append(k, '|')) {
					fail("reader: get %q = %q, %v", k, val, err)
				}
			}
		}()
	}
	wg.Wait()
	if s := failed.Load(); s != nil {
		v.t.Fatal(*s)
	}
}

// testConcurrentBatches has writers apply batches over the same keys, each
// writing one version to all of them. A batch is one unit with respect to
// other writers, so at the end every key holds the same version.
func testConcurrentBatches(v *env) {
	const writers, keys = 4, 8
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			batch := make([]engines.Mutation, keys)
			for i := range ops / 10 {
				val := []byte(fmt.Sprintf("w%d-%d", w, i))
				// Each writer orders its keys differently: a batch must not
				// depend on key order to be atomic (nor deadlock on it).
				for j := range batch {
					batch[j] = engines.Mutation{Key: []byte(fmt.Sprintf("k%d", (j+w)%keys)), Value: val}
				}
				if err := v.w.Apply(batch); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		v.t.Fatal(err)
	}
	first, _, err := v.e.Get([]byte("k0"))
	if err != nil {
		v.t.Fatal(err)
	}
	for j := 1; j < keys; j++ {
		v.want(fmt.Sprintf("k%d", j), first)
	}
}

// testConcurrentCAS increments a counter from several goroutines with CAS
// loops; no increment may be lost.
func testConcurrentCAS(v *env) {
	const workers = 4
	per := ops / 30
	k := []byte("counter")
	v.put("counter", "0")
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for done := 0; done < per; {
				cur, _, err := v.e.Get(k)
				if err != nil {
					errs <- err
					return
				}
				n, _ := strconv.Atoi(string(cur))
				res, err := v.w.CompareAndSwap(engines.CAS{
					Key: k, ExpectExists: true, ExpectedValue: cur,
					New: engines.Mutation{Value: []byte(strconv.Itoa(n + 1))},
				})
				if err != nil {
					errs <- err
					return
				}
				if res.Swapped {
					done++
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		v.t.Fatal(err)
	}
	v.want("counter", []byte(strconv.Itoa(workers*per)))
}

type modelRec struct {
	value string
	exp   int64
}

// testModel runs random operations against the engine and a map and
// compares every answer.
func testModel(v *env) {
	rng := rand.New(rand.NewPCG(Seed(v.t), 0x7ab))
	model := map[string]modelRec{}
	live := func(k string) (modelRec, bool) {
		r, ok := model[k]
		if ok && r.exp > 0 && r.exp <= v.clock.Now() {
			return modelRec{}, false
		}
		return r, ok
	}
	randKey := func() string { return fmt.Sprintf("key%d", rng.IntN(300)) }
	randVal := func() string { return strings.Repeat(string(rune('a'+rng.IntN(26))), rng.IntN(40)) }
	randExp := func() int64 {
		if rng.IntN(4) == 0 {
			return v.clock.Now() + int64(1+rng.IntN(50))
		}
		return 0
	}
	n := 20 * ops
	if testing.Short() { // the race run: a fifth, still every kind of step
		n /= 5
	}
	for i := range n {
		switch op := rng.IntN(100); {
		case op < 30: // batch of 1-4 mutations
			batch := make([]engines.Mutation, 1+rng.IntN(4))
			for j := range batch {
				if rng.IntN(5) == 0 {
					batch[j] = engines.Mutation{Key: []byte(randKey()), Delete: true}
				} else {
					batch[j] = engines.Mutation{Key: []byte(randKey()), Value: []byte(randVal()), ExpiresAt: randExp()}
				}
			}
			if err := v.w.Apply(batch); err != nil {
				v.t.Fatalf("op %d: apply: %v", i, err)
			}
			for _, m := range batch {
				if m.Delete {
					delete(model, string(m.Key))
				} else {
					model[string(m.Key)] = modelRec{string(m.Value), m.ExpiresAt}
				}
			}
		case op < 40:
			k := randKey()
			_, want := live(k)
			existed, err := v.w.Delete([]byte(k))
			if err != nil || existed != want {
				v.t.Fatalf("op %d: delete %q = %v, %v; model %v", i, k, existed, err, want)
			}
			delete(model, k)
		case op < 55:
			k := randKey()
			cur, exists := live(k)
			c := engines.CAS{Key: []byte(k), ExpectExists: rng.IntN(2) == 0}
			if c.ExpectExists {
				c.ExpectedValue = []byte(cur.value)
				if rng.IntN(3) == 0 {
					c.ExpectedValue = []byte(randVal())
				}
			}
			if rng.IntN(4) == 0 {
				c.New = engines.Mutation{Delete: true}
			} else {
				c.New = engines.Mutation{Value: []byte(randVal()), ExpiresAt: randExp()}
			}
			res, err := v.w.CompareAndSwap(c)
			if err != nil {
				v.t.Fatalf("op %d: CAS: %v", i, err)
			}
			want := exists == c.ExpectExists && (!exists || cur.value == string(c.ExpectedValue))
			if res.Swapped != want || res.Existed != exists || (exists && string(res.Current) != cur.value) {
				v.t.Fatalf("op %d: CAS %q = %+v; model exists %v value %q, want swapped %v", i, k, res, exists, cur.value, want)
			}
			if want {
				if c.New.Delete {
					delete(model, k)
				} else {
					model[k] = modelRec{string(c.New.Value), c.New.ExpiresAt}
				}
			}
		case op < 60:
			v.clock.Advance(int64(rng.IntN(20)))
		case op < 61:
			got := v.scan()
			want := map[string]string{}
			for k := range model {
				if r, ok := live(k); ok {
					want[k] = r.value
				}
			}
			if len(got) != len(want) {
				v.t.Fatalf("op %d: scan saw %d records, model has %d", i, len(got), len(want))
			}
			for k, val := range want {
				if g, ok := got[k]; !ok || g != val {
					v.t.Fatalf("op %d: scan %q = %q, %v; model %q", i, k, g, ok, val)
				}
			}
		default:
			k := randKey()
			r, ok := live(k)
			val, exp, err := v.e.Get([]byte(k))
			switch {
			case !ok && !errors.Is(err, engines.ErrNotFound):
				v.t.Fatalf("op %d: get %q = %q, %v; model absent", i, k, val, err)
			case ok && (err != nil || string(val) != r.value || exp != r.exp):
				v.t.Fatalf("op %d: get %q = %q (exp %d), %v; model %q (exp %d)", i, k, val, exp, err, r.value, r.exp)
			}
		}
	}
	nlive := 0
	for k := range model {
		if _, ok := live(k); ok {
			nlive++
		}
	}
	if s := v.e.Stats(); s.Keys < uint64(nlive) {
		v.t.Fatalf("stats count %d keys; at least %d are live", s.Keys, nlive)
	}
}
