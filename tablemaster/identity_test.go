package tablemaster

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/tabuladb/tabula/api"
)

func registerInc(id, addr string, inc uint64) Command {
	return Command{Payload: RegisterServer{ServerID: id, Addr: addr, FaultDomain: "fd-" + id, Incarnation: inc}}
}

// epochsAndAddrs lists every partition's epoch and replica addresses.
func epochsAndAddrs(s *State) map[uint64]string {
	out := map[uint64]string{}
	for _, t := range s.Tables {
		for _, p := range t.Partitions {
			v := ""
			for _, r := range p.Replicas {
				v += r.ServerID + "@" + r.Addr + " "
			}
			out[p.ID] = fmt.Sprintf("%s e%d", strings.TrimSpace(v), p.Epoch)
		}
	}
	return out
}

// TestRegisterIdentity: a live server id belongs to one process, (incarnation,
// addr). Another process is refused until the first drains or is declared
// dead; the same process again changes nothing.
func TestRegisterIdentity(t *testing.T) {
	s := NewState()
	mustApply(t, s,
		Command{Payload: CreateTenant{Tenant: "default"}},
		registerInc("a", "h1:1", 1),
		registerInc("b", "h2:1", 5),
		Command{Payload: CreateTable{Tenant: "default", Table: "disk", Kind: point, Options: &TableOptions{Partitions: 4, Storage: StorageSSD}}},
	)
	before := s.Clone()

	// The same process again (the master restarted): nothing changes.
	if res := mustApply(t, s, registerInc("a", "h1:1", 1)); res.Changed {
		t.Fatalf("re-registration of the same process changed the state: %+v", res)
	}
	if !reflect.DeepEqual(s, before) {
		t.Fatal("re-registration of the same process changed the state")
	}

	// Another process while the id is alive: refused, state untouched.
	for _, c := range []Command{
		registerInc("a", "h9:1", 1), // the review's case: a new address, same epochs
		registerInc("a", "h1:1", 2), // a new incarnation at the same address
		registerInc("a", "h9:1", 2),
		registerInc("a", "h1:1", 0), // a server from before incarnations
	} {
		_, err := s.Apply(c)
		if !errors.Is(err, ErrServerInUse) || api.CodeOf(err) != api.ErrorCode_ERROR_CODE_ALREADY_EXISTS || api.DetailOf(err).GetReason() != "server_id_in_use" {
			t.Fatalf("register %+v while the id is alive: %v", c, err)
		}
		if !reflect.DeepEqual(s, before) {
			t.Fatalf("refused registration %+v changed the state", c)
		}
	}

	// The holder silent past its lease (the master's liveness says so):
	// a new process takes the id over at once, without waiting for the
	// declaration of death.
	mustApply(t, s, Command{Payload: RegisterServer{ServerID: "b", Addr: "h2:9", FaultDomain: "fd-b", Incarnation: 50, HolderSilent: true}})
	if srv := s.Servers["b"]; !srv.Alive || srv.Incarnation != 50 || srv.Addr != "h2:9" {
		t.Fatalf("server after a takeover from a silent holder: %+v", srv)
	}
	if _, err := s.Apply(registerInc("b", "h2:1", 5)); !errors.Is(err, ErrServerInUse) {
		t.Fatalf("the superseded process registering again: %v", err)
	}

	// Declared dead: the new process takes over the replicas the id still
	// holds (durable single copies) at their epochs, at its address.
	mustApply(t, s, Command{UnixMs: 5, Payload: ServerDown{ServerID: "a"}})
	held := epochsAndAddrs(s)
	mustApply(t, s, registerInc("a", "h9:1", 2))
	if srv := s.Servers["a"]; !srv.Alive || srv.Incarnation != 2 || srv.Addr != "h9:1" {
		t.Fatalf("server after the new process registered: %+v", srv)
	}
	for id, v := range epochsAndAddrs(s) {
		if want := strings.ReplaceAll(held[id], "a@h1:1", "a@h9:1"); v != want {
			t.Fatalf("partition %d: %s, want %s", id, v, want)
		}
	}
	// The old process (cut off while declared dead) comes back: refused.
	if _, err := s.Apply(registerInc("a", "h1:1", 1)); !errors.Is(err, ErrServerInUse) {
		t.Fatalf("old process re-registering over the new one: %v", err)
	}

	// Draining: the next process may register at once.
	mustApply(t, s, Command{Payload: ServerDown{ServerID: "b", Draining: true}})
	mustApply(t, s, registerInc("b", "h2:2", 6))
	if srv := s.Servers["b"]; !srv.Alive || srv.Draining || srv.Incarnation != 6 {
		t.Fatalf("server after a drained one's successor registered: %+v", srv)
	}

	// A server from before incarnations (state logged with 0) that comes
	// back at its address with one is adopted; at another it is refused.
	s.Servers["b"].Incarnation = 0
	if _, err := s.Apply(registerInc("b", "h2:3", 7)); !errors.Is(err, ErrServerInUse) {
		t.Fatalf("pre-incarnation server at a new address: %v", err)
	}
	if res := mustApply(t, s, registerInc("b", "h2:2", 7)); !res.Changed || s.Servers["b"].Incarnation != 7 {
		t.Fatalf("pre-incarnation server not adopted: %+v %+v", res, s.Servers["b"])
	}
}

