package tablemaster

import (
	"bytes"
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/keyspace"
	"github.com/tabuladb/tabula/replication/stream"
)

// Op names a command. The strings are written to the command log: never
// change or reuse one.
type Op string

const (
	// OpCreateTenant creates Command.Tenant with Keys (its key 1 and key
	// 2; none in logs from before tenants had keys).
	OpCreateTenant Op = "create_tenant"
	// OpDeleteTenant removes Command.Tenant, which has no tables.
	OpDeleteTenant Op = "delete_tenant"
	// OpRotateTenantKey replaces key KeyIndex (1 or 2) of Command.Tenant
	// with Keys[0].
	OpRotateTenantKey Op = "rotate_tenant_key"
	// OpSetTenantQuota replaces Command.Tenant's quotas with Quota.
	OpSetTenantQuota Op = "set_tenant_quota"
	// OpCreateTable creates Command.Tenant/Table with Kind and Options and
	// places its partitions on available servers (unplaced if none).
	OpCreateTable Op = "create_table"
	// OpDropTable removes a table; its ids are never reused.
	OpDropTable Op = "drop_table"
	// OpRegisterServer adds a server or brings a known one back (alive, not
	// draining, new address), then places unplaced partitions. An empty
	// ServerID asks for a new id "srv-N"; an empty FaultDomain gives the
	// server a domain of its own (DefaultFaultDomain). A live server's id is
	// refused to another process (see registerServer).
	OpRegisterServer Op = "register_server"
	// OpServerDown takes a server out of service: dead (Draining false) or
	// drained (Draining true, it stays alive until it goes silent). Every
	// partition it held loses that replica, gets a bumped epoch and a
	// replacement by placement.
	OpServerDown Op = "server_down"
	// OpForgetServer removes dead server ServerID from the cluster: every
	// partition it still holds moves to live servers. A durable partition
	// whose only copy it held moves empty and is marked DataLost, so the
	// command is refused unless AcceptDataLoss says the operator accepts
	// that (tabula server forget --accept-data-loss).
	OpForgetServer Op = "forget_server"
	// OpClearDataLoss clears the DataLost record of partition PartitionID
	// of Tenant/Table (every lost partition of the table when 0): the
	// operator acknowledged the loss, and the partitions serve what they
	// hold instead of answering DATA_LOSS for absent keys.
	OpClearDataLoss Op = "clear_data_loss"
	// OpPlace places every partition short of replicas on available servers.
	// It never moves a replica that exists.
	OpPlace Op = "place"
	// OpBulkPublish registers Version (a delta of BaseVersion when not 0)
	// of bulk table Tenant/Table with Files, loading (see bulk.go).
	OpBulkPublish Op = "bulk_publish"
	// OpBulkLoaded records that ServerID loaded File as partition
	// PartitionID of Version; the last partition to load switches to it.
	OpBulkLoaded Op = "bulk_loaded"
	// OpBulkRollback makes retained Version the serving one.
	OpBulkRollback Op = "bulk_rollback"
	// OpBulkStored records that the file of partition index PartitionID of
	// Version is in sealed stream Stream (BulkStreamName).
	OpBulkStored Op = "bulk_stored"
)

// Command is one input of the state machine: a tagged union on Op, so the
// log encodes every command the same way. Times travel inside commands, so
// Apply never reads a clock.
type Command struct {
	Op Op `json:"op"`
	// UnixMs is the proposer's clock when the command was made.
	UnixMs      int64         `json:"unix_ms,omitempty"`
	Tenant      string        `json:"tenant,omitempty"`
	Table       string        `json:"table,omitempty"`
	Kind        api.TableKind `json:"kind,omitempty"`
	Options     *TableOptions `json:"options,omitempty"`
	ServerID    string        `json:"server_id,omitempty"`
	Addr        string        `json:"addr,omitempty"`
	FaultDomain string        `json:"fault_domain,omitempty"`
	// InternalAddr: OpRegisterServer's internal listener (the extent
	// node's address for the stream layer); empty: Addr serves it.
	InternalAddr string `json:"internal_addr,omitempty"`
	// BulkCapacity: OpRegisterServer's bytes of bulk files the server may
	// hold loaded (0: not limited).
	BulkCapacity uint64 `json:"bulk_capacity,omitempty"`
	// Draining: OpServerDown because the server is shutting down, not dead.
	Draining bool `json:"draining,omitempty"`
	// Force: OpServerDown of a server already dead, moving the partitions
	// of durable tables it still holds (their data stays on its disk).
	// Masters before OpForgetServer logged it on their own after
	// --reassign-durable-after; it is only replayed now, never proposed: no
	// automatic path moves a durable partition's only copy.
	Force bool `json:"force,omitempty"`
	// Keep: OpServerDown keeps the server's replicas of partitions
	// replicated through a log (and with other replicas) in the replica
	// set, as secondaries, until they are replaced (Replace, after
	// Options.ReplaceAfter): a primary among them hands its role to
	// another replica, and the log's next extent leaves them out, but a
	// server that comes back soon (a restart, an upgrade) catches up from
	// the log instead of being copied elsewhere. Commands from before it
	// (false) drop the replicas at once.
	Keep bool `json:"keep,omitempty"`
	// To: OpMoveReplica's and OpMoveDone's target server.
	To string `json:"to,omitempty"`
	// Replace: OpServerDown of a dead server whose kept replicas (Keep)
	// are now dropped and placed again on live servers, which copy them.
	Replace bool `json:"replace,omitempty"`
	// Hold: Replace leaves these partitions' replicas on the server: the
	// proposer found no live replica that reported holding their data (in
	// sync or catching up), so the dead one may be the only full copy.
	Hold []uint64 `json:"hold,omitempty"`
	// Incarnation: OpRegisterServer's process incarnation, a random number
	// the server picks at each start (0 from servers that predate it).
	Incarnation uint64 `json:"incarnation,omitempty"`
	// HolderSilent: OpRegisterServer's proposer found the process that
	// holds the (live) id silent for longer than its lease, so it serves
	// nothing; another process may take the id over (see registerServer).
	HolderSilent bool `json:"holder_silent,omitempty"`
	// AcceptDataLoss: OpForgetServer may leave partitions with no copy of
	// their data.
	AcceptDataLoss bool `json:"accept_data_loss,omitempty"`
	// Bulk commands.
	Version     uint64     `json:"version,omitempty"`
	BaseVersion uint64     `json:"base_version,omitempty"`
	Files       []BulkFile `json:"files,omitempty"`
	PartitionID uint64     `json:"partition_id,omitempty"`
	File        *BulkFile  `json:"file,omitempty"`
	// Stream is OpBulkStored's stream.
	Stream string `json:"stream,omitempty"`
	// Error: OpBulkLoaded reports that ServerID refused the file (why).
	Error string `json:"error,omitempty"`
	// Action is OpBulkRollout's: pause, resume or abort.
	Action string `json:"action,omitempty"`
	// StreamCmd is OpStream's stream manager command.
	StreamCmd *stream.Command `json:"stream_cmd,omitempty"`
	// Promote: OpServerDown's choice of new primary per partition id (the
	// most caught-up secondary by the replicas' reports).
	Promote map[uint64]string `json:"promote,omitempty"`
	// Log commands (replication.go): the extent allocated or failed, the
	// epoch and replica servers it was decided at.
	Extent  uint64   `json:"extent,omitempty"`
	Epoch   uint64   `json:"epoch,omitempty"`
	Servers []string `json:"servers,omitempty"`
	// Coprocessor commands: the coprocessor's name and the version deployed.
	Name   string         `json:"name,omitempty"`
	Coproc *CoprocVersion `json:"coproc,omitempty"`
	// Keys: OpCreateTenant's two keys, OpRotateTenantKey's new one (made
	// by the proposer: Apply draws no randomness). KeyIndex: which key
	// OpRotateTenantKey replaces.
	Keys     [][]byte `json:"keys,omitempty"`
	KeyIndex int      `json:"key_index,omitempty"`
	// Quota: OpCreateTenant's and OpSetTenantQuota's (nil: no limits).
	Quota *TenantQuota `json:"quota,omitempty"`
	// RequestID is the client's id of the call that made the command
	// (requests.go): a command whose id was applied before changes
	// nothing.
	RequestID string `json:"request_id,omitempty"`
	// Handoffs: OpHandoffDone's partitions (id → the Handoff.Version it
	// clears); see handoff.go.
	Handoffs map[uint64]uint64 `json:"handoffs,omitempty"`
	// Split commands (split.go): OpSplitPartition's split point (Hash:
	// point tables, Key: ordered), OpSplitDone's split record LSN.
	Hash uint64 `json:"hash,omitempty"`
	Key  []byte `json:"key,omitempty"`
	LSN  uint64 `json:"lsn,omitempty"`
}

