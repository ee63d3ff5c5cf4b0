package stream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/vfs"
)

// readEntries reads every durable entry of e.
func readEntries(t testing.TB, e *Extent) []Entry {
	t.Helper()
	var out []Entry
	var cur *Entry
	var off int64
	for {
		raw, _, _, err := e.Read(off, 1<<20)
		if err != nil {
			t.Fatalf("read extent %d at %d: %v", e.ID(), off, err)
		}
		if len(raw) == 0 {
			break
		}
		if err := DecodeBlocks(raw, e.ID(), off, func(o int64, seq uint64, cont bool, p []byte) error {
			if cur == nil {
				cur = &Entry{Seq: seq, Offset: o}
			}
			cur.Blocks = append(cur.Blocks, bytes.Clone(p))
			cur.Sizes = append(cur.Sizes, blockSize(len(p)))
			if !cont {
				out = append(out, *cur)
				cur = nil
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		off += int64(len(raw))
	}
	if cur != nil {
		t.Fatalf("extent %d ends inside an entry", e.ID())
	}
	return out
}

func randomEntry(rng *rand.Rand, seq uint64) EntryData {
	en := EntryData{Seq: seq}
	for range 1 + rng.IntN(3) {
		b := make([]byte, rng.IntN(300))
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		en.Blocks = append(en.Blocks, b)
	}
	return en
}

func sameEntry(a Entry, b EntryData) bool {
	if a.Seq != b.Seq || len(a.Blocks) != len(b.Blocks) {
		return false
	}
	for i := range a.Blocks {
		if !bytes.Equal(a.Blocks[i], b.Blocks[i]) {
			return false
		}
	}
	return true
}

func TestExtentAppendReadSealReopen(t *testing.T) {
	fs := vfs.NewMem()
	s, err := OpenStore(fs, "/node")
	if err != nil {
		t.Fatal(err)
	}
	e, err := s.Create(1, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(1, true); err != nil {
		t.Fatalf("retried create: %v", err)
	}
	if _, err := s.Create(1, false); !errors.Is(err, ErrExists) {
		t.Fatalf("create with another role: %v", err)
	}
	in := []EntryData{
		{Seq: 1, Blocks: [][]byte{[]byte("one")}},
		{Seq: 2, Blocks: [][]byte{[]byte("two-a"), []byte("two-b"), {}}},
		{Seq: 3, Blocks: [][]byte{bytes.Repeat([]byte("x"), 10000)}},
	}
	locs, start, raw, err := e.AppendEntries(in)
	if err != nil || start != 0 {
		t.Fatal(start, err)
	}
	if e.Length() != 0 {
		t.Fatalf("length %d before sync", e.Length())
	}
	if err := e.Sync(); err != nil {
		t.Fatal(err)
	}
	if e.Length() != int64(len(raw)) {
		t.Fatalf("length %d, want %d", e.Length(), len(raw))
	}
	// An exact read of entry 1's second block.
	off := locs[1].Offset + locs[1].Sizes[0]
	got, _, _, err := e.Read(off, locs[1].Sizes[1])
	if err != nil {
		t.Fatal(err)
	}
	if err := DecodeBlocks(got, 1, off, func(_ int64, seq uint64, _ bool, p []byte) error {
		if seq != 2 || string(p) != "two-b" {
			return fmt.Errorf("got seq %d %q", seq, p)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := e.Read(off+1, 10); !errors.Is(err, ErrBadRange) {
		t.Fatalf("read off a boundary: %v", err)
	}
	// Seal inside an entry fails; at an entry boundary it cuts.
	if _, err := e.Seal(off); !errors.Is(err, ErrBadRange) {
		t.Fatalf("seal inside an entry: %v", err)
	}
	if _, err := e.Seal(e.Length() + 1); !errors.Is(err, ErrShort) {
		t.Fatalf("seal past the end: %v", err)
	}
	sealAt := locs[2].Offset
	seq, err := e.Seal(sealAt)
	if err != nil || seq != 2 {
		t.Fatalf("seal: seq %d, %v", seq, err)
	}
	if _, err := e.Seal(sealAt); err != nil {
		t.Fatalf("reseal at the same length: %v", err)
	}
	if _, err := e.Seal(0); !errors.Is(err, ErrSealConflict) {
		t.Fatalf("reseal elsewhere: %v", err)
	}
	if _, _, _, err := e.AppendEntries(in[:1]); !errors.Is(err, ErrSealed) {
		t.Fatalf("append after seal: %v", err)
	}
	if err := e.Scrub(nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	fs.Crash()
	s, err = OpenStore(fs, "/node")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	e, err = s.Get(1)
	if err != nil {
		t.Fatal(err)
	}
	info := e.Info()
	if !info.Sealed || info.Length != sealAt || info.LastSeq != 2 || !info.Primary {
		t.Fatalf("reopened: %+v", info)
	}
	got2 := readEntries(t, e)
	if len(got2) != 2 || !sameEntry(got2[0], in[0]) || !sameEntry(got2[1], in[1]) {
		t.Fatalf("reopened entries %+v", got2)
	}
}

func TestExtentReplicateRaw(t *testing.T) {
	s, err := OpenStore(vfs.NewMem(), "/n")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, _ := s.Create(5, true)
	q, _ := s.Create(6, false) // another id: the raw bytes must not fit
	r, err := OpenStore(vfs.NewMem(), "/m")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	sec, _ := r.Create(5, false)
	_, start, raw, err := p.AppendEntries([]EntryData{{Seq: 9, Blocks: [][]byte{[]byte("abc"), []byte("d")}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.AppendRaw(start, raw, true); !errors.Is(err, engines.ErrCorrupt) {
		t.Fatalf("raw blocks of another extent: %v", err)
	}
	if _, err := sec.AppendRaw(start+1, raw, true); !errors.Is(err, engines.ErrCorrupt) {
		t.Fatalf("raw blocks at another offset: %v", err)
	}
	if _, err := sec.AppendRaw(start, raw[:len(raw)-21], true); err == nil {
		t.Fatal("raw blocks ending inside an entry accepted")
	}
	if end, err := sec.AppendRaw(start, raw, true); err != nil || end != int64(len(raw)) {
		t.Fatal(end, err)
	}
	if _, err := sec.AppendRaw(0, raw, true); !errors.Is(err, ErrOffset) {
		t.Fatalf("replicate at a stale offset: %v", err)
	}
	if err := sec.Sync(); err != nil {
		t.Fatal(err)
	}
	n, seq, _, err := sec.Freeze()
	if err != nil || n != int64(len(raw)) || seq != 9 {
		t.Fatal(n, seq, err)
	}
	if _, err := sec.AppendRaw(n, nil, true); !errors.Is(err, ErrFrozen) {
		t.Fatalf("replicate to a frozen replica: %v", err)
	}
}

// crashScenario appends entries to a fresh extent, syncing after each,
// and seals at the end; it stops at the first error and returns the
// entries that were acknowledged (synced) and whether the seal was.
func crashScenario(fs vfs.FS, seed uint64) (acked []EntryData, all []EntryData, sealed bool, err error) {
	rng := rand.New(rand.NewPCG(seed, 1))
	s, err := OpenStore(fs, "/node")
	if err != nil {
		return nil, nil, false, err
	}
	defer s.Close()
	e, err := s.Create(3, false)
	if err != nil {
		return nil, nil, false, err
	}
	for i := range 12 {
		batch := []EntryData{randomEntry(rng, uint64(2*i+1))}
		if rng.IntN(2) == 0 {
			batch = append(batch, randomEntry(rng, uint64(2*i+2)))
		}
		all = append(all, batch...)
		if _, _, _, err := e.AppendEntries(batch); err != nil {
			return acked, all, false, err
		}
		if err := e.Sync(); err != nil {
			return acked, all, false, err
		}
		acked = append(acked, batch...)
	}
	if _, err := e.Seal(e.Length()); err != nil {
		return acked, all, false, err
	}
	return acked, all, true, nil
}

// TestExtentCrash fails the k-th write, sync or truncate of a clean run for
// every k, crashes (dropping, or with torn, unsynced appends) and checks
// that the reopened extent holds every acknowledged entry, then only whole
// entries of the run, and takes appends again.
func TestExtentCrash(t *testing.T) {
	seed := testSeed(t)
	clean := vfs.NewMem()
	if _, _, sealed, err := crashScenario(clean, seed); err != nil || !sealed {
		t.Fatal(sealed, err)
	}
	ops := vfs.OpWrite | vfs.OpSync | vfs.OpTruncate | vfs.OpCreate | vfs.OpSyncDir
	n := clean.Ops(ops)
	for k := range n {
		for _, torn := range []bool{false, true} {
			fs := vfs.NewMem()
			fs.InjectAfter(int(k), ops, nil)
			acked, all, sealed, err := crashScenario(fs, seed)
			if err == nil {
				t.Fatalf("k=%d: no failure injected", k)
			}
			if torn {
				fs.CrashKeepingPrefix(rand.New(rand.NewPCG(seed, uint64(k))))
			} else {
				fs.Crash()
			}
			s, err := OpenStore(fs, "/node")
			if err != nil {
				t.Fatalf("k=%d torn=%v: reopen: %v", k, torn, err)
			}
			e, err := s.Get(3)
			if err != nil {
				if len(acked) > 0 {
					t.Fatalf("k=%d: extent lost with %d acknowledged entries", k, len(acked))
				}
				s.Close()
				continue
			}
			got := readEntries(t, e)
			if len(got) < len(acked) || len(got) > len(all) {
				t.Fatalf("k=%d torn=%v: %d entries after crash, %d acknowledged, %d written", k, torn, len(got), len(acked), len(all))
			}
			for i := range got {
				if !sameEntry(got[i], all[i]) {
					t.Fatalf("k=%d torn=%v: entry %d differs", k, torn, i)
				}
			}
			info := e.Info()
			if sealed && !info.Sealed {
				t.Fatalf("k=%d: acknowledged seal lost", k)
			}
			if !info.Sealed {
				if _, _, _, err := e.AppendEntries([]EntryData{{Seq: 100, Blocks: [][]byte{[]byte("after")}}}); err != nil {
					t.Fatalf("k=%d: append after recovery: %v", k, err)
				}
				if err := e.Sync(); err != nil {
					t.Fatal(err)
				}
				if got2 := readEntries(t, e); len(got2) != len(got)+1 {
					t.Fatalf("k=%d: %d entries after one more append to %d", k, len(got2), len(got))
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("%d fault points, each with a clean and a torn crash", n)
}

// TestExtentBitFlip flips one bit in a middle block: reads of it and the
// scrubber report corruption, the other blocks still read, and a reopen
// keeps everything after it (damage in the middle is not a torn tail).
func TestExtentBitFlip(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 2))
	fs := vfs.NewMem()
	s, err := OpenStore(fs, "/node")
	if err != nil {
		t.Fatal(err)
	}
	e, _ := s.Create(4, true)
	var in []EntryData
	for i := range 10 {
		in = append(in, randomEntry(rng, uint64(i+1)))
	}
	locs, _, _, err := e.AppendEntries(in)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Sync(); err != nil {
		t.Fatal(err)
	}
	length := e.Length()
	victim := locs[4]
	flipAt := e.base + victim.Offset + 2 // inside the CRC-covered header
	if err := fs.FlipBit("/node/0000000000000004.ext", flipAt, uint(rng.IntN(8))); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := e.Read(victim.Offset, victim.Sizes[0]); !errors.Is(err, engines.ErrCorrupt) {
		t.Fatalf("read of the flipped block: %v", err)
	}
	if _, _, _, err := e.Read(locs[5].Offset, locs[5].Sizes[0]); err != nil {
		t.Fatalf("read of a good block: %v", err)
	}
	if err := e.Scrub(nil); !errors.Is(err, engines.ErrCorrupt) {
		t.Fatalf("scrub: %v", err)
	}
	if !e.Info().Corrupt {
		t.Fatal("not marked corrupt")
	}
	s.Close()
	s, err = OpenStore(fs, "/node")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	e, _ = s.Get(4)
	if info := e.Info(); info.Length != length || !info.Corrupt {
		t.Fatalf("reopened: %+v, want length %d, corrupt", info, length)
	}
	if _, _, _, err := e.Read(locs[9].Offset, locs[9].Sizes[0]); err != nil {
		t.Fatalf("read after the damage: %v", err)
	}
}

func TestStoreInstallAndDelete(t *testing.T) {
	fs := vfs.NewMem()
	src, _ := OpenStore(fs, "/a")
	defer src.Close()
	dst, _ := OpenStore(fs, "/b")
	defer dst.Close()
	e, _ := src.Create(9, true)
	in := []EntryData{{Seq: 1, Blocks: [][]byte{[]byte("x"), []byte("y")}}, {Seq: 2, Blocks: [][]byte{[]byte("z")}}}
	e.AppendEntries(in)
	e.Sync()
	n := e.Length()
	if _, err := e.Seal(n); err != nil {
		t.Fatal(err)
	}
	fill := func(put func(int64, []byte) error) error {
		var off int64
		for {
			raw, _, _, err := e.Read(off, 30)
			if err != nil || len(raw) == 0 {
				return err
			}
			if err := put(off, raw); err != nil {
				return err
			}
			off += int64(len(raw))
		}
	}
	if err := dst.Install(9, n+1, fill); err == nil {
		t.Fatal("copy of the wrong length installed")
	}
	if err := dst.Install(9, n, fill); err != nil {
		t.Fatal(err)
	}
	c, err := dst.Get(9)
	if err != nil {
		t.Fatal(err)
	}
	if got := readEntries(t, c); len(got) != 2 || !sameEntry(got[0], in[0]) || !sameEntry(got[1], in[1]) || !c.Info().Sealed {
		t.Fatalf("copy: %+v %+v", got, c.Info())
	}
	if err := dst.Delete(9); err != nil {
		t.Fatal(err)
	}
	if _, err := dst.Get(9); !errors.Is(err, ErrNoExtent) {
		t.Fatal(err)
	}
	if err := dst.Delete(9); err != nil {
		t.Fatal(err)
	}
	if names, _ := fs.List("/b"); len(names) != 0 {
		t.Fatalf("left %v", names)
	}
}

// A primary breaks its extent when a secondary fails, yet may hold the
// only complete copy of what a quorum acknowledged: it must take a seal
// within its synced bytes (it refused any, and the sealed extent then had
// no replica holding its data), never beyond them.
func TestBrokenExtentSealsWithinDurable(t *testing.T) {
	s, err := OpenStore(vfs.NewMem(), "/node")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	e, err := s.Create(7, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := e.AppendEntries([]EntryData{{Seq: 1, Blocks: [][]byte{[]byte("acked")}}}); err != nil {
		t.Fatal(err)
	}
	if err := e.Sync(); err != nil {
		t.Fatal(err)
	}
	durable := e.Info().Length
	if _, _, _, err := e.AppendEntries([]EntryData{{Seq: 2, Blocks: [][]byte{[]byte("not synced")}}}); err != nil {
		t.Fatal(err)
	}
	e.Break(errors.New("replicate to a secondary failed"))
	if _, err := e.Seal(durable + 1); !errors.Is(err, ErrBroken) {
		t.Fatalf("seal beyond the durable length of a broken extent: %v", err)
	}
	seq, err := e.Seal(durable)
	if err != nil || seq != 1 {
		t.Fatalf("seal at the durable length of a broken extent: seq %d, %v", seq, err)
	}
	if got := readEntries(t, e); len(got) != 1 || string(got[0].Blocks[0]) != "acked" {
		t.Fatalf("sealed extent holds %v", got)
	}
}

// TestExtentCloseWakesWaiters: Close while callers wait for the commit
// point, and while others append: every waiter returns ErrClosed, none
// hangs, and (under -race) nothing reads the file handle unguarded.
// Before, WaitCommitted and Seal read the handle under the state lock
// while Close cleared it under the I/O lock alone: a data race.
func TestExtentCloseWakesWaiters(t *testing.T) {
	for round := range 20 {
		s, err := OpenStore(vfs.NewMem(), "/node")
		if err != nil {
			t.Fatal(err)
		}
		e, err := s.Create(uint64(round+1), true)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for range 4 {
			wg.Go(func() {
				_, err := e.WaitCommitted(ctx, 1<<40)
				errs <- err
			})
		}
		wg.Go(func() {
			for i := range 50 {
				if _, _, _, err := e.AppendEntries([]EntryData{{Seq: uint64(i + 1), Blocks: [][]byte{[]byte("x")}}}); err != nil {
					return // closed under it
				}
			}
		})
		wg.Go(func() { _, _ = e.Seal(0) })
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		cancel()
		close(errs)
		for err := range errs {
			// A seal that won the race ends the waits with a length (nil).
			if err != nil && !errors.Is(err, ErrClosed) {
				t.Fatalf("round %d: a waiter got %v; want ErrClosed or a sealed length", round, err)
			}
		}
	}
}

// TestReplicateOvertakenWaits: a secondary's write that arrives before the
// data in front of it (a primary keeps several Replicate calls in flight)
// waits for that data instead of failing at the gap, and a replica that can
// no longer be written, or a caller that gives up, ends the wait.
func TestReplicateOvertakenWaits(t *testing.T) {
	s, err := OpenStore(vfs.NewMem(), "/n")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, _ := s.Create(5, true)
	r, err := OpenStore(vfs.NewMem(), "/m")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	sec, _ := r.Create(5, false)
	_, start1, raw1, err := p.AppendEntries([]EntryData{{Seq: 1, Blocks: [][]byte{[]byte("first")}}})
	if err != nil {
		t.Fatal(err)
	}
	_, start2, raw2, err := p.AppendEntries([]EntryData{{Seq: 2, Blocks: [][]byte{[]byte("second")}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		sec.waitWritten(ctx, start2)
		_, _, err := sec.appendRaw(start2, raw2, true)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("the write after a gap did not wait: %v", err)
	default:
	}
	if _, err := sec.AppendRaw(start1, raw1, true); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the overtaking write, once the data before it landed: %v", err)
	}
	if err := sec.Sync(); err != nil {
		t.Fatal(err)
	}
	if got, want := sec.Length(), start2+int64(len(raw2)); got != want {
		t.Fatalf("secondary holds %d bytes, want %d", got, want)
	}

	// Nothing will fill the gap: a freeze ends the wait (the write that
	// follows then fails as it would have).
	frozen := make(chan struct{})
	go func() {
		sec.waitWritten(ctx, sec.Length()+100)
		close(frozen)
	}()
	if _, _, _, err := sec.Freeze(); err != nil {
		t.Fatal(err)
	}
	<-frozen
	// A caller that gives up stops waiting.
	q, _ := r.Create(6, false)
	cctx, cancel := context.WithCancel(ctx)
	waited := make(chan struct{})
	go func() {
		q.waitWritten(cctx, 1000)
		close(waited)
	}()
	cancel()
	<-waited
	// Nor does a gap nothing fills hold a Replicate for long.
	start := time.Now()
	q.waitWritten(ctx, 1000)
	if took := time.Since(start); took < overtakeWait/2 || took > 10*overtakeWait {
		t.Fatalf("a gap nothing fills held the write %v (the bound is %v)", took, overtakeWait)
	}
}
