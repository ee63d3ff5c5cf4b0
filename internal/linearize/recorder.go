package linearize

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/tabuladb/tabula/api"
)

// Options configure a Recorder; the zero value works.
type Options struct {
	// Classify reports whether a failed write certainly took no effect (it
	// is then dropped from the history); otherwise its outcome is unknown.
	// Default Definite.
	Classify func(err error) bool
}

// Definite reports whether err certainly means a Tabula write took no
// effect: the request was refused for what it is (INVALID_ARGUMENT,
// WRONG_KIND, UNIMPLEMENTED), which every attempt the SDK made would have
// been too. Anything else — a deadline, UNAVAILABLE, even NOT_OWNER, which
// the SDK may report after an earlier attempt was applied and its reply lost
// — leaves the outcome unknown.
func Definite(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	switch api.CodeOf(err) {
	case api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, api.ErrorCode_ERROR_CODE_WRONG_KIND, api.ErrorCode_ERROR_CODE_UNIMPLEMENTED:
		return true
	}
	return false
}

// Recorder collects the operations of concurrent clients. Safe for
// concurrent use.
type Recorder struct {
	start    time.Time // monotonic origin of every timestamp
	classify func(error) bool

	mu sync.Mutex // guards the fields below
	// ops are the ended operations; unknown ones have Return = -1 until a
	// Check places them at the end of the history.
	ops     []porcupine.Operation
	pending map[*Call]struct{} // begun, not ended
	notes   []porcupine.Annotation
	stats   Stats
}

// Stats counts how the recorded operations ended: Ok with a reply, Unknown
// writes (kept as never returning), and Dropped ones (certain failures, and
// reads without a reply).
type Stats struct {
	Ok, Unknown, Dropped int
}

// NewRecorder starts an empty history; its clock starts now.
func NewRecorder(opts Options) *Recorder {
	if opts.Classify == nil {
		opts.Classify = Definite
	}
	return &Recorder{start: time.Now(), classify: opts.Classify, pending: make(map[*Call]struct{})}
}

// Now is the Recorder's clock: nanoseconds since it was made.
func (r *Recorder) Now() int64 { return int64(time.Since(r.start)) }

// Call is one operation in flight. It belongs to the client that began it.
type Call struct {
	r      *Recorder
	client int
	in     Input
	call   int64
	tag    string
	ended  bool
}

// Tag attaches a label to the operation (shown in the visualisation, and
// passed to CheckWith's relax function). Call it before the call ends.
func (c *Call) Tag(tag string) { c.tag = tag }

// Begin records the call of in by client (a small non-negative number, one
// per concurrent client: porcupine draws one row per client).
func (r *Recorder) Begin(client int, in Input) *Call {
	c := &Call{r: r, client: client, in: in}
	r.mu.Lock()
	defer r.mu.Unlock()
	c.call = r.Now()
	r.pending[c] = struct{}{}
	return c
}

// Ok records the reply out.
func (c *Call) Ok(out Output) {
	out.Unknown = false
	c.end(out, true)
}

// Unknown records that the outcome is not known: a write may or may not
// have taken effect; a read is dropped.
func (c *Call) Unknown() {
	if c.in.Kind == Get {
		c.end(Output{}, false)
		return
	}
	c.end(Output{Unknown: true}, true)
}

// Fail records that the operation certainly took no effect: dropped.
func (c *Call) Fail() { c.end(Output{}, false) }

// Finish ends the call by err: nil is Ok(out); an error the Recorder's
// Classify calls definite is Fail; any other is Unknown.
func (c *Call) Finish(out Output, err error) {
	switch {
	case err == nil:
		c.Ok(out)
	case c.r.classify(err):
		c.Fail()
	default:
		c.Unknown()
	}
}

// end records the call's end; keep says whether it stays in the history.
func (c *Call) end(out Output, keep bool) {
	r := c.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if c.ended {
		panic(fmt.Sprintf("linearize: %v of %q ended twice", c.in.Kind, c.in.Key))
	}
	c.ended = true
	delete(r.pending, c)
	switch {
	case !keep:
		r.stats.Dropped++
		return
	case out.Unknown:
		r.stats.Unknown++
	default:
		r.stats.Ok++
	}
	ret := int64(-1)
	if !out.Unknown {
		ret = r.Now()
	}
	r.ops = append(r.ops, porcupine.Operation{ClientId: c.client, Input: c.in, Call: c.call, Output: out, Return: ret, Metadata: c.tag})
}

// Note records an event for the visualisation (a fault injected, say) from
// now until the returned function is called; tag names its row.
func (r *Recorder) Note(tag, description string) (end func()) {
	start := r.Now()
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.notes = append(r.notes, porcupine.Annotation{Tag: tag, Start: start, End: r.Now(), Description: description})
	}
}

// Stats counts the operations ended so far.
func (r *Recorder) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

// History returns the operations recorded so far, in call order: an
// unknown operation, and one still in flight, returns at the end of the
// history (after every other event).
func (r *Recorder) History() []porcupine.Operation {
	r.mu.Lock()
	defer r.mu.Unlock()
	ops := make([]porcupine.Operation, 0, len(r.ops)+len(r.pending))
	ops = append(ops, r.ops...)
	for c := range r.pending {
		if c.in.Kind != Get {
			ops = append(ops, porcupine.Operation{ClientId: c.client, Input: c.in, Call: c.call, Output: Output{Unknown: true}, Return: -1, Metadata: c.tag})
		}
	}
	end := r.Now() + 1
	for i := range ops {
		if ops[i].Return < 0 {
			ops[i].Return = end
		}
	}
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
	return ops
}

