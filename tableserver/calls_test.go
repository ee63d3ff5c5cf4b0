package tableserver_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/testcluster"
	"github.com/tabuladb/tabula/tableserver"
)

// callOnStream sends req on st and reads its answer (the only call in
// flight), as the unary RPC would return it.
func callOnStream(t *testing.T, st api.TableServer_CallsClient, req *api.CallRequest) (*api.CallResponse, error) {
	t.Helper()
	if err := st.Send(req); err != nil {
		t.Fatalf("send call %d: %v", req.GetId(), err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatalf("receive call %d: %v", req.GetId(), err)
	}
	if resp.GetId() != req.GetId() {
		t.Fatalf("call %d answered as %d", req.GetId(), resp.GetId())
	}
	if len(resp.GetStatus()) == 0 {
		return resp, nil
	}
	var s spb.Status
	if err := proto.Unmarshal(resp.GetStatus(), &s); err != nil {
		t.Fatalf("call %d: status: %v", req.GetId(), err)
	}
	return resp, status.ErrorProto(&s)
}

// sameError fails unless a and b are the same answer: both nil, or the
// same code, reason and message.
func sameError(t *testing.T, what string, unary, streamed error) {
	t.Helper()
	if (unary == nil) != (streamed == nil) {
		t.Fatalf("%s: unary %v, on the stream %v", what, unary, streamed)
	}
	if unary == nil {
		return
	}
	a, b := api.DetailOf(unary), api.DetailOf(streamed)
	if status.Code(unary) != status.Code(streamed) || a.GetCode() != b.GetCode() || a.GetReason() != b.GetReason() ||
		status.Convert(unary).Message() != status.Convert(streamed).Message() {
		t.Fatalf("%s: unary %v (%v), on the stream %v (%v)", what, unary, a, streamed, b)
	}
}

// TestCallsAnswerAsUnary: every kind of call on the Calls stream gets the
// answer its unary RPC gives (replies, and errors with their code, reason
// and message), a bad call fails alone, and the stream carries on.
func TestCallsAnswerAsUnary(t *testing.T) {
	f := newFixture(t, 6)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p0 := f.m.GetPartitions()[0]
	k0, k1 := keyIn(0, 6), keyIn(1, 6)
	s0 := f.server(t, p0)
	if _, err := eventually(t, func() (*api.PutResponse, error) {
		return s0.Put(ctx, &api.PutRequest{Header: hdr(p0), Key: k0, Value: []byte("v0")})
	}); err != nil {
		t.Fatalf("put: %v", err)
	}
	st, err := s0.Calls(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stale := hdr(p0)
	stale.Epoch--
	id := uint64(0)
	next := func() uint64 { id++; return id }

	// Reads: found, absent, not here, stale, no header, and a MultiGet.
	for i, g := range []*api.GetRequest{
		{Header: hdr(p0), Key: k0},
		{Header: hdr(p0), Key: []byte("absent-" + string(k0))},
		{Header: hdr(p0), Key: k1},
		{Header: stale, Key: k0},
		{Key: k0},
	} {
		alone, aerr := s0.Get(ctx, g)
		r, serr := callOnStream(t, st, &api.CallRequest{Id: next(), Call: &api.CallRequest_Get{Get: g}})
		sameError(t, "get", aerr, serr)
		if aerr == nil && !proto.Equal(alone, r.GetGet()) {
			t.Fatalf("get %d: unary %v, on the stream %v", i, alone, r.GetGet())
		}
	}
	mg := &api.MultiGetRequest{Gets: []*api.GetRequest{{Header: hdr(p0), Key: k0}, {Header: stale, Key: k0}}}
	// The stale read's error carries the map version, which a map change
	// between the two calls (a log moving to its next extent) raises:
	// compare a pair taken under one version.
	var alone *api.MultiGetResponse
	var r *api.CallResponse
	var aerr, serr error
	for try := 0; ; try++ {
		alone, aerr = s0.MultiGet(ctx, mg)
		r, serr = callOnStream(t, st, &api.CallRequest{Id: next(), Call: &api.CallRequest_MultiGet{MultiGet: mg}})
		sameError(t, "multiget", aerr, serr)
		if proto.Equal(alone, r.GetMultiGet()) || try == 4 {
			break
		}
	}
	if !proto.Equal(alone, r.GetMultiGet()) {
		t.Fatalf("multiget: unary %v, on the stream %v", alone, r.GetMultiGet())
	}

	// Writes: each applies once and answers as unary; the refusals match.
	r, err = callOnStream(t, st, &api.CallRequest{Id: next(), TimeoutMs: 5000, Call: &api.CallRequest_Put{Put: &api.PutRequest{Header: hdr(p0), Key: k0, Value: []byte("v1"), RequestId: "calls-put-1"}}})
	if err != nil || r.GetPut() == nil {
		t.Fatalf("put on the stream: %v, %v", r, err)
	}
	again, err := s0.Put(ctx, &api.PutRequest{Header: hdr(p0), Key: k0, Value: []byte("v1"), RequestId: "calls-put-1"})
	if err != nil || again.GetLsn() != r.GetPut().GetLsn() {
		t.Fatalf("unary retry of the stream's put: %v, %v; want LSN %d (applied once)", again, err, r.GetPut().GetLsn())
	}
	_, aerr = s0.Put(ctx, &api.PutRequest{Header: stale, Key: k0, Value: []byte("x")})
	_, serr = callOnStream(t, st, &api.CallRequest{Id: next(), Call: &api.CallRequest_Put{Put: &api.PutRequest{Header: stale, Key: k0, Value: []byte("x")}}})
	sameError(t, "stale put", aerr, serr)
	big := make([]byte, 2048) // over the table's MaxValueBytes
	_, aerr = s0.Put(ctx, &api.PutRequest{Header: hdr(p0), Key: k0, Value: big})
	_, serr = callOnStream(t, st, &api.CallRequest{Id: next(), Call: &api.CallRequest_Put{Put: &api.PutRequest{Header: hdr(p0), Key: k0, Value: big}}})
	sameError(t, "oversized put", aerr, serr)

	cas := &api.CompareAndSwapRequest{Header: hdr(p0), Key: k0, ExpectExists: true, Expected: []byte("nope"), Value: []byte("v2")}
	ua, aerr := s0.CompareAndSwap(ctx, cas)
	r, serr = callOnStream(t, st, &api.CallRequest{Id: next(), Call: &api.CallRequest_CompareAndSwap{CompareAndSwap: cas}})
	sameError(t, "cas", aerr, serr)
	if r.GetCompareAndSwap().GetSwapped() || ua.GetSwapped() || string(r.GetCompareAndSwap().GetCurrent()) != "v1" || string(ua.GetCurrent()) != "v1" {
		t.Fatalf("mismatched cas: unary %v, on the stream %v", ua, r.GetCompareAndSwap())
	}
	cas.Expected = []byte("v1")
	r, err = callOnStream(t, st, &api.CallRequest{Id: next(), Call: &api.CallRequest_CompareAndSwap{CompareAndSwap: cas}})
	if err != nil || !r.GetCompareAndSwap().GetSwapped() {
		t.Fatalf("cas on the stream: %v, %v", r, err)
	}
	r, err = callOnStream(t, st, &api.CallRequest{Id: next(), Call: &api.CallRequest_Delete{Delete: &api.DeleteRequest{Header: hdr(p0), Key: k0}}})
	if err != nil || !r.GetDelete().GetExisted() {
		t.Fatalf("delete on the stream: %v, %v", r, err)
	}
	if g, err := s0.Get(ctx, &api.GetRequest{Header: hdr(p0), Key: k0}); err != nil || g.GetFound() {
		t.Fatalf("get after the stream's delete: %v, %v", g, err)
	}

	// A call that carries nothing fails alone; the stream goes on.
	if _, err := callOnStream(t, st, &api.CallRequest{Id: next()}); api.DetailOf(err).GetReason() != "call_missing" {
		t.Fatalf("empty call: %v; want call_missing", err)
	}
	if r, err := callOnStream(t, st, &api.CallRequest{Id: next(), Call: &api.CallRequest_Get{Get: &api.GetRequest{Header: hdr(p0), Key: k0}}}); err != nil || r.GetGet().GetFound() {
		t.Fatalf("get after a bad call: %v, %v", r, err)
	}
	// A call without an id ends the stream with INVALID_ARGUMENT.
	if err := st.Send(&api.CallRequest{Call: &api.CallRequest_Get{Get: &api.GetRequest{Header: hdr(p0), Key: k0}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); api.DetailOf(err).GetReason() != "call_id_missing" {
		t.Fatalf("call with id 0: %v; want the stream ended with call_id_missing", err)
	}
}

// TestCallsRefusedForBytesAnswerAlone: a call on the stream that the size
// guard refuses undecoded (the server's in-flight bytes are taken) is
// answered SERVER_BUSY alone, by its id; the stream and the other calls
// on it go on. (It was read as a call without an id, which ended the
// stream and failed every call on it with INVALID_ARGUMENT.)
func TestCallsRefusedForBytesAnswerAlone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := testcluster.Start(ctx, testcluster.Options{Servers: 1, ServerOptions: func(_ int, o *tableserver.Options) {
		o.MaxInFlightBytes = 1 << 20
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	f := &fixture{c: c, conns: map[string]*grpc.ClientConn{}}
	f.master = api.NewMasterClient(f.dial(t, c.MasterAddr()))
	resp, err := f.master.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: "t", Kind: api.TableKind_TABLE_KIND_POINT,
		Options: &api.TableOptions{Partitions: 1, Replication: 1, MaxValueBytes: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	p := resp.GetMap().GetPartitions()[0]
	s := f.server(t, p)
	if _, err := eventually(t, func() (*api.PutResponse, error) {
		return s.Put(ctx, &api.PutRequest{Header: hdr(p), Key: []byte("boot"), Value: []byte("v")})
	}); err != nil {
		t.Fatalf("put: %v", err)
	}
	st, err := s.Calls(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Puts of 700 KiB sent back to back: while one is in flight, the next
	// does not fit the 1 MiB of requests the server may hold. (Bursts
	// until one is refused: whether one is depends on timing.)
	const n = 8
	ok, busy, id := 0, 0, uint64(0)
	for burst := 0; burst < 20 && busy == 0; burst++ {
		for i := range n {
			put := &api.PutRequest{Header: hdr(p), Key: fmt.Appendf(nil, "big%d", i), Value: make([]byte, 700<<10)}
			id++
			if err := st.Send(&api.CallRequest{Id: id, TimeoutMs: 10000, Call: &api.CallRequest_Put{Put: put}}); err != nil {
				t.Fatalf("send: %v (ok %d, busy %d so far)", err, ok, busy)
			}
		}
		for range n {
			r, err := st.Recv()
			if err != nil {
				t.Fatalf("the stream ended: %v (ok %d, busy %d so far)", err, ok, busy)
			}
			if r.GetId() < id-n+1 || r.GetId() > id {
				t.Fatalf("answer for call %d", r.GetId())
			}
			if len(r.GetStatus()) == 0 {
				ok++
				continue
			}
			var sp spb.Status
			if err := proto.Unmarshal(r.GetStatus(), &sp); err != nil {
				t.Fatal(err)
			}
			if d := api.DetailOf(status.ErrorProto(&sp)); d.GetCode() != api.ErrorCode_ERROR_CODE_SERVER_BUSY || d.GetReason() != "inflight_bytes" {
				t.Fatalf("call %d: %v; want SERVER_BUSY inflight_bytes", r.GetId(), status.ErrorProto(&sp))
			}
			busy++
		}
	}
	if ok == 0 || busy == 0 {
		t.Fatalf("%d puts applied, %d refused for bytes; want some of each", ok, busy)
	}
	r, err := callOnStream(t, st, &api.CallRequest{Id: id + 1, Call: &api.CallRequest_Get{Get: &api.GetRequest{Header: hdr(p), Key: []byte("boot")}}})
	if err != nil || !r.GetGet().GetFound() {
		t.Fatalf("get after the refusals: %v, %v", r, err)
	}
}
