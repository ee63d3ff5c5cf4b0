package tablemaster

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/keyspace"
)

const point = api.TableKind_TABLE_KIND_POINT

// mustApply applies cmds in order and fails the test on any error.
func mustApply(t *testing.T, s *State, cmds ...Command) Result {
	t.Helper()
	var res Result
	for _, c := range cmds {
		var err error
		if res, err = s.Apply(c); err != nil {
			t.Fatalf("Apply(%+v): %v", c, err)
		}
	}
	return res
}

func register(id, addr, fd string) Command {
	return Command{Payload: RegisterServer{ServerID: id, Addr: addr, FaultDomain: fd}}
}

func createTable(tenant, name string, parts uint32) Command {
	return Command{UnixMs: 1000, Payload: CreateTable{Tenant: tenant, Table: name, Kind: point, Options: &TableOptions{Partitions: parts, Storage: StorageMemory}}}
}

// baseState has tenant "default", table default/t (4 partitions) and two servers.
func baseState(t *testing.T) *State {
	s := NewState()
	mustApply(t, s,
		Command{Payload: CreateTenant{Tenant: "default"}},
		register("", "h1:1", "a"),
		register("", "h2:1", "b"),
		createTable("default", "t", 4),
	)
	return s
}

func TestApplyRefusals(t *testing.T) {
	tests := []struct {
		name   string
		cmd    Command
		kind   error
		code   api.ErrorCode
		reason string
		field  string
	}{
		{"unknown op", Command{Payload: unknownPayload{op: "nope"}}, ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "unknown_command", "op"},
		{"tenant bad name", Command{Payload: CreateTenant{Tenant: "1x"}}, ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "name_invalid", "tenant"},
		{"tenant exists", Command{Payload: CreateTenant{Tenant: "default"}}, ErrTenantExists, api.ErrorCode_ERROR_CODE_ALREADY_EXISTS, "tenant_exists", ""},
		{"table empty tenant", Command{Payload: CreateTable{Table: "x", Kind: point}}, ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "name_empty", "tenant"},
		{"table empty name", Command{Payload: CreateTable{Tenant: "default", Kind: point}}, ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "name_empty", "name"},
		{"table unknown tenant", createTable("nobody", "x", 0), ErrTenantNotFound, api.ErrorCode_ERROR_CODE_NOT_FOUND, "tenant_not_found", ""},
		{"table exists", createTable("default", "t", 0), ErrTableExists, api.ErrorCode_ERROR_CODE_ALREADY_EXISTS, "table_exists", ""},
		{"kind unspecified", Command{Payload: CreateTable{Tenant: "default", Table: "x"}}, ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "kind_invalid", "kind"},
		{"bulk memory", Command{Payload: CreateTable{Tenant: "default", Table: "x", Kind: api.TableKind_TABLE_KIND_BULK, Options: &TableOptions{Storage: StorageMemory}}}, ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "storage_invalid", "options.storage"},
		{"bulk compression", Command{Payload: CreateTable{Tenant: "default", Table: "x", Kind: api.TableKind_TABLE_KIND_BULK, Options: &TableOptions{Compression: CompressionS2}}}, ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "bulk_option", "options"},
		{"bulk retained", Command{Payload: CreateTable{Tenant: "default", Table: "x", Kind: api.TableKind_TABLE_KIND_BULK, Options: &TableOptions{BulkRetainedVersions: 9}}}, ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "too_many_retained", "options.bulk_retained_versions"},
		{"point retained", Command{Payload: CreateTable{Tenant: "default", Table: "x", Kind: point, Options: &TableOptions{BulkRetainedVersions: 2}}}, ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "bulk_option", "options.bulk_retained_versions"},
		{"ordered split points unordered", Command{Payload: CreateTable{Tenant: "default", Table: "x", Kind: api.TableKind_TABLE_KIND_ORDERED, Options: &TableOptions{SplitPoints: [][]byte{[]byte("m"), []byte("c")}}}}, ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "split_points_unordered", "options.split_points"},
		{"ordered split point twice", Command{Payload: CreateTable{Tenant: "default", Table: "x", Kind: api.TableKind_TABLE_KIND_ORDERED, Options: &TableOptions{SplitPoints: [][]byte{[]byte("m"), []byte("m")}}}}, ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "split_points_unordered", "options.split_points"},
		{"ordered split point empty", Command{Payload: CreateTable{Tenant: "default", Table: "x", Kind: api.TableKind_TABLE_KIND_ORDERED, Options: &TableOptions{SplitPoints: [][]byte{{}}}}}, ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "split_point_empty", "options.split_points"},
		{"ordered partitions and split points", Command{Payload: CreateTable{Tenant: "default", Table: "x", Kind: api.TableKind_TABLE_KIND_ORDERED, Options: &TableOptions{Partitions: 4, SplitPoints: [][]byte{[]byte("m")}}}}, ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "partitions_with_split_points", "options.partitions"},
		{"point split points", Command{Payload: CreateTable{Tenant: "default", Table: "x", Kind: point, Options: &TableOptions{SplitPoints: [][]byte{[]byte("m")}}}}, ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "split_points_not_ordered", "options.split_points"},
		{"too many partitions", createTable("default", "x", api.MaxPartitions+1), ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "too_many_partitions", "options.partitions"},
		{"replication above domains", Command{Payload: CreateTable{Tenant: "default", Table: "x", Kind: point, Options: &TableOptions{Replication: 3}}}, ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "replication_above_fault_domains", "options.replication"},
		{"bulk copies above domains", Command{Payload: CreateTable{Tenant: "default", Table: "x", Kind: api.TableKind_TABLE_KIND_BULK, Options: &TableOptions{Replication: 3}}}, ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "replication_above_fault_domains", "options.replication"},
		{"value limit", Command{Payload: CreateTable{Tenant: "default", Table: "x", Kind: point, Options: &TableOptions{MaxValueBytes: api.MaxValueBytesLimit + 1}}}, ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "max_value_bytes_too_large", "options.max_value_bytes"},
		{"default ttl too long", Command{Payload: CreateTable{Tenant: "default", Table: "x", Kind: point, Options: &TableOptions{DefaultTTLMs: api.MaxTTLMs + 1}}}, ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "ttl_too_long", "options.default_ttl_ms"},
		{"durability with memory", Command{Payload: CreateTable{Tenant: "default", Table: "x", Kind: point, Options: &TableOptions{Storage: StorageMemory, Durability: DurabilityLazy}}}, ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "durability_invalid", "options.durability"},
		{"durability unknown", Command{Payload: CreateTable{Tenant: "default", Table: "x", Kind: point, Options: &TableOptions{Durability: "eventually"}}}, ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "durability_invalid", "options.durability"},
		{"compression with memory", Command{Payload: CreateTable{Tenant: "default", Table: "x", Kind: point, Options: &TableOptions{Storage: StorageMemory, Compression: CompressionS2}}}, ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "compression_invalid", "options.compression"},
		{"compression unknown", Command{Payload: CreateTable{Tenant: "default", Table: "x", Kind: point, Options: &TableOptions{Compression: "zip"}}}, ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "compression_invalid", "options.compression"},
		{"storage disk", Command{Payload: CreateTable{Tenant: "default", Table: "x", Kind: point, Options: &TableOptions{Storage: "disk"}}}, ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "storage_invalid", "options.storage"},
		{"drop unknown table", Command{Payload: DropTable{Tenant: "default", Table: "x"}}, ErrTableNotFound, api.ErrorCode_ERROR_CODE_NOT_FOUND, "table_not_found", ""},
		{"drop unknown tenant", Command{Payload: DropTable{Tenant: "nobody", Table: "t"}}, ErrTenantNotFound, api.ErrorCode_ERROR_CODE_NOT_FOUND, "tenant_not_found", ""},
		{"drop bad name", Command{Payload: DropTable{Tenant: "default", Table: "-"}}, ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "name_invalid", "name"},
		{"register no addr", register("", "", ""), ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "addr_empty", "addr"},
		{"register bad id", register("a b", "h:1", ""), ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "server_id_invalid", "server_id"},
		{"down unknown server", Command{Payload: ServerDown{ServerID: "srv-9"}}, ErrServerNotFound, api.ErrorCode_ERROR_CODE_NOT_FOUND, "server_not_found", ""},
		{"down empty id", Command{Payload: ServerDown{}}, ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "server_id_empty", "server_id"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := baseState(t)
			before := s.Clone()
			res, err := s.Apply(tc.cmd)
			if err == nil {
				t.Fatalf("Apply succeeded: %+v", res)
			}
			if !errors.Is(err, tc.kind) {
				t.Fatalf("error %v is not %v", err, tc.kind)
			}
			d := api.DetailOf(err)
			if d.Code != tc.code || d.Reason != tc.reason || d.Field != tc.field {
				t.Fatalf("detail = %v/%q/%q, want %v/%q/%q (%v)", d.Code, d.Reason, d.Field, tc.code, tc.reason, tc.field, err)
			}
			if !reflect.DeepEqual(s, before) {
				t.Fatalf("refused command changed the state")
			}
		})
	}
}

