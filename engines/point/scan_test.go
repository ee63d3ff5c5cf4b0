package point

import (
	"fmt"
	"testing"

	"github.com/tabuladb/tabula/engines"
)

// TestScanSeesKeysRewrittenDuringScan: a key that exists for the whole scan
// is reported even when, mid-scan, it is rewritten after another key's slot
// (behind the scan) was freed. The writes come from another goroutine while
// the scan waits, as the Scan contract allows.
func TestScanSeesKeysRewrittenDuringScan(t *testing.T) {
	for _, moveTo := range []string{"freed slot", "new chunk"} {
		t.Run(moveTo, func(t *testing.T) {
			e, err := Open(engines.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			n := 100
			if moveTo == "new chunk" {
				n = memChunkSize // the chunk is full: a fresh slot opens a new one
			}
			for i := 0; i < n; i++ {
				if err := e.Apply([]engines.Mutation{{Key: fmt.Appendf(nil, "k%06d", i), Value: []byte("v1")}}); err != nil {
					t.Fatal(err)
				}
			}
			last := fmt.Sprintf("k%06d", n-1)
			seen := map[string]int{}
			count := 0
			err = e.Scan(func(r engines.Record) error {
				seen[string(r.Key)]++
				if count++; count == n/2 {
					done := make(chan error)
					go func() {
						// Free a slot the scan has passed, then rewrite a key it
						// has not reached yet.
						if _, err := e.Delete([]byte("k000000")); err != nil {
							done <- err
							return
						}
						done <- e.Apply([]engines.Mutation{{Key: []byte(last), Value: []byte("v2")}})
					}()
					return <-done
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if seen[last] != 1 {
				t.Fatalf("%s existed during the whole scan; reported %d times", last, seen[last])
			}
			for k, c := range seen {
				if c != 1 {
					t.Fatalf("%s reported %d times", k, c)
				}
			}
			if len(seen) != n {
				t.Fatalf("scan reported %d keys, want %d", len(seen), n)
			}
		})
	}
}