// Result is what Apply reports about an applied command.
type Result struct {
	// Changed is false when the command was valid but changed nothing (a
	// heartbeat-driven drain of a server already drained, say); such a
	// command need not be logged.
	Changed bool
	// ServerID is the id of the server OpRegisterServer registered.
	ServerID string
	// Table is the table OpCreateTable made; it is part of the state and
	// must not be modified.
	Table *Table
	// Moved lists the partitions whose replica set changed, in table then
	// index order.
	Moved []uint64
	// Held lists the partitions OpServerDown left on the server: durable
	// partitions with no other replica, whose data only that server has.
	Held []uint64
	// Lost lists the partitions OpForgetServer left with no copy of their
	// data (now DataLost), in table then index order; for OpClearDataLoss,
	// the partitions whose record it cleared.
	Lost []uint64
	// Stream is OpStream's stream manager result.
	Stream stream.Result
	// Version is the coprocessor version OpCoprocDeploy made (or found).
	Version uint64
	// Duplicate: the command's RequestID was applied before, so this one
	// changed nothing (requests.go). Table is then the table the first
	// OpCreateTable made, if it still exists.
	Duplicate bool
}

// TableOptions mirror api.TableOptions with the defaults filled in.
type TableOptions struct {
	Partitions    uint32 `json:"partitions"`
	Replication   uint32 `json:"replication"`
	MaxValueBytes uint64 `json:"max_value_bytes"`
	DefaultTTLMs  uint64 `json:"default_ttl_ms,omitempty"`
	Storage       string `json:"storage"`
	// Durability is "sync" or "lazy" for ssd tables, empty for memory ones.
	Durability string `json:"durability,omitempty"`
	// Compression is "none" or "s2" for ssd point tables, empty otherwise.
	Compression string `json:"compression,omitempty"`
	// BulkRetainedVersions is how many versions a bulk table keeps loaded
	// (0 for other kinds).
	BulkRetainedVersions uint32 `json:"bulk_retained_versions,omitempty"`
	// SplitPoints are an ordered table's partition boundaries (none for
	// other kinds): partition i holds [SplitPoints[i-1], SplitPoints[i]).
	SplitPoints [][]byte `json:"split_points,omitempty"`
}

// Storages of point tables. A table on durable storage (anything but
// memory) keeps its data across server restarts, so its partitions are not
// moved off a dead or draining server that holds their only copy (see
// serverDown).
const (
	StorageMemory = "memory"
	StorageSSD    = "ssd"
)

// Compressions of ssd tables' values.
const (
	CompressionNone = "none"
	CompressionS2   = "s2"
)

// Durabilities of ssd tables: when a write is acknowledged.
const (
	DurabilitySync = "sync"
	DurabilityLazy = "lazy"
)

// durable reports whether t's data survives a server restart.
func (t *Table) durable() bool { return t.Options.Storage != StorageMemory }

// Tenant is a tenant of the catalog.
type Tenant struct {
	Name          string `json:"name"`
	CreatedUnixMs int64  `json:"created_unix_ms"`
	// Keys are key 1 and key 2 (auth.KeyBytes each); either signs the
	// tenant's requests. Empty for a tenant made before tenants had keys
	// (RotateTenantKey gives it some). A Tenant is never modified once
	// published: a rotation replaces it.
	Keys [][]byte `json:"keys,omitempty"`
	// Quota is what the tenant may use (zero fields: no limit).
	Quota TenantQuota `json:"quota,omitzero"`
}

// TenantQuota is a tenant's limits (api.TenantQuota); 0 is no limit.
type TenantQuota struct {
	StoredBytes       uint64 `json:"stored_bytes,omitempty"`
	MemoryBytes       uint64 `json:"memory_bytes,omitempty"`
	ReadOpsPerSec     uint64 `json:"read_ops_per_sec,omitempty"`
	WriteOpsPerSec    uint64 `json:"write_ops_per_sec,omitempty"`
	CoprocCPUMsPerSec uint64 `json:"coproc_cpu_ms_per_sec,omitempty"`
}

// TenantQuotaOf converts q (nil: no limits).
func TenantQuotaOf(q *api.TenantQuota) TenantQuota {
	return TenantQuota{StoredBytes: q.GetStoredBytes(), MemoryBytes: q.GetMemoryBytes(),
		ReadOpsPerSec: q.GetReadOpsPerSec(), WriteOpsPerSec: q.GetWriteOpsPerSec(), CoprocCPUMsPerSec: q.GetCoprocCpuMsPerSec()}
}

// Proto converts q.
func (q TenantQuota) Proto() *api.TenantQuota {
	return &api.TenantQuota{StoredBytes: q.StoredBytes, MemoryBytes: q.MemoryBytes,
		ReadOpsPerSec: q.ReadOpsPerSec, WriteOpsPerSec: q.WriteOpsPerSec, CoprocCpuMsPerSec: q.CoprocCPUMsPerSec}
}

// Limited reports whether q limits anything.
func (q TenantQuota) Limited() bool { return q != TenantQuota{} }

// Table is a table and its partitions.
type Table struct {
	Tenant        string        `json:"tenant"`
	Name          string        `json:"name"`
	Kind          api.TableKind `json:"kind"`
	Options       TableOptions  `json:"options"`
	ID            uint64        `json:"id"`
	CreatedUnixMs int64         `json:"created_unix_ms"`
	Partitions    []Partition   `json:"partitions"`
	// Bulk is a bulk table's versions (nil for other kinds).
	Bulk *BulkState `json:"bulk,omitempty"`
	// Coprocs are the table's coprocessors by name.
	Coprocs map[string]*Coproc `json:"coprocs,omitempty"`
	// Resplit: a partition of the table split (split.go), so its
	// partitions' ids are no longer consecutive from the first.
	Resplit bool `json:"resplit,omitempty"`
}

// Partition is one hash range [Start, End] of a table and where it lives.
type Partition struct {
	ID    uint64 `json:"id"`
	Index uint32 `json:"index"`
	Start uint64 `json:"start"`
	End   uint64 `json:"end"`
	// KeyStart and KeyEnd are an ordered table's partition's key range,
	// [KeyStart, KeyEnd) (empty KeyEnd: unbounded); Start and End are 0.
	KeyStart []byte `json:"key_start,omitempty"`
	KeyEnd   []byte `json:"key_end,omitempty"`
	// Epoch is 0 until the partition first gets a primary and grows on every
	// change of its replica set that removes a replica or sets a primary.
	Epoch    uint64    `json:"epoch"`
	Replicas []Replica `json:"replicas"`
	// Log is the partition's commit log (point tables; nil for bulk
	// tables, whose files are their own record). See replication.go.
	Log *PartitionLog `json:"log,omitempty"`
	// DataLost is set when an operator forgot the dead server that held the
	// partition's only copy (OpForgetServer): the partition was placed again,
	// empty. It stays set, so describe keeps showing it. A DataLoss is never
	// modified once set (clones share it).
	DataLost *DataLoss `json:"data_lost,omitempty"`
	// Move is the replica move in progress, if any (move.go). A Move is
	// never modified once set (clones share it).
	Move *Move `json:"move,omitempty"`
	// Handoff is set while the primary role moved off a live server and
	// the new primary may not serve yet (handoff.go); nil: it may (and in
	// every state from before it).
	Handoff *Handoff `json:"handoff,omitempty"`
	// Split is the split in progress, if any (split.go); SplitFrom and
	// SplitLSN name, in a split's child, its parent and the split record's
	// LSN in the parent's log (0: not a child).
	Split     *Split `json:"split,omitempty"`
	SplitFrom uint64 `json:"split_from,omitempty"`
	SplitLSN  uint64 `json:"split_lsn,omitempty"`
}

// DataLoss records how a partition lost every copy of its data.
type DataLoss struct {
	// UnixMs is when the operator's command was made.
	UnixMs int64 `json:"unix_ms"`
	// ServerID is the forgotten server that held the only copy (its data
	// may still be on that server's disk, under partitions/<id>).
	ServerID string `json:"server_id"`
	// Epoch is the partition's epoch before it moved.
	Epoch uint64 `json:"epoch"`
}

// Replica is one copy of a partition on a server.
type Replica struct {
	ServerID    string          `json:"server_id"`
	Addr        string          `json:"addr"`
	Role        api.ReplicaRole `json:"role"`
	FaultDomain string          `json:"fault_domain,omitempty"`
	// Bulk tables in rows mode (rollout.go): the version this copy serves
	// (0: none yet) and the one it loads to serve next (0: none, unless
	// it serves nothing: then the table's target).
	BulkServes uint64 `json:"bulk_serves,omitempty"`
	BulkNext   uint64 `json:"bulk_next,omitempty"`
	// BulkDrop is a version the copy stopped serving at a row switch and
	// still holds until BulkDropAtMs, so reads routed by an older map
	// finish; BulkLeaving: the copy itself goes then (its row was
	// replaced by an extra copy).
	BulkDrop     uint64 `json:"bulk_drop,omitempty"`
	BulkDropAtMs int64  `json:"bulk_drop_at_ms,omitempty"`
	BulkLeaving  bool   `json:"bulk_leaving,omitempty"`
}

