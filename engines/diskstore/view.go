package diskstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/vfs"
)

// ViewName is the file of a store's view rules (see ViewRule).
const ViewName = "VIEW"

// View file: on-disk, never change or reuse.
//
//	| magic "TABVIEW1" (8) | version (4, =1) | count (4) | rules: up to seq (8) lo (8) hi (8) ... | crc32c (4) |
//
// Integers little-endian; crc32c (Castagnoli) covers everything before it.
const (
	viewMagic   = "TABVIEW1"
	viewVersion = 1
	viewMaxLen  = 1 << 20
)

// ErrNoViewKey: the store has view rules but Options.ViewKey is nil.
var ErrNoViewKey = errors.New("diskstore: store has a VIEW but no Options.ViewKey")

// ViewRule hides records of the log's older segments: a record in a
// segment whose sequence number is at most UpTo is visible only if its
// key's hash (Options.ViewKey) is in [Lo, Hi] or the owner marked the key
// as kept everywhere. A split partition's child is its parent's segments,
// hard-linked, and one rule more: its range of the parent's hashes up to
// the parent's last segment; its own segments come after and are not
// filtered. Hidden records are not handed to the owner at recovery, count
// as garbage, and are never re-appended by the collector, so they vanish
// from view at once and their space is reclaimed as the collector rewrites
// the shared segments (into the child's own files: the parent's are
// never written again).
type ViewRule struct {
	UpTo   uint64
	Lo, Hi uint64
}

// view is a store's rules; nil shows everything.
type view []ViewRule

// hides reports whether the record of seq with key hash h (mark: the
// owner keeps it everywhere) is out of view.
func (v view) hides(seq, h uint64, mark bool) bool {
	if mark {
		return false
	}
	for _, r := range v {
		if seq <= r.UpTo && (h < r.Lo || h > r.Hi) {
			return true
		}
	}
	return false
}

// hidesKey is hides for a record whose key is at hand.
func (s *Store) hidesKey(seq uint64, key []byte) bool {
	if len(s.view) == 0 {
		return false
	}
	h, mark := s.opts.ViewKey(key)
	return s.view.hides(seq, h, mark)
}

func encodeView(rules []ViewRule) []byte {
	b := make([]byte, 0, 16+24*len(rules)+4)
	b = append(b, viewMagic...)
	b = binary.LittleEndian.AppendUint32(b, viewVersion)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(rules)))
	for _, r := range rules {
		b = binary.LittleEndian.AppendUint64(b, r.UpTo)
		b = binary.LittleEndian.AppendUint64(b, r.Lo)
		b = binary.LittleEndian.AppendUint64(b, r.Hi)
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// decodeView decodes a view file. Errors wrap engines.ErrCorrupt or
// ErrFormatVersion.
func decodeView(b []byte) ([]ViewRule, error) {
	if len(b) < 16+4 {
		return nil, fmt.Errorf("view of %d bytes: %w", len(b), engines.ErrCorrupt)
	}
	body := b[:len(b)-4]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return nil, fmt.Errorf("view crc: %w", engines.ErrCorrupt)
	}
	if string(body[:8]) != viewMagic {
		return nil, fmt.Errorf("view magic %q: %w", body[:8], engines.ErrCorrupt)
	}
	if v := binary.LittleEndian.Uint32(body[8:]); v != viewVersion {
		return nil, fmt.Errorf("view version %d, this build reads %d: %w", v, viewVersion, ErrFormatVersion)
	}
	n := binary.LittleEndian.Uint32(body[12:])
	p := body[16:]
	if uint64(len(p)) != uint64(n)*24 {
		return nil, fmt.Errorf("view of %d rules has %d bytes of them: %w", n, len(p), engines.ErrCorrupt)
	}
	rules := make([]ViewRule, n)
	for i := range rules {
		rules[i] = ViewRule{
			UpTo: binary.LittleEndian.Uint64(p[24*i:]),
			Lo:   binary.LittleEndian.Uint64(p[24*i+8:]),
			Hi:   binary.LittleEndian.Uint64(p[24*i+16:]),
		}
		if rules[i].Lo > rules[i].Hi {
			return nil, fmt.Errorf("view rule %d: range [%d, %d]: %w", i, rules[i].Lo, rules[i].Hi, engines.ErrCorrupt)
		}
	}
	return rules, nil
}

// ReadView returns the view rules of the store in dir (none if it has no
// VIEW file).
func ReadView(fs vfs.FS, dir string) ([]ViewRule, error) {
	if fs == nil {
		fs = vfs.Default
	}
	f, err := fs.Open(filepath.Join(dir, ViewName))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read view of %s: %w", dir, err)
	}
	b, err := io.ReadAll(io.LimitReader(f, viewMaxLen))
	if err = errors.Join(err, f.Close()); err != nil {
		return nil, fmt.Errorf("read view of %s: %w", dir, err)
	}
	rules, err := decodeView(b)
	if err != nil {
		return nil, fmt.Errorf("read view of %s: %w", dir, err)
	}
	return rules, nil
}

// WriteView durably writes the view rules of the store in dir (which
// must not be open).
func WriteView(fs vfs.FS, dir string, rules []ViewRule) error {
	if fs == nil {
		fs = vfs.Default
	}
	for i, r := range rules {
		if r.Lo > r.Hi {
			return fmt.Errorf("write view of %s: rule %d: range [%d, %d] is empty", dir, i, r.Lo, r.Hi)
		}
	}
	if err := engines.WriteFileAtomic(fs, filepath.Join(dir, ViewName), encodeView(rules)); err != nil {
		return fmt.Errorf("write view of %s: %w", dir, err)
	}
	return nil
}

// StageView writes the view file of a new store in dir (made by
// engines.StageDir: it holds no view yet), its syncs left in p.
func StageView(fs vfs.FS, dir string, rules []ViewRule, p *engines.Pending) error {
	if fs == nil {
		fs = vfs.Default
	}
	for i, r := range rules {
		if r.Lo > r.Hi {
			return fmt.Errorf("write view of %s: rule %d: range [%d, %d] is empty", dir, i, r.Lo, r.Hi)
		}
	}
	if err := engines.StageFile(fs, filepath.Join(dir, ViewName), encodeView(rules), p); err != nil {
		return fmt.Errorf("write view of %s: %w", dir, err)
	}
	return nil
}

// SharedFiles lists the files of the closed store in dir that a split's
// children share (segments and index blocks; the view each writes its
// own) and the sequence number of its newest segment (0: none), up to
// which a child's view rule reaches.
func SharedFiles(fs vfs.FS, dir string) (names []string, lastSeq uint64, err error) {
	if fs == nil {
		fs = vfs.Default
	}
	all, err := fs.List(dir)
	if err != nil {
		return nil, 0, fmt.Errorf("list store %s: %w", dir, err)
	}
	for _, n := range all {
		if seq, ok := parseSegmentName(n); ok {
			names = append(names, n)
			lastSeq = max(lastSeq, seq)
			continue
		}
		if _, ok := parseIndexName(n); ok {
			names = append(names, n)
		}
	}
	return names, lastSeq, nil
}
