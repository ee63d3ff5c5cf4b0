package diskstore

import (
	"bytes"
	"errors"
	"testing"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/vfs"
)

func TestViewHides(t *testing.T) {
	v := view{{UpTo: 10, Lo: 100, Hi: 200}, {UpTo: 5, Lo: 150, Hi: 300}}
	for _, c := range []struct {
		seq, h uint64
		mark   bool
		hidden bool
	}{
		{11, 0, false, false},   // after every rule
		{10, 150, false, false}, // in range
		{10, 99, false, true},
		{10, 201, false, true},
		{10, 99, true, false}, // marked: kept everywhere
		{5, 120, false, true}, // in the first rule's range, not the older one's
		{5, 160, false, false},
		{6, 120, false, false},
	} {
		if got := v.hides(c.seq, c.h, c.mark); got != c.hidden {
			t.Errorf("hides(seq %d, hash %d, mark %v) = %v, want %v", c.seq, c.h, c.mark, got, c.hidden)
		}
	}
}

func TestViewFile(t *testing.T) {
	fs := vfs.NewMem()
	if err := fs.MkdirAll("/s", 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"/", "/d"} {
		if err := fs.SyncDir(d); err != nil && d == "/" {
			t.Fatal(err)
		}
	}
	rules := []ViewRule{{UpTo: 7, Lo: 0, Hi: 1<<63 - 1}}
	if err := WriteView(fs, "/s", rules); err != nil {
		t.Fatal(err)
	}
	fs.Crash()
	got, err := ReadView(fs, "/s")
	if err != nil || len(got) != 1 || got[0] != rules[0] {
		t.Fatalf("ReadView = %v, %v", got, err)
	}
	// A store with a view opens only with the owner's ViewKey.
	if _, err := Open("/s", Options{FS: fs}); !errors.Is(err, ErrNoViewKey) {
		t.Fatalf("Open without ViewKey: %v, want ErrNoViewKey", err)
	}
	if err := fs.FlipBit("/s/"+ViewName, 20, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadView(fs, "/s"); !errors.Is(err, engines.ErrCorrupt) {
		t.Fatalf("ReadView of a flipped file: %v, want ErrCorrupt", err)
	}
	if err := WriteView(fs, "/s", []ViewRule{{UpTo: 1, Lo: 5, Hi: 4}}); err == nil {
		t.Fatal("WriteView took an empty range")
	}
}

func FuzzDecodeView(f *testing.F) {
	f.Add(encodeView(nil))
	f.Add(encodeView([]ViewRule{{UpTo: 3, Lo: 1, Hi: 2}, {UpTo: 9, Lo: 0, Hi: ^uint64(0)}}))
	f.Add([]byte(viewMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		rules, err := decodeView(b)
		if err != nil {
			if !errors.Is(err, engines.ErrCorrupt) && !errors.Is(err, ErrFormatVersion) {
				t.Fatalf("error %v wraps neither ErrCorrupt nor ErrFormatVersion", err)
			}
			return
		}
		if got := encodeView(rules); !bytes.Equal(got, b) {
			t.Fatalf("re-encoding %v gives %x, decoded from %x", rules, got, b)
		}
	})
}

// TestIndexBlockKeepsMark: a marked put survives an index block's encoding
// (op 3), so a restart keeps the owner's mark without reading the key.
func TestIndexBlockKeepsMark(t *testing.T) {
	in := []indexChange{
		{op: indexOpPut, hash: 1, pos: logPos{1, 40}, bytes: 10, mark: true},
		{op: indexOpPut, hash: 2, pos: logPos{1, 80}, bytes: 10},
		{op: indexOpDelete, hash: 3, old: logPos{1, 120}},
	}
	blk, err := decodeIndexBlock(encodeIndexBlock(indexKindDelta, 2, 1, logPos{2, 0}, in))
	if err != nil {
		t.Fatal(err)
	}
	for i := range in {
		if blk.changes[i] != in[i] {
			t.Fatalf("change %d: %+v, want %+v", i, blk.changes[i], in[i])
		}
	}
}
