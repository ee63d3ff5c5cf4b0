package metrics

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/replication/stream/streampb"
)

// UnaryServerInterceptor records every unary RPC: requests, errors by code
// and latency, per tenant, table and operation (see the package comment).
// Chain it after interceptors that refuse requests it should not count
// (authentication) and before those whose refusals it should
// (admission control).
func (r *Registry) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		tenant, table := tenantTable(req)
		r.record(opOf(info.FullMethod), tenant, table, time.Since(start), err)
		return resp, err
	}
}

// StreamServerInterceptor records every streaming RPC as
// UnaryServerInterceptor does a unary one: labelled by its first request
// message, timed over its whole life.
func (r *Registry) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if info.FullMethod == api.TableServer_Calls_FullMethodName {
			// A stream of calls, each recorded as the unary call of its
			// kind (the server runs them through UnaryServerInterceptor).
			return handler(srv, ss)
		}
		if info.FullMethod == streampb.ExtentNode_ReplicateStream_FullMethodName {
			// A stream of replication batches, each recorded as the
			// ReplicateBatch call it stands for, from its arrival to its
			// answer; the stream's own life (hours) is no latency.
			return handler(srv, &batchStream{ServerStream: ss, r: r, started: map[uint64]time.Time{}})
		}
		start := time.Now()
		w := &labelStream{ServerStream: ss}
		err := handler(srv, w)
		w.mu.Lock()
		tenant, table := w.tenant, w.table
		w.mu.Unlock()
		rerr := err
		if err != nil && errors.Is(ss.Context().Err(), context.Canceled) {
			// The client ended the stream (a watch it no longer needs,
			// every CLI command's map watch): its way of saying goodbye,
			// not a failure.
			rerr = nil
		}
		r.record(opOf(info.FullMethod), tenant, table, time.Since(start), rerr)
		return err
	}
}

// labelStream reads the labels of a stream's first received message.
type labelStream struct {
	grpc.ServerStream

	mu sync.Mutex
	// Guarded by mu (a handler may receive on another goroutine than the
	// one that returns).
	seen          bool
	tenant, table string
}

func (s *labelStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if !s.seen {
		s.seen = true
		s.tenant, s.table = tenantTable(m)
	}
	s.mu.Unlock()
	return nil
}

// replicateBatchOp is the op a ReplicateStream's batches are recorded as.
var replicateBatchOp = opOf(streampb.ExtentNode_ReplicateBatch_FullMethodName)

// batchStream times each batch of a ReplicateStream: a request's id is
// noted when it arrives, and its answer (the response with that id)
// records it.
type batchStream struct {
	grpc.ServerStream
	r *Registry

	mu      sync.Mutex
	started map[uint64]time.Time // guarded by mu: batches not yet answered
}

func (s *batchStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if b, ok := m.(*streampb.ReplicateBatchRequest); ok && err == nil {
		s.mu.Lock()
		s.started[b.GetId()] = time.Now()
		s.mu.Unlock()
	}
	return err
}

func (s *batchStream) SendMsg(m any) error {
	err := s.ServerStream.SendMsg(m)
	if b, ok := m.(*streampb.ReplicateBatchResponse); ok && b.GetId() != 0 {
		s.mu.Lock()
		start, ok := s.started[b.GetId()]
		delete(s.started, b.GetId())
		s.mu.Unlock()
		if ok {
			s.r.record(replicateBatchOp, "", "", time.Since(start), err)
		}
	}
	return err
}

// record counts one RPC.
func (r *Registry) record(op, tenant, table string, took time.Duration, err error) {
	tenant, table, over := r.labels.label(tenant, table)
	if over {
		r.overflow.Inc()
	}
	c := r.child(tenant, table, op)
	c.requests.Inc()
	c.latency.Observe(took.Seconds())
	if err != nil {
		r.errs.WithLabelValues(tenant, table, op, codeOf(err), errorLabel(err)).Inc()
	}
}

// series are the request counter and latency histogram of one (tenant,
// table, op), cached so a request does not hash its labels twice.
type series struct {
	requests prometheus.Counter
	latency  prometheus.Observer
}

type seriesKey struct{ tenant, table, op string }

// child returns the series of (tenant, table, op), made on first use. The
// cache holds at most one entry per series the vectors hold, so it is
// bounded as they are.
func (r *Registry) child(tenant, table, op string) *series {
	k := seriesKey{tenant, table, op}
	if c, ok := r.series.Load(k); ok {
		return c.(*series)
	}
	c, _ := r.series.LoadOrStore(k, &series{
		requests: r.requests.WithLabelValues(tenant, table, op),
		latency:  r.latency.WithLabelValues(tenant, table, op),
	})
	return c.(*series)
}

// codeOf is the gRPC code the client sees for err: a status's own, or, as
// grpc-go answers a handler's plain error, Canceled or DeadlineExceeded for
// a context error and Unknown for anything else.
func codeOf(err error) string {
	if st, ok := status.FromError(err); ok {
		return st.Code().String()
	}
	return status.FromContextError(err).Code().String()
}

// errorLabel is err's Tabula error code without its prefix ("SERVER_BUSY"),
// empty when the status carries none. Codes outside the enumeration (a
// newer peer's) become "OTHER", so the label stays bounded.
func errorLabel(err error) string {
	c := api.CodeOf(err)
	if c == api.ErrorCode_ERROR_CODE_UNSPECIFIED {
		return ""
	}
	if _, known := api.ErrorCode_name[int32(c)]; !known {
		return "OTHER"
	}
	return strings.TrimPrefix(c.String(), "ERROR_CODE_")
}
