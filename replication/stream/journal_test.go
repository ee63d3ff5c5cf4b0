package stream

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/vfs"
)

// journalFile builds the bytes of a journal file holding frames of recs.
func journalFile(num, salt uint64, frames ...[]journalRecord) []byte {
	b := appendJournalHeader(nil, num, salt)
	for i, recs := range frames {
		b = appendJournalFrame(b, salt, int64(len(b)), uint64(i+1), recs)
	}
	return b
}

func testRecords(rng *rand.Rand, n int) []journalRecord {
	var recs []journalRecord
	for i := range n {
		r := journalRecord{kind: journalKindData, extent: rng.Uint64N(5), off: rng.Int64N(1 << 30)}
		if i%4 == 3 {
			r.kind = journalKindSeal
		} else {
			r.data = make([]byte, 1+rng.IntN(200))
			for k := range r.data {
				r.data[k] = byte(rng.Uint32())
			}
		}
		recs = append(recs, r)
	}
	return recs
}

func sameRecords(a, b []journalRecord) bool {
	return slices.EqualFunc(a, b, func(x, y journalRecord) bool {
		return x.kind == y.kind && x.extent == y.extent && x.off == y.off && bytes.Equal(x.data, y.data)
	})
}

func TestJournalFrameRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 1))
	var frames [][]journalRecord
	var all []journalRecord
	for i := range 5 {
		recs := testRecords(rng, 1+i*3)
		frames = append(frames, recs)
		all = append(all, recs...)
	}
	b := journalFile(7, 99, frames...)
	got, batch, _, err := scanJournalFile(b, 7, false, 0)
	if err != nil || batch != 5 || !sameRecords(got, all) {
		t.Fatalf("scan: batch %d, err %v, same %v", batch, err, sameRecords(got, all))
	}
	// Another salt, file number, or position: the frames do not check.
	if _, _, _, err := decodeJournalFrame(b[journalHeaderLen:], 98, journalHeaderLen); !errors.Is(err, engines.ErrCorrupt) {
		t.Fatalf("frame with another salt: %v", err)
	}
	if _, _, _, err := scanJournalFile(b, 8, true, 0); !errors.Is(err, engines.ErrCorrupt) {
		t.Fatalf("file under another number: %v", err)
	}
	// Batch numbers must increase across files.
	if _, _, _, err := scanJournalFile(b, 7, true, 5); !errors.Is(err, engines.ErrCorrupt) {
		t.Fatalf("batches not after the previous file's: %v", err)
	}
	// A version this code does not know is refused, never skipped.
	v := slices.Clone(b)
	v[8] = 2
	copy(v[28:], appendJournalHeader(nil, 7, 99)[28:]) // keeps the old crc: bad
	if _, _, _, err := scanJournalFile(v, 7, false, 0); err == nil {
		t.Fatal("a header of another version was read")
	}
}

