package tablemaster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// workload is a sequence of commands touching every op.
func workload(n int) []Command {
	cmds := []Command{
		{UnixMs: 1, Payload: CreateTenant{Tenant: "default"}},
		register("", "h1:1", "a"), register("", "h2:1", "b"), register("", "h3:1", "c"),
	}
	for i := 0; len(cmds) < n; i++ {
		cmds = append(cmds, createTable("default", fmt.Sprintf("t%d", i), uint32(1+i%5)))
		switch i % 4 {
		case 1:
			cmds = append(cmds, Command{Payload: ServerDown{ServerID: fmt.Sprintf("srv-%d", 1+i%3)}})
		case 2:
			cmds = append(cmds, register(fmt.Sprintf("srv-%d", 1+(i-1)%3), "h:9", "a"))
		case 3:
			cmds = append(cmds, Command{Payload: DropTable{Tenant: "default", Table: fmt.Sprintf("t%d", i-1)}})
		}
	}
	return cmds[:n]
}

// logged is what a run of the store acknowledged.
type logged struct {
	states []*State // states[k]: after the first k commands
	sizes  []int64  // sizes[k]: log file size after the first k commands
}

// runStore applies cmds through a store in dir as the Master does (apply,
// append+fsync, maybe snapshot) and records each acknowledged state.
func runStore(t *testing.T, dir string, cmds []Command, snapshotEvery int) logged {
	t.Helper()
	s, st, seq, err := openStore(dir, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	size := func() int64 {
		fi, err := os.Stat(filepath.Join(dir, logFileName))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	l := logged{states: []*State{st.Clone()}, sizes: []int64{size()}}
	for _, c := range cmds {
		if _, err := st.Apply(c); err != nil {
			t.Fatalf("Apply(%+v): %v", c, err)
		}
		seq++
		if err := s.append(logEntry{Seq: seq, Cmd: c}); err != nil {
			t.Fatal(err)
		}
		if snapshotEvery > 0 && s.records >= snapshotEvery {
			if err := snapshotNow(s, st, seq); err != nil {
				t.Fatal(err)
			}
		}
		l.states = append(l.states, st.Clone())
		l.sizes = append(l.sizes, size())
	}
	return l
}

func reopen(t *testing.T, dir string) (*State, uint64, error) {
	t.Helper()
	s, st, seq, err := openStore(dir, testLogger(t))
	if err != nil {
		return nil, 0, err
	}
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	return st, seq, nil
}

func TestStoreRoundTrip(t *testing.T) {
	for _, every := range []int{0, 1, 3, 7} {
		t.Run(fmt.Sprintf("snapshotEvery=%d", every), func(t *testing.T) {
			dir := t.TempDir()
			cmds := workload(40)
			l := runStore(t, dir, cmds[:20], every)
			st, seq, err := reopen(t, dir)
			if err != nil {
				t.Fatal(err)
			}
			if seq != 20 || !reflect.DeepEqual(st, l.states[20]) {
				t.Fatalf("reopened at seq %d with a different state", seq)
			}
			// Keep going on the reopened store.
			l2 := runStore(t, dir, cmds[20:], every)
			st, seq, err = reopen(t, dir)
			if err != nil {
				t.Fatal(err)
			}
			if seq != 40 || !reflect.DeepEqual(st, l2.states[20]) {
				t.Fatalf("second reopen at seq %d with a different state", seq)
			}
			want := NewState()
			mustApply(t, want, cmds...)
			if !reflect.DeepEqual(st, want) {
				t.Fatalf("persisted state differs from applying the commands directly")
			}
		})
	}
}

// TestStoreCrashTornTail cuts the log at every byte offset of its last
// record (a crash in the middle of that append) and at zero-filled
// extensions: reopening must give every acknowledged command, drop only the
// unacknowledged one, and leave a log that takes appends again.
func TestStoreCrashTornTail(t *testing.T) {
	src := t.TempDir()
	cmds := workload(12)
	l := runStore(t, src, cmds, 0)
	full, err := os.ReadFile(filepath.Join(src, logFileName))
	if err != nil {
		t.Fatal(err)
	}
	n := len(cmds)
	lastStart := l.sizes[n-1]
	type crash struct {
		name string
		data []byte
	}
	var crashes []crash
	for cut := lastStart; cut < int64(len(full)); cut++ {
		crashes = append(crashes, crash{fmt.Sprintf("cut@%d", cut), full[:cut]})
		// Space allocated, never written: the tail reads as zeros.
		z := append(append([]byte{}, full[:cut]...), make([]byte, int64(len(full))-cut)...)
		crashes = append(crashes, crash{fmt.Sprintf("zeros@%d", cut), z})
	}
	for _, c := range crashes {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, logFileName), c.data, 0o644); err != nil {
			t.Fatal(err)
		}
		st, seq, err := reopen(t, dir)
		if err != nil {
			t.Fatalf("%s: reopen: %v", c.name, err)
		}
		if seq != uint64(n-1) || !reflect.DeepEqual(st, l.states[n-1]) {
			t.Fatalf("%s: reopened at seq %d, want %d with every acknowledged command", c.name, seq, n-1)
		}
		fi, err := os.Stat(filepath.Join(dir, logFileName))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() != lastStart {
			t.Fatalf("%s: torn tail not cut: size %d, want %d", c.name, fi.Size(), lastStart)
		}
		// The repaired log takes the lost command again.
		runStore(t, dir, cmds[n-1:], 0)
		st, seq, err = reopen(t, dir)
		if err != nil || seq != uint64(n) || !reflect.DeepEqual(st, l.states[n]) {
			t.Fatalf("%s: after re-append: seq %d err %v", c.name, seq, err)
		}
	}
}

