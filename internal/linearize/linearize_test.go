package linearize

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/tabuladb/tabula/api"
)

// op builds one operation of a hand-written history; ret < 0 is unknown.
func op(client int, call, ret int64, in Input, out Output) porcupine.Operation {
	if ret < 0 {
		out.Unknown = true
		ret = 1 << 40
	}
	return porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret}
}

func put(k, v string) Input { return Input{Kind: Put, Key: k, Value: v} }
func get(k string) Input    { return Input{Kind: Get, Key: k} }
func del(k string) Input    { return Input{Kind: Delete, Key: k} }
func cas(k, expected, v string) Input {
	return Input{Kind: CAS, Key: k, Expected: expected, Value: v}
}
func casAbsent(k, v string) Input { return Input{Kind: CAS, Key: k, ExpectAbsent: true, Value: v} }

var (
	ok       = Output{}
	notFound = Output{Found: false}
)

func found(v string) Output { return Output{Found: true, Value: v} }

func TestModel(t *testing.T) {
	tests := []struct {
		name    string
		history []porcupine.Operation
		want    bool
	}{
		{"empty reads absent", []porcupine.Operation{
			op(0, 0, 1, get("k"), notFound),
		}, true},
		{"read own write", []porcupine.Operation{
			op(0, 0, 1, put("k", "a"), ok),
			op(0, 2, 3, get("k"), found("a")),
		}, true},
		{"concurrent put and get may see either", []porcupine.Operation{
			op(0, 0, 1, put("k", "a"), ok),
			op(1, 2, 6, put("k", "b"), ok),
			op(2, 3, 4, get("k"), found("a")),
			op(2, 5, 7, get("k"), found("b")),
		}, true},
		{"stale read", []porcupine.Operation{
			op(0, 0, 1, put("k", "a"), ok),
			op(0, 2, 3, put("k", "b"), ok),
			op(1, 4, 5, get("k"), found("a")),
		}, false},
		{"lost write", []porcupine.Operation{
			op(0, 0, 1, put("k", "a"), ok),
			op(1, 2, 3, get("k"), notFound),
		}, false},
		{"value from nowhere", []porcupine.Operation{
			op(0, 0, 1, get("k"), found("z")),
		}, false},
		{"reads go back in time", []porcupine.Operation{
			op(0, 0, 10, put("k", "a"), ok),
			op(1, 1, 2, get("k"), found("a")),
			op(1, 3, 4, get("k"), notFound),
		}, false},
		{"keys are independent", []porcupine.Operation{
			op(0, 0, 1, put("x", "a"), ok),
			op(1, 2, 3, get("y"), notFound),
			op(1, 4, 5, get("x"), found("a")),
		}, true},
		{"delete reports existence", []porcupine.Operation{
			op(0, 0, 1, put("k", "a"), ok),
			op(0, 2, 3, del("k"), Output{Existed: true}),
			op(0, 4, 5, del("k"), Output{Existed: false}),
			op(0, 6, 7, get("k"), notFound),
		}, true},
		{"delete of an absent key cannot exist", []porcupine.Operation{
			op(0, 0, 1, del("k"), Output{Existed: true}),
		}, false},
		{"cas swaps on a match", []porcupine.Operation{
			op(0, 0, 1, casAbsent("k", "a"), Output{Swapped: true}),
			op(0, 2, 3, cas("k", "a", "b"), Output{Swapped: true, Existed: true}),
			op(0, 4, 5, cas("k", "a", "c"), Output{Existed: true, Current: "b"}),
			op(0, 6, 7, casAbsent("k", "d"), Output{Existed: true, Current: "b"}),
			op(0, 8, 9, Input{Kind: CAS, Key: "k", Expected: "b", SwapDelete: true}, Output{Swapped: true, Existed: true}),
			op(0, 10, 11, get("k"), notFound),
		}, true},
		{"cas must swap on a match", []porcupine.Operation{
			op(0, 0, 1, put("k", "a"), ok),
			op(0, 2, 3, cas("k", "a", "b"), Output{Existed: true, Current: "a"}),
		}, false},
		{"cas reports the wrong current", []porcupine.Operation{
			op(0, 0, 1, put("k", "a"), ok),
			op(0, 2, 3, cas("k", "x", "b"), Output{Existed: true, Current: "q"}),
		}, false},
		// The shape of a CAS retried after its applied first attempt lost
		// its reply: it reports not swapped, seeing its own value.
		{"cas applied but reported not swapped", []porcupine.Operation{
			op(0, 0, 1, put("k", "a"), ok),
			op(0, 2, 5, cas("k", "a", "b"), Output{Existed: true, Current: "b"}),
			op(1, 6, 7, get("k"), found("b")),
		}, false},
		{"unknown write may have happened", []porcupine.Operation{
			op(0, 0, -1, put("k", "a"), ok),
			op(1, 2, 3, get("k"), found("a")),
		}, true},
		{"unknown write may not have happened", []porcupine.Operation{
			op(0, 0, -1, put("k", "a"), ok),
			op(1, 2, 3, get("k"), notFound),
		}, true},
		{"unknown write happens at most once", []porcupine.Operation{
			op(0, 0, -1, put("k", "a"), ok),
			op(1, 2, 3, get("k"), found("a")),
			op(1, 4, 5, put("k", "b"), ok),
			op(1, 6, 7, get("k"), found("a")),
		}, false},
		{"unknown write cannot happen before its call", []porcupine.Operation{
			op(1, 0, 1, get("k"), found("a")),
			op(0, 2, -1, put("k", "a"), ok),
		}, false},
		{"unknown cas applies only on a match", []porcupine.Operation{
			op(0, 0, 1, put("k", "a"), ok),
			op(0, 2, -1, cas("k", "x", "b"), ok),
			op(1, 3, 4, get("k"), found("b")),
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := porcupine.CheckOperations(Model(), tt.history); got != tt.want {
				t.Fatalf("linearizable = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestDefinite(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{api.InvalidArgument("key", "key_empty", 0, "empty key"), true},
		{fmt.Errorf("client: put: %w", api.Errorf(api.ErrorCode_ERROR_CODE_WRONG_KIND, "wrong_kind", "bulk")), true},
		{api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "down", "down"), false},
		{api.Errorf(api.ErrorCode_ERROR_CODE_NOT_OWNER, "not_owner", "moved"), false},
		{fmt.Errorf("gave up (%w); last error: %w", context.DeadlineExceeded, api.InvalidArgument("k", "r", 0, "x")), false},
		{context.Canceled, false},
		{fmt.Errorf("plain"), false},
	}
	for _, tt := range tests {
		if got := Definite(tt.err); got != tt.want {
			t.Errorf("Definite(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// TestRecorderEnds checks what each way of ending a call leaves in the
// history.
func TestRecorderEnds(t *testing.T) {
	r := NewRecorder(Options{})
	r.Begin(0, put("k", "a")).Ok(ok)
	r.Begin(0, put("k", "b")).Fail()
	r.Begin(0, put("k", "c")).Unknown()
	r.Begin(0, get("k")).Unknown()
	r.Begin(0, put("k", "d")).Finish(ok, api.InvalidArgument("value", "value_too_large", 1, "big"))
	r.Begin(0, put("k", "e")).Finish(ok, api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "down", "down"))
	inflight := r.Begin(1, put("k", "f"))
	r.Begin(0, get("k")).Finish(found("a"), nil)
	if s := r.Stats(); s != (Stats{Ok: 2, Unknown: 2, Dropped: 3}) {
		t.Fatalf("stats %+v", s)
	}
	h := r.History()
	var got []string
	var last int64
	for _, o := range h {
		got = append(got, describeOperation(o.Input, o.Output))
		last = max(last, o.Call)
	}
	want := []string{`put("k", "a") -> ok`, `put("k", "c") -> ?`, `put("k", "e") -> ?`, `put("k", "f") -> ?`, `get("k") -> "a"`}
	if strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Fatalf("history\n got %q\nwant %q", got, want)
	}
	for _, o := range h {
		if o.Output.(Output).Unknown && o.Return <= last {
			t.Fatalf("unknown %v returns at %d, before the last call at %d", o.Input, o.Return, last)
		}
	}
	if res := r.Check(time.Minute); res.Verdict != porcupine.Ok || res.Keys != 1 || res.Ops != 5 {
		t.Fatalf("check: %+v", res)
	}
	inflight.Ok(ok)
	defer func() {
		if recover() == nil {
			t.Fatal("a call ended twice did not panic")
		}
	}()
	inflight.Fail()
}

// TestRecorderFindsViolation records a lost write and a stale read on two
// keys among clean ones: Check names exactly those keys and draws them.
func TestRecorderFindsViolation(t *testing.T) {
	r := NewRecorder(Options{})
	end := r.Note("nemesis", "kill -9 server 3")
	for i := 0; i < 20; i++ {
		k := fmt.Sprintf("clean-%d", i)
		r.Begin(0, put(k, "v")).Ok(ok)
		r.Begin(1, get(k)).Ok(found("v"))
	}
	r.Begin(0, put("lost", "v")).Ok(ok)
	r.Begin(1, get("lost")).Ok(notFound)
	r.Begin(0, put("stale", "1")).Ok(ok)
	r.Begin(0, put("stale", "2")).Ok(ok)
	r.Begin(1, get("stale")).Ok(found("1"))
	r.Begin(0, put("relaxed", "1")).Ok(ok)
	c := r.Begin(0, del("relaxed"))
	c.Tag("relax")
	c.Ok(Output{Existed: false}) // a retried delete's answer
	end()
	res := r.Check(time.Minute)
	if res.Verdict != porcupine.Illegal {
		t.Fatalf("verdict %v", res.Verdict)
	}
	if strings.Join(res.BadKeys, ",") != "lost,relaxed,stale" {
		t.Fatalf("bad keys %v", res.BadKeys)
	}
	rep := res.Report(10)
	t.Logf("report:\n%s", rep)
	for _, want := range []string{
		`key "lost": 1 of 2 operations linearized, reaching "v"`,
		`* client 1 [`,
		`get("lost") -> not found`,
		`key "stale": 2 of 3 operations linearized, reaching "2"`,
	} {
		if !strings.Contains(rep, want) {
			t.Fatalf("report lacks %q:\n%s", want, rep)
		}
	}
	path := filepath.Join(t.TempDir(), "history.html")
	if err := res.Visualize(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`get(\"lost\") -\u003e not found`, "kill -9 server 3"} {
		if !strings.Contains(string(b), want) {
			t.Fatalf("visualisation lacks %q", want)
		}
	}
	// Relaxing the stale read leaves the lost write.
	relaxed := r.CheckWith(time.Minute, func(in Input, out Output, tag string) bool { return tag == "relax" })
	if relaxed.Verdict != porcupine.Illegal || strings.Join(relaxed.BadKeys, ",") != "lost,stale" {
		t.Fatalf("relaxed: verdict %v, bad keys %v", relaxed.Verdict, relaxed.BadKeys)
	}
	if err := (Result{Verdict: porcupine.Ok}).Visualize(path); err == nil {
		t.Fatal("Visualize of a passing result succeeded")
	}
}

// lockedMap is a linearizable store: one mutex around a map.
type lockedMap struct {
	mu sync.Mutex
	m  map[string]string
}

func (s *lockedMap) apply(in Input) Output {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, present := s.m[in.Key]
	switch in.Kind {
	case Get:
		return Output{Found: present, Value: v}
	case Put:
		s.m[in.Key] = in.Value
		return Output{}
	case Delete:
		delete(s.m, in.Key)
		return Output{Existed: present}
	}
	match := !present
	if !in.ExpectAbsent {
		match = present && v == in.Expected
	}
	if !match {
		return Output{Existed: present, Current: v}
	}
	if in.SwapDelete {
		delete(s.m, in.Key)
	} else {
		s.m[in.Key] = in.Value
	}
	return Output{Swapped: true, Existed: present}
}

// TestRecorderConcurrent runs clients against a linearizable store, some
// replies lost (Unknown) after the store applied them: the history passes.
// With a store that loses writes, it fails. Run with -race.
func TestRecorderConcurrent(t *testing.T) {
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			s := &lockedMap{m: map[string]string{}}
			r := NewRecorder(Options{})
			var wg sync.WaitGroup
			for c := 0; c < 8; c++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(seed, uint64(c)))
					for i := 0; i < 300; i++ {
						k := fmt.Sprintf("k%d", rng.IntN(5))
						v := fmt.Sprintf("c%d-%d", c, i)
						var in Input
						switch rng.IntN(4) {
						case 0:
							in = get(k)
						case 1:
							in = put(k, v)
						case 2:
							in = del(k)
						default:
							in = cas(k, fmt.Sprintf("c%d-%d", rng.IntN(8), rng.IntN(max(i, 1))), v)
							if rng.IntN(3) == 0 {
								in = casAbsent(k, v)
							}
						}
						call := r.Begin(c, in)
						if broken && in.Kind == Put && rng.IntN(5) == 0 {
							call.Ok(Output{}) // acknowledged, never applied
							continue
						}
						out := s.apply(in)
						if rng.IntN(20) == 0 {
							call.Unknown()
						} else {
							call.Ok(out)
						}
					}
				}()
			}
			wg.Wait()
			res := r.Check(time.Minute)
			if want := map[bool]porcupine.CheckResult{false: porcupine.Ok, true: porcupine.Illegal}[broken]; res.Verdict != want {
				t.Fatalf("verdict %v, want %v (bad keys %v)", res.Verdict, want, res.BadKeys)
			}
		})
	}
}
