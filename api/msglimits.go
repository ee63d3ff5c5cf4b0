package api

import (
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Request size limits per RPC. A server refuses a request larger than its
// RPC's limit before decoding it (SizeGuard), with INVALID_ARGUMENT, reason
// message_too_large, the limit in ErrorDetail.limit; nothing runs. Each
// limit is what the largest legitimate request of that RPC needs plus
// framing (see RATIONALE.md, "Request size limits"). Raising one is a
// compatible change; lowering one is not.
const (
	// SmallRequestBytes bounds requests that carry names, ids and at most
	// one key: a header, a key, a few strings.
	SmallRequestBytes = 64 << 10
	// BatchKeysRequestBytes bounds a request carrying up to MaxBatchKeys
	// keys (BatchGet), or gets (MultiGet, each with its own header).
	BatchKeysRequestBytes = MaxBatchKeys*(MaxKeyBytes+1<<10) + SmallRequestBytes
	// PutRequestBytes bounds a Put: the largest value a table may take
	// (MaxValueBytesLimit), its key and header.
	PutRequestBytes = MaxValueBytesLimit + SmallRequestBytes
	// BatchWriteRequestBytes bounds a BatchWrite: MaxBatchBytes of keys
	// and values plus each mutation's framing (op, ttl: under 64 bytes).
	BatchWriteRequestBytes = MaxBatchBytes + MaxBatchKeys*64 + SmallRequestBytes
	// MaxBulkChunkBytes is the most file data one BulkUpload message may
	// carry (client.PublishOptions.ChunkBytes; the SDK sends 1 MiB).
	MaxBulkChunkBytes = 8 << 20
	// MaxCoprocInputBytes is the most input one coprocessor call takes
	// (the servers' coproc.Options.MaxInputBytes).
	MaxCoprocInputBytes = 1 << 20
	// InvokeRequestBytes bounds an Invoke: its input, up to MaxBatchKeys
	// target keys, the range bounds and names.
	InvokeRequestBytes = MaxCoprocInputBytes + MaxBatchKeys*(MaxKeyBytes+8) + SmallRequestBytes
	// MaxCoprocModuleBytes is the largest WebAssembly module a deploy
	// takes; it equals coproc.DefaultMaxModuleBytes.
	MaxCoprocModuleBytes = 32 << 20
	// BulkPublishRequestBytes bounds a BulkPublish: one BulkFile (under
	// 1 KiB with its stream name) per partition.
	BulkPublishRequestBytes = MaxPartitions*(1<<10) + SmallRequestBytes
	// RaftSnapshotChunkBytes bounds one chunk of a master snapshot sent
	// to a raft member: 1 MiB of data, the first with its raft message.
	RaftSnapshotChunkBytes = 4 << 20
	// DefaultRequestBytes is the limit of a request type no table lists
	// (a service added later, gRPC's own health checks).
	DefaultRequestBytes = 1 << 20
)

// MessageLimit is one request type's limit.
type MessageLimit struct {
	// Bytes is the most bytes one message of the type may have on the wire.
	Bytes int
	// Internal: cluster-internal traffic (replication, heartbeats, map
	// watches), not counted in the in-flight request-bytes budget, so that
	// client load never refuses it.
	Internal bool
}

// MessageLimits maps request message types (their protobuf full names) to
// their limits. A server serving several services merges their tables.
type MessageLimits map[protoreflect.FullName]MessageLimit

// Add sets the limit of m's type and returns l.
func (l MessageLimits) Add(m proto.Message, bytes int, internal bool) MessageLimits {
	l[m.ProtoReflect().Descriptor().FullName()] = MessageLimit{Bytes: bytes, Internal: internal}
	return l
}

// Merge copies every limit of others into l (a type listed twice keeps the
// larger) and returns l.
func (l MessageLimits) Merge(others ...MessageLimits) MessageLimits {
	for _, o := range others {
		for k, v := range o {
			if old, ok := l[k]; !ok || v.Bytes > old.Bytes {
				l[k] = v
			}
		}
	}
	return l
}

// Max is the largest limit in l (at least DefaultRequestBytes): the
// server-wide gRPC receive limit.
func (l MessageLimits) Max() int {
	n := DefaultRequestBytes
	for _, v := range l {
		n = max(n, v.Bytes)
	}
	return n
}

// Lookup returns the limit of messages named name, DefaultRequestBytes
// for a type l does not list.
func (l MessageLimits) Lookup(name protoreflect.FullName) MessageLimit {
	if v, ok := l[name]; ok {
		return v
	}
	return MessageLimit{Bytes: DefaultRequestBytes}
}

// TableServerLimits are the limits of the TableServer service's requests.
func TableServerLimits() MessageLimits {
	return MessageLimits{}.
		Add(&GetRequest{}, SmallRequestBytes, false).
		Add(&BatchGetRequest{}, BatchKeysRequestBytes, false).
		Add(&MultiGetRequest{}, BatchKeysRequestBytes, false).
		Add(&PutRequest{}, PutRequestBytes, false).
		Add(&DeleteRequest{}, SmallRequestBytes, false).
		// A swap carries an expected and a new value; both together are
		// held to the message limit, as before per-RPC limits.
		Add(&CompareAndSwapRequest{}, MaxMessageBytes, false).
		Add(&BatchWriteRequest{}, BatchWriteRequestBytes, false).
		Add(&ScanRequest{}, SmallRequestBytes, false).
		Add(&CopyReplicaRequest{}, SmallRequestBytes, true).
		Add(&BulkUploadRequest{}, MaxBulkChunkBytes+SmallRequestBytes, false).
		Add(&BulkUploadStatusRequest{}, SmallRequestBytes, false).
		Add(&InvokeRequest{}, InvokeRequestBytes, false).
		// Partials of every partition: a module without a merge export
		// gets them concatenated, as large as a reply may be.
		Add(&CoprocMergeRequest{}, MaxMessageBytes, false).
		// One call of any kind the stream carries: a swap is the largest.
		Add(&CallRequest{}, MaxMessageBytes, false)
}

// MasterLimits are the limits of the Master and Raft services' requests.
func MasterLimits() MessageLimits {
	l := MessageLimits{}
	for _, m := range []proto.Message{
		&CreateTableRequest{}, &DropTableRequest{}, &ListTablesRequest{}, &DescribeTableRequest{},
		&GetPartitionMapRequest{}, &ListServersRequest{}, &BulkStatusRequest{}, &BulkRollbackRequest{}, &BulkRolloutRequest{},
		&CoprocListRequest{}, &CoprocRollbackRequest{}, &ForgetServerRequest{}, &ListDataLossRequest{}, &ClearDataLossRequest{},
		&MasterMembersRequest{}, &AddMasterRequest{}, &RemoveMasterRequest{}, &TransferLeaderRequest{},
		&MovePartitionRequest{}, &DrainServerRequest{}, &SplitPartitionRequest{}, &MergePartitionsRequest{}, &AlterTableRequest{}, &BalancePlanRequest{},
		&CreateTenantRequest{}, &ListTenantsRequest{}, &DescribeTenantRequest{}, &DeleteTenantRequest{},
		&RotateTenantKeyRequest{}, &SetTenantQuotaRequest{},
	} {
		l.Add(m, SmallRequestBytes, false)
	}
	for _, m := range []proto.Message{
		&WatchPartitionMapRequest{}, &RegisterServerRequest{}, &PartitionLogFailedRequest{},
		&BulkStoredRequest{}, &StreamRequest{}, &CoprocFetchRequest{}, &TenantKeysRequest{},
		&RaftWhereRequest{},
	} {
		l.Add(m, SmallRequestBytes, true)
	}
	return l.
		Add(&BulkPublishRequest{}, BulkPublishRequestBytes, false).
		Add(&CoprocDeployRequest{}, MaxCoprocModuleBytes+SmallRequestBytes, false).
		// A server reports every replica it hosts (up to
		// MaxClusterPartitions, a few hundred bytes each).
		Add(&HeartbeatRequest{}, MaxMessageBytes, true).
		// A batch of raft messages; one entry may be a whole coprocessor
		// deploy.
		Add(&RaftBatch{}, MaxMessageBytes, true).
		Add(&RaftSnapshotChunk{}, RaftSnapshotChunkBytes, true)
}

// messageTooLarge is the error a request over its limit gets.
func messageTooLarge(method string, size, limit int) error {
	return Status(&ErrorDetail{
		Code:   ErrorCode_ERROR_CODE_INVALID_ARGUMENT,
		Reason: "message_too_large",
		Field:  "request",
		Limit:  uint64(limit),
	}, fmt.Sprintf("%s: the request is %d bytes; the limit for this call is %d bytes", method, size, limit))
}