// Server is a registered table server.
type Server struct {
	ID   string `json:"id"`
	Addr string `json:"addr"`
	// InternalAddr is the server's internal listener (cluster traffic,
	// its extent node); empty: Addr serves it too.
	InternalAddr string `json:"internal_addr,omitempty"`
	FaultDomain  string `json:"fault_domain,omitempty"`
	// BulkCapacity is the bytes of bulk files it may hold loaded (0: not
	// limited): a rollout places no copy where the file does not fit.
	BulkCapacity uint64 `json:"bulk_capacity,omitempty"`
	Alive        bool   `json:"alive"`
	Draining     bool   `json:"draining,omitempty"`
	// Incarnation is the registered process's incarnation (0: unknown, a
	// server from before incarnations).
	Incarnation uint64 `json:"incarnation,omitempty"`
	// DownSinceMs is when the server was declared dead (0 while alive).
	DownSinceMs int64 `json:"down_since_ms,omitempty"`
}

// State is the catalog and partition map: a deterministic state machine.
// Apply (a proposed command, validated) and ApplyLogged (a logged one, as
// written) are its only mutators; it does no I/O, reads no clock and starts no
// goroutine, so the same commands in the same order give the same State on
// every replica and on every replay. A command that fails changes nothing.
//
// State is not safe for concurrent use; the Master publishes immutable
// clones to readers.
type State struct {
	// Version is the cluster map version; it grows on every change.
	Version         uint64             `json:"version"`
	NextTableID     uint64             `json:"next_table_id"`
	NextPartitionID uint64             `json:"next_partition_id"`
	NextServerID    uint64             `json:"next_server_id"`
	Tenants         map[string]*Tenant `json:"tenants"`
	// Tables by tableKey(tenant, name).
	Tables  map[string]*Table  `json:"tables"`
	Servers map[string]*Server `json:"servers"`
	// Streams is the stream manager (see streams.go); nil in states from
	// before it existed until the first stream command.
	Streams *StreamState `json:"streams,omitempty"`
	// TenantsVersion grows with every tenant created, deleted or rekeyed:
	// table servers fetch the tenants' keys again when it changes.
	TenantsVersion uint64 `json:"tenants_version,omitempty"`
	// Requests are the request ids of applied commands (requests.go).
	Requests map[string]*Request `json:"requests,omitempty"`

	// cow is set while the State is a successor being built (cow.go);
	// nil on a published State and on one its user owns whole.
	cow *cow
	// primaries caches primaryCounts while one command places replicas;
	// nil between commands.
	primaries map[string]int
	// before holds, while one command applies, the primaries of each
	// table it changes as they were before it (handoff.go); nil between
	// commands.
	before map[string]primariesBefore
}

// NewState returns the empty state: no tenants, ids starting at 1.
func NewState() *State {
	return &State{
		NextTableID:     1,
		NextPartitionID: 1,
		NextServerID:    1,
		Tenants:         map[string]*Tenant{},
		Tables:          map[string]*Table{},
		Servers:         map[string]*Server{},
		Streams:         newStreamState(),
	}
}

func tableKey(tenant, name string) string { return tenant + "/" + name }

// Clone returns a deep copy of s, owned whole by the caller. (The Master
// copies on write instead: see cow.go.)
func (s *State) Clone() *State {
	c := *s
	c.cow, c.primaries = nil, nil
	c.Tenants = make(map[string]*Tenant, len(s.Tenants))
	for k, v := range s.Tenants {
		t := *v
		c.Tenants[k] = &t
	}
	c.Tables = make(map[string]*Table, len(s.Tables))
	for k, v := range s.Tables {
		c.Tables[k] = cloneTable(v)
	}
	c.Servers = make(map[string]*Server, len(s.Servers))
	for k, v := range s.Servers {
		sv := *v
		c.Servers[k] = &sv
	}
	c.Streams = s.Streams.clone()
	if s.Requests != nil {
		c.Requests = cloneMap(s.Requests) // a Request is never modified
	}
	return &c
}

// Table returns tenant/name, or a NOT_FOUND error naming which is missing.
func (s *State) Table(tenant, name string) (*Table, error) {
	if _, ok := s.Tenants[tenant]; !ok {
		return nil, errTenantNotFound(tenant)
	}
	t, ok := s.Tables[tableKey(tenant, name)]
	if !ok {
		return nil, errTableNotFound(tenant, name)
	}
	return t, nil
}

// TablesOf returns the tables of tenant sorted by name ("" means every
// tenant, sorted by tenant then name).
func (s *State) TablesOf(tenant string) []*Table {
	var ts []*Table
	for _, t := range s.Tables {
		if tenant == "" || t.Tenant == tenant {
			ts = append(ts, t)
		}
	}
	slices.SortFunc(ts, func(a, b *Table) int {
		return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Name, b.Name))
	})
	return ts
}

// ServerIDs returns the ids of every known server, sorted.
func (s *State) ServerIDs() []string {
	return slices.Sorted(maps.Keys(s.Servers))
}

// primaryCounts returns how many primaries each server holds.
func (s *State) primaryCounts() map[string]int {
	n := map[string]int{}
	for _, t := range s.Tables {
		for _, p := range t.Partitions {
			for _, r := range p.Replicas {
				if r.Role == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
					n[r.ServerID]++
				}
			}
		}
	}
	return n
}

// ReplicaCounts returns how many replicas each server holds.
func (s *State) ReplicaCounts() map[string]int {
	n := map[string]int{}
	for _, t := range s.Tables {
		for _, p := range t.Partitions {
			for _, r := range p.Replicas {
				n[r.ServerID]++
			}
		}
	}
	return n
}

// Commands are validated once, when they are proposed, and applied as
// logged ever after. Apply is the proposal path: it checks cmd against the
// rules of this release (names, options, limits, the operator's consent)
// and applies it. ApplyLogged is the path of a logged command (replay,
// and a replicated log's committed entries): it applies without those
// rules, so a later release that tightens one still reads an old log. Both
// keep the structural checks (the table must exist, say) that make a
// command that no longer fits the state a deterministic no-op with an
// error; on error the state is unchanged.

// Apply validates cmd against the current rules and applies it. On error
// the state is unchanged.
func (s *State) Apply(cmd Command) (Result, error) {
	res, _, err := s.ApplyChecked(cmd)
	return res, err
}

// ApplyChecked is Apply that also returns the command to log: cmd with
// what validation resolved filled in (a table's options normalized), so
// replaying it never depends on this release's defaults.
func (s *State) ApplyChecked(cmd Command) (Result, Command, error) {
	res, err := s.apply(&cmd, true)
	return res, cmd, err
}

// ApplyLogged applies a command as it was logged, without re-validating
// it (see Apply). On error the state is unchanged.
func (s *State) ApplyLogged(cmd Command) (Result, error) {
	return s.apply(&cmd, false)
}

// apply applies cmd; chk applies the rules of proposal (and may fill in
// *cmd what they resolve).
func (s *State) apply(cmd *Command, chk bool) (Result, error) {
	var (
		res Result
		err error
	)
	defer func() { s.primaries, s.before = nil, nil }()
	if cmd.RequestID != "" {
		if chk {
			if err := checkRequestID(cmd.RequestID); err != nil {
				return Result{}, err
			}
		}
		if res, ok := s.requestDone(cmd); ok {
			return res, nil
		}
	}
	switch cmd.Op {
	case OpCreateTenant:
		res, err = s.createTenant(*cmd, chk)
	case OpDeleteTenant:
		res, err = s.deleteTenant(*cmd, chk)
	case OpRotateTenantKey:
		res, err = s.rotateTenantKey(*cmd, chk)
	case OpSetTenantQuota:
		res, err = s.setTenantQuota(*cmd)
	case OpCreateTable:
		res, err = s.createTable(cmd, chk)
	case OpDropTable:
		res, err = s.dropTable(*cmd, chk)
	case OpRegisterServer:
		res, err = s.registerServer(*cmd, chk)
	case OpServerDown:
		res, err = s.serverDown(*cmd, chk)
	case OpForgetServer:
		res, err = s.forgetServer(*cmd, chk)
	case OpClearDataLoss:
		res, err = s.clearDataLoss(*cmd, chk)
	case OpPlace:
		res.Moved = s.placeShort(s.candidates())
		res.Changed = len(res.Moved) > 0
	case OpBulkPublish:
		res, err = s.bulkPublish(*cmd, chk)
	case OpBulkLoaded:
		res, err = s.bulkLoadedCmd(*cmd, chk)
	case OpBulkRollback:
		res, err = s.bulkRollback(*cmd, chk)
	case OpBulkStored:
		res, err = s.bulkStoredCmd(*cmd, chk)
	case OpBulkRollout:
		res, err = s.bulkRolloutCmd(*cmd, chk)
	case OpBulkAdvance:
		res, err = s.bulkAdvanceCmd(*cmd, chk)
	case OpStream:
		res, err = s.applyStream(*cmd)
	case OpCoprocDeploy:
		res, err = s.coprocDeploy(*cmd, chk)
	case OpCoprocReady:
		res, err = s.coprocReady(*cmd, chk)
	case OpCoprocRollback:
		res, err = s.coprocRollback(*cmd, chk)
	case OpPartitionLog:
		res, err = s.partitionLog(*cmd)
	case OpPartitionLogReset:
		res, err = s.partitionLogReset(*cmd)
	case OpMoveReplica:
		res, err = s.moveReplica(cmd, chk)
	case OpMoveDone:
		res, err = s.moveDone(*cmd)
	case OpReplicaFailed:
		res, err = s.replicaFailed(*cmd)
	case OpHandoffDone:
		res, err = s.handoffDone(*cmd)
	case OpSplitPartition:
		res, err = s.splitPartition(cmd, chk)
	case OpSplitDone:
		res, err = s.splitDone(*cmd)
	default:
		return Result{}, errInvalid("op", "unknown_command", 0, "unknown command %q", cmd.Op)
	}
	if err != nil {
		return Result{}, err
	}
	if res.Changed && cmd.RequestID != "" {
		s.recordRequest(cmd, res)
	}
	if res.Changed && cmd.Op != OpStream {
		// The stream manager's own state (extents, seals, node inventory)
		// is not the partition map: servers and clients need not refetch
		// the map when only it changed.
		s.Version++
		s.fenceHandoffs() // a primary moved off a live server waits (handoff.go)
	}
	return res, nil
}

