package diskstore

import (
	"testing"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/vfs"
)

// Stores opened with one budget split it: each cache is resized as
// another store opens and closes.
func TestStoresShareCacheBudget(t *testing.T) {
	b, err := engines.NewCacheBudget(8 << 20)
	if err != nil {
		t.Fatal(err)
	}
	open := func(dir string) *Store {
		t.Helper()
		s, err := Open(dir, Options{FS: vfs.NewMem(), SegmentSize: 4096, CacheBudget: b, IndexBlockBytes: -1, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a := open("/a")
	defer a.Close()
	if got := a.cache.c.MaxCost(); got != 8<<20 {
		t.Fatalf("one store's cache: %d bytes, want the whole budget", got)
	}
	c := open("/c")
	if got := a.cache.c.MaxCost(); got != 4<<20 {
		t.Fatalf("with two stores: %d bytes, want half", got)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if got := a.cache.c.MaxCost(); got != 8<<20 {
		t.Fatalf("after the other closed: %d bytes, want the whole budget again", got)
	}
}
