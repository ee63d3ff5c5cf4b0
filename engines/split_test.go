package engines

import (
	"bytes"
	"errors"
	"testing"

	"github.com/tabuladb/tabula/engines/vfs"
)

func TestMarkerRoundTrip(t *testing.T) {
	fs := vfs.NewMem()
	if err := fs.MkdirAll("/d/p", 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"/", "/d"} {
		if err := fs.SyncDir(d); err != nil && d == "/" {
			t.Fatal(err)
		}
	}
	if _, _, done, err := SplitDone(fs, "/d/p"); done || err != nil {
		t.Fatalf("SplitDone before the commit = %v, %v", done, err)
	}
	if _, _, done, err := SplitDone(fs, "/d/absent"); done || err != nil {
		t.Fatalf("SplitDone of a missing dir = %v, %v", done, err)
	}
	if err := CommitSplit(fs, "/d/p", "/d/l", "/d/r"); err != nil {
		t.Fatal(err)
	}
	fs.Crash() // the commit is durable when it returns
	l, r, done, err := SplitDone(fs, "/d/p")
	if err != nil || !done || l != "/d/l" || r != "/d/r" {
		t.Fatalf("SplitDone = %q, %q, %v, %v", l, r, done, err)
	}
	if _, _, done, _ := MergeDone(fs, "/d/p"); done {
		t.Fatal("a split marker reads as a merge")
	}
	if err := fs.FlipBit("/d/p/"+SplitMarkerName, 10, 2); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := SplitDone(fs, "/d/p"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("SplitDone of a flipped marker: %v, want ErrCorrupt", err)
	}
	if err := RemoveDir(fs, "/d/p"); err != nil {
		t.Fatal(err)
	}
	fs.Crash()
	if names, _ := fs.List("/d"); len(names) != 0 {
		t.Fatalf("after RemoveDir /d holds %v", names)
	}
}

func FuzzDecodeMarker(f *testing.F) {
	f.Add(encodeMarker(splitMagic, "/a/left", "/a/right"))
	f.Add(encodeMarker(mergeMagic, "", ""))
	f.Add([]byte("TABSPLIT"))
	f.Fuzz(func(t *testing.T, b []byte) {
		l, r, err := decodeMarker(splitMagic, b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrMarkerVersion) {
				t.Fatalf("error %v wraps neither ErrCorrupt nor ErrMarkerVersion", err)
			}
			return
		}
		if got := encodeMarker(splitMagic, l, r); !bytes.Equal(got, b) {
			t.Fatalf("re-encoding %q, %q gives %x, decoded from %x", l, r, got, b)
		}
	})
}
