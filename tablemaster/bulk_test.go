package tablemaster

import (
	"errors"
	"slices"
	"testing"

	"github.com/tabuladb/tabula/api"
)

const bulkKind = api.TableKind_TABLE_KIND_BULK

// bulkState has table default/b (bulk, 3 partitions, retention 2) on two servers.
func bulkState(t *testing.T) *State {
	s := NewState()
	mustApply(t, s,
		Command{Op: OpCreateTenant, Tenant: "default"},
		register("", "h1:1", "a"),
		register("", "h2:1", "b"),
		Command{Op: OpCreateTable, Tenant: "default", Table: "b", Kind: bulkKind, Options: &TableOptions{Partitions: 3}},
	)
	return s
}

func files(n int, seed uint32) []BulkFile {
	out := make([]BulkFile, n)
	for i := range out {
		out[i] = BulkFile{Size: uint64(100 + i), CRC: seed*10 + uint32(i), Records: 10}
	}
	return out
}

func publish(v, base uint64, fs []BulkFile) Command {
	return Command{Op: OpBulkPublish, Tenant: "default", Table: "b", Version: v, BaseVersion: base, Files: fs, UnixMs: 5}
}

// loadAll reports version v loaded by every partition's host.
func loadAll(t *testing.T, s *State, v uint64, fs []BulkFile) {
	t.Helper()
	tb := s.Tables["default/b"]
	for i, p := range tb.Partitions {
		mustApply(t, s, Command{Op: OpBulkLoaded, Tenant: "default", Table: "b", Version: v, PartitionID: p.ID,
			ServerID: p.Replicas[0].ServerID, File: &fs[i], UnixMs: 9})
	}
}

func versions(s *State) (cur uint64, vs []uint64, states []string) {
	b := s.Tables["default/b"].Bulk
	for _, v := range b.Versions {
		vs = append(vs, v.Version)
		states = append(states, v.State)
	}
	return b.Current, vs, states
}

func TestBulkPublishSwitchRetain(t *testing.T) {
	s := bulkState(t)
	f1 := files(3, 1)
	mustApply(t, s, publish(1, 0, f1))
	if cur, vs, st := versions(s); cur != 0 || !slices.Equal(vs, []uint64{1}) || st[0] != BulkLoading {
		t.Fatalf("after publish: current %d versions %v %v", cur, vs, st)
	}
	// Partial load: not switched; a wrong file is refused; a repeated
	// report changes nothing.
	tb := s.Tables["default/b"]
	p0 := tb.Partitions[0]
	mustApply(t, s, Command{Op: OpBulkLoaded, Tenant: "default", Table: "b", Version: 1, PartitionID: p0.ID, ServerID: p0.Replicas[0].ServerID, File: &f1[0]})
	if res := mustApply(t, s, Command{Op: OpBulkLoaded, Tenant: "default", Table: "b", Version: 1, PartitionID: p0.ID, ServerID: p0.Replicas[0].ServerID, File: &f1[0]}); res.Changed {
		t.Fatal("repeated load report changed the state")
	}
	if _, err := s.Apply(Command{Op: OpBulkLoaded, Tenant: "default", Table: "b", Version: 1, PartitionID: p0.ID, ServerID: p0.Replicas[0].ServerID, File: &f1[1]}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("mismatched file: %v", err)
	}
	// A report from a server that does not host the partition is ignored.
	other := "srv-1"
	if p0.Replicas[0].ServerID == other {
		other = "srv-2"
	}
	if res := mustApply(t, s, Command{Op: OpBulkLoaded, Tenant: "default", Table: "b", Version: 1, PartitionID: tb.Partitions[1].ID, ServerID: "srv-9", File: &f1[1]}); res.Changed {
		t.Fatal("report of a non-host changed the state")
	}
	if cur, _, _ := versions(s); cur != 0 {
		t.Fatalf("switched before every partition loaded: %d", cur)
	}
	before := s.Version
	loadAll(t, s, 1, f1)
	if cur, vs, st := versions(s); cur != 1 || !slices.Equal(vs, []uint64{1}) || st[0] != BulkServing {
		t.Fatalf("after load: current %d versions %v %v", cur, vs, st)
	}
	if s.Version <= before {
		t.Fatal("switch did not bump the map version")
	}
	// Versions 2 and 3: retention 2 keeps the serving one and one more.
	f2, f3 := files(3, 2), files(3, 3)
	mustApply(t, s, publish(2, 0, f2))
	loadAll(t, s, 2, f2)
	mustApply(t, s, publish(3, 0, f3))
	if cur, vs, _ := versions(s); cur != 2 || !slices.Equal(vs, []uint64{1, 2, 3}) {
		t.Fatalf("while 3 loads: current %d versions %v", cur, vs)
	}
	loadAll(t, s, 3, f3)
	if cur, vs, st := versions(s); cur != 3 || !slices.Equal(vs, []uint64{2, 3}) || !slices.Equal(st, []string{BulkReady, BulkServing}) {
		t.Fatalf("after 3: current %d versions %v %v", cur, vs, st)
	}
	// Rollback to 2, then forward to 3; 1 is gone.
	mustApply(t, s, Command{Op: OpBulkRollback, Tenant: "default", Table: "b", Version: 2})
	if cur, vs, _ := versions(s); cur != 2 || !slices.Equal(vs, []uint64{2, 3}) {
		t.Fatalf("after rollback: current %d versions %v", cur, vs)
	}
	if _, err := s.Apply(Command{Op: OpBulkRollback, Tenant: "default", Table: "b", Version: 1}); api.CodeOf(err) != api.ErrorCode_ERROR_CODE_NOT_FOUND {
		t.Fatalf("rollback to unloaded version: %v", err)
	}
	mustApply(t, s, Command{Op: OpBulkRollback, Tenant: "default", Table: "b", Version: 3})

	// Publishing an old number, or the same number with other files, is
	// refused; the same files again are a no-op.
	if _, err := s.Apply(publish(2, 0, f3)); api.CodeOf(err) != api.ErrorCode_ERROR_CODE_ALREADY_EXISTS {
		t.Fatalf("republish 2 with other files: %v", err)
	}
	if _, err := s.Apply(publish(1, 0, f1)); api.CodeOf(err) != api.ErrorCode_ERROR_CODE_ALREADY_EXISTS {
		t.Fatalf("publish of a retired number: %v", err)
	}
	if res := mustApply(t, s, publish(3, 0, f3)); res.Changed {
		t.Fatal("same publish again changed the state")
	}
	if _, err := s.Apply(publish(4, 0, files(2, 4))); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("wrong file count: %v", err)
	}
	if _, err := s.Apply(publish(4, 9, files(3, 4))); api.DetailOf(err).GetReason() != "base_not_retained" {
		t.Fatalf("delta of a missing base: %v", err)
	}
	_ = other
}