func (s *State) createTenant(cmd Command, chk bool) (Result, error) {
	if err := checkName(chk, "tenant", cmd.Tenant); err != nil {
		return Result{}, err
	}
	if _, ok := s.Tenants[cmd.Tenant]; ok {
		return Result{}, errCode(ErrTenantExists, api.ErrorCode_ERROR_CODE_ALREADY_EXISTS, "tenant_exists", "tenant %q already exists", cmd.Tenant)
	}
	// No keys: only the cluster credential acts for the tenant until a
	// rotation gives it some (states from before tenants had keys).
	if chk && len(cmd.Keys) != 2 && len(cmd.Keys) != 0 {
		return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "tenant_keys", "a new tenant has 2 keys, got %d", len(cmd.Keys))
	}
	for _, k := range cmd.Keys {
		if err := checkKey(chk, k); err != nil {
			return Result{}, err
		}
	}
	t := &Tenant{Name: cmd.Tenant, CreatedUnixMs: cmd.UnixMs, Keys: cmd.Keys}
	if cmd.Quota != nil {
		t.Quota = *cmd.Quota
	}
	s.tenantsW()[cmd.Tenant] = t
	s.TenantsVersion++
	return Result{Changed: true}, nil
}

// TenantKeyBytes is the length of a tenant key (auth.KeyBytes).
const TenantKeyBytes = 64

func checkKey(chk bool, k []byte) error {
	if chk && len(k) != TenantKeyBytes {
		return errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "tenant_key", "a tenant key is %d bytes, got %d", TenantKeyBytes, len(k))
	}
	return nil
}

// deleteTenant removes a tenant with no tables: its tables' data is never
// dropped as a side effect.
func (s *State) deleteTenant(cmd Command, chk bool) (Result, error) {
	if _, ok := s.Tenants[cmd.Tenant]; !ok {
		return Result{}, errTenantNotFound(cmd.Tenant)
	}
	if n := len(s.TablesOf(cmd.Tenant)); n > 0 {
		return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, "tenant_has_tables",
			"tenant %q has %d table(s); drop them first (tabula table drop)", cmd.Tenant, n)
	}
	delete(s.tenantsW(), cmd.Tenant)
	s.TenantsVersion++
	return Result{Changed: true}, nil
}

// rotateTenantKey replaces one of a tenant's keys; the other keeps
// signing.
func (s *State) rotateTenantKey(cmd Command, chk bool) (Result, error) {
	t, ok := s.Tenants[cmd.Tenant]
	if !ok {
		return Result{}, errTenantNotFound(cmd.Tenant)
	}
	if cmd.KeyIndex != 1 && cmd.KeyIndex != 2 {
		return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "tenant_key_number", "key %d: a tenant has key 1 and key 2", cmd.KeyIndex)
	}
	if len(cmd.Keys) != 1 {
		return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "tenant_keys", "a rotation carries 1 key, got %d", len(cmd.Keys))
	}
	if err := checkKey(chk, cmd.Keys[0]); err != nil {
		return Result{}, err
	}
	n := *t
	n.Keys = make([][]byte, 2)
	copy(n.Keys, t.Keys)
	n.Keys[cmd.KeyIndex-1] = cmd.Keys[0]
	s.tenantsW()[cmd.Tenant] = &n
	s.TenantsVersion++
	return Result{Changed: true}, nil
}

// setTenantQuota replaces a tenant's quotas. Quotas are not keys: the
// tenants' version (which makes servers fetch keys) stays.
func (s *State) setTenantQuota(cmd Command) (Result, error) {
	t, ok := s.Tenants[cmd.Tenant]
	if !ok {
		return Result{}, errTenantNotFound(cmd.Tenant)
	}
	n := *t
	n.Quota = TenantQuota{}
	if cmd.Quota != nil {
		n.Quota = *cmd.Quota
	}
	if n.Quota == t.Quota {
		return Result{}, nil
	}
	s.tenantsW()[cmd.Tenant] = &n
	return Result{Changed: true}, nil
}

// Replication factors of tables.
const (
	// MaxReplication is the largest replication factor a table may ask for.
	MaxReplication = 5
	// DefaultReplication is the factor of a table that names none once
	// replicationServed is on (1 until then).
	DefaultReplication = 3
)

// replicationServed is the one switch for replicated tables. While it is
// false, table servers keep one copy per partition: a factor above 1 is
// refused as UNIMPLEMENTED and the default factor is 1. Data-path replication
// flips it to true; the rest (factors 1–MaxReplication, default
// DefaultReplication, no factor above the number of fault domains) is
// enforced already and tested with it on. It is a variable only so tests can
// turn it on.
var replicationServed = true

// defaultReplication is the factor of a create-table request that names none.
func defaultReplication() uint32 {
	if replicationServed {
		return DefaultReplication
	}
	return 1
}

// defaultReplicationFor is the factor of a new table of kind that names
// none: DefaultReplication, or as many as the live servers' fault domains
// when they are fewer (a one-server development cluster gets 1; a factor
// asked for explicitly is refused above the domains instead). With no live
// server at all it is DefaultReplication: the cluster is starting. For a
// bulk table the factor is its number of serving copies.
func (s *State) defaultReplicationFor(kind api.TableKind) uint32 {
	n := defaultReplication()
	domains := map[string]bool{}
	for _, c := range s.candidates() {
		if c.Available {
			domains[c.domain()] = true
		}
	}
	if d := uint32(len(domains)); d > 0 && d < n {
		n = d
	}
	return n
}

// checkReplication checks a replication factor (defaults filled in) against
// the range and the switch: served says whether factors above 1 are served.
func checkReplication(n uint32, served bool) error {
	switch {
	case n < 1 || n > MaxReplication:
		return errInvalid("options.replication", "replication_out_of_range", MaxReplication,
			"options.replication is %d; it must be 1 to %d", n, MaxReplication)
	case n > 1 && !served:
		return errCode(ErrUnimplemented, api.ErrorCode_ERROR_CODE_UNIMPLEMENTED, "replication_not_implemented",
			"options.replication %d: replication factor >1 arrives with data-path replication", n)
	}
	return nil
}

// checkReplicationFits refuses a factor above the number of fault domains
// the available servers span: placement puts at most one replica of a
// partition in a domain, so such a table would stay short of copies for good
// while looking replicated. Any factor is accepted with no server at all
// (a cluster starting up: the partitions wait, unplaced, for servers).
func (s *State) checkReplicationFits(n uint32) error {
	if n <= 1 {
		return nil
	}
	domains := map[string]bool{}
	for _, c := range s.candidates() {
		if c.Available {
			domains[c.domain()] = true
		}
	}
	if d := len(domains); d > 0 && int(n) > d {
		return errInvalid("options.replication", "replication_above_fault_domains", uint64(d),
			"options.replication is %d but the live servers span %d fault domain(s), and each replica needs a domain of its own: "+
				"ask for at most %d replicas or start servers in more fault domains (tabula server --fault-domain)", n, d, d)
	}
	return nil
}

