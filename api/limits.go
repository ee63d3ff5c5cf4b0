package api

import (
	"fmt"
)

// Limits every server enforces and every client may check early. Raising one
// is a compatible change; lowering one is not.
const (
	// MaxKeyBytes is the largest key, 4 KiB.
	MaxKeyBytes = 4 << 10
	// DefaultMaxValueBytes is a table's value limit unless its options say
	// otherwise, 4 MiB.
	DefaultMaxValueBytes = 4 << 20
	// MaxValueBytesLimit is the most a table may set max_value_bytes to, 64 MiB.
	MaxValueBytesLimit = 64 << 20
	// MaxBatchKeys is the most keys or mutations in one partition request.
	MaxBatchKeys = 1000
	// MaxBatchBytes is the most key and value bytes in one BatchWrite, 64 MiB.
	MaxBatchBytes = 64 << 20
	// MaxMessageBytes is the gRPC message limit both sides configure: a full
	// batch plus framing.
	MaxMessageBytes = MaxBatchBytes + 8<<20
	// DefaultPartitions is a table's partition count unless its options say otherwise.
	DefaultPartitions = 8
	// MaxPartitions is the most partitions a table may have.
	MaxPartitions = 4096
	// MaxClusterPartitions is the most partitions of all tables together. A
	// partition costs about 180 bytes in the master's snapshot and in the map
	// the servers watch, so this keeps both near 20 MB, well inside
	// MaxMessageBytes.
	MaxClusterPartitions = 100000
	// MaxNameLen is the longest tenant or table name.
	MaxNameLen = 63
	// DefaultTenant is the tenant a new master creates and clients use by default.
	DefaultTenant = "default"
	// MaxTTLMs is the longest TTL a write or a table default may give,
	// 100 years in milliseconds: an expiry stays far inside int64
	// milliseconds since 1970.
	MaxTTLMs = 3_155_760_000_000
)

// ValidateTTL checks a TTL in milliseconds against MaxTTLMs (0, "the
// table's default", passes).
func ValidateTTL(field string, ms uint64) error {
	if ms > MaxTTLMs {
		return InvalidArgument(field, "ttl_too_long", MaxTTLMs, "%s is %d ms; the limit is %d ms (100 years)", field, ms, uint64(MaxTTLMs))
	}
	return nil
}

// validName reports whether name matches ^[A-Za-z][A-Za-z0-9_-]*$ (a
// byte loop: every request checks two or three names, and a regexp cost
// ~0.45 µs each).
func validName(name string) bool {
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case i > 0 && ('0' <= c && c <= '9' || c == '_' || c == '-'):
		default:
			return false
		}
	}
	return len(name) > 0
}

// ValidateName checks a tenant or table name: 1 to 63 characters, letters,
// digits, '-' and '_', starting with a letter. field names the request field
// for the error.
func ValidateName(field, name string) error {
	switch {
	case name == "":
		return InvalidArgument(field, "name_empty", 0, "%s is empty", field)
	case len(name) > MaxNameLen:
		return InvalidArgument(field, "name_too_long", MaxNameLen, "%s %q is %d characters; the limit is %d", field, name, len(name), MaxNameLen)
	case !validName(name):
		return InvalidArgument(field, "name_invalid", 0, "%s %q must start with a letter and hold only letters, digits, '-' and '_'", field, name)
	}
	return nil
}

// ValidateKey checks a key against MaxKeyBytes.
func ValidateKey(field string, key []byte) error {
	switch {
	case len(key) == 0:
		return InvalidArgument(field, "key_empty", 0, "%s is empty", field)
	case len(key) > MaxKeyBytes:
		return InvalidArgument(field, "key_too_large", MaxKeyBytes, "%s is %d bytes; the limit is %d", field, len(key), MaxKeyBytes)
	case IsReservedKey(key):
		return InvalidArgument(field, "key_reserved", 0, "%s starts with %q, which the platform keeps for itself (coprocessor idempotency records)", field, ReservedKeyPrefix)
	}
	return nil
}

// ReservedKeyPrefix starts every key the platform keeps in a table's key
// space for itself (coprocessors' idempotency records). Clients can neither
// read nor write such keys, and scans skip them. It equals
// coproc/abi.ReservedPrefix.
const ReservedKeyPrefix = "\x00tabula/"

// IsReservedKey reports whether key starts with ReservedKeyPrefix.
func IsReservedKey(key []byte) bool {
	return len(key) >= len(ReservedKeyPrefix) && string(key[:len(ReservedKeyPrefix)]) == ReservedKeyPrefix
}

// ValidateValue checks a value against a table's limit.
func ValidateValue(field string, value []byte, limit uint64) error {
	if uint64(len(value)) > limit {
		return InvalidArgument(field, "value_too_large", limit, "%s is %d bytes; the table's limit is %d", field, len(value), limit)
	}
	return nil
}

// KindName is the short name of a kind as the CLI spells it.
func KindName(k TableKind) string {
	switch k {
	case TableKind_TABLE_KIND_POINT:
		return "point"
	case TableKind_TABLE_KIND_BULK:
		return "bulk"
	case TableKind_TABLE_KIND_ORDERED:
		return "ordered"
	}
	return "unspecified"
}

// ParseKind is the inverse of KindName.
func ParseKind(s string) (TableKind, error) {
	for _, k := range []TableKind{TableKind_TABLE_KIND_POINT, TableKind_TABLE_KIND_BULK, TableKind_TABLE_KIND_ORDERED} {
		if KindName(k) == s {
			return k, nil
		}
	}
	return 0, fmt.Errorf("unknown table kind %q (want point, bulk or ordered)", s)
}
