package tablemaster

import (
	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/replication/stream"
)

// Payload is the typed body of a Command: one type per Op, each with
// the fields its op reads, under the JSON names the command log has
// always used for them (Command's encoding is flat: see command.go).
// Payloads are values, safe for concurrent use once built; a payload
// holds slices and maps its command shares, which are never modified
// once the command is made.
type Payload interface {
	// Op is the payload's op.
	Op() Op
}

// CreateTenant creates a tenant with its two keys and quota (OpCreateTenant).
type CreateTenant struct {
	Tenant string       `json:"tenant,omitempty"`
	Keys   [][]byte     `json:"keys,omitempty"`
	Quota  *TenantQuota `json:"quota,omitempty"`
}

// Op returns OpCreateTenant.
func (CreateTenant) Op() Op { return OpCreateTenant }

// DeleteTenant removes a tenant that has no tables (OpDeleteTenant).
type DeleteTenant struct {
	Tenant string `json:"tenant,omitempty"`
}

// Op returns OpDeleteTenant.
func (DeleteTenant) Op() Op { return OpDeleteTenant }

// RotateTenantKey replaces key KeyIndex of a tenant with Keys[0] (OpRotateTenantKey).
type RotateTenantKey struct {
	Tenant   string   `json:"tenant,omitempty"`
	Keys     [][]byte `json:"keys,omitempty"`
	KeyIndex int      `json:"key_index,omitempty"`
}

// Op returns OpRotateTenantKey.
func (RotateTenantKey) Op() Op { return OpRotateTenantKey }

// SetTenantQuota replaces a tenant's quotas (OpSetTenantQuota).
type SetTenantQuota struct {
	Tenant string       `json:"tenant,omitempty"`
	Quota  *TenantQuota `json:"quota,omitempty"`
}

// Op returns OpSetTenantQuota.
func (SetTenantQuota) Op() Op { return OpSetTenantQuota }

// CreateTable creates a table and places its partitions (OpCreateTable).
type CreateTable struct {
	Tenant  string        `json:"tenant,omitempty"`
	Table   string        `json:"table,omitempty"`
	Kind    api.TableKind `json:"kind,omitempty"`
	Options *TableOptions `json:"options,omitempty"`
}

// Op returns OpCreateTable.
func (CreateTable) Op() Op { return OpCreateTable }

// DropTable removes a table (OpDropTable).
type DropTable struct {
	Tenant string `json:"tenant,omitempty"`
	Table  string `json:"table,omitempty"`
}

// Op returns OpDropTable.
func (DropTable) Op() Op { return OpDropTable }

// RegisterServer adds a server or brings a known one back (OpRegisterServer).
type RegisterServer struct {
	ServerID     string `json:"server_id,omitempty"`
	Addr         string `json:"addr,omitempty"`
	FaultDomain  string `json:"fault_domain,omitempty"`
	InternalAddr string `json:"internal_addr,omitempty"`
	BulkCapacity uint64 `json:"bulk_capacity,omitempty"`
	Incarnation  uint64 `json:"incarnation,omitempty"`
	HolderSilent bool   `json:"holder_silent,omitempty"`
}

// Op returns OpRegisterServer.
func (RegisterServer) Op() Op { return OpRegisterServer }

// ServerDown takes a server out of service (OpServerDown).
type ServerDown struct {
	ServerID string            `json:"server_id,omitempty"`
	Draining bool              `json:"draining,omitempty"`
	Force    bool              `json:"force,omitempty"`
	Keep     bool              `json:"keep,omitempty"`
	Replace  bool              `json:"replace,omitempty"`
	Hold     []uint64          `json:"hold,omitempty"`
	Promote  map[uint64]string `json:"promote,omitempty"`
}

// Op returns OpServerDown.
func (ServerDown) Op() Op { return OpServerDown }