func TestCreateTableDefaultsAndPlacement(t *testing.T) {
	s := NewState()
	mustApply(t, s, Command{Payload: CreateTenant{Tenant: "default"}})
	for _, c := range []Command{register("", "h1:1", "a"), register("", "h2:1", "b"), register("", "h3:1", "c")} {
		mustApply(t, s, c)
	}
	v := s.Version
	res := mustApply(t, s, Command{UnixMs: 42, Payload: CreateTable{Tenant: "default", Table: "t", Kind: point}})
	if s.Version != v+1 {
		t.Fatalf("version %d, want %d", s.Version, v+1)
	}
	tb := res.Table
	want := TableOptions{Partitions: api.DefaultPartitions, Replication: 1, MaxValueBytes: api.DefaultMaxValueBytes, Storage: StorageSSD, Durability: DurabilitySync, Compression: CompressionNone}
	if !reflect.DeepEqual(tb.Options, want) || tb.ID != 1 || tb.CreatedUnixMs != 42 {
		t.Fatalf("table %+v, want options %+v id 1 created 42", tb, want)
	}
	for i, p := range tb.Partitions {
		start, end := keyspace.Range(i, len(tb.Partitions))
		if p.Index != uint32(i) || p.ID != uint64(i+1) || p.Start != start || p.End != end || p.Epoch != 1 {
			t.Fatalf("partition %d = %+v", i, p)
		}
		if len(p.Replicas) != 1 || p.Replicas[0].Role != api.ReplicaRole_REPLICA_ROLE_PRIMARY {
			t.Fatalf("partition %d replicas %+v", i, p.Replicas)
		}
	}
	// Ids are never reused: drop and re-create.
	mustApply(t, s, Command{Payload: DropTable{Tenant: "default", Table: "t"}})
	res = mustApply(t, s, createTable("default", "t", 12))
	if res.Table.ID != 2 || res.Table.Partitions[0].ID != 9 {
		t.Fatalf("re-created table id %d first partition %d, want 2 and 9", res.Table.ID, res.Table.Partitions[0].ID)
	}
	counts := s.ReplicaCounts()
	for _, id := range []string{"srv-1", "srv-2", "srv-3"} {
		if counts[id] != 4 {
			t.Fatalf("replica counts %v, want 4 each", counts)
		}
	}
}

