package tablemaster

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
)

var errCrash = errors.New("crash")

// A snapshot is cut at seq 10, written while commands 11-13 are appended,
// then the log is trimmed. A crash at every step (and with the leftover
// temp files of a crash inside an atomic replace) reopens to every
// acknowledged command, and the reopened store takes more.
func TestSnapshotCrashAtEachStep(t *testing.T) {
	cmds := workload(16)
	want := NewState()
	mustApply(t, want, cmds[:13]...)
	wantAll := NewState()
	mustApply(t, wantAll, cmds...)
	for _, crash := range []string{"cut", "snapshot-temp", "snapshot-written", "trim-read", "trim-temp", "trim-renamed", "none"} {
		t.Run(crash, func(t *testing.T) {
			dir := t.TempDir()
			s, st, seq, err := openStore(dir, testLogger(t))
			if err != nil {
				t.Fatal(err)
			}
			appendCmd := func(c Command) {
				t.Helper()
				if _, err := st.Apply(c); err != nil {
					t.Fatal(err)
				}
				seq++
				if err := s.append(logEntry{Seq: seq, Cmd: c}); err != nil {
					t.Fatal(err)
				}
			}
			for _, c := range cmds[:10] {
				appendCmd(c)
			}
			cut, snap := s.cut(seq), st.Clone()
			for _, c := range cmds[10:13] {
				appendCmd(c) // while the snapshot is being written
			}
			s.crashAt = func(step string) error {
				if step == crash {
					return errCrash
				}
				return nil
			}
			err = func() error {
				if crash == "cut" {
					return errCrash
				}
				if crash == "snapshot-temp" {
					return os.WriteFile(filepath.Join(dir, "."+snapFileName+".tmp-1"), []byte("half a snapshot"), 0o644)
				}
				if err := writeSnapshot(dir, snap, cut.seq); err != nil {
					return err
				}
				if err := s.step("snapshot-written"); err != nil {
					return err
				}
				if crash == "trim-temp" {
					return os.WriteFile(filepath.Join(dir, "."+logFileName+".tmp-1"), []byte("half a log"), 0o644)
				}
				return s.trim(cut)
			}()
			if crash == "none" && err != nil {
				t.Fatal(err)
			}
			if err := s.close(); err != nil {
				t.Fatal(err)
			}
			// The restart.
			s, st, seq, err = openStore(dir, testLogger(t))
			if err != nil {
				t.Fatal(err)
			}
			if seq != 13 || !reflect.DeepEqual(st, want) {
				t.Fatalf("after a crash at %s: seq %d, state differs: %v", crash, seq, !reflect.DeepEqual(st, want))
			}
			for _, c := range cmds[13:] {
				appendCmd(c)
			}
			if err := s.close(); err != nil {
				t.Fatal(err)
			}
			st, seq, err = reopen(t, dir)
			if err != nil || seq != 16 || !reflect.DeepEqual(st, wantAll) {
				t.Fatalf("after more commands: seq %d err %v", seq, err)
			}
			if crash == "none" {
				snapState, snapSeq, err := loadSnapshot(filepath.Join(dir, snapFileName))
				if err != nil || snapSeq != 10 || !reflect.DeepEqual(snapState, snap) {
					t.Fatalf("snapshot: seq %d err %v", snapSeq, err)
				}
			}
		})
	}
}

// The master writes a snapshot off its propose lock: commands go on (and
// are durable) while one is being written.
func TestSnapshotDoesNotBlockCommands(t *testing.T) {
	dir := t.TempDir()
	m := openQuiet(t, Options{DataDir: dir, SnapshotEvery: 3})
	writing, release := make(chan struct{}), make(chan struct{})
	m.proposeMu.Lock()
	m.store.crashAt = func(step string) error {
		if step == "snapshot-written" {
			close(writing)
			<-release
		}
		return nil
	}
	m.proposeMu.Unlock()
	ctx := context.Background()
	create := func(name string) {
		t.Helper()
		if _, err := m.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: name, Kind: api.TableKind_TABLE_KIND_POINT}); err != nil {
			t.Fatal(err)
		}
	}
	create("a")
	create("b") // the third command (with the default tenant's): a snapshot
	select {
	case <-writing:
	case <-time.After(10 * time.Second):
		t.Fatal("no snapshot started")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		create("c")
		create("d")
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("commands wait for the snapshot being written")
	}
	close(release)
	// Once the trim is done the log holds only what followed the cut.
	deadline := time.Now().Add(10 * time.Second)
	for {
		m.proposeMu.Lock()
		snapping, records := m.snapping, m.store.records
		m.proposeMu.Unlock()
		if !snapping {
			if records != 2 {
				t.Fatalf("log holds %d records after the trim, want 2", records)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("snapshot never finished")
		}
		time.Sleep(time.Millisecond)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	st, seq, err := reopen(t, dir)
	if err != nil || seq != 5 || len(st.Tables) != 4 {
		t.Fatalf("reopen: seq %d, %d tables, err %v", seq, len(st.Tables), err)
	}
}