func TestBulkDeltaKeepsBase(t *testing.T) {
	s := bulkState(t)
	f1, d2, d3 := files(3, 1), files(3, 2), files(3, 3)
	mustApply(t, s, publish(1, 0, f1))
	loadAll(t, s, 1, f1)
	mustApply(t, s, publish(2, 1, d2))
	loadAll(t, s, 2, d2)
	mustApply(t, s, publish(3, 2, d3))
	loadAll(t, s, 3, d3)
	// Retention 2 keeps 3 and 2; 2 needs 1, so 1 stays too.
	if cur, vs, _ := versions(s); cur != 3 || !slices.Equal(vs, []uint64{1, 2, 3}) {
		t.Fatalf("delta chain: current %d versions %v", cur, vs)
	}
	f4 := files(3, 4)
	mustApply(t, s, publish(4, 0, f4))
	loadAll(t, s, 4, f4)
	if cur, vs, _ := versions(s); cur != 4 || !slices.Equal(vs, []uint64{1, 2, 3, 4}) {
		t.Fatalf("full after deltas: current %d versions %v", cur, vs)
	}
	f5 := files(3, 5)
	mustApply(t, s, publish(5, 0, f5))
	loadAll(t, s, 5, f5)
	if cur, vs, _ := versions(s); cur != 5 || !slices.Equal(vs, []uint64{4, 5}) {
		t.Fatalf("second full: current %d versions %v", cur, vs)
	}
}

func TestBulkAbandonAndMove(t *testing.T) {
	s := bulkState(t)
	f1, f2, f3 := files(3, 1), files(3, 2), files(3, 3)
	mustApply(t, s, publish(1, 0, f1))
	loadAll(t, s, 1, f1)
	mustApply(t, s, publish(2, 0, f2))
	mustApply(t, s, publish(3, 0, f3)) // abandons 2
	if _, vs, _ := versions(s); !slices.Equal(vs, []uint64{1, 3}) {
		t.Fatalf("abandon: versions %v", vs)
	}
	// A report for the abandoned version is ignored.
	p := s.Tables["default/b"].Partitions[0]
	if res := mustApply(t, s, Command{Op: OpBulkLoaded, Tenant: "default", Table: "b", Version: 2, PartitionID: p.ID, ServerID: p.Replicas[0].ServerID, File: &f2[0]}); res.Changed {
		t.Fatal("abandoned version's report changed the state")
	}
	// A partition that moves (forced off a dead server) no longer counts
	// as loaded there: rollback needs the version loaded everywhere.
	loadAll(t, s, 3, f3)
	host := p.Replicas[0].ServerID
	mustApply(t, s, Command{Op: OpServerDown, ServerID: host, UnixMs: 10})
	mustApply(t, s, Command{Op: OpServerDown, ServerID: host, Force: true, UnixMs: 11})
	tb := s.Tables["default/b"]
	if n := tb.BulkLoadedCount(&tb.Bulk.Versions[0]); n == 3 {
		t.Fatalf("version 1 counts loaded on %d partitions after a move", n)
	}
	if _, err := s.Apply(Command{Op: OpBulkRollback, Tenant: "default", Table: "b", Version: 1}); api.DetailOf(err).GetReason() != "version_not_loaded" {
		t.Fatalf("rollback with a moved partition: %v", err)
	}
	// Not a bulk table.
	mustApply(t, s, createTable("default", "p", 2))
	if _, err := s.Apply(Command{Op: OpBulkPublish, Tenant: "default", Table: "p", Version: 1, Files: files(2, 1)}); api.CodeOf(err) != api.ErrorCode_ERROR_CODE_WRONG_KIND {
		t.Fatalf("publish to a point table: %v", err)
	}
	// The state round-trips through Clone.
	c := s.Clone()
	c.Tables["default/b"].Bulk.Versions[0].LoadedOn[0] = "x"
	if s.Tables["default/b"].Bulk.Versions[0].LoadedOn[0] == "x" {
		t.Fatal("Clone shares bulk state")
	}
}
