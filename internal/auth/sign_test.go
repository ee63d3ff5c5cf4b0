package auth

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/tabuladb/tabula/api"
)

type benchKeys struct{ key []byte }

func (k benchKeys) Key(principal string, keyID int) []byte { return k.key }
func (benchKeys) Refresh(context.Context, string) bool     { return false }

// BenchmarkSignVerify is the signing cost of one Get: the client's
// signature and the server's check, replay cache included.
func BenchmarkSignVerify(b *testing.B) {
	key := NewKey()
	c := Credential{Principal: "acme", KeyID: 1, Key: key}
	v := NewVerifier(VerifierOptions{Keys: benchKeys{key}})
	req := &api.GetRequest{Header: &api.RequestHeader{Tenant: "acme", Table: "t", PartitionId: 7, Epoch: 3}, Key: []byte("some-key-0001")}
	const method = "/tabula.v1.TableServer/Get"
	b.ReportAllocs()
	for b.Loop() {
		kv, err := c.Sign(method, req, time.Now())
		if err != nil {
			b.Fatal(err)
		}
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(kv...))
		if _, err := v.authenticate(ctx, method, req); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzAuthHeader: whatever a caller puts in the tabula-auth entry, the
// check refuses it without panicking unless it is a valid signature of
// this request (which random input never is).
func FuzzAuthHeader(f *testing.F) {
	key := NewKey()
	c := Credential{Principal: "acme", KeyID: 1, Key: key}
	req := &api.GetRequest{Header: &api.RequestHeader{Tenant: "acme", Table: "t"}, Key: []byte("k")}
	const method = "/tabula.v1.TableServer/Get"
	kv, err := c.Sign(method, req, time.Now())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(kv[1])
	f.Add("acme 1 0 AAAAAAAAAAAAAAAA AAAA")
	f.Add("    ")
	f.Add("_cluster 0 1 x y")
	f.Fuzz(func(t *testing.T, value string) {
		v := NewVerifier(VerifierOptions{Keys: benchKeys{key}})
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(MDAuth, value))
		_, err := v.authenticate(ctx, method, req)
		if err == nil && value != kv[1] {
			t.Fatalf("accepted %q", value)
		}
	})
}
