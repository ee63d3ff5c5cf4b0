package tablemaster

import (
	"fmt"
	"reflect"
	"testing"
)

// TestRequestIDAppliedOnce: a command whose request id was applied before
// changes nothing, on the proposal path and as logged (two attempts of one
// call both committed), and the create's answer names the table it made.
func TestRequestIDAppliedOnce(t *testing.T) {
	s := baseState(t)
	create := createTable("default", "r", 1)
	create.RequestID = "req-1"
	first := mustApply(t, s, create)
	if !first.Changed || first.Duplicate || first.Table == nil {
		t.Fatalf("first attempt: %+v", first)
	}
	again := mustApply(t, s, create)
	if again.Changed || !again.Duplicate || again.Table == nil || again.Table.ID != first.Table.ID {
		t.Fatalf("retried create: %+v, want a duplicate naming table %d", again, first.Table.ID)
	}
	// Dropped by another call; a retry of the create creates nothing.
	mustApply(t, s, Command{RequestID: "req-2", Payload: DropTable{Tenant: "default", Table: "r"}})
	v := s.Version
	res, err := s.ApplyLogged(create)
	if err != nil || !res.Duplicate || res.Changed || res.Table != nil {
		t.Fatalf("logged retry after a drop: %+v, %v", res, err)
	}
	if _, ok := s.Tables[tableKey("default", "r")]; ok || s.Version != v {
		t.Fatal("a retried create made the table again")
	}
	// A new request creates it; a retried drop of the old one drops nothing.
	create.RequestID = "req-3"
	mustApply(t, s, create)
	if res := mustApply(t, s, Command{RequestID: "req-2", Payload: DropTable{Tenant: "default", Table: "r"}}); !res.Duplicate {
		t.Fatalf("retried drop: %+v", res)
	}
	if _, ok := s.Tables[tableKey("default", "r")]; !ok {
		t.Fatal("a retried drop dropped a table created after it")
	}
	// A refused command records nothing: its retry is judged anew.
	if _, err := s.Apply(Command{RequestID: "req-4", Payload: DropTable{Tenant: "default", Table: "nope"}}); err == nil {
		t.Fatal("drop of a missing table accepted")
	}
	if _, ok := s.Requests["req-4"]; ok {
		t.Fatal("a refused command's request id was recorded")
	}
	bad := createTable("default", "x", 1)
	bad.RequestID = "has space"
	if _, err := s.Apply(bad); err == nil {
		t.Fatal("a request id with a space was accepted")
	}
	if c := s.Clone(); !reflect.DeepEqual(c.Requests, s.Requests) {
		t.Fatal("Clone lost the request ids")
	}
}

// TestRequestIDsBounded: past maxRequests, the oldest half is dropped,
// the same on every replica; a successor never changes its predecessor.
func TestRequestIDsBounded(t *testing.T) {
	s := baseState(t)
	for i := range maxRequests + 1 {
		s = successorT(t, s, Command{UnixMs: int64(i), RequestID: fmt.Sprintf("r%d", i), Payload: CreateTable{Tenant: "default", Table: fmt.Sprintf("t%d", i), Kind: point, Options: &TableOptions{Partitions: 1, Storage: StorageMemory}}})
	}
	if n := len(s.Requests); n != maxRequests/2 {
		t.Fatalf("%d request ids kept, want %d", n, maxRequests/2)
	}
	if _, ok := s.Requests["r0"]; ok {
		t.Fatal("the oldest request id was kept")
	}
	if _, ok := s.Requests[fmt.Sprint("r", maxRequests)]; !ok {
		t.Fatal("the newest request id was dropped")
	}
}

func successorT(t *testing.T, cur *State, cmd Command) *State {
	t.Helper()
	n := len(cur.Requests)
	next, _, _, err := successor(cur, cmd)
	if err != nil {
		t.Fatal(err)
	}
	if len(cur.Requests) != n {
		t.Fatal("a successor changed its predecessor's request ids")
	}
	return next
}