// TestJournalTornTailAndCorruption cuts the newest file at every byte of
// its last frame (a torn tail: earlier frames kept, no error), and flips
// every bit of its first frame with frames after it (corruption: an
// error, never silently dropped frames).
func TestJournalTornTailAndCorruption(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 2))
	frames := [][]journalRecord{testRecords(rng, 3), testRecords(rng, 2), testRecords(rng, 4)}
	b := journalFile(1, 5, frames...)
	lastStart := len(journalFile(1, 5, frames[:2]...))
	want := append(slices.Clone(frames[0]), frames[1]...)
	for cut := lastStart; cut < len(b); cut++ {
		got, batch, _, err := scanJournalFile(b[:cut], 1, true, 0)
		if err != nil || batch != 2 || !sameRecords(got, want) {
			t.Fatalf("cut at %d: batch %d err %v", cut, batch, err)
		}
		if _, _, _, err := scanJournalFile(b[:cut], 1, false, 0); cut > lastStart && !errors.Is(err, engines.ErrCorrupt) {
			t.Fatalf("cut at %d of a complete file: %v", cut, err)
		}
	}
	// A header cut before its sync: an empty newest file.
	for cut := range journalHeaderLen + 1 {
		if got, _, _, err := scanJournalFile(b[:cut], 1, true, 0); err != nil || len(got) != 0 {
			t.Fatalf("header cut at %d: %v", cut, err)
		}
	}
	// Preallocated zeros after the frames (and after a torn frame): the
	// newest file ends at its last whole frame; a complete file with
	// zeros after its frames is corrupt.
	for _, cut := range []int{len(b), lastStart + 7} {
		z := append(slices.Clone(b[:cut]), make([]byte, 4096)...)
		got, _, end, err := scanJournalFile(z, 1, true, 0)
		wantEnd, wantRecs := len(b), append(slices.Clone(want), frames[2]...)
		if cut < len(b) {
			wantEnd, wantRecs = lastStart, want
		}
		if err != nil || end != int64(wantEnd) || !sameRecords(got, wantRecs) {
			t.Fatalf("frames to %d then zeros: end %d (want %d), %d records, err %v", cut, end, wantEnd, len(got), err)
		}
		if _, _, _, err := scanJournalFile(z, 1, false, 0); !errors.Is(err, engines.ErrCorrupt) {
			t.Fatalf("a complete file with zeros after its frames: %v", err)
		}
	}
	// A preallocated file whose header never synced: all zeros, or a
	// header cut short then zeros.
	for _, hdr := range []int{0, 9, journalHeaderLen} {
		z := append(slices.Clone(b[:hdr]), make([]byte, 4096)...)
		if hdr == journalHeaderLen {
			z[journalHeaderLen-1] ^= 1 // garbled
		}
		if got, _, end, err := scanJournalFile(z, 1, true, 0); err != nil || len(got) != 0 || end != 0 {
			t.Fatalf("preallocated file with %d header bytes: %d records, end %d, %v", hdr, len(got), end, err)
		}
	}
	firstEnd := len(journalFile(1, 5, frames[0]))
	for i := journalHeaderLen; i < firstEnd; i++ {
		for bit := range 8 {
			c := slices.Clone(b)
			c[i] ^= 1 << bit
			if _, _, _, err := scanJournalFile(c, 1, true, 0); !errors.Is(err, engines.ErrCorrupt) {
				t.Fatalf("bit %d of byte %d flipped: %v", bit, i, err)
			}
		}
	}
}

// encodeRaw encodes entries as the blocks at off of extent id (what a
// primary replicates).
func encodeRaw(id uint64, off int64, entries []EntryData) []byte {
	var raw []byte
	for _, en := range entries {
		for j, b := range en.Blocks {
			var flags byte
			if j < len(en.Blocks)-1 {
				flags = flagContinues
			}
			raw = appendBlock(raw, id, off+int64(len(raw)), kindData, flags, en.Seq, b)
		}
	}
	return raw
}

// journalScenario writes to three extents of a journaled store with
// small journal files (so it moves files and checkpoints): a primary
// (AppendEntries), a secondary (AppendRaw) and one sealed halfway. It
// stops at the first error and returns, per extent, the entries
// acknowledged (Sync returned) and all written.
type journalRun struct {
	acked, all map[uint64][]EntryData
	sealed     map[uint64]bool
}

func journalScenario(fs vfs.FS, seed uint64) (run journalRun, err error) {
	run = journalRun{acked: map[uint64][]EntryData{}, all: map[uint64][]EntryData{}, sealed: map[uint64]bool{}}
	rng := rand.New(rand.NewPCG(seed, 3))
	s, err := OpenJournaledStore(fs, "/node", JournalOptions{FileBytes: 2048}, nil)
	if err != nil {
		return run, err
	}
	defer s.Close()
	exts := map[uint64]*Extent{}
	for _, id := range []uint64{1, 2, 3} {
		if exts[id], err = s.Create(id, id != 2); err != nil {
			return run, err
		}
	}
	seq := uint64(0)
	for i := range 30 {
		id := uint64(1 + rng.IntN(3))
		if run.sealed[id] {
			id = 1
		}
		e := exts[id]
		seq++
		batch := []EntryData{randomEntry(rng, seq)}
		run.all[id] = append(run.all[id], batch...)
		if id == 2 {
			_, err = e.AppendRaw(e.Length(), encodeRaw(id, e.Length(), batch), true)
		} else {
			_, _, _, err = e.AppendEntries(batch)
		}
		if err != nil {
			return run, err
		}
		if err := e.Sync(); err != nil {
			return run, err
		}
		run.acked[id] = append(run.acked[id], batch...)
		switch i {
		case 15:
			// Sealed below what it holds: the file is cut under journaled data.
			n := len(run.acked[3]) / 2
			var length int64
			for _, en := range run.acked[3][:n] {
				for _, b := range en.Blocks {
					length += blockSize(len(b))
				}
			}
			// Asked to seal, the entries past the length may go (a failed
			// seal may have taken effect), then must go.
			run.acked[3] = run.acked[3][:n]
			if _, err := exts[3].Seal(length); err != nil {
				return run, err
			}
			run.all[3] = run.all[3][:n]
			run.sealed[3] = true
		case 20:
			if err := s.Checkpoint(); err != nil {
				return run, err
			}
		}
	}
	return run, nil
}

