package client_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
)

// tap is a gRPC client interceptor for tests: it records the table-server
// calls and, for the methods named in its rules, sends the request and
// drops the reply (a reply lost in transit) or refuses without sending.
// Safe for concurrent use.
type tap struct {
	mu    sync.Mutex
	calls []tapCall // guarded by mu
	// dropReply: method suffix → how many replies to drop (-1: all).
	dropReply map[string]int // guarded by mu
	// refuse: method suffix → an error returned without sending (all calls).
	refuse map[string]error // guarded by mu
}

type tapCall struct {
	method, target, requestID string
	readAny                   bool
	minLSN                    uint64
	lsn                       uint64 // of the reply, also a dropped one
	dropped                   bool
}

func newTap() *tap { return &tap{dropReply: map[string]int{}, refuse: map[string]error{}} }

func (tp *tap) option() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(tp.intercept)
}

func (tp *tap) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if !strings.HasPrefix(method, "/tabula.v1.TableServer/") {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	name := method[strings.LastIndex(method, "/")+1:]
	c := tapCall{method: name, target: cc.Target()}
	if r, ok := req.(interface{ GetRequestId() string }); ok {
		c.requestID = r.GetRequestId()
	}
	if r, ok := req.(interface{ GetHeader() *api.RequestHeader }); ok {
		c.readAny, c.minLSN = r.GetHeader().GetReadAny(), r.GetHeader().GetMinLsn()
	}
	tp.mu.Lock()
	refuse := tp.refuse[name]
	drop := tp.dropReply[name]
	if drop > 0 {
		tp.dropReply[name] = drop - 1
	}
	tp.mu.Unlock()
	var err error
	if refuse != nil {
		err = refuse
	} else {
		err = invoker(ctx, method, req, reply, cc, opts...)
		if r, ok := reply.(interface{ GetLsn() uint64 }); ok && err == nil {
			c.lsn = r.GetLsn()
		}
		if err == nil && drop != 0 {
			c.dropped = true
			err = status.Error(codes.Unavailable, "test: reply lost in transit")
		}
	}
	tp.mu.Lock()
	tp.calls = append(tp.calls, c)
	tp.mu.Unlock()
	return err
}

func (tp *tap) callsOf(method string) []tapCall {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	var out []tapCall
	for _, c := range tp.calls {
		if c.method == method {
			out = append(out, c)
		}
	}
	return out
}

func (tp *tap) set(f func(tp *tap)) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	f(tp)
}