func TestUnplacedThenRegister(t *testing.T) {
	s := NewState()
	res := mustApply(t, s, Command{Payload: CreateTenant{Tenant: "default"}}, createTable("default", "t", 4))
	for _, p := range res.Table.Partitions {
		if len(p.Replicas) != 0 || p.Epoch != 0 {
			t.Fatalf("partition placed with no server: %+v", p)
		}
	}
	res = mustApply(t, s, register("stable-id", "h1:1", ""))
	if res.ServerID != "stable-id" || len(res.Moved) != 4 {
		t.Fatalf("register result %+v, want stable-id placing 4", res)
	}
	for _, p := range s.Tables["default/t"].Partitions {
		if len(p.Replicas) != 1 || p.Replicas[0].ServerID != "stable-id" || p.Replicas[0].Addr != "h1:1" || p.Epoch != 1 {
			t.Fatalf("partition after register: %+v", p)
		}
	}
	// A second server gets nothing: live partitions never move.
	res = mustApply(t, s, register("", "h2:1", ""))
	if len(res.Moved) != 0 || s.ReplicaCounts()[res.ServerID] != 0 {
		t.Fatalf("second server took partitions: %+v", res)
	}
}

func TestServerDownAndReturn(t *testing.T) {
	s := NewState()
	mustApply(t, s, Command{Payload: CreateTenant{Tenant: "default"}},
		register("", "h1:1", "a"), register("", "h2:1", "b"), register("", "h3:1", "c"),
		createTable("default", "t", 12))
	before := s.Clone()
	v := s.Version
	res := mustApply(t, s, Command{Payload: ServerDown{ServerID: "srv-3"}})
	if s.Version != v+1 || len(res.Moved) != 4 || s.Servers["srv-3"].Alive {
		t.Fatalf("server down: version %d moved %v alive %v", s.Version, res.Moved, s.Servers["srv-3"].Alive)
	}
	for i, p := range s.Tables["default/t"].Partitions {
		old := before.Tables["default/t"].Partitions[i]
		switch {
		case old.Replicas[0].ServerID == "srv-3":
			if p.Epoch != old.Epoch+1 || p.Replicas[0].ServerID == "srv-3" || p.Replicas[0].Role != api.ReplicaRole_REPLICA_ROLE_PRIMARY {
				t.Fatalf("moved partition %d: %+v (was %+v)", i, p, old)
			}
		case !reflect.DeepEqual(p, old):
			t.Fatalf("partition %d on a live server changed: %+v (was %+v)", i, p, old)
		}
	}
	if c := s.ReplicaCounts(); c["srv-1"] != 6 || c["srv-2"] != 6 {
		t.Fatalf("counts after down %v, want 6/6", c)
	}
	// Down again: valid, no change, no version bump.
	res = mustApply(t, s, Command{Payload: ServerDown{ServerID: "srv-3"}})
	if res.Changed || s.Version != v+1 {
		t.Fatalf("second down changed the state: %+v", res)
	}
	// It comes back: alive, but its old partitions stay where they went.
	res = mustApply(t, s, register("srv-3", "h3:2", "c"))
	if !res.Changed || !s.Servers["srv-3"].Alive || s.Servers["srv-3"].Addr != "h3:2" || s.ReplicaCounts()["srv-3"] != 0 {
		t.Fatalf("returning server: %+v %+v", res, s.Servers["srv-3"])
	}
	// Drain srv-2: its 6 partitions go to the emptiest server, srv-3.
	res = mustApply(t, s, Command{Payload: ServerDown{ServerID: "srv-2", Draining: true}})
	if !s.Servers["srv-2"].Alive || !s.Servers["srv-2"].Draining || len(res.Moved) != 6 {
		t.Fatalf("drain: %+v %+v", res, s.Servers["srv-2"])
	}
	if c := s.ReplicaCounts(); c["srv-1"] != 6 || c["srv-3"] != 6 || c["srv-2"] != 0 {
		t.Fatalf("counts after drain %v", c)
	}
	// Same address re-register of an alive server is a no-op.
	v = s.Version
	if res = mustApply(t, s, register("srv-1", "h1:1", "a")); res.Changed || s.Version != v {
		t.Fatalf("idempotent register changed the state: %+v", res)
	}
	// Last server dies: partitions become unplaced with bumped epochs, and
	// are placed again when a server registers.
	mustApply(t, s, Command{Payload: ServerDown{ServerID: "srv-2"}}, Command{Payload: ServerDown{ServerID: "srv-3"}})
	mustApply(t, s, Command{Payload: ServerDown{ServerID: "srv-1"}})
	for _, p := range s.Tables["default/t"].Partitions {
		if len(p.Replicas) != 0 {
			t.Fatalf("partition still placed with no live server: %+v", p)
		}
	}
	res = mustApply(t, s, register("srv-2", "h2:1", "b"))
	if len(res.Moved) != 12 {
		t.Fatalf("re-registered server placed %d partitions, want 12", len(res.Moved))
	}
}

