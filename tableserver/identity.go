package tableserver

import (
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"

	"github.com/tabuladb/tabula/internal/atomicfile"
)

// The identity file keeps a server's id across restarts, so the master knows
// a returning server. Format (text, format version 1, never change):
//
//	tabula-server-identity v1
//	id=<server id>
//	crc32c=<8 hex digits of CRC32C(id)>
const (
	identityFile   = "server-identity"
	identityHeader = "tabula-server-identity v1"
)

// ErrCorruptIdentity: the identity file does not decode or fails its checksum.
var ErrCorruptIdentity = errors.New("tableserver: corrupt server identity file")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func encodeIdentity(id string) []byte {
	return fmt.Appendf(nil, "%s\nid=%s\ncrc32c=%08x\n", identityHeader, id, crc32.Checksum([]byte(id), castagnoli))
}

func decodeIdentity(b []byte) (string, error) {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) != 3 {
		return "", fmt.Errorf("%w: %d lines, want 3", ErrCorruptIdentity, len(lines))
	}
	if lines[0] != identityHeader {
		if strings.HasPrefix(lines[0], "tabula-server-identity ") {
			return "", fmt.Errorf("%w: unsupported format %q (this binary reads v1)", ErrCorruptIdentity, lines[0])
		}
		return "", fmt.Errorf("%w: bad header %q", ErrCorruptIdentity, lines[0])
	}
	id, ok := strings.CutPrefix(lines[1], "id=")
	if !ok || id == "" {
		return "", fmt.Errorf("%w: bad id line", ErrCorruptIdentity)
	}
	var sum uint32
	if _, err := fmt.Sscanf(lines[2], "crc32c=%08x", &sum); err != nil {
		return "", fmt.Errorf("%w: bad checksum line: %v", ErrCorruptIdentity, err)
	}
	if got := crc32.Checksum([]byte(id), castagnoli); got != sum {
		return "", fmt.Errorf("%w: checksum %08x, want %08x", ErrCorruptIdentity, got, sum)
	}
	return id, nil
}

// loadIdentity returns the stored id, or "" for a new data directory.
func loadIdentity(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, identityFile))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read server identity: %w", err)
	}
	id, err := decodeIdentity(b)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", filepath.Join(dir, identityFile), err)
	}
	return id, nil
}

func storeIdentity(dir, id string) error {
	return atomicfile.WriteFile(filepath.Join(dir, identityFile), encodeIdentity(id), 0o644)
}