// NormalizeOptions checks a table's kind and options and fills in defaults
// (replication: defaultReplication).
func NormalizeOptions(kind api.TableKind, o *TableOptions) (TableOptions, error) {
	if o != nil && len(o.SplitPoints) > 0 && kind != api.TableKind_TABLE_KIND_ORDERED {
		return TableOptions{}, errInvalid("options.split_points", "split_points_not_ordered", 0,
			"split points apply to ordered tables only; %s tables are partitioned by key hash (options.partitions)", api.KindName(kind))
	}
	switch kind {
	case api.TableKind_TABLE_KIND_POINT:
	case api.TableKind_TABLE_KIND_BULK:
		return normalizeBulkOptions(o)
	case api.TableKind_TABLE_KIND_ORDERED:
		return normalizeOrderedOptions(o)
	default:
		return TableOptions{}, errInvalid("kind", "kind_invalid", 0, "kind must be point, bulk or ordered (got %d)", int32(kind))
	}
	n, err := normalizeCommon(o)
	if err != nil {
		return TableOptions{}, err
	}
	if n.BulkRetainedVersions != 0 {
		return TableOptions{}, errInvalid("options.bulk_retained_versions", "bulk_option", 0, "options.bulk_retained_versions applies to bulk tables only")
	}
	if n.Storage == "" {
		n.Storage = StorageSSD
	}
	if n.Storage != StorageMemory && n.Storage != StorageSSD {
		return TableOptions{}, errInvalid("options.storage", "storage_invalid", 0,
			"options.storage %q is not supported; allowed values: %q, %q", n.Storage, StorageMemory, StorageSSD)
	}
	if n.Durability, err = ssdOption(n.Storage, "durability", n.Durability, DurabilitySync, DurabilityLazy,
		"; a memory table loses its data when its server stops"); err != nil {
		return TableOptions{}, err
	}
	if n.Compression, err = ssdOption(n.Storage, "compression", n.Compression, CompressionNone, CompressionS2, ""); err != nil {
		return TableOptions{}, err
	}
	return n, nil
}

// normalizeOrderedOptions: an ordered table takes a point table's
// options (its engine honours the same storage, durability and
// compression), and its partitions are the key ranges its split points
// cut: options.partitions is their number, filled in here.
func normalizeOrderedOptions(o *TableOptions) (TableOptions, error) {
	b := TableOptions{}
	if o != nil {
		b = *o
	}
	sp := b.SplitPoints
	if len(sp) >= api.MaxPartitions {
		return TableOptions{}, errInvalid("options.split_points", "too_many_partitions", api.MaxPartitions-1,
			"%d split points make %d partitions; the limit is %d partitions", len(sp), len(sp)+1, api.MaxPartitions)
	}
	for i, k := range sp {
		switch {
		case len(k) == 0:
			return TableOptions{}, errInvalid("options.split_points", "split_point_empty", 0, "split point %d is empty (every key is at or above the empty key)", i)
		case len(k) > api.MaxKeyBytes:
			return TableOptions{}, errInvalid("options.split_points", "key_too_large", api.MaxKeyBytes, "split point %d is %d bytes; keys are at most %d", i, len(k), api.MaxKeyBytes)
		case i > 0 && bytes.Compare(sp[i-1], k) >= 0:
			return TableOptions{}, errInvalid("options.split_points", "split_points_unordered", 0, "split points must be strictly increasing: %d (%q) is not above %d (%q)", i, k, i-1, sp[i-1])
		}
	}
	want := uint32(len(sp) + 1)
	if b.Partitions != 0 && b.Partitions != want {
		return TableOptions{}, errInvalid("options.partitions", "partitions_with_split_points", 0,
			"options.partitions is %d, but %d split points make %d partitions: an ordered table is partitioned by its split points", b.Partitions, len(sp), want)
	}
	b.Partitions = want
	b.SplitPoints = nil
	n, err := NormalizeOptions(api.TableKind_TABLE_KIND_POINT, &b)
	if err != nil {
		return TableOptions{}, err
	}
	n.SplitPoints = make([][]byte, len(sp))
	for i, k := range sp {
		n.SplitPoints[i] = bytes.Clone(k)
	}
	return n, nil
}

// normalizeBulkOptions: bulk tables keep their version files on the
// servers' disks (storage ssd); durability and compression are the
// builder's business, not options.
func normalizeBulkOptions(o *TableOptions) (TableOptions, error) {
	// options.replication is the number of serving copies of each
	// partition, in distinct fault domains: every copy loads each version
	// (from its stream) and answers reads, and a version switches once
	// every copy has it.
	b := TableOptions{}
	if o != nil {
		b = *o
	}
	n, err := normalizeCommon(&b)
	if err != nil {
		return TableOptions{}, err
	}
	if n.Storage == "" {
		n.Storage = StorageSSD
	}
	if n.Storage != StorageSSD {
		return TableOptions{}, errInvalid("options.storage", "storage_invalid", 0,
			"options.storage %q: bulk tables keep their version files on disk (storage %q)", n.Storage, StorageSSD)
	}
	if n.Durability != "" || n.Compression != "" || n.DefaultTTLMs != 0 {
		return TableOptions{}, errInvalid("options", "bulk_option", 0,
			"durability, compression and default TTL do not apply to bulk tables (their files are built offline and verified at load)")
	}
	if n.BulkRetainedVersions == 0 {
		n.BulkRetainedVersions = DefaultBulkRetained
	}
	if n.BulkRetainedVersions > MaxBulkRetained {
		return TableOptions{}, errInvalid("options.bulk_retained_versions", "too_many_retained", MaxBulkRetained,
			"options.bulk_retained_versions is %d; the limit is %d", n.BulkRetainedVersions, MaxBulkRetained)
	}
	return n, nil
}

// normalizeCommon checks and defaults the options of every kind.
func normalizeCommon(o *TableOptions) (TableOptions, error) {
	var n TableOptions
	if o != nil {
		n = *o
	}
	if n.Partitions == 0 {
		n.Partitions = api.DefaultPartitions
	}
	if n.Partitions > api.MaxPartitions {
		return TableOptions{}, errInvalid("options.partitions", "too_many_partitions", api.MaxPartitions,
			"options.partitions is %d; the limit is %d", n.Partitions, api.MaxPartitions)
	}
	if n.Replication == 0 {
		n.Replication = defaultReplication()
	}
	if err := checkReplication(n.Replication, replicationServed); err != nil {
		return TableOptions{}, err
	}
	if n.MaxValueBytes == 0 {
		n.MaxValueBytes = api.DefaultMaxValueBytes
	}
	if n.MaxValueBytes > api.MaxValueBytesLimit {
		return TableOptions{}, errInvalid("options.max_value_bytes", "max_value_bytes_too_large", api.MaxValueBytesLimit,
			"options.max_value_bytes is %d; the limit is %d", n.MaxValueBytes, api.MaxValueBytesLimit)
	}
	if n.DefaultTTLMs > api.MaxTTLMs {
		return TableOptions{}, errInvalid("options.default_ttl_ms", "ttl_too_long", api.MaxTTLMs,
			"options.default_ttl_ms is %d ms; the limit is %d ms (100 years)", n.DefaultTTLMs, uint64(api.MaxTTLMs))
	}
	return n, nil
}

// ssdOption validates an option only ssd tables take: empty for memory
// tables (refused otherwise, with why appended), else def when empty, else
// def or other.
func ssdOption(storage, name, v, def, other, why string) (string, error) {
	field, reason := "options."+name, name+"_invalid"
	switch {
	case storage == StorageMemory && v != "":
		return "", errInvalid(field, reason, 0, "%s %q applies to ssd tables only%s", field, v, why)
	case storage == StorageMemory:
		return "", nil
	case v == "":
		return def, nil
	case v != def && v != other:
		return "", errInvalid(field, reason, 0, "%s %q is not supported; allowed values: %q, %q", field, v, def, other)
	}
	return v, nil
}

// partitionCount is the number of partitions of every table.
func (s *State) partitionCount() int {
	n := 0
	for _, t := range s.Tables {
		n += len(t.Partitions)
	}
	return n
}