// ForgetServer removes a dead server from the cluster (OpForgetServer).
type ForgetServer struct {
	ServerID       string `json:"server_id,omitempty"`
	AcceptDataLoss bool   `json:"accept_data_loss,omitempty"`
}

// Op returns OpForgetServer.
func (ForgetServer) Op() Op { return OpForgetServer }

// ClearDataLoss clears the DataLost record of a table's partitions (OpClearDataLoss).
type ClearDataLoss struct {
	Tenant      string `json:"tenant,omitempty"`
	Table       string `json:"table,omitempty"`
	PartitionID uint64 `json:"partition_id,omitempty"`
}

// Op returns OpClearDataLoss.
func (ClearDataLoss) Op() Op { return OpClearDataLoss }

// PlaceShort places every partition short of replicas (OpPlace).
type PlaceShort struct {
}

// Op returns OpPlace.
func (PlaceShort) Op() Op { return OpPlace }

// BulkPublish registers a version of a bulk table (OpBulkPublish).
type BulkPublish struct {
	Tenant      string     `json:"tenant,omitempty"`
	Table       string     `json:"table,omitempty"`
	Version     uint64     `json:"version,omitempty"`
	BaseVersion uint64     `json:"base_version,omitempty"`
	Files       []BulkFile `json:"files,omitempty"`
}

// Op returns OpBulkPublish.
func (BulkPublish) Op() Op { return OpBulkPublish }

// BulkLoaded records a server's load (or refusal) of a bulk file (OpBulkLoaded).
type BulkLoaded struct {
	Tenant      string    `json:"tenant,omitempty"`
	Table       string    `json:"table,omitempty"`
	ServerID    string    `json:"server_id,omitempty"`
	Version     uint64    `json:"version,omitempty"`
	PartitionID uint64    `json:"partition_id,omitempty"`
	File        *BulkFile `json:"file,omitempty"`
	Error       string    `json:"error,omitempty"`
}

// Op returns OpBulkLoaded.
func (BulkLoaded) Op() Op { return OpBulkLoaded }

// BulkRollback makes a retained bulk version the serving one (OpBulkRollback).
type BulkRollback struct {
	Tenant  string `json:"tenant,omitempty"`
	Table   string `json:"table,omitempty"`
	Version uint64 `json:"version,omitempty"`
}

// Op returns OpBulkRollback.
func (BulkRollback) Op() Op { return OpBulkRollback }

// BulkStored records that a bulk file is in its sealed stream (OpBulkStored).
type BulkStored struct {
	Tenant      string `json:"tenant,omitempty"`
	Table       string `json:"table,omitempty"`
	Version     uint64 `json:"version,omitempty"`
	PartitionID uint64 `json:"partition_id,omitempty"`
	Stream      string `json:"stream,omitempty"`
}

// Op returns OpBulkStored.
func (BulkStored) Op() Op { return OpBulkStored }

// BulkRolloutAction pauses, resumes or aborts a bulk rollout (OpBulkRollout).
type BulkRolloutAction struct {
	Tenant string `json:"tenant,omitempty"`
	Table  string `json:"table,omitempty"`
	Action string `json:"action,omitempty"`
}

// Op returns OpBulkRollout.
func (BulkRolloutAction) Op() Op { return OpBulkRollout }

// BulkAdvance re-evaluates a bulk table's copies and rollout (OpBulkAdvance).
type BulkAdvance struct {
	Tenant string `json:"tenant,omitempty"`
	Table  string `json:"table,omitempty"`
}

// Op returns OpBulkAdvance.
func (BulkAdvance) Op() Op { return OpBulkAdvance }

// StreamCommand is a stream manager command (OpStream).
type StreamCommand struct {
	StreamCmd *stream.Command `json:"stream_cmd,omitempty"`
}

// Op returns OpStream.
func (StreamCommand) Op() Op { return OpStream }

