package partition

import (
	"errors"
	"testing"
)

func drain(t *testing.T, r *Replica) Ready {
	t.Helper()
	rd := r.Ready()
	r.Advance(rd)
	if err := r.Check(); err != nil {
		t.Fatal(err)
	}
	return rd
}

func TestPrimaryLifecycle(t *testing.T) {
	r := New(Config{}, 0)
	if _, _, err := r.Propose(Proposal{Epoch: 1}); !errors.Is(err, ErrNotPrimary) {
		t.Fatalf("propose without a role: %v", err)
	}
	if err := r.BecomePrimary(1, 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Propose(Proposal{Epoch: 0}); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("stale epoch: %v", err)
	}
	if _, _, err := r.Propose(Proposal{Epoch: 2}); !errors.Is(err, ErrEpochAhead) {
		t.Fatalf("epoch ahead: %v", err)
	}
	lsn, joined, err := r.Propose(Proposal{Epoch: 1, RequestID: "a", Body: []byte("1"), Token: 10})
	if err != nil || lsn != 1 || joined {
		t.Fatalf("propose: %d %v %v", lsn, joined, err)
	}
	// A retry of the same request joins it.
	lsn2, joined, err := r.Propose(Proposal{Epoch: 1, RequestID: "a", Body: []byte("1"), Token: 11})
	if err != nil || lsn2 != 1 || !joined {
		t.Fatalf("retry: %d %v %v", lsn2, joined, err)
	}
	r.Propose(Proposal{Epoch: 1, Body: []byte("2"), Token: 12})
	rd := drain(t, r)
	if len(rd.Append) != 2 || len(rd.Apply) != 0 || len(rd.Acks) != 0 {
		t.Fatalf("first ready: %+v", rd)
	}
	// Nothing is applied before the log says durable.
	if rd := drain(t, r); !rd.Empty() {
		t.Fatalf("ready before durability: %+v", rd)
	}
	r.Durable(1)
	rd = drain(t, r)
	if len(rd.Apply) != 1 || rd.Apply[0].LSN != 1 || len(rd.Acks) != 2 {
		t.Fatalf("after durable 1: %+v", rd)
	}
	if r.Applied() != 1 {
		t.Fatalf("applied %d", r.Applied())
	}
	// The log fails: LSN 2 was cut by the seal and is sent again.
	r.AppendFailed()
	r.Propose(Proposal{Epoch: 1, Body: []byte("3"), Token: 13})
	if rd := drain(t, r); len(rd.Append) != 0 {
		t.Fatalf("append while the log is blocked: %+v", rd)
	}
	if err := r.LogRestarted(0); err == nil {
		t.Fatal("a seal below the acknowledged LSN must be refused")
	}
	if err := r.LogRestarted(1); err != nil {
		t.Fatal(err)
	}
	rd = drain(t, r)
	if len(rd.Append) != 2 || rd.Append[0].LSN != 2 || rd.Append[1].LSN != 3 {
		t.Fatalf("resend after restart: %+v", rd.Append)
	}
	// Deposed: in-flight writes fail as unknown; the records stay the
	// log's business.
	if err := r.BecomeSecondary(2); err != nil {
		t.Fatal(err)
	}
	rd = drain(t, r)
	if len(rd.Fails) != 2 || !errors.Is(rd.Fails[0].Err, ErrOutcomeUnknown) {
		t.Fatalf("fails on deposition: %+v", rd.Fails)
	}
	// As a secondary it observes the log, which kept LSN 2.
	if err := r.Observe(Record{LSN: 3, Epoch: 1}); err == nil {
		t.Fatal("a gap must be refused")
	}
	if err := r.Observe(Record{LSN: 2, Epoch: 1}); err != nil {
		t.Fatal(err)
	}
	rd = drain(t, r)
	if len(rd.Apply) != 1 || r.Applied() != 2 {
		t.Fatalf("secondary apply: %+v applied %d", rd, r.Applied())
	}
}

func TestNewPrimaryCatchesUp(t *testing.T) {
	r := New(Config{}, 0)
	if err := r.BecomeSecondary(1); err != nil {
		t.Fatal(err)
	}
	r.Observe(Record{LSN: 1})
	drain(t, r)
	if err := r.BecomePrimary(2, 3); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Propose(Proposal{Epoch: 2}); !errors.Is(err, ErrCatchingUp) {
		t.Fatalf("propose while catching up: %v", err)
	}
	r.Observe(Record{LSN: 2})
	r.Observe(Record{LSN: 3})
	drain(t, r)
	lsn, _, err := r.Propose(Proposal{Epoch: 2})
	if err != nil || lsn != 4 {
		t.Fatalf("first LSN of the new primary: %d, %v", lsn, err)
	}
	if err := r.BecomePrimary(1, 0); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("older epoch: %v", err)
	}
}

func TestBusy(t *testing.T) {
	r := New(Config{MaxInFlight: 2}, 5)
	r.BecomePrimary(1, 5)
	for i := range 2 {
		if _, _, err := r.Propose(Proposal{Epoch: 1}); err != nil {
			t.Fatal(i, err)
		}
	}
	if _, _, err := r.Propose(Proposal{Epoch: 1}); !errors.Is(err, ErrBusy) {
		t.Fatalf("over the limit: %v", err)
	}
}