func (s *State) createTable(cmd *Command, chk bool) (Result, error) {
	if err := checkName(chk, "tenant", cmd.Tenant); err != nil {
		return Result{}, err
	}
	if err := checkName(chk, "name", cmd.Table); err != nil {
		return Result{}, err
	}
	var req TableOptions
	if cmd.Options != nil {
		req = *cmd.Options
	}
	if req.Replication == 0 {
		// The master logs the factor it resolved (CreateTable fills the
		// default in), so a replay never depends on today's default; 0 is
		// from a master before that, whose default was 1.
		req.Replication = 1
	}
	var opts TableOptions
	if chk {
		var err error
		if opts, err = NormalizeOptions(cmd.Kind, &req); err != nil {
			return Result{}, err
		}
		// Logged normalized: a replay needs no defaults.
		logged := opts
		cmd.Options = &logged
	} else {
		opts = fillOptionDefaults(cmd.Kind, req)
	}
	if _, ok := s.Tenants[cmd.Tenant]; !ok {
		return Result{}, errTenantNotFound(cmd.Tenant)
	}
	if chk {
		if err := s.checkReplicationFits(opts.Replication); err != nil {
			return Result{}, err
		}
	}
	key := tableKey(cmd.Tenant, cmd.Table)
	if _, ok := s.Tables[key]; ok {
		return Result{}, errCode(ErrTableExists, api.ErrorCode_ERROR_CODE_ALREADY_EXISTS, "table_exists", "table %s already exists", key)
	}
	if total := s.partitionCount() + int(opts.Partitions); chk && total > api.MaxClusterPartitions {
		return Result{}, errInvalid("options.partitions", "cluster_partition_limit", api.MaxClusterPartitions,
			"the cluster would hold %d partitions; the limit is %d (it keeps the master's snapshot and the servers' map watch bounded)", total, api.MaxClusterPartitions)
	}
	// Validation is over: mutate.
	n := int(opts.Partitions)
	t := &Table{
		Tenant: cmd.Tenant, Name: cmd.Table, Kind: cmd.Kind, Options: opts,
		ID: s.NextTableID, CreatedUnixMs: cmd.UnixMs,
		Partitions: make([]Partition, n),
	}
	if cmd.Kind == api.TableKind_TABLE_KIND_BULK {
		t.Bulk = &BulkState{}
	}
	for i := range t.Partitions {
		start, end := keyspace.Range(i, n)
		t.Partitions[i] = Partition{ID: s.NextPartitionID + uint64(i), Index: uint32(i), Start: start, End: end}
		if cmd.Kind == api.TableKind_TABLE_KIND_ORDERED {
			t.Partitions[i].Start, t.Partitions[i].End = 0, 0
			if i > 0 {
				t.Partitions[i].KeyStart = opts.SplitPoints[i-1]
			}
			if i < len(opts.SplitPoints) {
				t.Partitions[i].KeyEnd = opts.SplitPoints[i]
			}
		}
		if t.replicatesByLog() {
			t.Partitions[i].Log = &PartitionLog{Stream: LogStreamName(t.Partitions[i].ID)}
		}
	}
	s.NextTableID++
	s.NextPartitionID += uint64(n)
	s.tablesW()[key] = t
	s.ownNewTable(t)
	cands := s.candidates()
	var moved []uint64
	for i := range t.Partitions {
		if s.fill(t, i, cands) {
			moved = append(moved, t.Partitions[i].ID)
		}
	}
	return Result{Changed: true, Table: t, Moved: moved}, nil
}

func (s *State) dropTable(cmd Command, chk bool) (Result, error) {
	if err := checkName(chk, "tenant", cmd.Tenant); err != nil {
		return Result{}, err
	}
	if err := checkName(chk, "name", cmd.Table); err != nil {
		return Result{}, err
	}
	t, err := s.Table(cmd.Tenant, cmd.Table)
	if err != nil {
		return Result{}, err
	}
	if t.Bulk != nil {
		for _, v := range t.Bulk.Versions {
			s.dropBulkStreams(t, v.Version)
		}
	}
	s.dropLogStreams(t)
	delete(s.tablesW(), tableKey(cmd.Tenant, cmd.Table))
	return Result{Changed: true}, nil
}

// MaxServerIDLen bounds a server id a server chooses for itself.
const MaxServerIDLen = 128

// ValidateServerID checks a server id: 1 to 128 printable ASCII characters
// other than space and '/'.
func ValidateServerID(field, id string) error {
	if id == "" {
		return errInvalid(field, "server_id_empty", 0, "%s is empty", field)
	}
	if len(id) > MaxServerIDLen {
		return errInvalid(field, "server_id_too_long", MaxServerIDLen, "%s is %d bytes; the limit is %d", field, len(id), MaxServerIDLen)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c > '~' || c == '/' {
			return errInvalid(field, "server_id_invalid", 0, "%s %q holds a character other than printable ASCII (no space or '/')", field, id)
		}
	}
	return nil
}

// DefaultFaultDomain is the fault domain of a server that names none: a
// domain of its own, derived from its id, so it is stable across restarts
// (the id lives in the server's data directory) and replicas of one
// partition never share a server by accident. Servers that share a rack or
// a host should name their domain (tabula server --fault-domain).
func DefaultFaultDomain(serverID string) string { return "server:" + serverID }

// registerServer adds a server or brings a known one back.
//
// A known id is a process identity, (Incarnation, Addr): a server picks a
// new random incarnation at every start and keeps its address for its life.
// While the id is alive and not draining, a registration with another
// identity is refused (ALREADY_EXISTS, reason server_id_in_use) unless
// HolderSilent: two processes with one id (a copied data directory, a
// restart while the old process still runs) would otherwise both hold the
// id's replicas in one epoch. The refused process retries; it gets in once
// the old one drained (a draining server admits no request), or has been
// silent longer than its lease (HolderSilent: it serves nothing, its lease
// ran out by its own clock), or was declared dead. It then takes over the
// replicas the id still holds at their current epoch.
//
// Refusing was chosen over bumping those replicas' epochs: a bump does not
// stop an old process that still heartbeats (heartbeats carry no
// incarnation) from following the map and serving at the new epoch, and
// today's table server moves a durable partition's directory aside when it
// opens it at an epoch other than the one on disk, so a bump on every
// restart would empty every restarted single-copy partition. The price is
// that a server restarted after a crash waits out the old process's lease
// (1s) before it serves again; a drained one (SIGTERM) registers at once.
//
// The same identity again (the master restarted, or declared the server
// dead while it was cut off) changes nothing but liveness. Incarnation 0 is
// a server from before incarnations: its identity is its address.
func (s *State) registerServer(cmd Command, chk bool) (Result, error) {
	if chk {
		if err := checkRegistration(cmd); err != nil {
			return Result{}, err
		}
	}
	srv, ok := s.Servers[cmd.ServerID]
	if chk && ok && srv.Alive && !srv.Draining && !cmd.HolderSilent && (srv.Addr != cmd.Addr || srv.Incarnation != 0 && srv.Incarnation != cmd.Incarnation) {
		return Result{}, errCode(ErrServerInUse, api.ErrorCode_ERROR_CODE_ALREADY_EXISTS, "server_id_in_use",
			"server id %s is held by a live process (addr %s, incarnation %x); this one (addr %s, incarnation %x) may register once that one drains, or stays silent past its lease",
			cmd.ServerID, srv.Addr, srv.Incarnation, cmd.Addr, cmd.Incarnation)
	}
	changed := false
	id := cmd.ServerID
	if id == "" {
		for {
			id = fmt.Sprintf("srv-%d", s.NextServerID)
			s.NextServerID++
			if _, taken := s.Servers[id]; !taken {
				break
			}
		}
		changed = true
	}
	fd := cmd.FaultDomain
	if fd == "" {
		fd = DefaultFaultDomain(id)
	}
	srv, ok = s.Servers[id]
	switch {
	case !ok:
		srv = &Server{ID: id, Addr: cmd.Addr, InternalAddr: cmd.InternalAddr, FaultDomain: fd, Alive: true, Incarnation: cmd.Incarnation, BulkCapacity: cmd.BulkCapacity}
		s.serversW()[id] = srv
		s.ownNewServer(srv)
		changed = true
	case !srv.Alive || srv.Draining || srv.Addr != cmd.Addr || srv.InternalAddr != cmd.InternalAddr || srv.FaultDomain != fd || srv.Incarnation != cmd.Incarnation || srv.BulkCapacity != cmd.BulkCapacity:
		// A returning server (or a new process of a dead or drained one,
		// or a server from before incarnations that now sends one). Its
		// old partitions were moved when it died; the ones it still holds
		// (durable single copies, or it drained) get its new address.
		srv = s.mutServer(id)
		srv.Alive, srv.Draining, srv.Addr, srv.FaultDomain, srv.DownSinceMs = true, false, cmd.Addr, fd, 0
		srv.InternalAddr = cmd.InternalAddr
		srv.Incarnation = cmd.Incarnation
		srv.BulkCapacity = cmd.BulkCapacity
		for _, t := range s.Tables {
			if !t.staleAddr(id, cmd.Addr, fd) {
				continue
			}
			t = s.mutTable(t)
			for i := range t.Partitions {
				for j := range t.Partitions[i].Replicas {
					if r := &t.Partitions[i].Replicas[j]; r.ServerID == id {
						r.Addr, r.FaultDomain = cmd.Addr, fd
					}
				}
			}
		}
		// Replicas kept while it was away (Command.Keep) rejoin the log:
		// its next extent includes them, and they catch up from it.
		for _, t := range s.Tables {
			if !t.replicatesByLog() || !slices.ContainsFunc(t.Partitions, func(p Partition) bool { return hostsReplica(&p, id) }) {
				continue
			}
			t = s.mutTable(t)
			for i := range t.Partitions {
				if hostsReplica(&t.Partitions[i], id) {
					t.Partitions[i].resetLog()
				}
			}
		}
		changed = true
	}
	moved := s.placeShort(s.candidates())
	if changed {
		// Every table server is an extent node too, on its internal
		// listener when it has one.
		nodeAddr := cmd.Addr
		if cmd.InternalAddr != "" {
			nodeAddr = cmd.InternalAddr
		}
		s.streamNodeEvent(stream.Command{Op: stream.OpAddNode, Node: id, Addr: nodeAddr, FaultDomain: fd})
	}
	return Result{Changed: changed || len(moved) > 0, ServerID: id, Moved: moved}, nil
}

