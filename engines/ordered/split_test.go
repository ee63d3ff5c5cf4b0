package ordered

import (
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/enginetest"
)

func splitHarness(root func(t *testing.T) string, storage string) enginetest.SplitHarness {
	var n atomic.Int64
	h := enginetest.SplitHarness{
		Open: func(t *testing.T, opts engines.Options) engines.Engine {
			t.Helper()
			opts.Storage = storage
			e, err := Open(opts)
			if err != nil {
				t.Fatal(err)
			}
			return e
		},
	}
	if root != nil {
		h.NewDir = func(t *testing.T) string { return filepath.Join(root(t), fmt.Sprintf("p%d", n.Add(1))) }
	}
	return h
}

func TestSplitConformanceMemory(t *testing.T) {
	enginetest.RunSplit(t, splitHarness(nil, StorageMemory))
}

func TestSplitConformanceSSD(t *testing.T) {
	enginetest.RunSplit(t, splitHarness(func(t *testing.T) string { return t.TempDir() }, StorageSSD))
}