// checkJournalRun reopens the store on fs and checks every extent holds
// its acknowledged entries and then only entries that were written.
func checkJournalRun(t *testing.T, fs vfs.FS, run journalRun, what string) {
	t.Helper()
	s, err := OpenJournaledStore(fs, "/node", JournalOptions{FileBytes: 2048}, nil)
	if err != nil {
		t.Fatalf("%s: reopen: %v", what, err)
	}
	defer s.Close()
	for _, id := range []uint64{1, 2, 3} {
		e, err := s.Get(id)
		if err != nil {
			if len(run.acked[id]) > 0 {
				t.Fatalf("%s: extent %d lost with %d acknowledged entries", what, id, len(run.acked[id]))
			}
			continue
		}
		got := readEntries(t, e)
		if len(got) < len(run.acked[id]) || len(got) > len(run.all[id]) {
			t.Fatalf("%s: extent %d has %d entries, %d acknowledged, %d written", what, id, len(got), len(run.acked[id]), len(run.all[id]))
		}
		for i := range got {
			if !sameEntry(got[i], run.all[id][i]) {
				t.Fatalf("%s: extent %d entry %d differs", what, id, i)
			}
		}
		if run.sealed[id] && !e.Info().Sealed {
			t.Fatalf("%s: extent %d: acknowledged seal lost", what, id)
		}
		if e.CommittedLength() > 0 && !e.Info().Sealed {
			t.Fatalf("%s: extent %d reports a commit point %d after a restart", what, id, e.CommittedLength())
		}
		if !e.Info().Sealed {
			if _, _, _, err := e.AppendEntries([]EntryData{{Seq: 1000, Blocks: [][]byte{[]byte("after")}}}); err != nil {
				if id == 2 && errors.Is(err, ErrRole) {
					continue
				}
				t.Fatalf("%s: extent %d: append after recovery: %v", what, id, err)
			}
			if err := e.Sync(); err != nil {
				t.Fatalf("%s: extent %d: sync after recovery: %v", what, id, err)
			}
		}
	}
	if files := s.jr.stat(); len(files) != 1 {
		t.Fatalf("%s: journal files after recovery: %v", what, files)
	}
}

// TestJournalCrash fails the k-th file operation of a run for every k,
// crashes (dropping unsynced writes, or keeping a torn prefix of them)
// and checks the reopened store: every acknowledged entry is there, then
// only whole entries that were written, seals stay, and the journal is
// replayed into the extent files and starts afresh.
func TestJournalCrash(t *testing.T) {
	for _, prealloc := range []bool{false, true} {
		t.Run(fmt.Sprintf("prealloc=%v", prealloc), func(t *testing.T) { testJournalCrash(t, prealloc) })
	}
}

// newJournalFS is a MemFS whose files preallocate or not.
func newJournalFS(prealloc bool) *vfs.MemFS {
	fs := vfs.NewMem()
	fs.SetPreallocate(prealloc)
	return fs
}

