package tableserver_test

import (
	"context"
	"testing"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tabuladb/tabula/api"
)

// TestMultiGet: every get of a MultiGet is answered as it would be alone,
// its error (code, reason, details) included, and one get's error does
// not fail the others; a MultiGet over the key limit is refused whole.
func TestMultiGet(t *testing.T) {
	f := newFixture(t, 6)
	ctx := context.Background()
	p0 := f.m.GetPartitions()[0]
	k0 := keyIn(0, 6)
	s0 := f.server(t, p0)
	if _, err := eventually(t, func() (*api.PutResponse, error) {
		return s0.Put(ctx, &api.PutRequest{Header: hdr(p0), Key: k0, Value: []byte("v0")})
	}); err != nil {
		t.Fatalf("put: %v", err)
	}
	stale := hdr(p0)
	stale.Epoch--
	gets := []*api.GetRequest{
		{Header: hdr(p0), Key: k0},
		{Header: stale, Key: k0},
		{Header: hdr(p0), Key: keyIn(1, 6)},
		{Header: hdr(p0), Key: []byte("absent-" + string(k0))},
		{Key: k0},
	}
	resp, err := s0.MultiGet(ctx, &api.MultiGetRequest{Gets: gets})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetResults()) != len(gets) {
		t.Fatalf("%d results for %d gets", len(resp.GetResults()), len(gets))
	}
	for i, g := range gets {
		alone, aerr := s0.Get(ctx, g)
		r := resp.GetResults()[i]
		var merr error
		if len(r.GetStatus()) > 0 {
			var st spb.Status
			if err := proto.Unmarshal(r.GetStatus(), &st); err != nil {
				t.Fatalf("get %d: status: %v", i, err)
			}
			merr = status.ErrorProto(&st)
		}
		if (aerr == nil) != (merr == nil) {
			t.Fatalf("get %d: alone %v, in a MultiGet %v", i, aerr, merr)
		}
		if aerr != nil {
			a, m := api.DetailOf(aerr), api.DetailOf(merr)
			if status.Code(aerr) != status.Code(merr) || a.GetCode() != m.GetCode() || a.GetReason() != m.GetReason() || status.Convert(aerr).Message() != status.Convert(merr).Message() {
				t.Fatalf("get %d: alone %v (%v), in a MultiGet %v (%v)", i, aerr, a, merr, m)
			}
			continue
		}
		if alone.GetFound() != r.GetResponse().GetFound() || string(alone.GetValue()) != string(r.GetResponse().GetValue()) {
			t.Fatalf("get %d: alone %v, in a MultiGet %v", i, alone, r.GetResponse())
		}
	}
	if !resp.GetResults()[0].GetResponse().GetFound() || resp.GetResults()[3].GetResponse().GetFound() {
		t.Fatalf("results %v", resp.GetResults())
	}
	_, err = s0.MultiGet(ctx, &api.MultiGetRequest{Gets: make([]*api.GetRequest, api.MaxBatchKeys+1)})
	if d := api.DetailOf(err); d.GetReason() != "batch_too_large" {
		t.Fatalf("MultiGet over the limit: %v", err)
	}
}