func (s *State) serverDown(cmd Command, chk bool) (Result, error) {
	if err := checkServerID(chk, cmd.ServerID); err != nil {
		return Result{}, err
	}
	srv, ok := s.Servers[cmd.ServerID]
	if !ok {
		return Result{}, errServerNotFound(cmd.ServerID)
	}
	changed := false
	switch {
	case cmd.Force:
		if chk && srv.Alive {
			return Result{}, errInvalid("force", "server_alive", 0, "server %s is alive: only a dead server's partitions can be forced off it", cmd.ServerID)
		}
	case cmd.Draining && srv.Alive && !srv.Draining:
		srv = s.mutServer(cmd.ServerID)
		srv.Draining = true
		changed = true
	case !cmd.Draining && srv.Alive:
		// A draining server that goes silent (SIGTERM: it exits once its
		// in-flight requests are done) stays draining: moveLoop goes on
		// moving its replicas off, copied from the others, rather than
		// leaving them a replica short until ReplaceAfter.
		srv = s.mutServer(cmd.ServerID)
		srv.Alive, srv.DownSinceMs = false, cmd.UnixMs
		srv.Draining = srv.Draining && cmd.Keep
		changed = true
		s.streamNodeEvent(stream.Command{Op: stream.OpNodeDown, Node: cmd.ServerID})
	}
	if cmd.Replace && chk && srv.Alive {
		return Result{}, errInvalid("replace", "server_alive", 0, "server %s is alive: only a dead server's replicas are replaced", cmd.ServerID)
	}
	if !changed && !cmd.Force && !cmd.Replace {
		return Result{}, nil // already down: it holds only durable partitions, or kept replicas
	}
	cands := s.candidates()
	var moved, held []uint64
	for _, t := range s.tablesByID() {
		for i := range t.Partitions {
			p := &t.Partitions[i]
			k := slices.IndexFunc(p.Replicas, func(r Replica) bool { return r.ServerID == cmd.ServerID })
			if k < 0 {
				continue
			}
			if !cmd.Force && t.onlyCopy(i) {
				// Its data is on this server's disk and nowhere else:
				// moving it would serve an empty partition. It waits,
				// unavailable, for the server to come back, or for an
				// operator to accept the loss (OpForgetServer). A bulk
				// partition whose versions are all in streams moves:
				// its new server fetches them.
				held = append(held, p.ID)
				continue
			}
			if cmd.Replace && slices.Contains(cmd.Hold, p.ID) {
				held = append(held, p.ID)
				continue
			}
			if cmd.Keep && !cmd.Replace && t.replicatesByLog() && len(p.Replicas) > 1 {
				t = s.mutTable(t)
				s.demoteReplica(t, i, k, cmd.Promote[t.Partitions[i].ID])
				moved = append(moved, t.Partitions[i].ID)
				continue
			}
			t = s.mutTable(t)
			p = &t.Partitions[i]
			s.dropReplica(t, i, k, cmd.Promote[p.ID], cands)
			moved = append(moved, p.ID)
		}
	}
	return Result{Changed: changed || len(moved) > 0, Moved: moved, Held: held}, nil
}

// demoteReplica keeps replica k of partition i of t (its server died or
// drains; see Command.Keep): if it was the primary, a live replica
// (promote, the proposer's choice, else the first live one) takes the
// role and the epoch is bumped once; the log is reconfigured either way,
// so its next extent leaves the replica out. With no live replica left the
// primary stays where it is: the partition waits for its server.
func (s *State) demoteReplica(t *Table, i, k int, promote string) {
	p := &t.Partitions[i]
	p.resetLog()
	if p.Replicas[k].Role != api.ReplicaRole_REPLICA_ROLE_PRIMARY {
		return
	}
	live := func(j int) bool {
		srv := s.Servers[p.Replicas[j].ServerID]
		return j != k && srv != nil && srv.Alive && !srv.Draining
	}
	j := slices.IndexFunc(p.Replicas, func(r Replica) bool { return r.ServerID == promote })
	if j < 0 || !live(j) {
		j = -1
		for c := range p.Replicas {
			if live(c) {
				j = c
				break
			}
		}
	}
	if j < 0 {
		return
	}
	if s.primaries != nil {
		s.primaries[p.Replicas[k].ServerID]--
		s.primaries[p.Replicas[j].ServerID]++
	}
	p.Replicas[k].Role = api.ReplicaRole_REPLICA_ROLE_SECONDARY
	p.Replicas[j].Role = api.ReplicaRole_REPLICA_ROLE_PRIMARY
	p.Replicas[0], p.Replicas[j] = p.Replicas[j], p.Replicas[0]
	p.Epoch++
}

// dropReplica removes replica k of partition i of t, promotes a remaining
// one if it was the primary, places replacements and bumps the epoch once.
func (s *State) dropReplica(t *Table, i, k int, promote string, cands []Candidate) {
	p := &t.Partitions[i]
	t.Bulk.forgetLoaded(i, p.Replicas[k].ServerID) // its files go with it
	wasPrimary := p.Replicas[k].Role == api.ReplicaRole_REPLICA_ROLE_PRIMARY
	if wasPrimary && s.primaries != nil {
		s.primaries[p.Replicas[k].ServerID]--
	}
	p.Replicas = slices.Delete(p.Replicas, k, k+1)
	p.resetLog() // the next extent goes to the remaining replicas
	epoch := p.Epoch
	if wasPrimary && len(p.Replicas) > 0 {
		// The most caught-up secondary (promote: the proposer's choice,
		// from the replicas' reports) is promoted; else the first.
		j := max(0, slices.IndexFunc(p.Replicas, func(r Replica) bool { return r.ServerID == promote }))
		p.Replicas[j].Role = api.ReplicaRole_REPLICA_ROLE_PRIMARY
		p.Replicas[0], p.Replicas[j] = p.Replicas[j], p.Replicas[0]
		if s.primaries != nil {
			s.primaries[p.Replicas[0].ServerID]++
		}
	}
	s.fill(t, i, cands) // bumps the epoch if it picks a new primary
	if wasPrimary && p.Epoch == epoch {
		// Exactly one bump per change of primary. A secondary's removal
		// keeps the epoch: the primary's term goes on (its log continues
		// on the next extent).
		p.Epoch++
	}
}

// onlyCopy reports whether partition i of t keeps its data on one server
// and nowhere else: durable, one replica, and not a bulk partition whose
// versions are all in streams (a new server fetches those).
func (t *Table) onlyCopy(i int) bool {
	return t.durable() && len(t.Partitions[i].Replicas) == 1 && !t.bulkMovable(i)
}

// forgetServer removes a dead server and moves every partition it still
// holds; see OpForgetServer.
func (s *State) forgetServer(cmd Command, chk bool) (Result, error) {
	if err := checkServerID(chk, cmd.ServerID); err != nil {
		return Result{}, err
	}
	srv, ok := s.Servers[cmd.ServerID]
	if !ok {
		return Result{}, errServerNotFound(cmd.ServerID)
	}
	if chk && srv.Alive {
		return Result{}, errInvalid("server_id", "server_alive", 0,
			"server %s is alive (or not yet declared dead): only a dead server can be forgotten; stop it first, or drain it (SIGTERM) to move its partitions without loss", cmd.ServerID)
	}
	type hit struct {
		t    *Table
		i, k int
	}
	var hits []hit
	var lost []string
	for _, t := range s.tablesByID() {
		for i := range t.Partitions {
			k := slices.IndexFunc(t.Partitions[i].Replicas, func(r Replica) bool { return r.ServerID == cmd.ServerID })
			if k < 0 {
				continue
			}
			hits = append(hits, hit{t, i, k})
			if t.onlyCopy(i) {
				lost = append(lost, fmt.Sprintf("%s/%s#%d", t.Tenant, t.Name, t.Partitions[i].Index))
			}
		}
	}
	if chk && len(lost) > 0 && !cmd.AcceptDataLoss {
		const show = 10
		names := strings.Join(lost[:min(len(lost), show)], ", ")
		if len(lost) > show {
			names += fmt.Sprintf(" and %d more", len(lost)-show)
		}
		return Result{}, errInvalid("accept_data_loss", "data_loss_not_accepted", 0,
			"server %s holds the only copy of %d partition(s) (%s): forgetting it moves them to other servers EMPTY; "+
				"bring the server back instead, or accept the loss explicitly (accept_data_loss, tabula server forget --accept-data-loss)",
			cmd.ServerID, len(lost), names)
	}
	// Validation is over: mutate.
	delete(s.serversW(), cmd.ServerID)
	cands := s.candidates()
	res := Result{Changed: true}
	for _, h := range hits {
		h.t = s.mutTable(h.t)
		p := &h.t.Partitions[h.i]
		if h.t.onlyCopy(h.i) {
			p.DataLost = &DataLoss{UnixMs: cmd.UnixMs, ServerID: cmd.ServerID, Epoch: p.Epoch}
			res.Lost = append(res.Lost, p.ID)
			if p.Log != nil {
				// Its log's only copies were on the forgotten server: the
				// partition starts again on a new, empty log (the old one
				// could never be sealed, having no replica left).
				_, _ = s.streams().Apply(stream.Command{Op: stream.OpDeleteStream, Stream: p.Log.Stream})
				p.Log = &PartitionLog{Stream: fmt.Sprintf("%s/lost-%d", LogStreamName(p.ID), p.Epoch)}
			}
		}
		s.dropReplica(h.t, h.i, h.k, "", cands)
		res.Moved = append(res.Moved, p.ID)
	}
	return res, nil
}