// CoprocDeploy deploys a coprocessor version (OpCoprocDeploy).
type CoprocDeploy struct {
	Tenant string         `json:"tenant,omitempty"`
	Table  string         `json:"table,omitempty"`
	Name   string         `json:"name,omitempty"`
	Coproc *CoprocVersion `json:"coproc,omitempty"`
}

// Op returns OpCoprocDeploy.
func (CoprocDeploy) Op() Op { return OpCoprocDeploy }

// CoprocReady records that a server compiled a coprocessor version (OpCoprocReady).
type CoprocReady struct {
	Tenant   string `json:"tenant,omitempty"`
	Table    string `json:"table,omitempty"`
	ServerID string `json:"server_id,omitempty"`
	Version  uint64 `json:"version,omitempty"`
	Name     string `json:"name,omitempty"`
}

// Op returns OpCoprocReady.
func (CoprocReady) Op() Op { return OpCoprocReady }

// CoprocRollback makes a coprocessor version the live one (OpCoprocRollback).
type CoprocRollback struct {
	Tenant  string `json:"tenant,omitempty"`
	Table   string `json:"table,omitempty"`
	Version uint64 `json:"version,omitempty"`
	Name    string `json:"name,omitempty"`
}

// Op returns OpCoprocRollback.
func (CoprocRollback) Op() Op { return OpCoprocRollback }

// PartitionLogAllocated records the extent allocated to a partition's log (OpPartitionLog).
type PartitionLogAllocated struct {
	PartitionID uint64   `json:"partition_id,omitempty"`
	Extent      uint64   `json:"extent,omitempty"`
	Epoch       uint64   `json:"epoch,omitempty"`
	Servers     []string `json:"servers,omitempty"`
}

// Op returns OpPartitionLog.
func (PartitionLogAllocated) Op() Op { return OpPartitionLog }

// PartitionLogReset marks a partition's log for reconfiguration, dropping failed replicas (OpPartitionLogReset).
type PartitionLogReset struct {
	PartitionID uint64   `json:"partition_id,omitempty"`
	Extent      uint64   `json:"extent,omitempty"`
	Epoch       uint64   `json:"epoch,omitempty"`
	Servers     []string `json:"servers,omitempty"`
}

// Op returns OpPartitionLogReset.
func (PartitionLogReset) Op() Op { return OpPartitionLogReset }

// MoveReplica starts moving a partition's replica (OpMoveReplica).
type MoveReplica struct {
	ServerID    string `json:"server_id,omitempty"`
	To          string `json:"to,omitempty"`
	PartitionID uint64 `json:"partition_id,omitempty"`
}

// Op returns OpMoveReplica.
func (MoveReplica) Op() Op { return OpMoveReplica }

// MoveDone finishes a replica move (OpMoveDone).
type MoveDone struct {
	ServerID    string `json:"server_id,omitempty"`
	To          string `json:"to,omitempty"`
	PartitionID uint64 `json:"partition_id,omitempty"`
}

// Op returns OpMoveDone.
func (MoveDone) Op() Op { return OpMoveDone }

// ReplicaFailed drops a replica that failed (OpReplicaFailed).
type ReplicaFailed struct {
	ServerID    string            `json:"server_id,omitempty"`
	PartitionID uint64            `json:"partition_id,omitempty"`
	Promote     map[uint64]string `json:"promote,omitempty"`
}

// Op returns OpReplicaFailed.
func (ReplicaFailed) Op() Op { return OpReplicaFailed }

// HandoffDone clears finished live handoffs (OpHandoffDone).
type HandoffDone struct {
	Handoffs map[uint64]uint64 `json:"handoffs,omitempty"`
}

// Op returns OpHandoffDone.
func (HandoffDone) Op() Op { return OpHandoffDone }

// SplitPartition starts splitting a partition at a hash (point tables) or
// a key (ordered tables) (OpSplitPartition; split.go).
type SplitPartition struct {
	PartitionID uint64 `json:"partition_id,omitempty"`
	Hash        uint64 `json:"hash,omitempty"`
	Key         []byte `json:"key,omitempty"`
	// Reason: why the master split it (autosplit.go); empty: an operator.
	Reason string `json:"split_reason,omitempty"`
}

