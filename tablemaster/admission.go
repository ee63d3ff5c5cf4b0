package tablemaster

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/tabuladb/tabula/api"
)

// Admission control on the master (see RATIONALE.md, "Master admission"):
// the master bounds the requests it works on at once, per class, so that a
// burst of clients cannot starve the table servers' heartbeats (a server
// whose heartbeats are refused loses its lease) and no class grows without
// bound. A request over its class's cap gets SERVER_BUSY with a
// retry_after, which the SDK and the servers already back off on. Every
// request is also held to its type's size limit before decoding, and
// client requests to a budget of bytes in flight (api.SizeGuard).

// Defaults of the admission options.
const (
	// DefaultMaxRequests: client calls (catalog, bulk, coprocessor and
	// operator calls) in flight at once.
	DefaultMaxRequests = 512
	// DefaultMaxInternalRequests: table servers' calls (heartbeats,
	// registration, stream-manager and log reports, module fetches).
	DefaultMaxInternalRequests = 4096
	// DefaultMaxWatches: map watches open at once (one per table server
	// and per watching client; each lives as long as its watcher).
	DefaultMaxWatches = 16384
	// DefaultMaxInFlightBytes: bytes of client requests in flight.
	DefaultMaxInFlightBytes = 256 << 20
	// DefaultMaxConcurrentStreams: concurrent calls on one connection.
	DefaultMaxConcurrentStreams = 1024
	// DefaultBusyRetryAfter: the retry_after of a refusal.
	DefaultBusyRetryAfter = 50 * time.Millisecond
)

// admission classes.
const (
	classClient = iota
	classInternal
	classWatch
	classRaft // member-to-member: never refused (a handful of streams)
	numClasses
)

var classNames = [numClasses]string{"client", "internal", "watch", "raft"}

// internalMethods are the table servers' calls.
var internalMethods = map[string]bool{
	"/tabula.v1.Master/RegisterServer":     true,
	"/tabula.v1.Master/Heartbeat":          true,
	"/tabula.v1.Master/PartitionLogFailed": true,
	"/tabula.v1.Master/Stream":             true,
	"/tabula.v1.Master/BulkStored":         true,
	"/tabula.v1.Master/CoprocFetch":        true,
	"/tabula.v1.Master/MasterMembers":      true,
	"/tabula.v1.Master/TenantKeys":         true,
}

func classOf(method string) int {
	switch {
	case strings.HasPrefix(method, "/tabula.v1.Raft/"):
		return classRaft
	case method == "/tabula.v1.Master/WatchPartitionMap":
		return classWatch
	case internalMethods[method]:
		return classInternal
	}
	return classClient
}

// admission is the master's admission control. Safe for concurrent use.
type admission struct {
	max        [numClasses]int64
	inflight   [numClasses]atomic.Int64
	refused    [numClasses]atomic.Int64
	retryAfter time.Duration
	guard      *api.SizeGuard
	budget     *api.ByteBudget
}

func newAdmission(o Options) *admission {
	a := &admission{retryAfter: o.BusyRetryAfter, budget: api.NewByteBudget(o.MaxInFlightBytes)}
	a.max = [numClasses]int64{int64(o.MaxRequests), int64(o.MaxInternalRequests), int64(o.MaxWatches), -1}
	a.guard = api.NewSizeGuard(api.SizeGuardOptions{
		Limits:         api.MasterLimits(),
		Codec:          newWatchCodec(), // map watches send pre-encoded responses
		Budget:         a.budget,
		BusyRetryAfter: o.BusyRetryAfter,
		Digests:        o.ClusterKey != nil, // signatures cover the wire bytes
	})
	return a
}

// serverOptions install the size guard (its codec and first interceptors)
// and the stream cap on one of the master's gRPC servers.
func (a *admission) serverOptions(o Options) []grpc.ServerOption {
	return append(a.guard.ServerOptions(), grpc.MaxConcurrentStreams(o.MaxConcurrentStreams))
}

// admit takes a slot of method's class, or refuses with SERVER_BUSY.
func (a *admission) admit(method string) (release func(), err error) {
	c := classOf(method)
	if a.max[c] < 0 {
		return func() {}, nil
	}
	if n := a.inflight[c].Add(1); n > a.max[c] {
		a.inflight[c].Add(-1)
		a.refused[c].Add(1)
		return nil, api.Status(&api.ErrorDetail{
			Code:         api.ErrorCode_ERROR_CODE_SERVER_BUSY,
			Reason:       "master_busy",
			RetryAfterMs: uint64(max(1, a.retryAfter.Milliseconds())),
		}, fmt.Sprintf("%s: master busy: %d %s requests in flight, the most it takes", method, a.max[c], classNames[c]))
	}
	return func() { a.inflight[c].Add(-1) }, nil
}

func (m *Master) admitUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	release, err := m.adm.admit(info.FullMethod)
	if err != nil {
		return nil, err
	}
	defer release()
	return h(ctx, req)
}

func (m *Master) admitStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	release, err := m.adm.admit(info.FullMethod)
	if err != nil {
		return err
	}
	defer release()
	return h(srv, ss)
}

// AdmissionStats are what the master's admission control did. For metrics.
type AdmissionStats struct {
	// InFlight and Refused per class: "client", "internal", "watch",
	// "raft" (raft is never refused).
	InFlight map[string]int64
	Refused  map[string]int64
	// RefusedBySize counts requests refused for their size or the
	// in-flight bytes budget; InFlightBytes is that budget's use now.
	RefusedBySize int64
	InFlightBytes int64
}

// AdmissionStats returns the admission counters. Safe for concurrent use.
func (m *Master) AdmissionStats() AdmissionStats {
	st := AdmissionStats{InFlight: map[string]int64{}, Refused: map[string]int64{},
		RefusedBySize: m.adm.guard.Refused(), InFlightBytes: m.adm.budget.InUse()}
	for c := range numClasses {
		st.InFlight[classNames[c]] = m.adm.inflight[c].Load()
		st.Refused[classNames[c]] = m.adm.refused[c].Load()
	}
	return st
}
