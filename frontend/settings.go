package frontend

// The gateway keeps an account's service properties and its tables'
// stored access policies in the account's own tenant, in one point
// table named SettingsTable, so every gateway reads the same ones and
// they are as durable as any record. The name cannot be an Azure table
// (Azure names are letters and digits only) and the gateway lists only
// ordered tables, so Azure clients never see it.
//
// Keys and values:
//
//	"service"         service properties (serviceProps as JSON)
//	"acl/<table>"     a table's signed identifiers ([]signedIdentifier as
//	                  JSON); <table> lower-case, as table names are
//	                  case-insensitive
//
// Every value is framed (never change or reuse the version byte):
//
//	| version (1) = 1 | crc32c (4, little-endian) of payload | payload |

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
	"sync"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
)

// SettingsTable is the point table of a tenant holding what the gateway
// stores for the account: service properties and stored access
// policies. Reserved: do not create or drop it by hand.
const SettingsTable = "azure-gateway-settings"

const settingsV1 = 1

// settingsCacheFor bounds how stale a gateway's copy of an account's
// service properties may be (a write through another gateway). The
// service allows CORS rules up to 30 s to take effect.
const settingsCacheFor = time.Second

// ErrSettingsCorrupt marks a stored settings value that fails its
// checksum or does not decode.
var ErrSettingsCorrupt = errors.New("frontend: stored gateway settings are corrupt")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// encodeSetting frames v's JSON with the version and its checksum.
func encodeSetting(v any) ([]byte, error) {
	payload, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode gateway setting: %w", err)
	}
	out := make([]byte, 5, 5+len(payload))
	out[0] = settingsV1
	binary.LittleEndian.PutUint32(out[1:5], crc32.Checksum(payload, castagnoli))
	return append(out, payload...), nil
}

// decodeSetting checks b's frame and decodes its JSON into v.
func decodeSetting(b []byte, v any) error {
	if len(b) < 5 {
		return fmt.Errorf("%w: %d bytes", ErrSettingsCorrupt, len(b))
	}
	if b[0] != settingsV1 {
		return fmt.Errorf("%w: unknown format version %d (a newer gateway wrote it?)", ErrSettingsCorrupt, b[0])
	}
	if got, want := crc32.Checksum(b[5:], castagnoli), binary.LittleEndian.Uint32(b[1:5]); got != want {
		return fmt.Errorf("%w: checksum %08x, want %08x", ErrSettingsCorrupt, got, want)
	}
	if err := json.Unmarshal(b[5:], v); err != nil {
		return fmt.Errorf("%w: %v", ErrSettingsCorrupt, err)
	}
	return nil
}

func aclKey(table string) []byte { return []byte("acl/" + strings.ToLower(table)) }

var serviceKey = []byte("service")

// settings are one account's stored settings, with a short-lived copy of
// its service properties (read on every request carrying an Origin).
// Safe for concurrent use.
type settings struct {
	c   *client.Client
	now func() time.Time

	mu sync.Mutex
	// Guarded by mu.
	props   *serviceProps
	fetched time.Time
}

// missing says err means the settings table does not exist (yet).
func missing(err error) bool {
	return errors.Is(err, client.ErrKeyNotFound) || api.CodeOf(err) == api.ErrorCode_ERROR_CODE_NOT_FOUND
}

// get reads key into v; found is false when it is not stored.
func (s *settings) get(ctx context.Context, key []byte, v any) (found bool, err error) {
	b, err := s.c.Table(SettingsTable).Get(ctx, key)
	if missing(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read gateway setting %q: %w", key, err)
	}
	if err := decodeSetting(b, v); err != nil {
		return false, fmt.Errorf("read gateway setting %q: %w", key, err)
	}
	return true, nil
}

// update replaces key's value with what fn makes of the current one (nil
// when absent; fn returns nil to delete), as a compare-and-swap retried
// on contention, so two gateways' concurrent updates both apply.
// Durable when it returns nil.
func (s *settings) update(ctx context.Context, key []byte, fn func(cur []byte) ([]byte, error)) error {
	tbl := s.c.Table(SettingsTable)
	created := false
	for attempt := 0; ; attempt++ {
		cur, err := tbl.Get(ctx, key)
		existed := true
		switch {
		case errors.Is(err, client.ErrKeyNotFound):
			existed, cur = false, nil
		case api.CodeOf(err) == api.ErrorCode_ERROR_CODE_NOT_FOUND && !created:
			// No settings table: nothing to delete, else make it.
			if next, err := fn(nil); err != nil || next == nil {
				return err
			}
			if _, err := s.c.CreateTable(ctx, SettingsTable, api.TableKind_TABLE_KIND_POINT, &api.TableOptions{}); err != nil &&
				api.CodeOf(err) != api.ErrorCode_ERROR_CODE_ALREADY_EXISTS {
				return fmt.Errorf("create the gateway's settings table: %w", err)
			}
			created = true
			continue
		case err != nil:
			return fmt.Errorf("read gateway setting %q: %w", key, err)
		}
		next, err := fn(cur)
		if err != nil {
			return err
		}
		if next == nil && !existed {
			return nil
		}
		res, err := tbl.CompareAndSwap(ctx, client.CAS{Key: key, ExpectAbsent: !existed, Expected: cur, Delete: next == nil, Value: next})
		if err != nil {
			return fmt.Errorf("write gateway setting %q: %w", key, err)
		}
		if res.Swapped {
			return nil
		}
		if attempt >= 100 {
			return fmt.Errorf("write gateway setting %q: still contended after %d attempts", key, attempt)
		}
	}
}

// serviceProps returns the account's service properties (the defaults
// when none were set), from a copy at most settingsCacheFor old.
func (s *settings) serviceProps(ctx context.Context) (*serviceProps, error) {
	s.mu.Lock()
	if p := s.props; p != nil && s.now().Sub(s.fetched) < settingsCacheFor {
		s.mu.Unlock()
		return p, nil
	}
	s.mu.Unlock()
	p := defaultServiceProps()
	if _, err := s.get(ctx, serviceKey, p); err != nil {
		return nil, err
	}
	p.fillDefaults()
	s.mu.Lock()
	s.props, s.fetched = p, s.now()
	s.mu.Unlock()
	return p, nil
}

// setServiceProps merges set into the stored properties (an element set
// omits is kept, as the service does).
func (s *settings) setServiceProps(ctx context.Context, set *serviceProps) error {
	var merged *serviceProps
	err := s.update(ctx, serviceKey, func(cur []byte) ([]byte, error) {
		merged = defaultServiceProps()
		if cur != nil {
			if err := decodeSetting(cur, merged); err != nil {
				return nil, err
			}
		}
		merged.merge(set)
		return encodeSetting(merged)
	})
	if err != nil {
		return err
	}
	merged.fillDefaults()
	s.mu.Lock()
	s.props, s.fetched = merged, s.now()
	s.mu.Unlock()
	return nil
}

// acl reads a table's signed identifiers (none when never set).
func (s *settings) acl(ctx context.Context, table string) ([]signedIdentifier, error) {
	var ids []signedIdentifier
	if _, err := s.get(ctx, aclKey(table), &ids); err != nil {
		return nil, err
	}
	return ids, nil
}

// setACL replaces a table's signed identifiers (none: deletes the
// record). Durable when it returns nil.
func (s *settings) setACL(ctx context.Context, table string, ids []signedIdentifier) error {
	return s.update(ctx, aclKey(table), func([]byte) ([]byte, error) {
		if len(ids) == 0 {
			return nil, nil
		}
		return encodeSetting(ids)
	})
}
