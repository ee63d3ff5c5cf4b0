package diskstore

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/vfs"
)

// mapOwner is the smallest owner of a store: an index of key -> location
// under one mutex (engines/point is the real one).
type mapOwner struct {
	s  *Store
	mu sync.Mutex
	ix map[string]uint64
}

func (o *mapOwner) put(t *testing.T, k, v string) uint64 {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	loc, err := o.s.Append(engines.Record{Key: []byte(k), Value: []byte(v)})
	if err != nil {
		t.Fatal(err)
	}
	if old, ok := o.ix[k]; ok {
		_ = o.s.Free(old, engines.Record{Key: []byte(k), Value: []byte(v)}) // same length in these tests
	}
	o.ix[k] = loc
	return loc
}

func (o *mapOwner) Relocate(loc uint64, r engines.Record) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ix[string(r.Key)] != loc {
		return nil
	}
	nloc, err := o.s.AppendRelocated(r)
	if err != nil {
		return err
	}
	o.ix[string(r.Key)] = nloc
	return o.s.Free(loc, r)
}

func (o *mapOwner) RelocateTombstone(key []byte, keep func() error) error { return nil }

var quiet = slog.New(slog.DiscardHandler)

func openTestStore(t *testing.T, fs vfs.FS) (*Store, *mapOwner) {
	t.Helper()
	s, err := Open("/d", Options{FS: fs, SegmentSize: 4096, CacheBytes: -1, IndexBlockBytes: -1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Recover(func(uint64, engines.Record, bool) error { return nil }); err != nil {
		t.Fatal(err)
	}
	return s, &mapOwner{s: s, ix: map[string]uint64{}}
}

// TestSnapshotScanPosition: a snapshot's Scan reads exactly the records
// before its position, in log order, also after the collector moved them
// and the head grew; Needs is true only for locations before the position
// that the scan has not reached; Scan runs once.
func TestSnapshotScanPosition(t *testing.T) {
	s, o := openTestStore(t, vfs.NewMem())
	defer s.Close()
	v := strings.Repeat("v", 300)
	var before []uint64
	for i := range 40 {
		before = append(before, o.put(t, fmt.Sprintf("k%02d", i), v))
	}
	sn, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	after := o.put(t, "k00", v) // past the position: k00's first record is garbage now
	for i := 1; i < 40; i++ {
		o.put(t, fmt.Sprintf("k%02d", i), v)
	}
	if sn.Needs(after) || !sn.Needs(before[0]) || !sn.Needs(before[39]) {
		t.Fatalf("Needs: after the position %v, first %v, last %v; want false, true, true",
			sn.Needs(after), sn.Needs(before[0]), sn.Needs(before[39]))
	}
	if _, err := s.GC(o); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	if st.GCSegmentsDeferred == 0 || st.ObsoleteSegments == 0 {
		t.Fatalf("GC under the snapshot: %+v; want pinned segments collected and held", st)
	}
	var got []uint64
	err = sn.Scan(func(loc uint64, r engines.Record) error {
		got = append(got, loc)
		if len(got) == 20 {
			if sn.Needs(before[0]) || !sn.Needs(before[39]) {
				return errors.New("Needs after half the scan: want false for a passed location, true for one ahead")
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(before) {
		t.Fatalf("scan read %v, want %v", got, before)
	}
	if sn.Needs(before[39]) {
		t.Fatal("Needs true after the scan")
	}
	if err := sn.Scan(func(uint64, engines.Record) error { return nil }); !errors.Is(err, ErrSnapshotScanned) {
		t.Fatalf("second scan: %v", err)
	}
	if st := s.Stats(); st.ObsoleteSegments != 0 || st.Snapshots != 0 || st.PinnedSegments != 0 {
		t.Fatalf("after the scan: %+v", st)
	}
}

// TestOpenRemovesObsolete: a segment the collector freed while a snapshot
// pinned it, renamed "<seq>.obsolete", is deleted when the store reopens
// after a crash, and is not read.
func TestOpenRemovesObsolete(t *testing.T) {
	fs := vfs.NewMem()
	s, o := openTestStore(t, fs)
	v := strings.Repeat("v", 300)
	for i := range 30 {
		o.put(t, fmt.Sprintf("k%02d", i), v)
	}
	sn, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		o.put(t, fmt.Sprintf("k%02d", i), strings.Repeat("w", 300))
	}
	if _, err := s.GC(o); err != nil {
		t.Fatal(err)
	}
	names, _ := fs.List("/d")
	n := 0
	for _, name := range names {
		if strings.HasSuffix(name, obsoleteExt) {
			n++
		}
	}
	if n == 0 || n != s.Stats().ObsoleteSegments {
		t.Fatalf("%d .obsolete files, stats say %d", n, s.Stats().ObsoleteSegments)
	}
	fs.Crash()
	_ = sn.Close()
	_ = s.Close()
	s, err = Open("/d", Options{FS: fs, SegmentSize: 4096, CacheBytes: -1, IndexBlockBytes: -1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	live := map[string]string{}
	err = s.Recover(func(loc uint64, r engines.Record, tomb bool) error {
		live[string(r.Key)] = string(r.Value)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	names, _ = fs.List("/d")
	for _, name := range names {
		if strings.HasSuffix(name, obsoleteExt) {
			t.Fatalf("%s survived the reopen", name)
		}
	}
	for i := range 30 {
		if k := fmt.Sprintf("k%02d", i); live[k] != strings.Repeat("w", 300) {
			t.Fatalf("%s = %.10q after the reopen", k, live[k])
		}
	}
}
