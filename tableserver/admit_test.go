package tableserver

import (
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
)

// TestClientLoadNeverRefusesReplication: with every client slot taken,
// extent replication and replica copies are still admitted, on slots of
// their own.
func TestClientLoadNeverRefusesReplication(t *testing.T) {
	s := &Server{opts: Options{MaxInFlight: 2, MaxInternalInFlight: 1, BusyRetryAfter: 10 * time.Millisecond}}
	const get, appendRPC, copyRPC = "/tabula.v1.TableServer/Get", "/tabula.stream.v1.ExtentNode/Append", "/tabula.v1.TableServer/CopyReplica"
	var held []func()
	for range 2 {
		r, err := s.admit(get)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, r)
	}
	if _, err := s.admit(get); api.CodeOf(err) != api.ErrorCode_ERROR_CODE_SERVER_BUSY {
		t.Fatalf("a third client call: %v, want SERVER_BUSY", err)
	}
	r, err := s.admit(appendRPC)
	if err != nil {
		t.Fatalf("replication under full client load: %v", err)
	}
	if _, err := s.admit(copyRPC); api.CodeOf(err) != api.ErrorCode_ERROR_CODE_SERVER_BUSY {
		t.Fatalf("a cluster call over its own limit: %v, want SERVER_BUSY", err)
	}
	r()
	if r, err := s.admit(copyRPC); err != nil {
		t.Fatalf("a replica copy once a cluster slot is free: %v", err)
	} else {
		r()
	}
	for _, r := range held {
		r()
	}
	if s.inflight.Load() != 0 || s.internalInflight.Load() != 0 {
		t.Fatalf("in flight after release: %d client, %d cluster", s.inflight.Load(), s.internalInflight.Load())
	}
}
