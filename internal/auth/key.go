package auth

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/tabuladb/tabula/internal/atomicfile"
)

// KeyBytes is the length of every key: 512 bits.
const KeyBytes = 64

// ClusterPrincipal names the cluster credential's principal. Tenant names
// start with a letter, so it never collides with one.
const ClusterPrincipal = "_cluster"

// ErrBadKeyFile is returned (wrapped) for a credential file that does not
// parse or fails its checksum.
var ErrBadKeyFile = errors.New("auth: bad credential file")

// NewKey returns a fresh random key.
func NewKey() []byte {
	k := make([]byte, KeyBytes)
	if _, err := rand.Read(k); err != nil {
		panic(fmt.Sprintf("auth: no randomness: %v", err)) // crypto/rand does not fail on supported systems
	}
	return k
}

// EncodeKey renders a key as unpadded URL-safe base64 (86 characters), the
// form the CLI prints and profiles hold.
func EncodeKey(k []byte) string { return base64.RawURLEncoding.EncodeToString(k) }

// DecodeKey parses EncodeKey's form (standard base64, padded or not, is
// accepted too) and checks the length.
func DecodeKey(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	var k []byte
	var err error
	for _, enc := range []*base64.Encoding{base64.RawURLEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.StdEncoding} {
		if k, err = enc.DecodeString(s); err == nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("auth: key is not base64: %w", err)
	}
	if len(k) != KeyBytes {
		return nil, fmt.Errorf("auth: key is %d bytes; want %d (512 bits)", len(k), KeyBytes)
	}
	return k, nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// A credential file is one line:
//
//	tabula-credential 1 <principal> <key number> <key, EncodeKey> <crc32c, 8 hex>
//
// the checksum over the fields before it joined by single spaces. A line
// starting with '#' is a comment.
const credentialMagic = "tabula-credential"

// MarshalCredential renders c as a credential file.
func MarshalCredential(c Credential) []byte {
	body := fmt.Sprintf("%s 1 %s %d %s", credentialMagic, c.Principal, c.KeyID, EncodeKey(c.Key))
	return fmt.Appendf(nil, "# Tabula credential of %s: keep it secret (mode 0600).\n%s %08x\n",
		c.Principal, body, crc32.Checksum([]byte(body), castagnoli))
}

// ParseCredential parses a credential file.
func ParseCredential(b []byte) (Credential, error) {
	for _, line := range bytes.Split(b, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		f := strings.Fields(string(line))
		if len(f) != 6 || f[0] != credentialMagic {
			return Credential{}, fmt.Errorf("%w: want %q and 5 fields", ErrBadKeyFile, credentialMagic)
		}
		if f[1] != "1" {
			return Credential{}, fmt.Errorf("%w: format version %q; this release reads 1", ErrBadKeyFile, f[1])
		}
		body := strings.Join(f[:5], " ")
		sum, err := strconv.ParseUint(f[5], 16, 32)
		if err != nil || len(f[5]) != 8 {
			return Credential{}, fmt.Errorf("%w: checksum %q is not 8 hex digits", ErrBadKeyFile, f[5])
		}
		if uint32(sum) != crc32.Checksum([]byte(body), castagnoli) {
			return Credential{}, fmt.Errorf("%w: checksum mismatch (the file was changed or damaged)", ErrBadKeyFile)
		}
		id, err := strconv.Atoi(f[3])
		if err != nil || id < 0 || id > 2 {
			return Credential{}, fmt.Errorf("%w: key number %q: want 0, 1 or 2", ErrBadKeyFile, f[3])
		}
		key, err := DecodeKey(f[4])
		if err != nil {
			return Credential{}, fmt.Errorf("%w: %w", ErrBadKeyFile, err)
		}
		c := Credential{Principal: f[2], KeyID: id, Key: key}
		if err := c.Validate(); err != nil {
			return Credential{}, fmt.Errorf("%w: %w", ErrBadKeyFile, err)
		}
		return c, nil
	}
	return Credential{}, fmt.Errorf("%w: empty", ErrBadKeyFile)
}

// ReadCredentialFile reads a credential file.
func ReadCredentialFile(path string) (Credential, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Credential{}, fmt.Errorf("auth: read credential: %w", err)
	}
	c, err := ParseCredential(b)
	if err != nil {
		return Credential{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// WriteCredentialFile durably writes c to path, readable by its owner only.
func WriteCredentialFile(path string, c Credential) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	return atomicfile.WriteFile(path, MarshalCredential(c), 0o600)
}

// LoadOrCreateClusterCredential reads the cluster credential at path, or,
// if there is no file, creates one with a fresh key: a new cluster's
// credential. created reports which.
func LoadOrCreateClusterCredential(path string) (c Credential, created bool, err error) {
	c, err = ReadCredentialFile(path)
	if err == nil {
		if c.Principal != ClusterPrincipal {
			return Credential{}, false, fmt.Errorf("%s: a credential of %q, not the cluster's", path, c.Principal)
		}
		return c, false, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return Credential{}, false, err
	}
	// Create it only if still absent (link fails on an existing name), so
	// members of a raft group started together with one --cluster-key all
	// end up with the same key.
	c = Credential{Principal: ClusterPrincipal, Key: NewKey()}
	tmp := fmt.Sprintf("%s.new-%d", path, os.Getpid())
	if err := WriteCredentialFile(tmp, c); err != nil {
		return Credential{}, false, err
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, os.ErrExist) {
			c, err = ReadCredentialFile(path)
			return c, false, err
		}
		return Credential{}, false, fmt.Errorf("auth: create %s: %w", path, err)
	}
	if err := atomicfile.SyncDir(filepath.Dir(path)); err != nil {
		return Credential{}, false, err
	}
	return c, true, nil
}