func TestRegisterIDs(t *testing.T) {
	s := NewState()
	mustApply(t, s, register("srv-2", "h:2", ""))
	a := mustApply(t, s, register("", "h:a", "")).ServerID
	b := mustApply(t, s, register("", "h:b", "")).ServerID
	if a != "srv-1" || b != "srv-3" {
		t.Fatalf("generated ids %q %q, want srv-1 srv-3 (srv-2 was taken)", a, b)
	}
}

func TestApplyDeterministic(t *testing.T) {
	cmds := []Command{
		{Payload: CreateTenant{Tenant: "default"}},
		register("", "h1:1", "a"), register("", "h2:1", "b"), register("", "h3:1", "a"),
		createTable("default", "t1", 7), createTable("default", "t2", 13),
		{Payload: ServerDown{ServerID: "srv-2"}}, createTable("default", "t3", 5),
		register("", "h4:1", "c"), {Payload: ServerDown{ServerID: "srv-1", Draining: true}},
		{Payload: DropTable{Tenant: "default", Table: "t2"}}, {Payload: PlaceShort{}},
	}
	a, b := NewState(), NewState()
	mustApply(t, a, cmds...)
	mustApply(t, b, cmds...)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("same commands gave different states")
	}
	if !reflect.DeepEqual(a, a.Clone()) {
		t.Fatalf("Clone differs")
	}
}

