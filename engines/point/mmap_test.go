package point

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/diskstore"
	"github.com/tabuladb/tabula/engines/enginetest"
)

// TestMappedSegments runs on the OS file system, where sealed segments are
// read through memory mappings: reads race the collector (which unmaps and
// removes the segments it frees) and see every value; after a reopen the
// recovered segments are mapped; a bit flipped in a mapped file is caught
// by the record CRC, never served.
func TestMappedSegments(t *testing.T) {
	dir := t.TempDir()
	clock := enginetest.NewClock()
	ds := diskstore.Options{SegmentSize: 64 << 10, CacheBytes: -1, Durability: diskstore.DurabilityLazy}
	open := func() *Engine {
		e, err := OpenDisk(engines.Options{Dir: dir, Now: clock.Now, Logger: quiet}, ds)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	const n = 4000
	val := func(i, round int) string { return fmt.Sprintf("%s-%d-%d", strings.Repeat("v", 80), i, round) }
	e := open()
	for i := range n {
		mustPut(t, e, fmt.Sprintf("k%05d", i), val(i, 0))
	}
	// Readers check every key while writers overwrite them and the
	// collector frees (and unmaps) segments.
	var round atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var readErr atomic.Value
	for r := range 2 {
		wg.Go(func() {
			for i := r; ; i = (i + 7) % n {
				select {
				case <-stop:
					return
				default:
				}
				v, _, err := e.Get(fmt.Appendf(nil, "k%05d", i))
				if err != nil {
					readErr.Store(fmt.Sprintf("key %d: %v", i, err))
					return
				}
				if !strings.HasPrefix(string(v), strings.Repeat("v", 80)+fmt.Sprintf("-%d-", i)) {
					readErr.Store(fmt.Sprintf("key %d = %q", i, v))
					return
				}
			}
		})
	}
	mapped := 0
	for rd := 1; rd <= 3; rd++ {
		round.Store(int64(rd))
		for i := range n {
			mustPut(t, e, fmt.Sprintf("k%05d", i), val(i, rd))
		}
		if st, _ := e.DiskStats(); st.MappedSegments > mapped {
			mapped = st.MappedSegments
		}
		if _, err := e.GC(); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if err := readErr.Load(); err != nil {
		t.Fatal(err)
	}
	st, _ := e.DiskStats()
	t.Logf("segments %d, mapped %d (max seen %d), collected %d", st.Segments, st.MappedSegments, mapped, st.GCSegmentsFreed)
	if mapped == 0 {
		t.Fatal("no segment was ever mapped")
	}
	if st.GCSegmentsFreed == 0 {
		t.Fatal("the collector freed no segment")
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}

	e = open()
	if st, _ := e.DiskStats(); st.MappedSegments == 0 {
		// Mapped lazily on first read: read one key of each segment.
		for i := range n {
			if _, _, err := e.Get(fmt.Appendf(nil, "k%05d", i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if st, _ := e.DiskStats(); st.MappedSegments == 0 {
		t.Fatal("no recovered segment is mapped")
	}
	// Flip a byte in the middle of every segment file: through MAP_SHARED
	// the mapping sees it at once.
	names, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, de := range names {
		if !strings.HasSuffix(de.Name(), ".log") {
			continue
		}
		f, err := os.OpenFile(filepath.Join(dir, de.Name()), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		fi, _ := f.Stat()
		b := make([]byte, 1)
		off := fi.Size() / 2
		if _, err := f.ReadAt(b, off); err != nil {
			t.Fatal(err)
		}
		b[0] ^= 0x10
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	corrupt := 0
	for i := range n {
		v, _, err := e.Get(fmt.Appendf(nil, "k%05d", i))
		switch {
		case errors.Is(err, engines.ErrCorrupt):
			corrupt++
		case err != nil:
			t.Fatalf("key %d: %v", i, err)
		case string(v) != val(i, 3):
			t.Fatalf("key %d served %q after a bit flip", i, v)
		}
	}
	t.Logf("%d reads caught the flipped bits", corrupt)
	if corrupt == 0 {
		t.Fatal("no read noticed the flipped bits")
	}
	_ = e.Close()
}