// Op returns OpSplitPartition.
func (SplitPartition) Op() Op { return OpSplitPartition }

// SplitDone puts a split partition's children in its place, split by the
// record at LSN of its log (OpSplitDone; split.go).
type SplitDone struct {
	PartitionID uint64 `json:"partition_id,omitempty"`
	LSN         uint64 `json:"lsn,omitempty"`
}

// Op returns OpSplitDone.
func (SplitDone) Op() Op { return OpSplitDone }

// AlterTable replaces a table's split settings (OpAlterTable;
// autosplit.go).
type AlterTable struct {
	Tenant   string         `json:"tenant,omitempty"`
	Table    string         `json:"table,omitempty"`
	Settings *SplitSettings `json:"split_settings,omitempty"`
}

// Op returns OpAlterTable.
func (AlterTable) Op() Op { return OpAlterTable }

// MergePartitions starts merging partition PartitionID with the next one
// of its table (OpMergePartitions; merge.go).
type MergePartitions struct {
	PartitionID uint64 `json:"partition_id,omitempty"`
}

// Op returns OpMergePartitions.
func (MergePartitions) Op() Op { return OpMergePartitions }

// MergeDone puts a merge's child in the place of its parents, PartitionID
// (the left) merged at the record at LSN of its log and the right at
// RightLSN of its own (OpMergeDone; merge.go).
type MergeDone struct {
	PartitionID uint64 `json:"partition_id,omitempty"`
	LSN         uint64 `json:"lsn,omitempty"`
	RightLSN    uint64 `json:"right_lsn,omitempty"`
}

// Op returns OpMergeDone.
func (MergeDone) Op() Op { return OpMergeDone }

