package tableserver

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

func newDirServer(t *testing.T) *Server {
	t.Helper()
	s, err := Open(Options{Masters: []string{"127.0.0.1:1"}, DataDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestPartitionDirEpochs(t *testing.T) {
	s := newDirServer(t)
	dir, err := s.preparePartitionDir(7, 3)
	if err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "segment-1")
	if err := os.WriteFile(data, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Same epoch (a restart): the data stays.
	if _, err := s.preparePartitionDir(7, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(data); err != nil {
		t.Fatalf("data lost on reopen at the same epoch: %v", err)
	}
	// Another epoch: the partition lived elsewhere meanwhile; the old data is
	// moved aside and the new directory starts empty.
	if _, err := s.preparePartitionDir(7, 5); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(data); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale data still in place: %v", err)
	}
	orphans, _ := filepath.Glob(filepath.Join(s.opts.DataDir, orphanedDir, "7-e3-*", "segment-1"))
	if len(orphans) != 1 {
		t.Fatalf("stale data not kept aside: %v", orphans)
	}
	// A corrupt EPOCH is treated like a foreign one.
	if err := os.WriteFile(filepath.Join(s.partitionDir(7), epochFile), []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.preparePartitionDir(7, 5); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(s.partitionDir(7), epochFile))
	if err != nil {
		t.Fatal(err)
	}
	if e, err := decodeEpoch(b); err != nil || e != 5 {
		t.Fatalf("EPOCH after repair: %d, %v", e, err)
	}
	if err := s.removePartitionDir(7); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.partitionDir(7)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("dropped partition's directory remains: %v", err)
	}
}

func FuzzDecodeEpoch(f *testing.F) {
	f.Add(encodeEpoch(0))
	f.Add(encodeEpoch(1 << 63))
	f.Add([]byte("tabula-partition-epoch v1\nepoch=1\ncrc32c=00000000\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := decodeEpoch(b)
		if err != nil {
			if !errors.Is(err, ErrCorruptEpoch) {
				t.Fatalf("error %v is not ErrCorruptEpoch", err)
			}
			return
		}
		if got, err := decodeEpoch(encodeEpoch(e)); err != nil || got != e {
			t.Fatalf("round trip of %d: %d, %v", e, got, err)
		}
	})
}
