package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// SizeGuard enforces MessageLimits and an in-flight request-bytes budget
// on one gRPC server, before requests are decoded where gRPC allows.
//
// gRPC reads a message whole (up to the server-wide MaxRecvMsgSize, which
// SizeGuard sets to the largest limit) and hands it to the codec, which
// knows its length and the type it decodes into, but not the method. The
// request types are one per RPC, so the type names the RPC's limit. A
// codec that returns an error gets the call failed with INTERNAL and its
// own text, so SizeGuard's codec instead leaves an oversized (or, over
// the budget, a refused) message undecoded and marks it with an unknown
// field that only this process can forge (field 19999, a number protobuf
// reserves for implementations, carrying a random nonce); SizeGuard's
// interceptors, installed ahead of every other, turn a marked message into
// INVALID_ARGUMENT message_too_large (or SERVER_BUSY) and the handler never
// runs. The mark lives in the message, so nothing leaks when gRPC drops a
// request between decoding and the interceptor. See RATIONALE.md,
// "Request size limits".
//
// A SizeGuard is safe for concurrent use.
type SizeGuard struct {
	limits     MessageLimits
	maxBytes   int
	inner      encoding.CodecV2
	budget     *ByteBudget
	retryAfter time.Duration
	nonce      uint64
	refused    atomic.Int64
	// digests: the unary request types whose wire bytes are hashed (nil:
	// none; SizeGuardOptions.Digests).
	digests map[protoreflect.FullName]bool
	perCall map[string]bool // SizeGuardOptions.PerCallStreams
}

// SizeGuardOptions configure a SizeGuard.
type SizeGuardOptions struct {
	// Limits are the request limits of every service the server serves.
	Limits MessageLimits
	// Codec is the codec messages are decoded and encoded with. Default:
	// gRPC's proto codec.
	Codec encoding.CodecV2
	// Digests makes the codec hash the wire bytes of every unary request
	// and carry the SHA-256 with the decoded message, for TakeDigest:
	// request signatures cover the bytes the client sent, so the server
	// need not encode the request again to check one. Streams' messages
	// are not hashed.
	Digests bool
	// Budget, when set, bounds the bytes of requests (not Internal ones)
	// in flight: a request that does not fit gets SERVER_BUSY with
	// BusyRetryAfter.
	Budget *ByteBudget
	// BusyRetryAfter is the retry_after a budget refusal carries. Default
	// 10 ms.
	BusyRetryAfter time.Duration
	// PerCallStreams are the streaming methods whose messages are calls
	// of their own (TableServer.Calls): the guard does not end such a
	// stream over one message, its handler checks each (Admit) and fails
	// only that call.
	PerCallStreams []string
}

// NewSizeGuard returns a guard for o.
func NewSizeGuard(o SizeGuardOptions) *SizeGuard {
	if o.Codec == nil {
		o.Codec = encoding.GetCodecV2("proto")
	}
	if o.BusyRetryAfter <= 0 {
		o.BusyRetryAfter = 10 * time.Millisecond
	}
	g := &SizeGuard{limits: o.Limits, maxBytes: o.Limits.Max(), inner: o.Codec, budget: o.Budget,
		retryAfter: o.BusyRetryAfter, nonce: rand.Uint64() | 1}
	if o.Digests {
		g.digests = unaryRequestTypes()
	}
	for _, m := range o.PerCallStreams {
		if g.perCall == nil {
			g.perCall = map[string]bool{}
		}
		g.perCall[m] = true
	}
	return g
}

// unaryRequestTypes are the request types of every registered service's
// unary methods, less any type that is also a streaming method's message.
func unaryRequestTypes() map[protoreflect.FullName]bool {
	unary, streamed := map[protoreflect.FullName]bool{}, map[protoreflect.FullName]bool{}
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		svcs := fd.Services()
		for i := range svcs.Len() {
			ms := svcs.Get(i).Methods()
			for j := range ms.Len() {
				m := ms.Get(j)
				if m.IsStreamingClient() || m.IsStreamingServer() {
					streamed[m.Input().FullName()] = true
				} else {
					unary[m.Input().FullName()] = true
				}
			}
		}
		return true
	})
	for n := range streamed {
		delete(unary, n)
	}
	return unary
}

// digestField is the unknown field the codec appends a unary request's
// digest in: the guard's nonce (8 bytes) and the SHA-256 of the wire bytes.
const digestField protowire.Number = 19998

// digestTrailer is the encoded field's prefix (tag and length).
var digestTrailer = protowire.AppendVarint(protowire.AppendTag(nil, digestField, protowire.BytesType), 8+sha256.Size)

// digestFieldBytes is the whole encoded field's length.
var digestFieldBytes = len(digestTrailer) + 8 + sha256.Size

