package raftnode

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"path"
	"testing"

	"github.com/tabuladb/tabula/engines/vfs"
	"go.etcd.io/raft/v3/raftpb"
)

func ents(lo, hi, term uint64) []raftpb.Entry {
	var es []raftpb.Entry
	for i := lo; i <= hi; i++ {
		es = append(es, raftpb.Entry{Index: i, Term: term, Data: []byte(fmt.Sprintf("e%d.%d", i, term))})
	}
	return es
}

func mustOpen(t *testing.T, fs vfs.FS) *Storage {
	t.Helper()
	s, err := OpenStorage(fs, "/r", nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// logOf returns the terms of entries first..last of s.
func logOf(t *testing.T, s *Storage) (first, last uint64, terms []uint64) {
	t.Helper()
	first, _ = s.FirstIndex()
	last, _ = s.LastIndex()
	if last < first {
		return first, last, nil
	}
	es, err := s.Entries(first, last+1, ^uint64(0))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		terms = append(terms, e.Term)
	}
	return first, last, terms
}

func TestStorageReopen(t *testing.T) {
	fs := vfs.NewMem()
	s := mustOpen(t, fs)
	if err := s.Save(raftpb.HardState{Term: 1, Vote: 1, Commit: 0}, ents(1, 5, 1), true); err != nil {
		t.Fatal(err)
	}
	// A new leader overwrites 4..5 with term 2 entries.
	if err := s.Save(raftpb.HardState{Term: 2, Vote: 2, Commit: 3}, ents(4, 6, 2), true); err != nil {
		t.Fatal(err)
	}
	snap := raftpb.Snapshot{Data: []byte("state@5"), Metadata: raftpb.SnapshotMetadata{Index: 5, Term: 2, ConfState: raftpb.ConfState{Voters: []uint64{1, 2, 3}}}}
	if err := s.Save(raftpb.HardState{Term: 2, Vote: 2, Commit: 6}, nil, true); err != nil {
		t.Fatal(err)
	}
	if err := s.WriteSnapshotFile(snap); err != nil {
		t.Fatal(err)
	}
	if err := s.Compact(snap, 2); err != nil {
		t.Fatal(err)
	}
	if err := s.Save(raftpb.HardState{}, ents(7, 8, 2), true); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	fs.Crash()
	s = mustOpen(t, fs)
	first, last, terms := logOf(t, s)
	if first != 6 || last != 8 || fmt.Sprint(terms) != "[2 2 2]" {
		t.Fatalf("log %d..%d terms %v, want 6..8 of term 2", first, last, terms)
	}
	hs, cs, _ := s.InitialState()
	if hs.Term != 2 || hs.Vote != 2 || hs.Commit != 6 || len(cs.Voters) != 3 {
		t.Fatalf("state %+v %+v", hs, cs)
	}
	got, _ := s.Snapshot()
	if string(got.Data) != "state@5" {
		t.Fatalf("snapshot %q", got.Data)
	}
	names, _ := fs.List("/r")
	if fmt.Sprint(names) != "[snap-0000000000000005.snap wal-0000000000000003.log]" {
		t.Fatalf("files %v", names)
	}
}

func TestStorageReceivedSnapshotDropsLog(t *testing.T) {
	fs := vfs.NewMem()
	s := mustOpen(t, fs)
	if err := s.Save(raftpb.HardState{Term: 1, Commit: 2}, ents(1, 10, 1), true); err != nil {
		t.Fatal(err)
	}
	// The leader's snapshot at 8 (term 3) replaces a log that diverged.
	snap := raftpb.Snapshot{Data: []byte("x"), Metadata: raftpb.SnapshotMetadata{Index: 8, Term: 3, ConfState: raftpb.ConfState{Voters: []uint64{1}}}}
	if err := s.SaveSnapshot(snap, raftpb.HardState{Term: 3, Commit: 8}); err != nil {
		t.Fatal(err)
	}
	fs.Crash()
	s = mustOpen(t, fs)
	first, last, _ := logOf(t, s)
	if first != 9 || last != 8 {
		t.Fatalf("log %d..%d, want empty after 8", first, last)
	}
}

func TestStorageTornTail(t *testing.T) {
	clean := vfs.NewMem()
	s := mustOpen(t, clean)
	for i := uint64(1); i <= 4; i++ {
		if err := s.Save(raftpb.HardState{Term: 1, Commit: i - 1}, ents(i, i, 1), true); err != nil {
			t.Fatal(err)
		}
	}
	name := "/r/" + walName(s.gen)
	full, _ := readFile(clean, name)
	// Cut the file at every length inside the last Save's records.
	before := 0
	{
		b := appendRecord(nil, recHardState, mustMarshal(raftpb.HardState{Term: 1, Commit: 3}))
		e, _ := appendEntries(nil, ents(4, 4, 1))
		before = len(full) - len(b) - len(appendRecord(nil, recEntries, e))
	}
	for cut := before; cut < len(full); cut++ {
		fs := vfs.NewMem()
		writeAll(t, fs, name, full[:cut])
		s, err := OpenStorage(fs, "/r", nil)
		if err != nil {
			t.Fatalf("cut at %d: %v", cut, err)
		}
		if _, last, _ := logOf(t, s); last < 3 {
			t.Fatalf("cut at %d: last %d, want ≥3", cut, last)
		}
	}
}

func mustMarshal(hs raftpb.HardState) []byte {
	b, err := hs.Marshal()
	if err != nil {
		panic(err)
	}
	return b
}

func writeAll(t *testing.T, fs vfs.FS, name string, data []byte) {
	t.Helper()
	if err := fs.MkdirAll(path.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := fs.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestStorageCorruption(t *testing.T) {
	fs := vfs.NewMem()
	s := mustOpen(t, fs)
	for i := uint64(1); i <= 4; i++ {
		if err := s.Save(raftpb.HardState{Term: 1, Commit: i - 1}, ents(i, i, 1), true); err != nil {
			t.Fatal(err)
		}
	}
	name := "/r/" + walName(s.gen)
	// A flipped bit in the first record, with intact records after it.
	if err := fs.FlipBit(name, fileHeaderLen+recordHeaderLen+3, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenStorage(fs, "/r", nil); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open with a bad record in the middle: %v, want ErrCorrupt", err)
	}
	// A bad version is refused as such.
	data, _ := readFile(fs, name)
	bad := append([]byte{}, data...)
	binary.LittleEndian.PutUint32(bad[8:], 9)
	binary.LittleEndian.PutUint32(bad[12:], crc32.Checksum(bad[:12], castagnoli))
	fs2 := vfs.NewMem()
	writeAll(t, fs2, name, bad)
	if _, err := OpenStorage(fs2, "/r", nil); !errors.Is(err, ErrUnsupportedVersion) {
		t.Fatalf("open of version 9: %v, want ErrUnsupportedVersion", err)
	}
	// A log whose base snapshot is missing.
	fs3 := vfs.NewMem()
	writeAll(t, fs3, name, appendRecord(appendFileHeader(nil, walMagic), recSnapMark, snapMark{7, 2, markReset}.encode()))
	if _, err := OpenStorage(fs3, "/r", nil); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open without the base snapshot: %v, want ErrCorrupt", err)
	}
}

// TestStorageCrash runs a random workload, fails the k-th write or sync
// for every k, crashes (dropping everything unsynced, sometimes keeping a
// torn tail), reopens and checks that every acknowledged Save is there.
func TestStorageCrash(t *testing.T) {
	var leaderSnap uint64 // the index of a leader's snapshot whose install failed
	// attempted is the log as the failed call would have left it: any
	// prefix of an unacknowledged write may survive a crash.
	workload := func(fs *vfs.MemFS, seed uint64) (acked, attempted []raftpb.Entry, ackedHS raftpb.HardState, base uint64) {
		rng := rand.New(rand.NewPCG(seed, 1))
		s, err := OpenStorage(fs, "/r", nil)
		if err != nil {
			return nil, nil, raftpb.HardState{}, 0
		}
		leaderSnap = 0
		var log []raftpb.Entry // the log as acknowledged, from index 1
		term := uint64(1)
		for step := 0; step < 60; step++ {
			switch r := rng.IntN(10); {
			case r < 7: // append, sometimes overwriting a suffix
				next := uint64(len(log)) + 1
				if rng.IntN(5) == 0 && len(log) > 0 {
					next = max(base+1, next-uint64(rng.IntN(3)))
					term++
				}
				es := ents(next, next+uint64(rng.IntN(3)), term)
				hs := raftpb.HardState{Term: term, Commit: max(base, min(next-1, ackedHS.Commit+1))}
				if err := s.Save(hs, es, true); err != nil {
					return acked, append(append([]raftpb.Entry(nil), log[:next-1]...), es...), ackedHS, base
				}
				log = append(log[:next-1], es...)
				acked, ackedHS = append([]raftpb.Entry(nil), log...), hs
			case r < 9: // a snapshot of our own at the commit index
				if ackedHS.Commit <= base {
					continue
				}
				i := ackedHS.Commit
				snap := raftpb.Snapshot{Data: []byte(fmt.Sprint(i)), Metadata: raftpb.SnapshotMetadata{Index: i, Term: log[i-1].Term, ConfState: raftpb.ConfState{Voters: []uint64{1}}}}
				if err := s.WriteSnapshotFile(snap); err != nil {
					return acked, acked, ackedHS, base
				}
				if err := s.Compact(snap, uint64(rng.IntN(3))); err != nil {
					return acked, acked, ackedHS, base
				}
				base = i
			default: // a snapshot from the leader
				i := uint64(len(log)) + uint64(rng.IntN(4))
				term++
				snap := raftpb.Snapshot{Data: []byte(fmt.Sprint(i)), Metadata: raftpb.SnapshotMetadata{Index: i, Term: term, ConfState: raftpb.ConfState{Voters: []uint64{1}}}}
				hs := raftpb.HardState{Term: term, Commit: i}
				if err := s.SaveSnapshot(snap, hs); err != nil {
					leaderSnap = i
					return acked, nil, ackedHS, base
				}
				log = ents(1, i, term) // stand-ins below the base, never read
				acked, ackedHS, base = append([]raftpb.Entry(nil), log...), hs, i
			}
		}
		return acked, acked, ackedHS, base
	}
	for seed := uint64(1); seed <= 6; seed++ {
		clean := vfs.NewMem()
		workload(clean, seed)
		ops := clean.Ops(vfs.OpWrite | vfs.OpSync)
		for k := int64(0); k < ops; k++ {
			fs := vfs.NewMem()
			fs.InjectAfter(int(k), vfs.OpWrite|vfs.OpSync, nil)
			acked, attempted, hs, base := workload(fs, seed)
			if k%2 == 0 {
				fs.Crash()
			} else {
				fs.CrashKeepingPrefix(rand.New(rand.NewPCG(uint64(k), seed)))
			}
			s, err := OpenStorage(fs, "/r", nil)
			if err != nil {
				t.Fatalf("seed %d k %d: reopen: %v", seed, k, err)
			}
			first, last, _ := logOf(t, s)
			if first == leaderSnap+1 {
				_ = s.Close()
				continue // the failed install of a snapshot took effect
			}
			if first > base+1 {
				t.Fatalf("seed %d k %d: log starts at %d, acknowledged base %d", seed, k, first, base)
			}
			// The log holds every acknowledged entry after the base, or
			// every entry of the failed write's outcome.
			holds := func(want []raftpb.Entry) error {
				if last < uint64(len(want)) {
					return fmt.Errorf("log %d..%d, want to %d", first, last, len(want))
				}
				for _, e := range want {
					if e.Index <= max(base, first-1) {
						continue
					}
					if term, err := s.Term(e.Index); err != nil || term != e.Term {
						return fmt.Errorf("entry %d has term %d (%v), want %d", e.Index, term, err, e.Term)
					}
				}
				return nil
			}
			if err := holds(acked); err != nil && (attempted == nil || holds(attempted) != nil) {
				t.Fatalf("seed %d k %d: %v", seed, k, err)
			}
			got, _, _ := s.InitialState()
			if got.Term < hs.Term || got.Commit < hs.Commit {
				t.Fatalf("seed %d k %d: hard state %+v, acknowledged %+v", seed, k, got, hs)
			}
			if snap, _ := s.Snapshot(); snap.Metadata.Index < base {
				t.Fatalf("seed %d k %d: snapshot at %d, acknowledged %d", seed, k, snap.Metadata.Index, base)
			}
			_ = s.Close()
		}
	}
}

// TestStorageTornOlderGeneration: a Save without sync leaves an unsynced
// tail; a compaction then writes the next generation but fails to remove
// the old one; a crash keeps part of the old tail. The old generation's
// torn tail must be dropped, not refused: the new one holds it all.
func TestStorageTornOlderGeneration(t *testing.T) {
	for seed := uint64(0); seed < 20; seed++ {
		fs := vfs.NewMem()
		s := mustOpen(t, fs)
		if err := s.Save(raftpb.HardState{Term: 1, Commit: 3}, ents(1, 3, 1), true); err != nil {
			t.Fatal(err)
		}
		if err := s.Save(raftpb.HardState{Term: 1, Commit: 4}, ents(4, 9, 1), false); err != nil {
			t.Fatal(err)
		}
		snap := raftpb.Snapshot{Data: []byte("s"), Metadata: raftpb.SnapshotMetadata{Index: 3, Term: 1, ConfState: raftpb.ConfState{Voters: []uint64{1}}}}
		if err := s.WriteSnapshotFile(snap); err != nil {
			t.Fatal(err)
		}
		fs.Inject(vfs.Fault{Ops: vfs.OpRemove, Sticky: true})
		if err := s.Compact(snap, 0); err != nil && !errors.Is(err, vfs.ErrInjected) {
			t.Fatal(err) // a failed removal may be reported; the log is intact
		}
		fs.CrashKeepingPrefix(rand.New(rand.NewPCG(seed, 3)))
		s, err := OpenStorage(fs, "/r", nil)
		if err != nil {
			t.Fatalf("seed %d: reopen: %v", seed, err)
		}
		if _, last, _ := logOf(t, s); last != 9 {
			t.Fatalf("seed %d: last index %d, want 9", seed, last)
		}
	}
}