// TestStoreCorruptMiddle flips one bit at every byte before the last record:
// replay must fail with ErrCorrupt, never panic or drop acknowledged
// commands silently. Flips in the last record may read as a torn tail.
func TestStoreCorruptMiddle(t *testing.T) {
	src := t.TempDir()
	cmds := workload(10)
	l := runStore(t, src, cmds, 0)
	full, err := os.ReadFile(filepath.Join(src, logFileName))
	if err != nil {
		t.Fatal(err)
	}
	n := len(cmds)
	lastStart := int(l.sizes[n-1])
	logger := testLogger(t)
	for off := range full {
		for _, bit := range []byte{0x01, 0x80} {
			data := append([]byte{}, full...)
			data[off] ^= bit
			st := NewState()
			_, _, seq, err := replayLog(data, st, 0, logger)
			switch {
			case off < lastStart && !errors.Is(err, ErrCorrupt):
				t.Fatalf("flip %#x at %d: err %v, want ErrCorrupt", bit, off, err)
			case off >= lastStart && err != nil && !errors.Is(err, ErrCorrupt):
				t.Fatalf("flip %#x at %d in the last record: err %v", bit, off, err)
			case off >= lastStart && err == nil && (seq != uint64(n-1) || !reflect.DeepEqual(st, l.states[n-1])):
				t.Fatalf("flip %#x at %d in the last record: seq %d", bit, off, seq)
			}
		}
	}
}

// TestStoreCrashBetweenSnapshotAndLogReset: the snapshot is renamed in but
// the log still holds the commands it covers; replay must not apply them twice.
func TestStoreCrashBetweenSnapshotAndLogReset(t *testing.T) {
	dir := t.TempDir()
	cmds := workload(15)
	l := runStore(t, dir, cmds[:10], 0)
	staleLog, err := os.ReadFile(filepath.Join(dir, logFileName))
	if err != nil {
		t.Fatal(err)
	}
	s, st, seq, err := openStore(dir, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := snapshotNow(s, st, seq); err != nil {
		t.Fatal(err)
	}
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	// The crash: the snapshot (seq 10) is in, the log reset never happened.
	if err := os.WriteFile(filepath.Join(dir, logFileName), staleLog, 0o644); err != nil {
		t.Fatal(err)
	}
	st, seq, err = reopen(t, dir)
	if err != nil || seq != 10 || !reflect.DeepEqual(st, l.states[10]) {
		t.Fatalf("reopen with a stale log: seq %d err %v", seq, err)
	}
	// Appends after the stale records replay on top of the snapshot.
	runStore(t, dir, cmds[10:], 0)
	st, seq, err = reopen(t, dir)
	want := NewState()
	mustApply(t, want, cmds...)
	if err != nil || seq != 15 || !reflect.DeepEqual(st, want) {
		t.Fatalf("reopen after more appends: seq %d err %v", seq, err)
	}
}

func TestStoreRefusesBadFiles(t *testing.T) {
	hdr := func(magic string, version uint32) []byte {
		b := make([]byte, fileHeaderLen)
		copy(b, magic)
		binary.LittleEndian.PutUint32(b[8:], version)
		binary.LittleEndian.PutUint32(b[12:], crc32.Checksum(b[:12], castagnoli))
		return b
	}
	tests := []struct {
		name string
		file string
		data []byte
		want error
	}{
		{"log version 2", logFileName, hdr(logMagic, 2), ErrUnsupportedVersion},
		{"log wrong magic", logFileName, hdr(snapMagic, 1), ErrCorrupt},
		{"log short header", logFileName, hdr(logMagic, 1)[:9], ErrCorrupt},
		{"snapshot version 2", snapFileName, hdr(snapMagic, 2), ErrUnsupportedVersion},
		{"snapshot empty", snapFileName, hdr(snapMagic, 1), ErrCorrupt},
		{"snapshot torn", snapFileName, appendRecord(hdr(snapMagic, 1), []byte(`{"seq":1}`))[:20], ErrCorrupt},
		{"snapshot without state", snapFileName, appendRecord(hdr(snapMagic, 1), []byte(`{"seq":1}`)), ErrCorrupt},
		{"snapshot not json", snapFileName, appendRecord(hdr(snapMagic, 1), []byte(`{`)), ErrCorrupt},
		{"log not json", logFileName, appendRecord(hdr(logMagic, 1), []byte(`nope`)), ErrCorrupt},
		{"log seq gap", logFileName, appendRecord(hdr(logMagic, 1), []byte(`{"seq":2,"cmd":{"op":"create_tenant","tenant":"x"}}`)), ErrCorrupt},
		{"log command that fails", logFileName, appendRecord(hdr(logMagic, 1), []byte(`{"seq":1,"cmd":{"op":"drop_table","tenant":"x","table":"y"}}`)), ErrCorrupt},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, tc.file), tc.data, 0o644); err != nil {
				t.Fatal(err)
			}
			if _, _, err := reopen(t, dir); !errors.Is(err, tc.want) {
				t.Fatalf("reopen: %v, want %v", err, tc.want)
			}
		})
	}
}

// snapshotNow cuts, writes and trims a snapshot of st (after seq) at once,
// as the Master does in three steps.
func snapshotNow(s *store, st *State, seq uint64) error {
	c := s.cut(seq)
	if err := writeSnapshot(s.dir, st, seq); err != nil {
		return err
	}
	return s.trim(c)
}
