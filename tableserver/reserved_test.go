package tableserver

import (
	"testing"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/coproc/abi"
)

// The API refuses exactly the keys coprocessors keep for the platform.
func TestReservedPrefixesAgree(t *testing.T) {
	if api.ReservedKeyPrefix != abi.ReservedPrefix {
		t.Fatalf("api.ReservedKeyPrefix %q != abi.ReservedPrefix %q", api.ReservedKeyPrefix, abi.ReservedPrefix)
	}
	if err := api.ValidateKey("key", []byte(abi.IdempotencyPrefix+"tok")); api.DetailOf(err).GetReason() != "key_reserved" {
		t.Fatalf("ValidateKey of an idempotency key: %v", err)
	}
	if err := api.ValidateKey("key", []byte("\x00tabul")); err != nil {
		t.Fatalf("ValidateKey of a key sharing part of the prefix: %v", err)
	}
}
