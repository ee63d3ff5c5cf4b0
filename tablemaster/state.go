package tablemaster

import (
	"cmp"
	"encoding/json"
	"maps"
	"slices"

	"github.com/tabuladb/tabula/api"
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

// Command is one input of the state machine: its typed payload (one type
// per op, payloads.go), applied by the sub-machine of the payload's
// domain (apply_*.go). Times travel inside commands, so Apply never reads
// a clock. The log holds a command flat (flatCommand), as it always has.
type Command struct {
	// UnixMs is the proposer's clock when the command was made.
	UnixMs int64
	// RequestID is the client's id of the call that made the command
	// (requests.go): a command whose id was applied before changes
	// nothing.
	RequestID string
	// Payload is what the command does; its type names the op.
	Payload Payload
}

// Op is c's op ("" with no payload).
func (c Command) Op() Op {
	if c.Payload == nil {
		return ""
	}
	return c.Payload.Op()
}

// flatCommand is Command's JSON form: the tagged union on Op the command
// log and raft entries have always held, every op's fields side by side
// (never change a name: old logs are replayed through it).
type flatCommand struct {
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
	// To: OpMoveReplica's, OpMoveDone's and OpTransferPrimary's target
	// server.
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
	// SplitReason: OpSplitPartition's reason ("load", "size"; empty: an
	// operator's split).
	SplitReason string `json:"split_reason,omitempty"`
	// SplitSettings: OpAlterTable's new split settings.
	SplitSettings *SplitSettings `json:"split_settings,omitempty"`
	// RightLSN is OpMergeDone's merge record LSN in the right partition's
	// log (LSN: the left's); merge.go.
	RightLSN uint64 `json:"right_lsn,omitempty"`
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
	// Automatic splits (autosplit.go), 0: the cluster's setting.
	// MinPartitions is kept for merges (they never go below it).
	MinPartitions  uint32 `json:"min_partitions,omitempty"`
	MaxPartitions  uint32 `json:"max_partitions,omitempty"`
	SplitSizeBytes uint64 `json:"split_size_bytes,omitempty"`
	SplitQPS       uint64 `json:"split_qps,omitempty"`
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
	// SplitReason and SplitUnixMs: in a split's child, why the split was
	// made (splitpolicy.ByLoad, BySize; empty: by an operator) and when
	// it finished. A child is not split again by load within the
	// cooldown, and one split by load is not merged back while warm.
	SplitReason string `json:"split_reason,omitempty"`
	SplitUnixMs int64  `json:"split_unix_ms,omitempty"`
	// Merge is the merge in progress, if any, on both partitions merging
	// (merge.go); MergeLeft, MergeRight and MergeLSN name, in a merge's
	// child, its parents and the LSN its log continues after (0: not a
	// child).
	Merge      *Merge `json:"merge,omitempty"`
	MergeLeft  uint64 `json:"merge_left,omitempty"`
	MergeRight uint64 `json:"merge_right,omitempty"`
	MergeLSN   uint64 `json:"merge_lsn,omitempty"`
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
	// Each domain's sub-machine applies its own commands (apply_*.go);
	// the payload is a copy, so a handler that resolves a field (a
	// table's options, a move's target) hands it back to be logged.
	at := cmd.UnixMs
	switch p := cmd.payload().(type) {
	// Tenants (apply_tenants.go).
	case CreateTenant:
		res, err = s.createTenant(&p, at, chk)
	case DeleteTenant:
		res, err = s.deleteTenant(&p, chk)
	case RotateTenantKey:
		res, err = s.rotateTenantKey(&p, chk)
	case SetTenantQuota:
		res, err = s.setTenantQuota(&p)
	// Catalog (apply_catalog.go).
	case CreateTable:
		res, err = s.createTable(&p, at, chk)
		cmd.setPayload(p)
	case DropTable:
		res, err = s.dropTable(&p, chk)
	// Servers and liveness (apply_servers.go).
	case RegisterServer:
		res, err = s.registerServer(&p, chk)
	case ServerDown:
		res, err = s.serverDown(&p, at, chk)
	case ForgetServer:
		res, err = s.forgetServer(&p, at, chk)
	// Placement and partitions (apply_placement.go; moves in move.go).
	case PlaceShort:
		res = s.place()
	case ClearDataLoss:
		res, err = s.clearDataLoss(&p, chk)
	case PartitionLogAllocated:
		res, err = s.partitionLog(&p)
	case PartitionLogReset:
		res, err = s.partitionLogReset(&p)
	case HandoffDone:
		res, err = s.handoffDone(&p)
	case MoveReplica:
		res, err = s.moveReplica(&p, at, chk)
		cmd.setPayload(p)
	case MoveDone:
		res, err = s.moveDone(&p)
	case ReplicaFailed:
		res, err = s.replicaFailed(&p)
	case TransferPrimary:
		res, err = s.transferPrimary(&p, chk)
	case SplitPartition:
		res, err = s.splitPartition(&p, at, chk)
		cmd.setPayload(p)
	case MergePartitions:
		res, err = s.mergePartitions(&p, at, chk)
	case MergeDone:
		res, err = s.mergeDone(&p)
	case SplitDone:
		res, err = s.splitDone(&p, at)
	case AlterTable:
		res, err = s.alterTable(&p, chk)
	// Streams (apply_streams.go).
	case StreamCommand:
		res, err = s.applyStream(&p)
	// Bulk (apply_bulk.go).
	case BulkPublish:
		res, err = s.bulkPublish(&p, at, chk)
	case BulkLoaded:
		res, err = s.bulkLoadedCmd(&p, at, chk)
	case BulkRollback:
		res, err = s.bulkRollback(&p, at, chk)
	case BulkStored:
		res, err = s.bulkStoredCmd(&p, at, chk)
	case BulkRolloutAction:
		res, err = s.bulkRolloutCmd(&p, at, chk)
	case BulkAdvance:
		res, err = s.bulkAdvanceCmd(&p, at, chk)
	// Coprocessors (apply_coprocs.go).
	case CoprocDeploy:
		res, err = s.coprocDeploy(&p, at, chk)
	case CoprocReady:
		res, err = s.coprocReady(&p, chk)
	case CoprocRollback:
		res, err = s.coprocRollback(&p, chk)
	default:
		return Result{}, errInvalid("op", "unknown_command", 0, "unknown command %q", cmd.Op())
	}
	if err != nil {
		return Result{}, err
	}
	if res.Changed && cmd.RequestID != "" {
		s.recordRequest(cmd, res)
	}
	if res.Changed && cmd.Op() != OpStream {
		// The stream manager's own state (extents, seals, node inventory)
		// is not the partition map: servers and clients need not refetch
		// the map when only it changed.
		s.Version++
		s.fenceHandoffs() // a primary moved off a live server waits (handoff.go)
	}
	return res, nil
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

// MaxServerIDLen bounds a server id a server chooses for itself.
const MaxServerIDLen = 128

// MarshalJSON encodes c flat, its payload's fields among the others'.
func (c Command) MarshalJSON() ([]byte, error) {
	f := flatCommand{UnixMs: c.UnixMs, RequestID: c.RequestID}
	if c.Payload != nil {
		f.Op = c.Payload.Op()
		f.setPayload(c.Payload)
	}
	return json.Marshal(f)
}

// UnmarshalJSON decodes a flat command (a log record, a raft entry). An
// op this build does not know decodes to a payload that Apply refuses.
func (c *Command) UnmarshalJSON(b []byte) error {
	var f flatCommand
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	p := payloadOf(&f)
	if p == nil {
		p = unknownPayload{op: f.Op}
	}
	*c = Command{UnixMs: f.UnixMs, RequestID: f.RequestID, Payload: p}
	return nil
}

// unknownPayload is a logged command of an op this build does not know.
type unknownPayload struct{ op Op }

// Op returns the unknown op.
func (p unknownPayload) Op() Op { return p.op }

// payload returns c's typed payload.
func (c *Command) payload() Payload { return c.Payload }

// setPayload hands back p, the payload a handler resolved fields of.
func (c *Command) setPayload(p Payload) { c.Payload = p }
