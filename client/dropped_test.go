package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/testcluster"
)

// TestTableDroppedByAnotherClient: calls on a table another client dropped
// fail promptly with NOT_FOUND, whether or not this client's watch has seen
// the drop yet.
func TestTableDroppedByAnotherClient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := testcluster.Start(ctx, testcluster.Options{Servers: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mk := func() *client.Client {
		cl, err := client.New(ctx, client.Options{Masters: []string{c.MasterAddr()}, Credential: c.Credential(), RetryTimeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cl.Close() })
		return cl
	}
	c1, c2 := mk(), mk()
	for _, name := range []string{"right-away", "later"} {
		if _, err := c1.CreateTable(ctx, name, api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Replication: 1}); err != nil {
			t.Fatal(err)
		}
		// c1 holds the map CreateTable returned; its first use comes after
		// the drop.
		if err := c2.DropTable(ctx, name); err != nil {
			t.Fatal(err)
		}
		if name == "later" {
			// Let the servers see the drop first.
			deadline := time.Now().Add(5 * time.Second)
			for time.Now().Before(deadline) {
				if ts, _ := c1.ListTables(ctx); len(ts) == 0 {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			time.Sleep(200 * time.Millisecond)
		}
		for i := 0; i < 2; i++ {
			t0 := time.Now()
			err := c1.Table(name).Put(ctx, []byte("k"), []byte("v"))
			if api.CodeOf(err) != api.ErrorCode_ERROR_CODE_NOT_FOUND {
				t.Fatalf("%s: put %d to a dropped table: %v", name, i, err)
			}
			if el := time.Since(t0); el > 3*time.Second {
				t.Fatalf("%s: put %d took %v to report NOT_FOUND", name, i, el)
			}
		}
	}
}