func testJournalCrash(t *testing.T, prealloc bool) {
	seed := testSeed(t)
	clean := newJournalFS(prealloc)
	run, err := journalScenario(clean, seed)
	if err != nil {
		t.Fatal(err)
	}
	// The clean run moved journal files and checkpointed.
	if n := clean.Ops(vfs.OpRemove); n == 0 {
		t.Fatal("no journal file was removed by a checkpoint")
	}
	clean.Crash() // every acknowledged write survives on the journal alone
	checkJournalRun(t, clean, run, "clean")
	ops := vfs.OpWrite | vfs.OpSync | vfs.OpTruncate | vfs.OpCreate | vfs.OpSyncDir | vfs.OpRemove
	n := newJournalFS(prealloc)
	if _, err := journalScenario(n, seed); err != nil {
		t.Fatal(err)
	}
	count := n.Ops(ops)
	for k := range count + 5 {
		for _, torn := range []bool{false, true} {
			fs := newJournalFS(prealloc)
			fs.InjectAfter(int(k), ops, nil)
			run, _ := journalScenario(fs, seed)
			fs.ClearFaults()
			if torn {
				fs.CrashKeepingPrefix(rand.New(rand.NewPCG(seed, uint64(k))))
			} else {
				fs.Crash()
			}
			checkJournalRun(t, fs, run, fmt.Sprintf("k=%d torn=%v", k, torn))
		}
	}
	t.Logf("%d fault points, each with a clean and a torn crash", count)
}

// appendSynced appends n entries of size bytes to e, syncing each, and
// returns them.
func appendSynced(t *testing.T, e *Extent, n, size int) []EntryData {
	t.Helper()
	var written []EntryData
	for i := range n {
		en := EntryData{Seq: uint64(i + 1), Blocks: [][]byte{bytes.Repeat([]byte{byte(i)}, size)}}
		if _, _, _, err := e.AppendEntries([]EntryData{en}); err != nil {
			t.Fatal(err)
		}
		if err := e.Sync(); err != nil {
			t.Fatal(err)
		}
		written = append(written, en)
	}
	return written
}

// expectEntries fails the test unless e holds exactly want.
func expectEntries(t *testing.T, e *Extent, want []EntryData) {
	t.Helper()
	got := readEntries(t, e)
	if len(got) != len(want) {
		t.Fatalf("after reopen: %d entries, want %d", len(got), len(want))
	}
	for i := range got {
		if !sameEntry(got[i], want[i]) {
			t.Fatalf("after reopen: entry %d differs", i)
		}
	}
}

