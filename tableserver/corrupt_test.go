package tableserver

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/engines"
)

// A record that fails its checksum on a partition's only copy is
// DATA_LOSS at once (nothing to rebuild from, nothing a retry changes),
// logged at error level; before, it was UNAVAILABLE and the SDK retried
// it for its whole retry budget.
func TestCorruptOnlyCopyIsDataLoss(t *testing.T) {
	var logs bytes.Buffer
	r := &replica{
		table:  &api.Table{Tenant: "default", Name: "t"},
		part:   &api.Partition{Id: 7, Replicas: []*api.Replica{{ServerId: "srv-1", Role: api.ReplicaRole_REPLICA_ROLE_PRIMARY}}},
		logger: slog.New(slog.NewTextHandler(&logs, nil)),
	}
	err := engineErr(r, fmt.Errorf("read key: %w", engines.ErrCorrupt))
	if d := api.DetailOf(err); d.GetCode() != api.ErrorCode_ERROR_CODE_DATA_LOSS || d.GetReason() != "corrupt" {
		t.Fatalf("engineErr = %v (%v/%q), want DATA_LOSS/corrupt", err, d.GetCode(), d.GetReason())
	}
	if !strings.Contains(logs.String(), "level=ERROR") {
		t.Fatalf("not logged at error level: %q", logs.String())
	}
}
