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
