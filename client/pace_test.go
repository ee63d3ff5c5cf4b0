package client

import (
	"context"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
)

// TestPacerHoldsCallsToTheShare: after a rate refusal naming a share of
// 50/s, calls of that class to that server are spaced out (others are
// not), and a call that could not be sent before its deadline fails
// SERVER_BUSY client_paced at once, without waiting.
func TestPacerHoldsCallsToTheShare(t *testing.T) {
	var ps pacers
	ps.refused("s1", &api.ErrorDetail{Code: api.ErrorCode_ERROR_CODE_SERVER_BUSY, Reason: "tenant_write_rate", Limit: 50})
	ctx := context.Background()
	start := time.Now()
	for range 20 {
		if err := ps.wait(ctx, "s1", classWrite); err != nil {
			t.Fatal(err)
		}
	}
	// 20 calls at about 56/s with a burst of 5: at least ~0.25 s.
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("20 paced calls took %v; want them spaced out", d)
	}
	start = time.Now()
	for range 100 {
		if err := ps.wait(ctx, "s1", classRead); err != nil {
			t.Fatal(err)
		}
		if err := ps.wait(ctx, "s2", classWrite); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d > 50*time.Millisecond {
		t.Errorf("calls of another class or server were held %v", d)
	}
	// Take the slots of the next second, as 50 waiting calls would.
	lim := ps.m[paceKey{"s1", classWrite}].lim
	for range 50 {
		if !lim.ReserveN(time.Now(), 1).OK() {
			t.Fatal("could not reserve a slot")
		}
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	start = time.Now()
	err := ps.wait(dctx, "s1", classWrite)
	if d := api.DetailOf(err); d.GetCode() != api.ErrorCode_ERROR_CODE_SERVER_BUSY || d.GetReason() != "client_paced" {
		t.Fatalf("a call with no slot before its deadline: %v, want SERVER_BUSY client_paced", err)
	}
	if d := time.Since(start); d > 20*time.Millisecond {
		t.Errorf("the refused call waited %v", d)
	}
}
