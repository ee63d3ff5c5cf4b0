package auth

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/tabuladb/tabula/api"
)

// MaxClockSkew is how far a request's timestamp may be from the server's
// clock, either way.
const MaxClockSkew = 15 * time.Minute

// Keyring finds principals' keys for a Verifier.
type Keyring interface {
	// Key returns principal's key number id (0: the cluster key; 1 or 2: a
	// tenant's), or nil if there is none.
	Key(principal string, id int) []byte
	// Refresh is called when a signature fails against the keys held or
	// names an unknown principal: a keyring that caches keys from
	// elsewhere may fetch them again (within ctx, at most so often) and
	// report true if it did, so the signature is checked once more.
	Refresh(ctx context.Context, principal string) bool
}

// Principal is who signed a request.
type Principal struct {
	Name string // a tenant, or ClusterPrincipal
}

// IsCluster reports whether p is the cluster (the operator or a cluster
// process), which may act for every tenant.
func (p Principal) IsCluster() bool { return p.Name == ClusterPrincipal }

type principalKey struct{}

// FromContext returns the principal a server's interceptor authenticated
// for the call; ok is false when authentication is off.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// WithPrincipal returns ctx carrying p (the interceptors' doing; tests and
// in-process callers that bypass gRPC use it too).
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// VerifierOptions configure a Verifier.
type VerifierOptions struct {
	Keys Keyring
	// Access decides who may call a method (MethodAccess when nil).
	Access func(fullMethod string) Access
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// ReplayCapacity bounds the signatures remembered
	// (DefaultReplayCapacity when 0).
	ReplayCapacity int
	Logger         *slog.Logger
	// Digests, when set, returns the SHA-256 of the wire bytes a unary
	// request was decoded from (api.SizeGuard.TakeDigest with
	// SizeGuardOptions.Digests); a request it has none for is encoded
	// again (Digest).
	Digests func(msg proto.Message) ([sha256.Size]byte, bool)
}

// Verifier checks the signatures of incoming RPCs.
type Verifier struct {
	opts   VerifierOptions
	replay *replayCache
}

