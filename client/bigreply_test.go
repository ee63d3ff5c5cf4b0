package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/testcluster"
)

// TestBatchGetReplyTooLarge: a BatchGet whose values would not fit one reply
// fails at once with INVALID_ARGUMENT naming the limit, instead of being
// retried as if the server were busy.
func TestBatchGetReplyTooLarge(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := testcluster.Start(ctx, testcluster.Options{Servers: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := client.New(ctx, client.Options{Masters: []string{c.MasterAddr()}, Credential: c.Credential(), RetryTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.CreateTable(ctx, "t", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Replication: 1, Partitions: 1, MaxValueBytes: 40 << 20}); err != nil {
		t.Fatal(err)
	}
	tb := cl.Table("t")
	v := make([]byte, 40<<20)
	for _, k := range []string{"a", "b"} {
		if err := tb.Put(ctx, []byte(k), v); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Now()
	_, err = tb.BatchGet(ctx, [][]byte{[]byte("a"), []byte("b")})
	d := api.DetailOf(err)
	if d.GetCode() != api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT || d.GetReason() != "reply_too_large" || d.GetLimit() != api.MaxBatchBytes {
		t.Fatalf("BatchGet of 80 MiB: %v (code %v, reason %q)", err, d.GetCode(), d.GetReason())
	}
	if el := time.Since(t0); el > 5*time.Second {
		t.Fatalf("refusal took %v: it was retried", el)
	}
	// One key at a time still works.
	if got, err := tb.Get(ctx, []byte("a")); err != nil || len(got) != len(v) {
		t.Fatalf("Get: %d bytes, %v", len(got), err)
	}
}