// payloadOf returns the payload of flat command c (nil for an unknown op).
func payloadOf(c *flatCommand) Payload {
	switch c.Op {
	case OpCreateTenant:
		return CreateTenant{Tenant: c.Tenant, Keys: c.Keys, Quota: c.Quota}
	case OpDeleteTenant:
		return DeleteTenant{Tenant: c.Tenant}
	case OpRotateTenantKey:
		return RotateTenantKey{Tenant: c.Tenant, Keys: c.Keys, KeyIndex: c.KeyIndex}
	case OpSetTenantQuota:
		return SetTenantQuota{Tenant: c.Tenant, Quota: c.Quota}
	case OpCreateTable:
		return CreateTable{Tenant: c.Tenant, Table: c.Table, Kind: c.Kind, Options: c.Options}
	case OpDropTable:
		return DropTable{Tenant: c.Tenant, Table: c.Table}
	case OpRegisterServer:
		return RegisterServer{ServerID: c.ServerID, Addr: c.Addr, FaultDomain: c.FaultDomain, InternalAddr: c.InternalAddr, BulkCapacity: c.BulkCapacity, Incarnation: c.Incarnation, HolderSilent: c.HolderSilent}
	case OpServerDown:
		return ServerDown{ServerID: c.ServerID, Draining: c.Draining, Force: c.Force, Keep: c.Keep, Replace: c.Replace, Hold: c.Hold, Promote: c.Promote}
	case OpForgetServer:
		return ForgetServer{ServerID: c.ServerID, AcceptDataLoss: c.AcceptDataLoss}
	case OpClearDataLoss:
		return ClearDataLoss{Tenant: c.Tenant, Table: c.Table, PartitionID: c.PartitionID}
	case OpPlace:
		return PlaceShort{}
	case OpBulkPublish:
		return BulkPublish{Tenant: c.Tenant, Table: c.Table, Version: c.Version, BaseVersion: c.BaseVersion, Files: c.Files}
	case OpBulkLoaded:
		return BulkLoaded{Tenant: c.Tenant, Table: c.Table, ServerID: c.ServerID, Version: c.Version, PartitionID: c.PartitionID, File: c.File, Error: c.Error}
	case OpBulkRollback:
		return BulkRollback{Tenant: c.Tenant, Table: c.Table, Version: c.Version}
	case OpBulkStored:
		return BulkStored{Tenant: c.Tenant, Table: c.Table, Version: c.Version, PartitionID: c.PartitionID, Stream: c.Stream}
	case OpBulkRollout:
		return BulkRolloutAction{Tenant: c.Tenant, Table: c.Table, Action: c.Action}
	case OpBulkAdvance:
		return BulkAdvance{Tenant: c.Tenant, Table: c.Table}
	case OpStream:
		return StreamCommand{StreamCmd: c.StreamCmd}
	case OpCoprocDeploy:
		return CoprocDeploy{Tenant: c.Tenant, Table: c.Table, Name: c.Name, Coproc: c.Coproc}
	case OpCoprocReady:
		return CoprocReady{Tenant: c.Tenant, Table: c.Table, ServerID: c.ServerID, Version: c.Version, Name: c.Name}
	case OpCoprocRollback:
		return CoprocRollback{Tenant: c.Tenant, Table: c.Table, Version: c.Version, Name: c.Name}
	case OpPartitionLog:
		return PartitionLogAllocated{PartitionID: c.PartitionID, Extent: c.Extent, Epoch: c.Epoch, Servers: c.Servers}
	case OpPartitionLogReset:
		return PartitionLogReset{PartitionID: c.PartitionID, Extent: c.Extent, Epoch: c.Epoch, Servers: c.Servers}
	case OpMoveReplica:
		return MoveReplica{ServerID: c.ServerID, To: c.To, PartitionID: c.PartitionID}
	case OpMoveDone:
		return MoveDone{ServerID: c.ServerID, To: c.To, PartitionID: c.PartitionID}
	case OpReplicaFailed:
		return ReplicaFailed{ServerID: c.ServerID, PartitionID: c.PartitionID, Promote: c.Promote}
	case OpHandoffDone:
		return HandoffDone{Handoffs: c.Handoffs}
	case OpSplitPartition:
		return SplitPartition{PartitionID: c.PartitionID, Hash: c.Hash, Key: c.Key, Reason: c.SplitReason}
	case OpAlterTable:
		return AlterTable{Tenant: c.Tenant, Table: c.Table, Settings: c.SplitSettings}
	case OpSplitDone:
		return SplitDone{PartitionID: c.PartitionID, LSN: c.LSN}
	case OpMergePartitions:
		return MergePartitions{PartitionID: c.PartitionID}
	case OpMergeDone:
		return MergeDone{PartitionID: c.PartitionID, LSN: c.LSN, RightLSN: c.RightLSN}
	case OpTransferPrimary:
		return TransferPrimary{PartitionID: c.PartitionID, ServerID: c.ServerID, To: c.To}
	}
	return nil
}

