package client

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/tabuladb/tabula/internal/atomicfile"
)

// A profile file holds named profiles, as the Azure and AWS CLIs keep
// theirs, in INI form:
//
//	[default]
//	master = 127.0.0.1:7100
//	tenant = acme
//	key-id = 1
//	key = <base64, as tabula tenant create prints it>
//
//	[ops]
//	cluster-key-file = /etc/tabula/cluster.key
//
// Lines starting with '#' or ';' are comments. Unknown keys are refused,
// so a typo is not silently ignored.

// Profile is one named profile.
type Profile struct {
	Masters []string
	// Tenant and Credential: a tenant's key, or the cluster credential
	// read from ClusterKeyFile.
	Tenant         string
	Credential     Credential
	ClusterKeyFile string
}

// ErrNoProfile is returned (wrapped) by LoadProfile when the file or the
// profile does not exist.
var ErrNoProfile = errors.New("client: no such profile")

// DefaultConfigPath is the profile file's default location:
// $TABULA_CONFIG, else $XDG_CONFIG_HOME/tabula/config, else
// ~/.config/tabula/config.
func DefaultConfigPath() string {
	if p := os.Getenv("TABULA_CONFIG"); p != "" {
		return p
	}
	if d := os.Getenv("XDG_CONFIG_HOME"); d != "" {
		return filepath.Join(d, "tabula", "config")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(".config", "tabula", "config")
	}
	return filepath.Join(home, ".config", "tabula", "config")
}

// ParseProfiles parses a profile file: each profile's keys and values.
func ParseProfiles(b []byte) (map[string]map[string]string, error) {
	out := map[string]map[string]string{}
	var cur map[string]string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[':
			name, ok := strings.CutSuffix(line[1:], "]")
			name = strings.TrimSpace(name)
			if !ok || name == "" || strings.ContainsAny(name, "[]") {
				return nil, fmt.Errorf("line %d: want [profile-name], got %q", n, line)
			}
			if _, dup := out[name]; dup {
				return nil, fmt.Errorf("line %d: profile %q appears twice", n, name)
			}
			cur = map[string]string{}
			out[name] = cur
		default:
			k, v, ok := strings.Cut(line, "=")
			k, v = strings.TrimSpace(k), strings.TrimSpace(v)
			if !ok || k == "" {
				return nil, fmt.Errorf("line %d: want key = value, got %q", n, line)
			}
			if cur == nil {
				return nil, fmt.Errorf("line %d: %q before any [profile]", n, k)
			}
			if !slices.Contains(profileKeys, k) {
				return nil, fmt.Errorf("line %d: unknown key %q (known: %s)", n, k, strings.Join(profileKeys, ", "))
			}
			cur[k] = v
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

var profileKeys = []string{"master", "tenant", "key-id", "key", "cluster-key-file"}

// LoadProfile reads profile name from the profile file at path.
func LoadProfile(path, name string) (Profile, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return Profile{}, fmt.Errorf("%w: %s does not exist", ErrNoProfile, path)
	}
	if err != nil {
		return Profile{}, fmt.Errorf("client: read profiles: %w", err)
	}
	all, err := ParseProfiles(b)
	if err != nil {
		return Profile{}, fmt.Errorf("client: %s: %w", path, err)
	}
	kv, ok := all[name]
	if !ok {
		return Profile{}, fmt.Errorf("%w: %s has no profile %q", ErrNoProfile, path, name)
	}
	p, err := profileOf(kv)
	if err != nil {
		return Profile{}, fmt.Errorf("client: %s: profile %q: %w", path, name, err)
	}
	return p, nil
}

func profileOf(kv map[string]string) (Profile, error) {
	var p Profile
	if m := kv["master"]; m != "" {
		for _, a := range strings.Split(m, ",") {
			if a = strings.TrimSpace(a); a != "" {
				p.Masters = append(p.Masters, a)
			}
		}
	}
	p.Tenant = kv["tenant"]
	p.ClusterKeyFile = kv["cluster-key-file"]
	if k := kv["key"]; k != "" {
		if p.Tenant == "" {
			return Profile{}, errors.New("key without tenant")
		}
		if p.ClusterKeyFile != "" {
			return Profile{}, errors.New("both key and cluster-key-file: a profile holds one credential")
		}
		key, err := DecodeKey(k)
		if err != nil {
			return Profile{}, err
		}
		id := 1
		if s := kv["key-id"]; s != "" {
			if id, err = strconv.Atoi(s); err != nil || (id != 1 && id != 2) {
				return Profile{}, fmt.Errorf("key-id %q: want 1 or 2", s)
			}
		}
		p.Credential = TenantCredential(p.Tenant, id, key)
	}
	if p.ClusterKeyFile != "" {
		c, err := ReadCredentialFile(p.ClusterKeyFile)
		if err != nil {
			return Profile{}, err
		}
		p.Credential = c
	}
	return p, nil
}

// SaveProfile writes profile name into the profile file at path (created,
// readable by its owner only), replacing a profile of that name and
// keeping the others.
func SaveProfile(path, name string, p Profile) error {
	if name == "" || strings.ContainsAny(name, "[]\n") {
		return fmt.Errorf("client: profile name %q", name)
	}
	var all map[string]map[string]string
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		all = map[string]map[string]string{}
	case err != nil:
		return fmt.Errorf("client: read profiles: %w", err)
	default:
		if all, err = ParseProfiles(b); err != nil {
			return fmt.Errorf("client: %s: %w", path, err)
		}
	}
	kv := map[string]string{}
	if len(p.Masters) > 0 {
		kv["master"] = strings.Join(p.Masters, ",")
	}
	if p.Tenant != "" {
		kv["tenant"] = p.Tenant
	}
	switch {
	case p.ClusterKeyFile != "":
		kv["cluster-key-file"] = p.ClusterKeyFile
	case p.Credential.Key != nil:
		kv["key-id"] = strconv.Itoa(p.Credential.KeyID)
		kv["key"] = EncodeKey(p.Credential.Key)
	}
	all[name] = kv
	var out bytes.Buffer
	out.WriteString("# Tabula profiles (tabula --profile NAME). Keys are secrets: keep this file 0600.\n")
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(&out, "\n[%s]\n", n)
		for _, k := range profileKeys {
			if v, ok := all[n][k]; ok {
				fmt.Fprintf(&out, "%s = %s\n", k, v)
			}
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	return atomicfile.WriteFile(path, out.Bytes(), 0o600)
}
