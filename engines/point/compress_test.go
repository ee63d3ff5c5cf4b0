package point

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/diskstore"
	"github.com/tabuladb/tabula/engines/enginetest"
	"github.com/tabuladb/tabula/engines/vfs"
)

// TestCompression: with s2 the log holds compressed values and reads give
// them back whole; live bytes count stored (compressed) bytes exactly, so
// after overwrites the collector still brings the log down to its target,
// and a reopen — by index blocks, by a full log scan, with compression off —
// gives the same values and live bytes. A compressed value damaged on disk
// is caught by the record CRC, never served.
func TestCompression(t *testing.T) {
	mem := vfs.NewMem()
	clock := enginetest.NewClock()
	ds := diskstore.Options{SegmentSize: 16 << 10, CacheBytes: -1, Compression: diskstore.CompressionS2}
	e, err := openMemOpts(t, mem, clock, ds)
	if err != nil {
		t.Fatal(err)
	}
	const n = 2000
	val := func(i, round int) string {
		return strings.Repeat(fmt.Sprintf("value %d of round %d; ", i, round), 40) // ~1 KB, compressible
	}
	logical := int64(0)
	for round := range 3 {
		logical = 0
		for i := 0; i < n; i += 50 {
			batch := make([]engines.Mutation, 0, 50)
			for j := i; j < i+50; j++ {
				k, v := fmt.Sprintf("k%05d", j), val(j, round)
				batch = append(batch, engines.Mutation{Key: []byte(k), Value: []byte(v)})
				logical += int64(len(k) + len(v))
			}
			if err := e.Apply(batch); err != nil {
				t.Fatal(err)
			}
		}
	}
	mustPut(t, e, "short", "tiny") // below the compression threshold
	for range 20 {
		if _, err := e.GC(); err != nil {
			t.Fatal(err)
		}
	}
	st, _ := e.DiskStats()
	t.Logf("logical %d bytes; log %d, live %d, amp %.2f", logical, st.LogBytes, st.LiveBytes, st.SpaceAmp)
	if st.LiveBytes*4 > logical {
		t.Fatalf("live %d bytes for %d logical: values not compressed", st.LiveBytes, logical)
	}
	if st.SpaceAmp > 1.3 {
		t.Fatalf("space amplification %.2f after collection: live bytes drifted", st.SpaceAmp)
	}
	check := func(e *Engine) {
		t.Helper()
		for i := range n {
			v, _, err := e.Get(fmt.Appendf(nil, "k%05d", i))
			if err != nil || string(v) != val(i, 2) {
				t.Fatalf("key %d = %d bytes, %v", i, len(v), err)
			}
		}
		if v, _, err := e.Get([]byte("short")); err != nil || string(v) != "tiny" {
			t.Fatalf("short = %q, %v", v, err)
		}
	}
	check(e)
	live := st.LiveBytes
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	for _, o := range []diskstore.Options{ds, {SegmentSize: 16 << 10, CacheBytes: -1, IndexBlockBytes: -1}} {
		e, err := openMemOpts(t, mem, clock, o)
		if err != nil {
			t.Fatal(err)
		}
		check(e)
		if st, _ := e.DiskStats(); st.LiveBytes != live {
			t.Errorf("reopened (compression %q, index blocks %v): live %d bytes, before %d", o.Compression, o.IndexBlockBytes >= 0, st.LiveBytes, live)
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}

	// Flip a bit in the middle of every segment: the record CRC catches it.
	names, _ := mem.List(crashDir)
	for _, name := range names {
		if strings.HasSuffix(name, ".log") {
			size, _ := mem.Stat(crashDir + "/" + name)
			if err := mem.FlipBit(crashDir+"/"+name, size/2, 3); err != nil {
				t.Fatal(err)
			}
		}
	}
	e, err = openMemOpts(t, mem, clock, diskstore.Options{SegmentSize: 16 << 10, CacheBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	corrupt := 0
	for i := range n {
		v, _, err := e.Get(fmt.Appendf(nil, "k%05d", i))
		switch {
		case errors.Is(err, engines.ErrCorrupt):
			corrupt++
		case err != nil:
			t.Fatal(err)
		case string(v) != val(i, 2):
			t.Fatalf("key %d served a damaged value", i)
		}
	}
	t.Logf("%d reads caught the flipped bits", corrupt)
	if corrupt == 0 {
		t.Fatal("no read caught the flipped bits")
	}
}

func TestCompressionOptions(t *testing.T) {
	if _, err := Open(engines.Options{Storage: StorageMemory, Compression: "s2"}); err == nil {
		t.Fatal("memory storage accepted compression")
	}
	if _, err := Open(engines.Options{Dir: t.TempDir(), Storage: StorageSSD, Compression: "zip"}); err == nil {
		t.Fatal("ssd storage accepted compression zip")
	}
}