// tablesByID returns every table in id order, the deterministic order
// placement walks them in.
func (s *State) tablesByID() []*Table {
	ts := slices.Collect(maps.Values(s.Tables))
	slices.SortFunc(ts, func(a, b *Table) int { return cmp.Compare(a.ID, b.ID) })
	return ts
}

// candidates is the placement view of every server, sorted by id.
func (s *State) candidates() []Candidate {
	counts := s.ReplicaCounts()
	cands := make([]Candidate, 0, len(s.Servers))
	for _, id := range s.ServerIDs() {
		srv := s.Servers[id]
		cands = append(cands, Candidate{
			ID: id, FaultDomain: srv.FaultDomain, Replicas: counts[id],
			Available: srv.Alive && !srv.Draining,
		})
	}
	return cands
}

// placeable reports whether some partition is short of replicas and an
// available server could take one.
func (s *State) placeable() bool {
	var cands []Candidate
	for _, t := range s.tablesByID() {
		for i := range t.Partitions {
			if staying(&t.Partitions[i]) >= int(t.Options.Replication) {
				continue
			}
			if cands == nil {
				cands = s.candidates()
			}
			if Place(cands, serversOf(&t.Partitions[i]), int(t.Options.Replication)-staying(&t.Partitions[i])) != nil {
				return true
			}
		}
	}
	return false
}

// placeShort fills every partition short of replicas, in table id and index
// order. Existing replicas never move.
func (s *State) placeShort(cands []Candidate) []uint64 {
	var moved []uint64
	for _, t := range s.tablesByID() {
		for i := range t.Partitions {
			if staying(&t.Partitions[i]) >= int(t.Options.Replication) {
				continue
			}
			if Place(cands, serversOf(&t.Partitions[i]), int(t.Options.Replication)-staying(&t.Partitions[i])) == nil {
				continue // nowhere to put it: copy nothing
			}
			t = s.mutTable(t)
			if s.fill(t, i, cands) {
				moved = append(moved, t.Partitions[i].ID)
			}
		}
	}
	return moved
}

// fill places replicas of partition i of t until it has the table's
// replication factor or no server qualifies, updating cands' counts. A
// partition without a primary gets its first new replica as primary and a
// bumped epoch. It reports whether any replica was added.
func (s *State) fill(t *Table, i int, cands []Candidate) bool {
	p := &t.Partitions[i]
	hosts := make([]string, len(p.Replicas))
	hasPrimary := false
	for k, r := range p.Replicas {
		hosts[k] = r.ServerID
		hasPrimary = hasPrimary || r.Role == api.ReplicaRole_REPLICA_ROLE_PRIMARY
	}
	// A bulk copy leaving (a rollout's replaced row) does not count.
	picks := Place(cands, hosts, int(t.Options.Replication)-staying(p))
	if len(picks) > 0 {
		p.resetLog() // the next extent includes the new replicas
	}
	if !hasPrimary && len(picks) > 1 {
		// The primary orders and applies first, and serves the strong
		// reads: it goes to the pick holding the fewest primaries, so a
		// table's primaries spread over its servers (ties: placement's
		// order).
		if s.primaries == nil {
			s.primaries = s.primaryCounts()
		}
		n := s.primaries
		best := 0
		for k, id := range picks {
			if n[id] < n[picks[best]] {
				best = k
			}
		}
		picks[0], picks[best] = picks[best], picks[0]
	}
	for _, id := range picks {
		srv := s.Servers[id]
		role := api.ReplicaRole_REPLICA_ROLE_SECONDARY
		if !hasPrimary {
			role, hasPrimary = api.ReplicaRole_REPLICA_ROLE_PRIMARY, true
			p.Epoch++
			if s.primaries != nil {
				s.primaries[id]++
			}
		}
		p.Replicas = append(p.Replicas, Replica{ServerID: id, Addr: srv.Addr, Role: role, FaultDomain: srv.FaultDomain})
		for k := range cands {
			if cands[k].ID == id {
				cands[k].Replicas++
			}
		}
	}
	return len(picks) > 0
}

// checkName is errValidateName at proposal (chk), nothing for a logged
// command.
func checkName(chk bool, field, name string) error {
	if !chk {
		return nil
	}
	return errValidateName(field, name)
}

// checkServerID is ValidateServerID("server_id") at proposal (chk).
func checkServerID(chk bool, id string) error {
	if !chk {
		return nil
	}
	return ValidateServerID("server_id", id)
}

// checkRegistration checks the fields of an OpRegisterServer.
func checkRegistration(cmd Command) error {
	if cmd.ServerID != "" {
		if err := ValidateServerID("server_id", cmd.ServerID); err != nil {
			return err
		}
	}
	if cmd.Addr == "" {
		return errInvalid("addr", "addr_empty", 0, "addr is empty")
	}
	if strings.ContainsAny(cmd.Addr, " \t\r\n") || len(cmd.Addr) > 255 {
		return errInvalid("addr", "addr_invalid", 255, "addr %q must be host:port, at most 255 bytes", cmd.Addr)
	}
	if strings.ContainsAny(cmd.InternalAddr, " \t\r\n") || len(cmd.InternalAddr) > 255 {
		return errInvalid("internal_addr", "addr_invalid", 255, "internal_addr %q must be host:port, at most 255 bytes", cmd.InternalAddr)
	}
	if len(cmd.FaultDomain) > api.MaxNameLen {
		return errInvalid("fault_domain", "fault_domain_too_long", api.MaxNameLen, "fault_domain is %d bytes; the limit is %d", len(cmd.FaultDomain), api.MaxNameLen)
	}
	return nil
}

// fillOptionDefaults is the options a logged OpCreateTable applies: o
// with every zero field defaulted as NormalizeOptions would, refusing
// nothing (a logged command was validated when it was proposed; masters
// from before it was logged normalized did not log the defaults).
func fillOptionDefaults(kind api.TableKind, o TableOptions) TableOptions {
	if o.Partitions == 0 {
		o.Partitions = api.DefaultPartitions
	}
	if o.Replication == 0 {
		o.Replication = 1
	}
	if o.MaxValueBytes == 0 {
		o.MaxValueBytes = api.DefaultMaxValueBytes
	}
	if o.Storage == "" {
		o.Storage = StorageSSD
	}
	if kind == api.TableKind_TABLE_KIND_BULK {
		// The logged factor is the table's serving copies (logs from
		// before copies carry 0, defaulted to 1 above).
		if o.BulkRetainedVersions == 0 {
			o.BulkRetainedVersions = DefaultBulkRetained
		}
		return o
	}
	if o.Storage != StorageMemory {
		if o.Durability == "" {
			o.Durability = DurabilitySync
		}
		if o.Compression == "" {
			o.Compression = CompressionNone
		}
	}
	return o
}

// clearDataLoss clears the DataLost record of one partition of a table, or
// of all of them; see OpClearDataLoss. Clearing what is not lost changes
// nothing.
func (s *State) clearDataLoss(cmd Command, chk bool) (Result, error) {
	if err := checkName(chk, "tenant", cmd.Tenant); err != nil {
		return Result{}, err
	}
	if err := checkName(chk, "table", cmd.Table); err != nil {
		return Result{}, err
	}
	t, err := s.Table(cmd.Tenant, cmd.Table)
	if err != nil {
		return Result{}, err
	}
	if cmd.PartitionID != 0 && !slices.ContainsFunc(t.Partitions, func(p Partition) bool { return p.ID == cmd.PartitionID }) {
		return Result{}, errInvalid("partition_id", "partition_not_in_table", 0, "partition %d is not in %s/%s", cmd.PartitionID, t.Tenant, t.Name)
	}
	var cleared []uint64
	for i := range t.Partitions {
		p := &t.Partitions[i]
		if p.DataLost == nil || cmd.PartitionID != 0 && p.ID != cmd.PartitionID {
			continue
		}
		if cleared == nil {
			t = s.mutTable(t)
			p = &t.Partitions[i]
		}
		p.DataLost = nil
		cleared = append(cleared, p.ID)
	}
	return Result{Changed: len(cleared) > 0, Lost: cleared, Table: t}, nil
}
