package auth

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// MDAuth is the metadata key of a signed RPC. Its value is five fields
// separated by spaces: the principal, the key number, the timestamp (unix
// ms), the nonce (nonceBytes random bytes) and the HMAC-SHA256, both in
// unpadded base64url. One header, not five: each call's random values
// are encoded in HTTP/2 headers, which costs per field and per byte.
const MDAuth = "tabula-auth"

// nonceBytes is the length of a signature's nonce: with the millisecond
// timestamp and the request digest it makes every signature distinct.
const nonceBytes = 12

const scheme = "TABULA-HMAC-SHA256"

// Credential is a principal's key: a tenant's key 1 or 2, or the cluster's
// (KeyID 0).
type Credential struct {
	Principal string
	KeyID     int
	Key       []byte
}

// Validate checks the credential's shape.
func (c Credential) Validate() error {
	switch {
	case c.Principal == "":
		return errors.New("auth: credential names no principal")
	case len(c.Key) != KeyBytes:
		return fmt.Errorf("auth: credential key is %d bytes; want %d", len(c.Key), KeyBytes)
	case c.Principal == ClusterPrincipal && c.KeyID != 0:
		return fmt.Errorf("auth: the cluster credential has key number 0, not %d", c.KeyID)
	case c.Principal != ClusterPrincipal && c.KeyID != 1 && c.KeyID != 2:
		return fmt.Errorf("auth: tenant key number %d: want 1 or 2", c.KeyID)
	}
	return nil
}

// IsCluster reports whether c is the cluster credential.
func (c Credential) IsCluster() bool { return c.Principal == ClusterPrincipal }

// Digest returns the hex SHA-256 of msg's deterministic encoding, or of
// nothing for a nil msg (streaming RPCs). The SDK signs a unary request
// over the bytes it sends, which are this encoding; a server hashes the
// bytes it received (VerifierOptions.Digests) and encodes the request
// again only when it has not them.
func Digest(msg any) (string, error) {
	var d [sha256.Size]byte
	if m, ok := msg.(proto.Message); ok && m != nil {
		b, err := encode(m)
		if err != nil {
			return "", err
		}
		d = sha256.Sum256(b)
	} else {
		d = sha256.Sum256(nil)
	}
	return hex.EncodeToString(d[:]), nil
}

// emptyDigest is the digest a stream's signature covers: of no bytes.
var emptyDigest = func() string { d := sha256.Sum256(nil); return hex.EncodeToString(d[:]) }()

func encode(m proto.Message) ([]byte, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("auth: encode request to sign: %w", err)
	}
	return b, nil
}

// signedBytes holds, for the length of a call, the encoding the signing
// interceptor signed, by request: wireCodec sends those bytes rather than
// encoding the request again. Interceptors chained after the signing one
// still see the request itself; one that swapped it for another message
// would send bytes the signature does not cover (and be refused).
var signedBytes sync.Map // proto.Message → *[]byte

// wireCodec is the signing client's codec: gRPC's proto codec, but a
// request being signed goes out as the bytes signed.
type wireCodec struct{}

var protoCodec = encoding.GetCodecV2("proto")

func (wireCodec) Name() string { return "proto" }

func (wireCodec) Marshal(v any) (mem.BufferSlice, error) {
	if m, ok := v.(proto.Message); ok {
		if b, ok := signedBytes.Load(m); ok {
			return mem.BufferSlice{mem.SliceBuffer(*b.(*[]byte))}, nil
		}
	}
	return protoCodec.Marshal(v)
}

func (wireCodec) Unmarshal(data mem.BufferSlice, v any) error { return protoCodec.Unmarshal(data, v) }

// stringToSign is what the HMAC covers: scheme, method, principal, key
// number, timestamp, nonce and digest, one per line.
func stringToSign(method, principal string, keyID int, tsMs int64, nonce, digest string) []byte {
	b := make([]byte, 0, len(scheme)+len(method)+len(principal)+len(nonce)+len(digest)+32)
	b = append(b, scheme...)
	b = append(append(b, '\n'), method...)
	b = append(append(b, '\n'), principal...)
	b = strconv.AppendInt(append(b, '\n'), int64(keyID), 10)
	b = strconv.AppendInt(append(b, '\n'), tsMs, 10)
	b = append(append(b, '\n'), nonce...)
	b = append(append(b, '\n'), digest...)
	return b
}