// setPayload sets the fields of flat command c that payload p holds.
func (c *flatCommand) setPayload(p Payload) {
	switch p := p.(type) {
	case CreateTenant:
		c.Tenant = p.Tenant
		c.Keys = p.Keys
		c.Quota = p.Quota
	case DeleteTenant:
		c.Tenant = p.Tenant
	case RotateTenantKey:
		c.Tenant = p.Tenant
		c.Keys = p.Keys
		c.KeyIndex = p.KeyIndex
	case SetTenantQuota:
		c.Tenant = p.Tenant
		c.Quota = p.Quota
	case CreateTable:
		c.Tenant = p.Tenant
		c.Table = p.Table
		c.Kind = p.Kind
		c.Options = p.Options
	case DropTable:
		c.Tenant = p.Tenant
		c.Table = p.Table
	case RegisterServer:
		c.ServerID = p.ServerID
		c.Addr = p.Addr
		c.FaultDomain = p.FaultDomain
		c.InternalAddr = p.InternalAddr
		c.BulkCapacity = p.BulkCapacity
		c.Incarnation = p.Incarnation
		c.HolderSilent = p.HolderSilent
	case ServerDown:
		c.ServerID = p.ServerID
		c.Draining = p.Draining
		c.Force = p.Force
		c.Keep = p.Keep
		c.Replace = p.Replace
		c.Hold = p.Hold
		c.Promote = p.Promote
	case ForgetServer:
		c.ServerID = p.ServerID
		c.AcceptDataLoss = p.AcceptDataLoss
	case ClearDataLoss:
		c.Tenant = p.Tenant
		c.Table = p.Table
		c.PartitionID = p.PartitionID
	case PlaceShort:
	case BulkPublish:
		c.Tenant = p.Tenant
		c.Table = p.Table
		c.Version = p.Version
		c.BaseVersion = p.BaseVersion
		c.Files = p.Files
	case BulkLoaded:
		c.Tenant = p.Tenant
		c.Table = p.Table
		c.ServerID = p.ServerID
		c.Version = p.Version
		c.PartitionID = p.PartitionID
		c.File = p.File
		c.Error = p.Error
	case BulkRollback:
		c.Tenant = p.Tenant
		c.Table = p.Table
		c.Version = p.Version
	case BulkStored:
		c.Tenant = p.Tenant
		c.Table = p.Table
		c.Version = p.Version
		c.PartitionID = p.PartitionID
		c.Stream = p.Stream
	case BulkRolloutAction:
		c.Tenant = p.Tenant
		c.Table = p.Table
		c.Action = p.Action
	case BulkAdvance:
		c.Tenant = p.Tenant
		c.Table = p.Table
	case StreamCommand:
		c.StreamCmd = p.StreamCmd
	case CoprocDeploy:
		c.Tenant = p.Tenant
		c.Table = p.Table
		c.Name = p.Name
		c.Coproc = p.Coproc
	case CoprocReady:
		c.Tenant = p.Tenant
		c.Table = p.Table
		c.ServerID = p.ServerID
		c.Version = p.Version
		c.Name = p.Name
	case CoprocRollback:
		c.Tenant = p.Tenant
		c.Table = p.Table
		c.Version = p.Version
		c.Name = p.Name
	case PartitionLogAllocated:
		c.PartitionID = p.PartitionID
		c.Extent = p.Extent
		c.Epoch = p.Epoch
		c.Servers = p.Servers
	case PartitionLogReset:
		c.PartitionID = p.PartitionID
		c.Extent = p.Extent
		c.Epoch = p.Epoch
		c.Servers = p.Servers
	case MoveReplica:
		c.ServerID = p.ServerID
		c.To = p.To
		c.PartitionID = p.PartitionID
	case MoveDone:
		c.ServerID = p.ServerID
		c.To = p.To
		c.PartitionID = p.PartitionID
	case ReplicaFailed:
		c.ServerID = p.ServerID
		c.PartitionID = p.PartitionID
		c.Promote = p.Promote
	case HandoffDone:
		c.Handoffs = p.Handoffs
	case SplitPartition:
		c.PartitionID = p.PartitionID
		c.Hash = p.Hash
		c.Key = p.Key
		c.SplitReason = p.Reason
	case AlterTable:
		c.Tenant = p.Tenant
		c.Table = p.Table
		c.SplitSettings = p.Settings
	case SplitDone:
		c.PartitionID = p.PartitionID
		c.LSN = p.LSN
	case MergePartitions:
		c.PartitionID = p.PartitionID
	case MergeDone:
		c.PartitionID = p.PartitionID
		c.LSN = p.LSN
		c.RightLSN = p.RightLSN
	case TransferPrimary:
		c.PartitionID = p.PartitionID
		c.ServerID = p.ServerID
		c.To = p.To
	}
}