// Result is the outcome of a Check.
type Result struct {
	// Verdict is porcupine.Ok, Illegal, or Unknown (the check timed out).
	Verdict porcupine.CheckResult
	// Ops is the number of operations checked; Keys the number of keys.
	Ops, Keys int
	// BadKeys are the keys whose histories are not linearizable (at most
	// maxBadKeys, in key order), when Verdict is Illegal.
	BadKeys []string

	info  porcupine.LinearizationInfo      // of BadKeys' histories
	byKey map[string][]porcupine.Operation // BadKeys' histories, in call order
}

// maxBadKeys bounds the keys a failed Check reports and draws.
const maxBadKeys = 10

// Check checks the history recorded so far, giving up after timeout (0:
// no limit) with Verdict porcupine.Unknown. When the history is not
// linearizable it finds the keys that are not, for Visualize.
func (r *Recorder) Check(timeout time.Duration) Result {
	return r.check(r.History(), timeout)
}

// CheckWith is Check with some answered writes taken as of unknown outcome:
// those for which relax (given the operation and its Tag) returns true. A
// test uses it to tell a violation that only a known client behaviour
// explains (say, a write retried after its reply was lost) from any other.
func (r *Recorder) CheckWith(timeout time.Duration, relax func(in Input, out Output, tag string) bool) Result {
	ops := r.History()
	var end int64
	for _, o := range ops {
		end = max(end, o.Return)
	}
	for i, o := range ops {
		in, out := o.Input.(Input), o.Output.(Output)
		if in.Kind != Get && !out.Unknown && relax(in, out, o.Metadata.(string)) {
			ops[i].Output, ops[i].Return = Output{Unknown: true}, end
		}
	}
	return r.check(ops, timeout)
}

func (r *Recorder) check(ops []porcupine.Operation, timeout time.Duration) Result {
	m := Model()
	parts := partitionByKey(ops)
	res := Result{Ops: len(ops), Keys: len(parts)}
	res.Verdict = porcupine.CheckOperationsTimeout(m, ops, timeout)
	if res.Verdict != porcupine.Illegal {
		return res
	}
	var bad []porcupine.Operation
	res.byKey = make(map[string][]porcupine.Operation)
	for _, part := range parts {
		if porcupine.CheckOperationsTimeout(m, part, timeout) == porcupine.Illegal {
			k := part[0].Input.(Input).Key
			res.BadKeys = append(res.BadKeys, k)
			res.byKey[k] = part
			bad = append(bad, part...)
			if len(res.BadKeys) == maxBadKeys {
				break
			}
		}
	}
	_, res.info = porcupine.CheckOperationsVerbose(m, bad, timeout)
	r.mu.Lock()
	res.info.AddAnnotations(r.notes)
	r.mu.Unlock()
	return res
}

// Report describes the keys that failed the check, for a test log: per
// key, how far the longest linearization porcupine found got and the state
// it reached, then the key's operations in call order (times in ms since
// the Recorder was made; "?" an unknown outcome), those outside that
// linearization marked "*". At most maxOps operations per key are listed,
// starting a little before the first one marked.
func (res Result) Report(maxOps int) string {
	if res.Verdict != porcupine.Illegal {
		return fmt.Sprintf("verdict %s", res.Verdict)
	}
	type id struct {
		call   int64
		client int
	}
	var b strings.Builder
	m := Model()
	// The info's partitions are the bad keys' histories, in key order.
	for p, partials := range res.info.PartialLinearizationsOperations() {
		if p >= len(res.BadKeys) {
			break
		}
		key := res.BadKeys[p]
		var longest []porcupine.Operation
		for _, l := range partials {
			if len(l) > len(longest) {
				longest = l
			}
		}
		linearized := map[id]bool{}
		state := m.Init()
		for _, o := range longest {
			linearized[id{o.Call, o.ClientId}] = true
			_, state = m.Step(state, o.Input, o.Output)
		}
		ops := res.byKey[key]
		fmt.Fprintf(&b, "key %q: %d of %d operations linearized, reaching %s; no other fits next\n",
			key, len(longest), len(ops), m.DescribeState(state))
		first := len(ops)
		for i, o := range ops {
			if !linearized[id{o.Call, o.ClientId}] {
				first = i
				break
			}
		}
		lo := max(0, first-maxOps/4)
		for _, o := range ops[lo:min(len(ops), lo+maxOps)] {
			mark := " "
			if !linearized[id{o.Call, o.ClientId}] {
				mark = "*"
			}
			ret := fmt.Sprintf("%.1f", float64(o.Return)/1e6)
			if o.Output.(Output).Unknown {
				ret = "?"
			}
			fmt.Fprintf(&b, "  %s client %d [%.1f, %s] %s\n", mark, o.ClientId, float64(o.Call)/1e6, ret, describeOperation(o.Input, o.Output))
		}
	}
	return b.String()
}

// Visualize writes porcupine's HTML view of the keys that failed the check
// (with the recorded notes) to path.
func (res Result) Visualize(path string) error {
	if res.Verdict != porcupine.Illegal {
		return fmt.Errorf("linearize: nothing to visualize: verdict %s", res.Verdict)
	}
	if err := porcupine.VisualizePath(Model(), res.info, path); err != nil {
		return fmt.Errorf("linearize: visualize to %s: %w", path, err)
	}
	return nil
}