// TakeDigest returns the SHA-256 of the wire bytes m was decoded from and
// removes it from m, or false when the codec did not hash m (a stream's
// message, a server without Digests, or taken already).
func (g *SizeGuard) TakeDigest(m proto.Message) ([sha256.Size]byte, bool) {
	var d [sha256.Size]byte
	if g.digests == nil || m == nil {
		return d, false
	}
	r := m.ProtoReflect()
	u := r.GetUnknown()
	if len(u) < digestFieldBytes {
		return d, false
	}
	f := u[len(u)-digestFieldBytes:]
	if !bytes.Equal(f[:len(digestTrailer)], digestTrailer) {
		return d, false
	}
	p := f[len(digestTrailer):]
	if binary.LittleEndian.Uint64(p) != g.nonce {
		return d, false
	}
	copy(d[:], p[8:])
	if len(u) == digestFieldBytes {
		r.SetUnknown(nil)
	} else {
		r.SetUnknown(u[:len(u)-digestFieldBytes])
	}
	return d, true
}

// MaxBytes is the server-wide receive limit: the largest limit.
func (g *SizeGuard) MaxBytes() int { return g.maxBytes }

// Refused counts the requests refused for their size or the budget.
func (g *SizeGuard) Refused() int64 { return g.refused.Load() }

// ServerOptions are the options that install the guard: the receive
// limit, the codec and the interceptors. The interceptors are installed
// with grpc.UnaryInterceptor and grpc.StreamInterceptor, which gRPC runs
// before every chained one; a server must not set those two again.
func (g *SizeGuard) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(g.maxBytes),
		grpc.ForceServerCodecV2(guardCodec{g}),
		grpc.UnaryInterceptor(g.unary),
		grpc.StreamInterceptor(g.stream),
	}
}

// markField is the unknown field a refused message is marked with.
const markField protowire.Number = 19999

const (
	markTooLarge = 1
	markBusy     = 2
)

// guardCodec is SizeGuard's codec: see SizeGuard.
type guardCodec struct{ g *SizeGuard }

func (guardCodec) Name() string { return "proto" }

func (c guardCodec) Marshal(v any) (mem.BufferSlice, error) { return c.g.inner.Marshal(v) }

func (c guardCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return c.g.inner.Unmarshal(data, v)
	}
	n := data.Len()
	lim := c.g.limits.Lookup(m.ProtoReflect().Descriptor().FullName())
	switch {
	case n > lim.Bytes:
		c.g.mark(m, markTooLarge, n, lim.Bytes)
		keepCallID(m, data)
		return nil
	case !lim.Internal && c.g.budget != nil && !c.g.budget.fits(int64(n)):
		// Advisory (the interceptor reserves): spares the decoding of a
		// request that would be refused.
		c.g.mark(m, markBusy, n, 0)
		keepCallID(m, data)
		return nil
	}
	if c.g.digests == nil || !c.g.digests[m.ProtoReflect().Descriptor().FullName()] {
		return c.g.inner.Unmarshal(data, v)
	}
	h := sha256.New()
	for _, b := range data {
		h.Write(b.ReadOnlyData())
	}
	if err := c.g.inner.Unmarshal(data, v); err != nil {
		return err
	}
	r := m.ProtoReflect()
	u := append(r.GetUnknown(), digestTrailer...)
	u = binary.LittleEndian.AppendUint64(u, c.g.nonce)
	r.SetUnknown(h.Sum(u))
	return nil
}

// keepCallID decodes only the id of a Calls stream message the guard
// refuses undecoded, so that its handler answers that one call with the
// refusal (Admit) instead of seeing a call without an id, which ends the
// stream and every call on it. The id is field 1, which encoders write
// first; anything else leaves it 0.
func keepCallID(m proto.Message, data mem.BufferSlice) {
	c, ok := m.(*CallRequest)
	if !ok {
		return
	}
	var head []byte
	for _, b := range data {
		head = append(head, b.ReadOnlyData()[:min(b.Len(), binary.MaxVarintLen64+1-len(head))]...)
		if len(head) > binary.MaxVarintLen64 {
			break
		}
	}
	num, typ, n := protowire.ConsumeTag(head)
	if n < 0 || num != 1 || typ != protowire.VarintType {
		return
	}
	if id, k := protowire.ConsumeVarint(head[n:]); k > 0 {
		c.Id = id
	}
}

func (g *SizeGuard) mark(m proto.Message, kind byte, size, limit int) {
	var p []byte
	p = binary.LittleEndian.AppendUint64(p, g.nonce)
	p = append(p, kind)
	p = protowire.AppendVarint(p, uint64(size))
	p = protowire.AppendVarint(p, uint64(limit))
	b := protowire.AppendTag(nil, markField, protowire.BytesType)
	b = protowire.AppendBytes(b, p)
	m.ProtoReflect().SetUnknown(b)
}