// replicatedTable starts a 3-server cluster and a client whose table-server
// calls go through tp, and creates a 3-replica table.
func replicatedTable(t *testing.T, tp *tap, retry time.Duration) (*client.Client, *client.Table) {
	t.Helper()
	tc := startCluster(t, 3)
	c, err := client.New(context.Background(), client.Options{Masters: []string{tc.MasterAddr()}, Credential: tc.Credential(), Seed: testSeed,
		RetryTimeout: retry, DialOptions: []grpc.DialOption{tp.option()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	tbl := createTable(t, c, "rep", &api.TableOptions{Partitions: 2, Storage: "memory", Replication: 3})
	return c, tbl
}

// A CAS whose first reply is lost is retried with the same request id and
// reports what the first attempt did: swapped. (Without request ids the
// retry saw its own new value and reported Swapped=false.) The same for a
// Delete: existed=true.
func TestLostReplyRetriedWithSameRequestID(t *testing.T) {
	tp := newTap()
	_, tbl := replicatedTable(t, tp, 10*time.Second)
	ctx := testCtx(t)
	if err := tbl.Put(ctx, []byte("k"), []byte("v1")); err != nil {
		t.Fatal(err)
	}
	tp.set(func(tp *tap) { tp.dropReply["CompareAndSwap"] = 1; tp.dropReply["Delete"] = 1 })

	res, err := tbl.CompareAndSwap(ctx, client.CAS{Key: []byte("k"), Expected: []byte("v1"), Value: []byte("v2")})
	if err != nil {
		t.Fatalf("CAS: %v", err)
	}
	calls := tp.callsOf("CompareAndSwap")
	for len(calls) > 0 && !calls[0].dropped { // refused before the server knew the table
		calls = calls[1:]
	}
	if len(calls) < 2 {
		t.Fatalf("expected a dropped first reply and a retry, got %+v", calls)
	}
	for _, c := range calls {
		if c.requestID == "" || c.requestID != calls[0].requestID {
			t.Fatalf("attempts carry request ids %q and %q: want one, non-empty", calls[0].requestID, c.requestID)
		}
	}
	if !res.Swapped || string(res.Current) != "v1" {
		t.Fatalf("retried CAS answered %+v; want swapped with current v1 (the first attempt's outcome)", res)
	}
	if res.LSN == 0 || res.LSN != calls[0].lsn {
		t.Fatalf("retried CAS LSN %d; the first attempt got %d", res.LSN, calls[0].lsn)
	}

	existed, err := tbl.Delete(ctx, []byte("k"))
	if err != nil {
		t.Fatalf("delete: %v", err)
	}
	if !existed {
		t.Fatalf("retried Delete answered existed=false; the first attempt deleted a present key")
	}
	if d := tp.callsOf("Delete"); len(d) < 2 || d[0].requestID != d[1].requestID || d[0].requestID == "" {
		t.Fatalf("delete attempts %+v", d)
	}
	// Two calls never share an id.
	if tp.callsOf("Put")[0].requestID == calls[0].requestID {
		t.Fatal("two calls sent the same request id")
	}
}

// A write whose every attempt may have applied ends in ErrOutcomeUnknown
// naming its request id; sending it again with WithRequestID returns the
// first outcome. A write the server certainly refused is not "unknown".
func TestOutcomeUnknown(t *testing.T) {
	tp := newTap()
	_, tbl := replicatedTable(t, tp, 400*time.Millisecond)
	ctx := testCtx(t)
	tp.set(func(tp *tap) { tp.dropReply["Put"] = -1 })
	err := tbl.Put(ctx, []byte("k"), []byte("v"))
	if !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("put with every reply lost: %v; want ErrOutcomeUnknown", err)
	}
	var ou *client.OutcomeUnknownError
	if !errors.As(err, &ou) || ou.RequestID == "" || !strings.Contains(err.Error(), ou.RequestID) || !strings.Contains(err.Error(), "WithRequestID") {
		t.Fatalf("error does not name the request id and how to retry: %v", err)
	}
	puts := tp.callsOf("Put")
	if len(puts) < 2 {
		t.Fatalf("put was not retried: %+v", puts)
	}
	for _, c := range puts {
		if c.requestID != ou.RequestID {
			t.Fatalf("attempt with request id %q; the call's is %q", c.requestID, ou.RequestID)
		}
	}

	var applied uint64 // the LSN of the first attempt the server applied
	for _, c := range puts {
		if c.dropped {
			applied = c.lsn
			break
		}
	}
	// Settle it: the same id returns the first outcome (its LSN), applying
	// nothing again.
	tp.set(func(tp *tap) { delete(tp.dropReply, "Put") })
	var lsn uint64
	if err := tbl.Put(ctx, []byte("k"), []byte("v"), client.WithRequestID(ou.RequestID), client.ReportLSN(&lsn)); err != nil {
		t.Fatal(err)
	}
	if applied == 0 || lsn != applied {
		t.Fatalf("retry with the request id got LSN %d; the first applied attempt was LSN %d", lsn, applied)
	}

	// A refusal (the server answered, nothing applied) stays as it is.
	tp.set(func(tp *tap) {
		tp.refuse["Delete"] = api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "log_reconfiguring", "test: retry shortly")
	})
	_, err = tbl.Delete(ctx, []byte("k"))
	if err == nil || errors.Is(err, client.ErrOutcomeUnknown) || api.DetailOf(err).GetReason() != "log_reconfiguring" {
		t.Fatalf("refused delete: %v; want log_reconfiguring, not an unknown outcome", err)
	}
	if err := tbl.Put(ctx, []byte("k"), []byte("v"), client.WithRequestID(strings.Repeat("x", client.MaxRequestIDBytes+1))); api.CodeOf(err) != api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT {
		t.Fatalf("over-long request id: %v", err)
	}
}

// ReadAny reads any replica and reports the LSN it reflects; MinLSN and a
// Session make it see the caller's writes; a replica behind MinLSN is
// skipped for another, then the primary.
func TestReadAnyAndMinLSN(t *testing.T) {
	tp := newTap()
	_, tbl := replicatedTable(t, tp, 2*time.Second)
	ctx := testCtx(t)
	var wrote uint64
	if err := tbl.Put(ctx, []byte("k"), []byte("v"), client.ReportLSN(&wrote)); err != nil {
		t.Fatal(err)
	}
	if wrote == 0 {
		t.Fatal("Put reported LSN 0 on a replicated table")
	}
	targets := map[string]bool{}
	for range 30 {
		var read uint64
		v, err := tbl.Get(ctx, []byte("k"), client.ReadAny(), client.MinLSN(wrote), client.ReportLSN(&read))
		if err != nil {
			t.Fatal(err)
		}
		if string(v) != "v" || read < wrote {
			t.Fatalf("read-any with MinLSN(%d): %q at LSN %d", wrote, v, read)
		}
	}
	for _, c := range tp.callsOf("Get") {
		if !c.readAny || c.minLSN != wrote {
			t.Fatalf("get sent read_any=%v min_lsn=%d", c.readAny, c.minLSN)
		}
		targets[c.target] = true
	}
	if len(targets) < 2 {
		t.Fatalf("30 read-any gets all went to %v; want them spread over the replicas", targets)
	}

	// A session carries the write's LSN to the read.
	s := client.NewSession()
	if err := tbl.Put(ctx, []byte("s"), []byte("1"), s); err != nil {
		t.Fatal(err)
	}
	before := len(tp.callsOf("Get"))
	if v, err := tbl.Get(ctx, []byte("s"), client.ReadAny(), s); err != nil || string(v) != "1" {
		t.Fatalf("session read: %q, %v", v, err)
	}
	if c := tp.callsOf("Get")[before]; c.minLSN == 0 {
		t.Fatal("session read sent no min_lsn")
	}

	// No replica has applied an LSN far ahead: every replica is asked,
	// the primary last, and the call gives up with behind_min_lsn.
	before = len(tp.callsOf("Get"))
	sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, err := tbl.Get(sctx, []byte("k"), client.ReadAny(), client.MinLSN(wrote+1_000_000))
	if api.DetailOf(err).GetReason() != "behind_min_lsn" {
		t.Fatalf("read-any beyond every replica: %v; want behind_min_lsn", err)
	}
	gets := tp.callsOf("Get")[before:]
	asked := map[string]bool{}
	for _, c := range gets[:min(3, len(gets))] {
		asked[c.target] = true
	}
	if len(asked) != 3 {
		t.Fatalf("the first 3 attempts went to %v; want every replica once", asked)
	}
}