// TestDefaultFaultDomain: a server that names no domain gets one of its own,
// stable for its id, in the map and in the stream layer.
func TestDefaultFaultDomain(t *testing.T) {
	s := NewState()
	mustApply(t, s, Command{Payload: CreateTenant{Tenant: "default"}})
	a := mustApply(t, s, register("", "h1:1", "")).ServerID
	b := mustApply(t, s, register("", "h2:1", "")).ServerID
	mustApply(t, s, createTable("default", "t", 2))
	fa, fb := s.Servers[a].FaultDomain, s.Servers[b].FaultDomain
	if fa != DefaultFaultDomain(a) || fb != DefaultFaultDomain(b) || fa == fb {
		t.Fatalf("default fault domains %q %q", fa, fb)
	}
	for _, p := range s.Tables["default/t"].Partitions {
		if r := p.Replicas[0]; r.FaultDomain != DefaultFaultDomain(r.ServerID) {
			t.Fatalf("replica %+v", r)
		}
	}
	for _, n := range s.streams().Nodes() {
		if n.FaultDomain != DefaultFaultDomain(n.ID) {
			t.Fatalf("extent node %+v", n)
		}
	}
	// The same server again: the same domain, nothing changes.
	if res := mustApply(t, s, register(a, "h1:1", "")); res.Changed {
		t.Fatalf("re-registration changed the state: %+v", res)
	}
}

func TestCheckReplication(t *testing.T) {
	for _, tc := range []struct {
		n      uint32
		served bool
		code   api.ErrorCode
	}{
		{1, false, 0},
		{2, false, api.ErrorCode_ERROR_CODE_UNIMPLEMENTED},
		{1, true, 0},
		{3, true, 0},
		{5, true, 0},
		{6, true, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT},
		{6, false, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT},
		{0, true, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT},
	} {
		err := checkReplication(tc.n, tc.served)
		if api.CodeOf(err) != tc.code && !(tc.code == 0 && err == nil) {
			t.Errorf("checkReplication(%d, %v) = %v, want code %v", tc.n, tc.served, err, tc.code)
		}
	}
}

// serveReplication turns the replicationServed switch on for one test.
func serveReplication(t *testing.T) {
	t.Helper()
	was := replicationServed
	replicationServed = true
	t.Cleanup(func() { replicationServed = was })
}

// TestReplicationFaultDomains: with replication served, a factor above the
// number of fault domains of the available servers is refused, naming both.
func TestReplicationFaultDomains(t *testing.T) {
	serveReplication(t)
	o, err := NormalizeOptions(point, nil)
	if err != nil || o.Replication != DefaultReplication {
		t.Fatalf("default factor %d (%v), want %d", o.Replication, err, DefaultReplication)
	}
	s := NewState()
	mustApply(t, s,
		Command{Payload: CreateTenant{Tenant: "default"}},
		register("a", "h1:1", "rack-1"),
		register("b", "h2:1", "rack-1"), // same rack as a
		register("c", "h3:1", "rack-2"),
		register("d", "h4:1", "rack-3"),
	)
	mustApply(t, s, Command{Payload: ServerDown{ServerID: "d", Draining: true}}) // leaving: not counted
	create := func(name string, n uint32) (Result, error) {
		return s.Apply(Command{Payload: CreateTable{Tenant: "default", Table: name, Kind: point, Options: &TableOptions{Partitions: 3, Storage: StorageMemory, Replication: n}}})
	}
	_, err = create("three", 3)
	d := api.DetailOf(err)
	if d.GetCode() != api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT || d.GetReason() != "replication_above_fault_domains" ||
		d.GetField() != "options.replication" || d.GetLimit() != 2 ||
		!strings.Contains(err.Error(), "replication is 3") || !strings.Contains(err.Error(), "span 2 fault domain") {
		t.Fatalf("factor 3 over 2 domains: %v (%+v)", err, d)
	}
	if _, ok := s.Tables["default/three"]; ok {
		t.Fatal("refused table exists")
	}
	if _, err := create("six", 6); api.DetailOf(err).GetReason() != "replication_out_of_range" {
		t.Fatalf("factor 6: %v", err)
	}
	res, err := create("two", 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range res.Table.Partitions {
		if len(p.Replicas) != 2 || p.Replicas[0].FaultDomain == p.Replicas[1].FaultDomain {
			t.Fatalf("partition %+v: want 2 replicas in 2 domains", p)
		}
	}
	// The drained server returns: 3 domains now.
	mustApply(t, s, register("d", "h4:1", "rack-3"))
	if _, err := create("three", 3); err != nil {
		t.Fatal(err)
	}
	// A logged command without a factor (from a master before the factor
	// was logged) replays as 1 whatever the default is now.
	res = mustApply(t, s, Command{Payload: CreateTable{Tenant: "default", Table: "old", Kind: point, Options: &TableOptions{Storage: StorageMemory}}})
	if res.Table.Options.Replication != 1 {
		t.Fatalf("legacy command replayed with factor %d", res.Table.Options.Replication)
	}
}

// TestReplicationSwitchOff: while replication is not served, the default is
// 1 and any higher factor is UNIMPLEMENTED.
func TestReplicationSwitchOff(t *testing.T) {
	if replicationServed {
		t.Skip("replication is served")
	}
	if o, err := NormalizeOptions(point, nil); err != nil || o.Replication != 1 {
		t.Fatalf("default factor %d (%v)", o.Replication, err)
	}
	s := baseState(t)
	_, err := s.Apply(Command{Payload: CreateTable{Tenant: "default", Table: "r", Kind: point, Options: &TableOptions{Replication: 2}}})
	if api.CodeOf(err) != api.ErrorCode_ERROR_CODE_UNIMPLEMENTED {
		t.Fatalf("factor 2 with replication off: %v", err)
	}
}
