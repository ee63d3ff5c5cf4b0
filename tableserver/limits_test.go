package tableserver_test

import (
	"context"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
)

// TestOversizedRequestRefusedBeforeHandler: a request over its RPC's limit
// is refused with message_too_large naming the limit, before any handler
// check runs (a handler would say key_too_large or batch_too_large), and
// changes nothing.
func TestOversizedRequestRefusedBeforeHandler(t *testing.T) {
	f := newFixture(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p := f.m.GetPartitions()[0]
	s := f.server(t, p)
	if _, err := eventually(t, func() (*api.PutResponse, error) {
		return s.Put(ctx, &api.PutRequest{Header: hdr(p), Key: []byte("before"), Value: []byte("v")})
	}); err != nil {
		t.Fatalf("put: %v", err)
	}
	var srv int
	for i, a := range f.c.ServerAddrs() {
		if a == primary(p).GetAddr() {
			srv = i
		}
	}
	refused := f.c.Server(srv).LimitStats().Refused

	_, err := s.Get(ctx, &api.GetRequest{Header: hdr(p), Key: make([]byte, 100<<10)})
	if d := api.DetailOf(err); d.GetReason() != "message_too_large" || d.GetLimit() != api.SmallRequestBytes {
		t.Fatalf("oversized get: %v", err)
	}
	// A BatchWrite over its limit: the handler would have refused it as
	// batch_too_large after decoding 65 MiB.
	big := &api.BatchWriteRequest{Header: hdr(p), Mutations: []*api.Mutation{
		{Op: api.Mutation_OP_PUT, Key: []byte("a"), Value: []byte("x")},
		{Op: api.Mutation_OP_PUT, Key: []byte("b"), Value: make([]byte, api.BatchWriteRequestBytes)},
	}}
	_, err = s.BatchWrite(ctx, big)
	if d := api.DetailOf(err); d.GetCode() != api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT || d.GetReason() != "message_too_large" || d.GetLimit() != api.BatchWriteRequestBytes {
		t.Fatalf("oversized batch: %v", err)
	}
	for _, k := range []string{"a", "b"} {
		got, err := s.Get(ctx, &api.GetRequest{Header: hdr(p), Key: []byte(k)})
		if err != nil || got.GetFound() {
			t.Fatalf("key %s after a refused batch: %v %v", k, got, err)
		}
	}
	if got, err := s.Get(ctx, &api.GetRequest{Header: hdr(p), Key: []byte("before")}); err != nil || !got.GetFound() {
		t.Fatalf("earlier write: %v %v", got, err)
	}
	if n := f.c.Server(srv).LimitStats().Refused - refused; n != 2 {
		t.Fatalf("server counted %d refusals, want 2", n)
	}
	if b := f.c.Server(srv).LimitStats().InFlightBytes; b != 0 {
		t.Fatalf("%d bytes left in flight", b)
	}
}
