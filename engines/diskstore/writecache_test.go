package diskstore

import (
	"fmt"
	"testing"
	"time"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/vfs"
)

// TestColdWritesSkipTheCache: a write marked Cold (a replica's bookkeeping
// records) is readable like any other but does not go through to the read
// cache, where the others do.
func TestColdWritesSkipTheCache(t *testing.T) {
	s := openRecovered(t, Options{FS: vfs.NewMem(), SegmentSize: 1 << 20, CacheBytes: 1 << 20, IndexBlockBytes: -1, Logger: quiet})
	defer s.Close()
	locs := make([]uint64, 2)
	if err := s.Write([]Op{
		{Record: engines.Record{Key: []byte("warm"), Value: []byte("w")}},
		{Record: engines.Record{Key: []byte("cold"), Value: []byte("c")}, Cold: true},
	}, locs); err != nil {
		t.Fatal(err)
	}
	s.cache.c.Wait() // ristretto admits its sets asynchronously
	read := func(i int, want string) (hit bool) {
		t.Helper()
		before := s.Stats().CacheHits
		rec, ok, err := s.Read(locs[i], nil)
		if err != nil || !ok || string(rec.Value) != want {
			t.Fatalf("read %q: %q %v %v", want, rec.Value, ok, err)
		}
		return s.Stats().CacheHits > before
	}
	if !read(0, "w") {
		t.Fatal("a write did not go through to the read cache")
	}
	if read(1, "c") {
		t.Fatal("a cold write went into the read cache")
	}
}

// TestLazyFlushBySize: a lazy store whose interval is long still writes and
// fsyncs once FlushBytes wait, so a burst does not pile up in memory until
// the next tick.
func TestLazyFlushBySize(t *testing.T) {
	s := openRecovered(t, Options{FS: vfs.NewMem(), Durability: DurabilityLazy, FlushInterval: time.Hour, FlushBytes: 4096, CacheBytes: -1, IndexBlockBytes: -1, Logger: quiet})
	defer s.Close()
	value := make([]byte, 200)
	locs := make([]uint64, 1)
	for i := range 10 {
		if err := s.Write([]Op{{Record: engines.Record{Key: fmt.Appendf(nil, "small%d", i), Value: value}}}, locs); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.Stats().Syncs; got != 0 {
		t.Fatalf("%d syncs with 2 KiB waiting, under FlushBytes and the interval", got)
	}
	for i := range 20 {
		if err := s.Write([]Op{{Record: engines.Record{Key: fmt.Appendf(nil, "burst%d", i), Value: value}}}, locs); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.Stats().Syncs == 0 {
		if time.Now().After(deadline) {
			t.Fatal("over FlushBytes waiting, and no flush within 10 s")
		}
		time.Sleep(time.Millisecond) // the flusher runs on its own goroutine
	}
}

// openRecovered opens an empty store at /d with o and recovers it.
func openRecovered(t *testing.T, o Options) *Store {
	t.Helper()
	s, err := Open("/d", o)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Recover(func(uint64, engines.Record, bool) error { return nil }); err != nil {
		t.Fatal(err)
	}
	return s
}