func TestClusterPartitionLimit(t *testing.T) {
	s := NewState()
	if _, err := s.Apply(Command{Payload: CreateTenant{Tenant: "default"}}); err != nil {
		t.Fatal(err)
	}
	full := api.MaxClusterPartitions / api.MaxPartitions
	for i := 0; i < full; i++ {
		if _, err := s.Apply(createTable("default", fmt.Sprintf("t%d", i), api.MaxPartitions)); err != nil {
			t.Fatalf("table %d: %v", i, err)
		}
	}
	before := s.Version
	_, err := s.Apply(createTable("default", "one-too-many", api.MaxPartitions))
	if d := api.DetailOf(err); d.GetReason() != "cluster_partition_limit" || d.GetLimit() != api.MaxClusterPartitions {
		t.Fatalf("over the cluster limit: %v", err)
	}
	if s.Version != before {
		t.Fatal("a refused command changed the state")
	}
	// What is left still fits.
	if _, err := s.Apply(createTable("default", "rest", uint32(api.MaxClusterPartitions-full*api.MaxPartitions))); err != nil {
		t.Fatalf("the remainder: %v", err)
	}
}

// TestDurablePartitionsWaitForTheirServer: a dead or draining server keeps
// the partitions of durable tables whose only copy it has (they would come
// back empty elsewhere); memory partitions move at once; a forced move takes
// the rest; a returning server serves what it kept.
func TestDurablePartitionsWaitForTheirServer(t *testing.T) {
	s := NewState()
	mustApply(t, s,
		Command{Payload: CreateTenant{Tenant: "default"}},
		register("a", "h:1", "fd1"),
		register("b", "h:2", "fd2"),
		Command{Payload: CreateTable{Tenant: "default", Table: "disk", Kind: point, Options: &TableOptions{Partitions: 4, Storage: StorageSSD}}},
		Command{Payload: CreateTable{Tenant: "default", Table: "mem", Kind: point, Options: &TableOptions{Partitions: 4, Storage: StorageMemory}}},
	)
	on := func(table, server string) (ids []uint64, epochs []uint64) {
		for _, p := range s.Tables["default/"+table].Partitions {
			if len(p.Replicas) == 1 && p.Replicas[0].ServerID == server {
				ids = append(ids, p.ID)
				epochs = append(epochs, p.Epoch)
			}
		}
		return ids, epochs
	}
	diskOnA, epochsBefore := on("disk", "a")
	memOnA, _ := on("mem", "a")
	if len(diskOnA) != 2 || len(memOnA) != 2 {
		t.Fatalf("placement: disk %v mem %v on a", diskOnA, memOnA)
	}

	res := mustApply(t, s, Command{UnixMs: 5000, Payload: ServerDown{ServerID: "a"}})
	if !slices.Equal(res.Held, diskOnA) || len(res.Moved) != 2 {
		t.Fatalf("server down: held %v moved %v; want held %v and the 2 memory partitions moved", res.Held, res.Moved, diskOnA)
	}
	if ids, epochs := on("disk", "a"); !slices.Equal(ids, diskOnA) || !slices.Equal(epochs, epochsBefore) {
		t.Fatalf("durable partitions changed: %v %v", ids, epochs)
	}
	if ids, _ := on("mem", "a"); len(ids) != 0 {
		t.Fatalf("memory partitions still on the dead server: %v", ids)
	}
	if s.Servers["a"].DownSinceMs != 5000 {
		t.Fatalf("DownSinceMs %d", s.Servers["a"].DownSinceMs)
	}
	// Already down: nothing more happens without force.
	if res := mustApply(t, s, Command{UnixMs: 6000, Payload: ServerDown{ServerID: "a"}}); res.Changed {
		t.Fatalf("second server down changed the state: %+v", res)
	}

	// It comes back: it still has its durable partitions.
	mustApply(t, s, register("a", "h:9", "fd1"))
	if ids, _ := on("disk", "a"); !slices.Equal(ids, diskOnA) {
		t.Fatalf("returning server lost its partitions: %v", ids)
	}
	if s.Servers["a"].DownSinceMs != 0 {
		t.Fatal("DownSinceMs not cleared on return")
	}
	for _, p := range s.Tables["default/disk"].Partitions {
		if p.Replicas[0].ServerID == "a" && p.Replicas[0].Addr != "h:9" {
			t.Fatalf("held partition kept the old address: %+v", p.Replicas[0])
		}
	}

	// Draining also keeps them (there is nowhere to hand the data to).
	res = mustApply(t, s, Command{Payload: ServerDown{ServerID: "a", Draining: true}})
	if !slices.Equal(res.Held, diskOnA) {
		t.Fatalf("drain held %v, want %v", res.Held, diskOnA)
	}

	// Forcing is refused while the server lives, then moves them with new epochs.
	if _, err := s.Apply(Command{Payload: ServerDown{ServerID: "a", Force: true}}); api.DetailOf(err).GetReason() != "server_alive" {
		t.Fatalf("force on a live server: %v", err)
	}
	mustApply(t, s, Command{UnixMs: 7000, Payload: ServerDown{ServerID: "a"}})
	res = mustApply(t, s, Command{UnixMs: 9000, Payload: ServerDown{ServerID: "a", Force: true}})
	if !slices.Equal(res.Moved, diskOnA) || len(res.Held) != 0 {
		t.Fatalf("force moved %v held %v", res.Moved, res.Held)
	}
	if ids, _ := on("disk", "a"); len(ids) != 0 {
		t.Fatalf("forced partitions still on a: %v", ids)
	}
	for _, p := range s.Tables["default/disk"].Partitions {
		if i := slices.Index(diskOnA, p.ID); i >= 0 && p.Epoch <= epochsBefore[i] {
			t.Fatalf("forced partition %d kept epoch %d", p.ID, p.Epoch)
		}
	}
}