// NewVerifier returns a Verifier.
func NewVerifier(opts VerifierOptions) *Verifier {
	if opts.Access == nil {
		opts.Access = MethodAccess
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.ReplayCapacity <= 0 {
		opts.ReplayCapacity = DefaultReplayCapacity
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Verifier{opts: opts, replay: newReplayCache(opts.ReplayCapacity)}
}

func unauthenticated(reason, format string, args ...any) error {
	return api.Errorf(api.ErrorCode_ERROR_CODE_UNAUTHENTICATED, reason, "auth: "+format, args...)
}

func denied(reason, format string, args ...any) error {
	return api.Errorf(api.ErrorCode_ERROR_CODE_PERMISSION_DENIED, reason, "auth: "+format, args...)
}

// authenticate checks ctx's signature of a call of method with request msg
// (nil for a stream) and returns the principal.
func (v *Verifier) authenticate(ctx context.Context, method string, msg any) (Principal, error) {
	access := v.opts.Access(method)
	if access == Deny {
		return Principal{}, denied("method_unknown", "method %s is not served", method)
	}
	vals := metadata.ValueFromIncomingContext(ctx, MDAuth)
	if len(vals) != 1 || vals[0] == "" {
		return Principal{}, unauthenticated("unsigned", "%s needs a signed request (metadata %s); the SDK signs with client.Options.Credential, the CLI with --profile, --key-file or --cluster-key", method, MDAuth)
	}
	f := strings.Split(vals[0], " ")
	if len(f) != 5 {
		return Principal{}, unauthenticated("malformed_signature", "metadata %s has %d fields; want principal, key number, timestamp, nonce, signature", MDAuth, len(f))
	}
	principal, sig64 := f[0], f[4]
	keyID, err := strconv.Atoi(f[1])
	if err != nil || keyID < 0 || keyID > 2 {
		return Principal{}, unauthenticated("bad_key_number", "key number %q: want 0, 1 or 2", f[1])
	}
	tsMs, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil {
		return Principal{}, unauthenticated("bad_timestamp", "timestamp %q is not unix milliseconds", f[2])
	}
	nonce := f[3]
	if n, err := base64.RawURLEncoding.DecodeString(nonce); err != nil || len(n) != nonceBytes {
		return Principal{}, unauthenticated("bad_nonce", "nonce must be %d bytes in unpadded base64url", nonceBytes)
	}
	sig, err := base64.RawURLEncoding.DecodeString(sig64)
	if err != nil || len(sig) != 32 {
		return Principal{}, unauthenticated("bad_signature", "signature is not a base64 HMAC-SHA256")
	}
	now := v.opts.Now()
	if skew := now.Sub(time.UnixMilli(tsMs)); skew > MaxClockSkew || skew < -MaxClockSkew {
		return Principal{}, unauthenticated("clock_skew", "request timestamp %s is %s from the server's clock; the limit is %s (check the client's clock)",
			time.UnixMilli(tsMs).UTC().Format(time.RFC3339), skew.Round(time.Second), MaxClockSkew)
	}
	var digest string
	if m, ok := msg.(proto.Message); ok && m != nil && v.opts.Digests != nil {
		if d, ok := v.opts.Digests(m); ok {
			digest = hex.EncodeToString(d[:])
		}
	}
	if digest == "" {
		if digest, err = Digest(msg); err != nil {
			return Principal{}, api.InvalidArgument("request", "unencodable", 0, "%v", err)
		}
	}
	want := stringToSign(method, principal, keyID, tsMs, nonce, digest)
	check := func() bool {
		key := v.opts.Keys.Key(principal, keyID)
		return key != nil && hmac.Equal(sig, mac(key, want))
	}
	if !check() && !(v.opts.Keys.Refresh(ctx, principal) && check()) {
		return Principal{}, v.mismatch(principal, keyID, sig, want)
	}
	if principal == ClusterPrincipal && keyID != 0 || principal != ClusterPrincipal && keyID == 0 {
		return Principal{}, unauthenticated("bad_key_number", "key number %d does not fit principal %q", keyID, principal)
	}
	if err := v.replay.add(sig, tsMs, now.UnixMilli()); err != nil {
		return Principal{}, err
	}
	p := Principal{Name: principal}
	if access == Cluster && !p.IsCluster() {
		return Principal{}, denied("cluster_only", "%s needs the cluster credential; tenant %q may not call it", method, principal)
	}
	return p, nil
}

// mismatch explains a signature that did not verify with the key the
// request named. When it verifies with the tenant's other key (a
// credential whose key number does not match its key, as a profile
// saying key-id 1 that holds key 2), it says so and which number to
// set: only a holder of that key can make such a signature, so this
// tells a stranger nothing. Otherwise it names the key it was checked
// against and the likely causes, a rotation first.
func (v *Verifier) mismatch(principal string, keyID int, sig, want []byte) error {
	if principal == ClusterPrincipal || keyID == 0 {
		return unauthenticated("signature_mismatch", "signature does not verify with the cluster key (key 0 of %q, the key the request named): the cluster credential file is not this cluster's, or the request changed in transit", principal)
	}
	other := 3 - keyID // keyID is 1 or 2 here
	if k := v.opts.Keys.Key(principal, other); k != nil && hmac.Equal(sig, mac(k, want)) {
		return unauthenticated("wrong_key_number", "signature made with key %d of tenant %q but sent as key %d: the credential names the wrong key number; set it to %d (a profile's key-id, $TABULA_KEY_ID, client.TenantCredential's id)", other, principal, keyID, other)
	}
	return unauthenticated("signature_mismatch", "signature does not verify with key %d of tenant %q; the request named key %d: rotated? (`tabula tenant describe %s --show-keys` prints the current keys; `tabula tenant keys rotate --save-profile` saves a new one in a profile) Else the key is not that tenant's, the tenant does not exist, or the request changed in transit", keyID, principal, keyID, principal)
}

// UnaryServerInterceptor authenticates every unary call, checks its
// request's tenant against the principal, and passes the principal in the
// handler's context.
func (v *Verifier) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		p, err := v.authenticate(ctx, info.FullMethod, req)
		if err != nil {
			return nil, err
		}
		if err := CheckTenant(p, req); err != nil {
			return nil, err
		}
		return handler(WithPrincipal(ctx, p), req)
	}
}

// StreamServerInterceptor authenticates every stream at its start and
// checks the tenant of each message it receives.
func (v *Verifier) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		p, err := v.authenticate(ss.Context(), info.FullMethod, nil)
		if err != nil {
			return err
		}
		return handler(srv, &checkedStream{ServerStream: ss, p: p, ctx: WithPrincipal(ss.Context(), p)})
	}
}

type checkedStream struct {
	grpc.ServerStream
	p   Principal
	ctx context.Context
}

func (s *checkedStream) Context() context.Context { return s.ctx }

func (s *checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return CheckTenant(s.p, m)
}

// CheckTenant refuses a tenant principal's request that names another
// tenant, and fills its empty tenant fields with its own name. The
// cluster may name any tenant. Requests are walked by reflection: every
// string field named "tenant", in the message and the messages it holds.
func CheckTenant(p Principal, req any) error {
	if p.IsCluster() {
		return nil
	}
	if handled, err := checkPointTenant(p.Name, req); handled {
		return err
	}
	m, ok := req.(proto.Message)
	if !ok {
		return nil
	}
	return checkTenant(p.Name, m.ProtoReflect(), 0)
}