// TestJournalPreallocatedFiles checks the preallocated layout on the OS
// file system: a new file is as long as FileBytes, a file the journal
// moved on from is cut to its frames, and a reopen cuts the newest file's
// zeros, so that a crash after the next file exists, before the replayed
// files are removed, still reopens with every entry.
func TestJournalPreallocatedFiles(t *testing.T) {
	dir := t.TempDir()
	const fileBytes = 64 << 10
	o := JournalOptions{FileBytes: fileBytes}
	s, err := OpenJournaledStore(vfs.Default, dir, o, nil)
	if err != nil {
		t.Fatal(err)
	}
	e, err := s.Create(1, true)
	if err != nil {
		t.Fatal(err)
	}
	jdir := filepath.Join(dir, journalDir)
	first := s.jr.stat()[0]
	if size, err := vfs.Default.Stat(filepath.Join(jdir, journalName(first))); err != nil || size != fileBytes {
		t.Fatalf("new journal file: %d bytes (%v), want %d (preallocated)", size, err, fileBytes)
	}
	written := appendSynced(t, e, 200, 700)
	if files := s.jr.stat(); files[len(files)-1] == first {
		t.Fatalf("journal files %v: 200 entries of 700 bytes never moved past a file of %d", files, fileBytes)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Reopen: the newest file is cut, replayed, then a new one starts.
	// Keep a copy of the directory's files as they are after the
	// reopen's cut to stand for a crash before it removed them.
	recs, newest, _, err := readJournal(vfs.Default, jdir)
	if err != nil {
		t.Fatal(err)
	}
	if size, err := vfs.Default.Stat(filepath.Join(jdir, journalName(newest))); err != nil || size == fileBytes {
		t.Fatalf("newest journal file after a reopen's read: %d bytes (%v), want it cut", size, err)
	}
	if len(recs) == 0 {
		t.Fatal("no records in the journal")
	}
	for range 2 {
		s, err = OpenJournaledStore(vfs.Default, dir, o, nil)
		if err != nil {
			t.Fatalf("reopen: %v", err)
		}
		expectEntries(t, mustGet(t, s, 1), written)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestJournalRotateCutsPreallocated: a journal moving to a new file cuts
// the one it leaves to its frames, which then scans as a complete file.
func TestJournalRotateCutsPreallocated(t *testing.T) {
	dir := t.TempDir()
	const fileBytes = 16 << 10
	j, err := openJournal(vfs.Default, dir, 1, 0, JournalOptions{FileBytes: fileBytes}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j.close()
	rng := rand.New(rand.NewPCG(1, 2))
	for _, r := range testRecords(rng, 400) {
		tk, err := j.add(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := j.wait(tk); err != nil {
			t.Fatal(err)
		}
	}
	files := j.stat()
	if len(files) < 2 {
		t.Fatalf("journal files %v: expected a move to a new file", files)
	}
	for i, num := range files {
		b, err := readWholeFile(vfs.Default, filepath.Join(dir, journalName(num)))
		if err != nil {
			t.Fatal(err)
		}
		last := i == len(files)-1
		if last && len(b) < fileBytes {
			t.Fatalf("current journal file %d: %d bytes, want at least %d (preallocated)", num, len(b), fileBytes)
		}
		if _, _, end, err := scanJournalFile(b, num, last, 0); err != nil || (!last && end != int64(len(b))) {
			t.Fatalf("journal file %d (last %v): valid to %d of %d bytes (%v)", num, last, end, len(b), err)
		}
	}
}

// TestJournalPreallocationFails: a journal file the disk cannot
// preallocate (full) is written as it grows, and nothing is lost.
func TestJournalPreallocationFails(t *testing.T) {
	fs := newJournalFS(true)
	fs.Inject(vfs.Fault{Ops: vfs.OpTruncate, Err: vfs.ErrNoSpace}) // Preallocate counts as a truncate
	s, err := OpenJournaledStore(fs, "/node", JournalOptions{FileBytes: 4096}, nil)
	if err != nil {
		t.Fatalf("open with the preallocation failing: %v", err)
	}
	s.jr.fmu.Lock()
	pre := s.jr.prealloc
	s.jr.fmu.Unlock()
	if pre {
		t.Fatal("the journal file counts as preallocated although the preallocation failed")
	}
	e, err := s.Create(1, true)
	if err != nil {
		t.Fatal(err)
	}
	written := appendSynced(t, e, 20, 300)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	fs.Crash()
	s, err = OpenJournaledStore(fs, "/node", JournalOptions{FileBytes: 4096}, nil)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s.Close()
	expectEntries(t, mustGet(t, s, 1), written)
}

// TestJournalPreallocatedKeptFiles: a reopen whose removal of the
// replayed files fails leaves them beside the new preallocated file; the
// next reopen must read them as complete files.
func TestJournalPreallocatedKeptFiles(t *testing.T) {
	seed := testSeed(t)
	fs := newJournalFS(true)
	run, err := journalScenario(fs, seed)
	if err != nil {
		t.Fatal(err)
	}
	fs.Crash()
	fs.Inject(vfs.Fault{Ops: vfs.OpRemove, Sticky: true})
	s, err := OpenJournaledStore(fs, "/node", JournalOptions{FileBytes: 2048}, nil)
	if err != nil {
		t.Fatalf("reopen with removals failing: %v", err)
	}
	files := s.jr.stat()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if len(files) < 2 {
		t.Fatalf("journal files %v: the replayed files should have stayed", files)
	}
	fs.Crash()
	fs.ClearFaults()
	checkJournalRun(t, fs, run, "after a reopen kept its replayed files")
}

// TestJournalConcurrentCrash has writers on many extents share the
// journal, crashes the file system at a random moment under them, and
// checks every acknowledged entry after the reopen.
func TestJournalConcurrentCrash(t *testing.T) {
	seed := testSeed(t)
	for round := range 20 {
		rng := rand.New(rand.NewPCG(seed, uint64(100+round)))
		fs := vfs.NewMem()
		s, err := OpenJournaledStore(fs, "/node", JournalOptions{FileBytes: 4096}, nil)
		if err != nil {
			t.Fatal(err)
		}
		const extents = 8
		var mu sync.Mutex
		acked := map[uint64][]EntryData{}
		all := map[uint64][]EntryData{}
		var wg sync.WaitGroup
		want := int64(20 + rng.IntN(200))
		var count atomic.Int64
		reached := make(chan struct{}) // closed at the want-th acknowledgement
		for id := uint64(1); id <= extents; id++ {
			e, err := s.Create(id, true)
			if err != nil {
				t.Fatal(err)
			}
			wrng := rand.New(rand.NewPCG(seed, uint64(round*100)+id))
			wg.Add(1)
			go func() {
				defer wg.Done()
				for seq := uint64(1); ; seq++ {
					en := randomEntry(wrng, seq)
					mu.Lock()
					all[id] = append(all[id], en)
					mu.Unlock()
					if _, _, _, err := e.AppendEntries([]EntryData{en}); err != nil {
						return
					}
					if err := e.Sync(); err != nil {
						return
					}
					mu.Lock()
					acked[id] = append(acked[id], en)
					mu.Unlock()
					if count.Add(1) == want {
						close(reached)
					}
				}
			}()
		}
		select {
		case <-reached:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: %d of %d appends in 10 s", round, count.Load(), want)
		}
		fs.CrashKeepingPrefix(rng) // while the writers go on
		wg.Wait()
		_ = s.Close() // handles from before the crash fail
		s, err = OpenJournaledStore(fs, "/node", JournalOptions{FileBytes: 4096}, nil)
		if err != nil {
			t.Fatalf("round %d: reopen: %v", round, err)
		}
		mu.Lock()
		for id := uint64(1); id <= extents; id++ {
			e, err := s.Get(id)
			if err != nil {
				t.Fatalf("round %d: extent %d: %v", round, id, err)
			}
			got := readEntries(t, e)
			if len(got) < len(acked[id]) || len(got) > len(all[id]) {
				t.Fatalf("round %d: extent %d has %d entries, %d acknowledged, %d written", round, id, len(got), len(acked[id]), len(all[id]))
			}
			for i := range got {
				if !sameEntry(got[i], all[id][i]) {
					t.Fatalf("round %d: extent %d entry %d differs", round, id, i)
				}
			}
		}
		mu.Unlock()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestJournalSealCutWithoutSealBlock: a seal cuts the file below
// journaled data; a crash that keeps the cut but not the seal block (the
// OS may write them back in any order) must reopen sealed, not fail with
// "synced data lost" nor resurrect the cut data.
func TestJournalSealCutWithoutSealBlock(t *testing.T) {
	fs := vfs.NewMem()
	s, err := OpenJournaledStore(fs, "/node", JournalOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e, err := s.Create(4, true)
	if err != nil {
		t.Fatal(err)
	}
	var ends []int64
	for i := range 6 {
		if _, _, _, err := e.AppendEntries([]EntryData{{Seq: uint64(i + 1), Blocks: [][]byte{bytes.Repeat([]byte{byte(i)}, 50)}}}); err != nil {
			t.Fatal(err)
		}
		if err := e.Sync(); err != nil {
			t.Fatal(err)
		}
		ends = append(ends, e.Length())
	}
	if _, err := e.Seal(ends[2]); err != nil {
		t.Fatal(err)
	}
	base, path := e.base, e.path
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// The cut reached the disk, the seal block did not.
	f, err := fs.OpenReadWrite(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(base + ends[2]); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	fs.Crash()
	s, err = OpenJournaledStore(fs, "/node", JournalOptions{}, nil)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s.Close()
	e, err = s.Get(4)
	if err != nil {
		t.Fatal(err)
	}
	if info := e.Info(); !info.Sealed || info.Length != ends[2] || len(readEntries(t, e)) != 3 {
		t.Fatalf("after the replay: %+v, %d entries", info, len(readEntries(t, e)))
	}
}

// TestJournalLostSyncedData: a journal record beyond what an extent file
// holds, where the file had been synced by a checkpoint, is corruption:
// the open fails with ErrCorrupt. A record of a deleted extent is
// skipped.
func TestJournalLostSyncedData(t *testing.T) {
	fs := vfs.NewMem()
	s, err := OpenJournaledStore(fs, "/node", JournalOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e, err := s.Create(5, true)
	if err != nil {
		t.Fatal(err)
	}
	gone, err := s.Create(6, true)
	if err != nil {
		t.Fatal(err)
	}
	appendOne := func(e *Extent, seq uint64) {
		t.Helper()
		if _, _, _, err := e.AppendEntries([]EntryData{{Seq: seq, Blocks: [][]byte{[]byte("payload")}}}); err != nil {
			t.Fatal(err)
		}
		if err := e.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	appendOne(e, 1)
	appendOne(gone, 1)
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	appendOne(e, 2) // journaled from offset > 0 on
	appendOne(gone, 2)
	if err := s.Delete(6); err != nil {
		t.Fatal(err)
	}
	base, path := e.base, e.path
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	fs.Crash()
	// Reopens: extent 6's records are skipped, extent 5's replayed.
	s, err = OpenJournaledStore(fs, "/node", JournalOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if e, err := s.Get(5); err != nil || len(readEntries(t, e)) != 2 {
		t.Fatalf("extent 5 after replay: %v", err)
	}
	if _, err := s.Get(6); !errors.Is(err, ErrNoExtent) {
		t.Fatalf("deleted extent: %v", err)
	}
	appendOne(mustGet(t, s, 5), 3)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// The synced first entry vanishes from the extent file.
	f, err := fs.OpenReadWrite(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(base); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	// The replay at open put entries 1-2 back and removed the old journal,
	// so only entry 3 is journaled now, from past entry 2.
	if _, err := OpenJournaledStore(fs, "/node", JournalOptions{}, nil); !errors.Is(err, engines.ErrCorrupt) {
		t.Fatalf("open with synced data lost: %v", err)
	}
}

func mustGet(t *testing.T, s *Store, id uint64) *Extent {
	t.Helper()
	e, err := s.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestJournalCorruptInTheMiddle: a bit flipped in a frame that frames
// follow fails the open with ErrCorrupt, naming the journal file.
func TestJournalCorruptInTheMiddle(t *testing.T) {
	fs := vfs.NewMem()
	s, err := OpenJournaledStore(fs, "/node", JournalOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e, err := s.Create(9, true)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, _, _, err := e.AppendEntries([]EntryData{{Seq: uint64(i + 1), Blocks: [][]byte{[]byte("x")}}}); err != nil {
			t.Fatal(err)
		}
		if err := e.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	nums, err := listJournal(fs, "/node/journal")
	if err != nil || len(nums) != 1 {
		t.Fatal(nums, err)
	}
	if err := fs.FlipBit(filepath.Join("/node/journal", journalName(nums[0])), journalHeaderLen+30, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenJournaledStore(fs, "/node", JournalOptions{}, nil); !errors.Is(err, engines.ErrCorrupt) {
		t.Fatalf("open with a corrupt frame in the middle: %v", err)
	}
}

// FuzzJournalFrame feeds arbitrary bytes to the journal file scanner and
// frame decoder: no panic, and whatever decodes re-encodes identically.
func FuzzJournalFrame(f *testing.F) {
	rng := rand.New(rand.NewPCG(1, 2))
	f.Add(journalFile(1, 5, testRecords(rng, 3), testRecords(rng, 1)), uint64(5))
	f.Add(journalFile(1, 5), uint64(5))
	f.Add([]byte{}, uint64(0))
	f.Fuzz(func(t *testing.T, b []byte, salt uint64) {
		recs, batch, n, err := decodeJournalFrame(b, salt, 0)
		if err == nil {
			if re := appendJournalFrame(nil, salt, 0, batch, recs); !bytes.Equal(re, b[:n]) {
				t.Fatalf("frame of %d bytes re-encodes differently", n)
			}
		} else if !errors.Is(err, engines.ErrCorrupt) {
			t.Fatalf("decode error not ErrCorrupt: %v", err)
		}
		if len(b) >= 20 {
			num := uint64(b[0])
			_, _, _, err := scanJournalFile(b, num, b[1]&1 == 0, 0)
			if err != nil && !errors.Is(err, engines.ErrCorrupt) && !errors.Is(err, ErrFormatVersion) {
				t.Fatalf("scan error of neither kind: %v", err)
			}
		}
	})
}

// TestJournalCheckpointKeepsJournalAfterFailedFsync: a checkpoint whose
// fsync of an extent file fails removes no journal file (after a failed
// fsync the file's content is unknown; the journal is the only copy),
// nor does any later checkpoint; the extent takes no more writes, and
// after a crash the replay brings its acknowledged entries back.
func TestJournalCheckpointKeepsJournalAfterFailedFsync(t *testing.T) {
	fs := vfs.NewMem()
	s, err := OpenJournaledStore(fs, "/node", JournalOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e, err := s.Create(11, true)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, _, _, err := e.AppendEntries([]EntryData{{Seq: uint64(i + 1), Blocks: [][]byte{[]byte("acknowledged")}}}); err != nil {
			t.Fatal(err)
		}
		if err := e.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	// Checkpoint: the new journal file's header sync succeeds, the
	// extent file's fsync fails.
	fs.InjectAfter(1, vfs.OpSync, nil)
	if err := s.Checkpoint(); !errors.Is(err, vfs.ErrInjected) {
		t.Fatalf("checkpoint with a failing fsync: %v", err)
	}
	if err := s.Checkpoint(); err == nil {
		t.Fatal("a later checkpoint passed an extent whose fsync failed")
	}
	if files := s.jr.stat(); len(files) < 2 {
		t.Fatalf("journal files after failed checkpoints: %v", files)
	}
	if _, _, _, err := e.AppendEntries([]EntryData{{Seq: 9, Blocks: [][]byte{[]byte("x")}}}); !errors.Is(err, ErrBroken) {
		t.Fatalf("append after a failed fsync: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	fs.Crash()
	s, err = OpenJournaledStore(fs, "/node", JournalOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := readEntries(t, mustGet(t, s, 11)); len(got) != 3 {
		t.Fatalf("%d entries after the replay, want 3", len(got))
	}
}

// BenchmarkStoreCommit is the journal's effect on the disk alone, with no
// network: one node's store on the real file system with 15 open extents,
// 16 writers each appending a 100-byte entry and syncing it (what a
// replicated append costs a node), with and without the journal. It
// reports appends/s and the p50 and p99 of append+sync.
func BenchmarkStoreCommit(b *testing.B) {
	for _, journaled := range []bool{false, true} {
		name := map[bool]string{false: "no-journal", true: "journal"}[journaled]
		b.Run(name, func(b *testing.B) {
			dir := b.TempDir()
			var s *Store
			var err error
			if journaled {
				s, err = OpenJournaledStore(vfs.Default, dir, JournalOptions{}, nil)
			} else {
				s, err = OpenStore(vfs.Default, dir)
			}
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			const extents, writers = 15, 16
			var exts []*Extent
			var locks [extents]sync.Mutex // one writer at a time per extent, as an appender
			for id := range uint64(extents) {
				e, err := s.Create(id+1, true)
				if err != nil {
					b.Fatal(err)
				}
				exts = append(exts, e)
			}
			payload := make([]byte, 100)
			var next atomic.Int64
			lat := make([][]time.Duration, writers)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
						k := int(i) % extents
						t0 := time.Now()
						locks[k].Lock()
						_, _, _, err := exts[k].AppendEntries([]EntryData{{Seq: uint64(i), Blocks: [][]byte{payload}}})
						if err == nil {
							err = exts[k].Sync()
						}
						locks[k].Unlock()
						if err != nil {
							b.Error(err)
							return
						}
						lat[w] = append(lat[w], time.Since(t0))
					}
				}()
			}
			wg.Wait()
			el := time.Since(start)
			b.StopTimer()
			all := slices.Concat(lat...)
			slices.Sort(all)
			if len(all) > 0 {
				b.ReportMetric(float64(len(all))/el.Seconds(), "appends/s")
				b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
			}
		})
	}
}