// A replicated table's primaries spread over its servers, and each
// partition gets a commit log to be allocated.
func TestPrimariesSpread(t *testing.T) {
	s := NewState()
	mustApply(t, s,
		Command{Payload: CreateTenant{Tenant: "default"}},
		register("srv-1", "a:1", "fd-1"), register("srv-2", "a:2", "fd-2"), register("srv-3", "a:3", "fd-3"),
		Command{Payload: CreateTable{Tenant: "default", Table: "t", Kind: point, Options: &TableOptions{Partitions: 12, Replication: 3}}},
	)
	n := s.primaryCounts()
	for _, id := range []string{"srv-1", "srv-2", "srv-3"} {
		if n[id] != 4 {
			t.Fatalf("primaries per server %v, want 4 each", n)
		}
	}
	for _, p := range s.Tables["default/t"].Partitions {
		if len(p.Replicas) != 3 || p.Log == nil || p.Log.Stream != LogStreamName(p.ID) || p.Log.Extent != 0 {
			t.Fatalf("partition %d: replicas %v log %+v", p.ID, p.Replicas, p.Log)
		}
	}
}

// A secondary the log's seal could not reach leaves the replica set, and
// the partition gets a new replica at once, on a server other than the one
// dropped (before, it stayed one short until some server registered).
func TestLogResetRestoresReplication(t *testing.T) {
	s := NewState()
	mustApply(t, s,
		Command{Payload: CreateTenant{Tenant: "default"}},
		register("srv-1", "a:1", "fd-1"), register("srv-2", "a:2", "fd-2"), register("srv-3", "a:3", "fd-3"),
		register("srv-4", "a:4", "fd-4"),
		Command{Payload: CreateTable{Tenant: "default", Table: "t", Kind: point, Options: &TableOptions{Partitions: 1, Replication: 3}}},
	)
	p := s.Tables["default/t"].Partitions[0]
	mustApply(t, s, Command{Payload: PartitionLogAllocated{PartitionID: p.ID, Epoch: p.Epoch, Servers: serversOf(&p), Extent: 7}})
	var victim string
	for _, r := range p.Replicas {
		if r.Role == api.ReplicaRole_REPLICA_ROLE_SECONDARY {
			victim = r.ServerID
			break
		}
	}
	res := mustApply(t, s, Command{Payload: PartitionLogReset{PartitionID: p.ID, Epoch: p.Epoch, Servers: []string{victim}}})
	if !res.Changed {
		t.Fatal("log reset with a dropped secondary changed nothing")
	}
	q := s.Tables["default/t"].Partitions[0]
	if len(q.Replicas) != 3 {
		t.Fatalf("replicas after dropping %s: %v, want 3", victim, q.Replicas)
	}
	if hostsReplica(&q, victim) {
		t.Fatalf("the dropped server %s was placed again at once: %v", victim, q.Replicas)
	}
	if q.Epoch != p.Epoch || primaryID(&q) != primaryID(&p) {
		t.Fatalf("primary or epoch changed: %s@%d -> %s@%d", primaryID(&p), p.Epoch, primaryID(&q), q.Epoch)
	}
	if q.Log.Extent != 0 {
		t.Fatalf("log extent %d after the reset, want 0 (the next one includes the new replica)", q.Log.Extent)
	}
}