// marked reads the mark of m: kind 0 when m carries none.
func (g *SizeGuard) marked(m proto.Message) (kind byte, size, limit int) {
	u := m.ProtoReflect().GetUnknown()
	if len(u) == 0 {
		return 0, 0, 0
	}
	num, typ, n := protowire.ConsumeTag(u)
	if n < 0 || num != markField || typ != protowire.BytesType {
		return 0, 0, 0
	}
	p, n2 := protowire.ConsumeBytes(u[n:])
	if n2 < 0 || len(p) < 9 || binary.LittleEndian.Uint64(p) != g.nonce {
		return 0, 0, 0
	}
	kind, p = p[8], p[9:]
	s, k := protowire.ConsumeVarint(p)
	if k < 0 {
		return 0, 0, 0
	}
	l, k2 := protowire.ConsumeVarint(p[k:])
	if k2 < 0 {
		return 0, 0, 0
	}
	return kind, int(s), int(l)
}

// admit checks one received message of method: its mark, then the budget.
// release (never nil) gives back what it reserved.
func (g *SizeGuard) admit(method string, req any) (release func(), err error) {
	m, ok := req.(proto.Message)
	if !ok {
		return func() {}, nil
	}
	switch kind, size, limit := g.marked(m); kind {
	case markTooLarge:
		g.refused.Add(1)
		return func() {}, messageTooLarge(method, size, limit)
	case markBusy:
		g.refused.Add(1)
		return func() {}, g.busy(method, size)
	}
	if g.budget == nil || g.limits.Lookup(m.ProtoReflect().Descriptor().FullName()).Internal {
		return func() {}, nil
	}
	n := int64(proto.Size(m))
	if !g.budget.TryAcquire(n) {
		g.refused.Add(1)
		return func() {}, g.busy(method, int(n))
	}
	return func() { g.budget.Release(n) }, nil
}

func (g *SizeGuard) busy(method string, size int) error {
	return Status(&ErrorDetail{
		Code:         ErrorCode_ERROR_CODE_SERVER_BUSY,
		Reason:       "inflight_bytes",
		RetryAfterMs: uint64(max(1, g.retryAfter.Milliseconds())),
	}, fmt.Sprintf("%s: server busy: a request of %d bytes does not fit in the %d bytes of requests it may work on at once", method, size, g.budget.Max()))
}

func (g *SizeGuard) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	release, err := g.admit(info.FullMethod, req)
	if err != nil {
		return nil, err
	}
	defer release()
	return h(ctx, req)
}

// Admit checks one request a multiplexed stream carries (see
// SizeGuardOptions.PerCallStreams) as the guard checks a unary call's:
// its mark (too large, or refused by the budget), then the in-flight
// budget, whose bytes stay reserved until release (never nil) is called.
func (g *SizeGuard) Admit(method string, req any) (release func(), err error) {
	return g.admit(method, req)
}

func (g *SizeGuard) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if g.perCall[info.FullMethod] {
		return h(srv, ss) // its handler admits each call (Admit)
	}
	gs := &guardedStream{ServerStream: ss, g: g, method: info.FullMethod, release: func() {}}
	err := h(srv, gs)
	gs.release()
	if gs.refusal != nil {
		// The handler may have wrapped or replaced the error Recv gave it;
		// the client is told why.
		return gs.refusal
	}
	return err
}

// guardedStream checks every message a stream receives. A message's bytes
// stay reserved until the next one is received or the stream ends.
type guardedStream struct {
	grpc.ServerStream
	g       *SizeGuard
	method  string
	release func()
	refusal error
}

func (s *guardedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	s.release()
	release, err := s.g.admit(s.method, m)
	s.release = release
	if err != nil {
		s.refusal = err
		return err
	}
	return nil
}

// ByteBudget bounds the bytes of requests a server works on at once. Safe
// for concurrent use.
type ByteBudget struct {
	max  int64
	used atomic.Int64
}

// NewByteBudget returns a budget of max bytes (max > 0).
func NewByteBudget(max int64) *ByteBudget { return &ByteBudget{max: max} }

// Max is the budget's size.
func (b *ByteBudget) Max() int64 { return b.max }

// InUse is the bytes reserved now.
func (b *ByteBudget) InUse() int64 { return b.used.Load() }

// fits reports whether n bytes would fit now.
func (b *ByteBudget) fits(n int64) bool {
	u := b.used.Load()
	return u == 0 || u+n <= b.max
}

// TryAcquire reserves n bytes if they fit. A request larger than the whole
// budget is admitted when nothing else is in flight, so every request
// under its message limit can run on an idle server.
func (b *ByteBudget) TryAcquire(n int64) bool {
	for {
		u := b.used.Load()
		if u != 0 && u+n > b.max {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// Release gives back n bytes reserved by TryAcquire.
func (b *ByteBudget) Release(n int64) { b.used.Add(-n) }
