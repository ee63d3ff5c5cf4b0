package tableserver

import (
	"time"

	"google.golang.org/grpc"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/replication/stream"
)

// Limits that protect the server (see RATIONALE.md, "Request size limits"
// and "Coprocessor deadline cap"): every request type's size limit,
// checked before decoding (api.SizeGuard over the TableServer and
// ExtentNode services); a budget of request bytes in flight; a cap on each
// connection's concurrent streams; a cap on coprocessor deadlines.

const (
	// DefaultMaxInFlightBytes is Options.MaxInFlightBytes's default:
	// client request bytes the server works on at once, about seven of the
	// largest requests.
	DefaultMaxInFlightBytes = 512 << 20
	// DefaultMaxConcurrentStreams is Options.MaxConcurrentStreams's
	// default: concurrent calls on one client connection (gRPC's own
	// default is unbounded). A client past it waits for a stream to end.
	DefaultMaxConcurrentStreams = 1024
	// DefaultCoprocMaxDeadline is Options.CoprocMaxDeadline's default.
	DefaultCoprocMaxDeadline = 30 * time.Second
)

// serverLimits is the server's size guard and in-flight byte budget.
type serverLimits struct {
	guard  *api.SizeGuard
	budget *api.ByteBudget
}

// newServerLimits builds the guard for o (with defaults).
func newServerLimits(o Options) *serverLimits {
	budget := api.NewByteBudget(o.MaxInFlightBytes)
	guard := api.NewSizeGuard(api.SizeGuardOptions{
		Limits:         api.TableServerLimits().Merge(stream.MessageLimits()),
		Budget:         budget,
		BusyRetryAfter: o.BusyRetryAfter,
		Digests:        o.ClusterKey != nil, // signatures cover the wire bytes
		PerCallStreams: []string{api.TableServer_Calls_FullMethodName},
	})
	return &serverLimits{guard: guard, budget: budget}
}

// serverOptions are the gRPC options that install the limits: the size
// guard (receive limit, codec, the first interceptors) and the stream cap.
func (l *serverLimits) serverOptions(o Options) []grpc.ServerOption {
	return append(l.guard.ServerOptions(), grpc.MaxConcurrentStreams(o.MaxConcurrentStreams))
}

// LimitStats are what the server's protective limits did. For metrics.
type LimitStats struct {
	// Refused counts the requests refused for their size or the in-flight
	// byte budget, before any handler ran.
	Refused int64
	// InFlightBytes is the bytes of client requests being worked on now.
	InFlightBytes int64
}

// LimitStats returns the limits' counters. Safe for concurrent use.
func (s *Server) LimitStats() LimitStats {
	return LimitStats{Refused: s.limits.guard.Refused(), InFlightBytes: s.limits.budget.InUse()}
}

// CoprocCPU returns, per tenant, the time its coprocessor calls have
// executed on this server since it started (coproc.Runtime.TenantCPU).
// Safe for concurrent use.
func (s *Server) CoprocCPU() map[string]time.Duration { return s.cp.rt.TenantCPU() }