// macs pools keyed HMAC states per key: hmac.New hashes the key into its
// pads, and Reset returns to that keyed state, so a pooled one skips it.
var macs sync.Map // string(key) → *sync.Pool of hash.Hash

func mac(key, msg []byte) []byte {
	pv, ok := macs.Load(string(key))
	if !ok {
		k := bytes.Clone(key)
		pv, _ = macs.LoadOrStore(string(k), &sync.Pool{New: func() any { return hmac.New(sha256.New, k) }})
	}
	pool := pv.(*sync.Pool)
	h := pool.Get().(hash.Hash)
	h.Reset()
	h.Write(msg)
	sum := h.Sum(make([]byte, 0, sha256.Size))
	pool.Put(h)
	return sum
}

// Sign returns the metadata pairs that sign a call of method with request
// msg (nil for a stream) at time now.
func (c Credential) Sign(method string, msg any, now time.Time) ([]string, error) {
	digest, err := Digest(msg)
	if err != nil {
		return nil, err
	}
	return c.sign(method, digest, now)
}

// sign returns the metadata pairs that sign a call of method whose request
// has digest (hex SHA-256).
func (c Credential) sign(method, digest string, now time.Time) ([]string, error) {
	var nb [nonceBytes]byte
	if _, err := rand.Read(nb[:]); err != nil {
		return nil, fmt.Errorf("auth: nonce: %w", err)
	}
	nonce := base64.RawURLEncoding.EncodeToString(nb[:])
	ts := now.UnixMilli()
	sig := mac(c.Key, stringToSign(method, c.Principal, c.KeyID, ts, nonce, digest))
	v := make([]byte, 0, len(c.Principal)+len(nonce)+64)
	v = append(v, c.Principal...)
	v = strconv.AppendInt(append(v, ' '), int64(c.KeyID), 10)
	v = strconv.AppendInt(append(v, ' '), ts, 10)
	v = append(append(v, ' '), nonce...)
	v = base64.RawURLEncoding.AppendEncode(append(v, ' '), sig)
	return []string{MDAuth, string(v)}, nil
}

// signed returns ctx with c's signature of the call appended to its
// outgoing metadata (replacing any earlier signature: a retry re-signs).
func (c Credential) signed(ctx context.Context, method, digest string) (context.Context, error) {
	kv, err := c.sign(method, digest, time.Now())
	if err != nil {
		return nil, err
	}
	if md, ok := metadata.FromOutgoingContext(ctx); ok && len(md[MDAuth]) > 0 {
		md = md.Copy()
		for i := 0; i < len(kv); i += 2 {
			md.Set(kv[i], kv[i+1])
		}
		return metadata.NewOutgoingContext(ctx, md), nil
	}
	return metadata.AppendToOutgoingContext(ctx, kv...), nil
}

// UnaryClientInterceptor signs every unary call with c.
func (c Credential) UnaryClientInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		m, ok := req.(proto.Message)
		if !ok {
			return fmt.Errorf("auth: sign %s: request %T is not a protobuf message", method, req)
		}
		b, err := encode(m)
		if err != nil {
			return err
		}
		d := sha256.Sum256(b)
		ctx, err = c.signed(ctx, method, hex.EncodeToString(d[:]))
		if err != nil {
			return err
		}
		// Two calls may share one request: both signed the same bytes.
		bp := &b
		signedBytes.Store(m, bp)
		defer signedBytes.CompareAndDelete(m, bp)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// StreamClientInterceptor signs every stream with c (the signature covers
// no message; the server checks each message's tenant as it arrives).
func (c Credential) StreamClientInterceptor() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		ctx, err := c.signed(ctx, method, emptyDigest)
		if err != nil {
			return nil, err
		}
		return streamer(ctx, desc, cc, method, opts...)
	}
}

// DialOptions returns the dial options that sign every call with c; none
// for a zero Credential (authentication off).
func (c Credential) DialOptions() []grpc.DialOption {
	if c.Principal == "" {
		return nil
	}
	return []grpc.DialOption{
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(wireCodec{})),
		grpc.WithChainUnaryInterceptor(c.UnaryClientInterceptor()),
		grpc.WithChainStreamInterceptor(c.StreamClientInterceptor()),
	}
}
