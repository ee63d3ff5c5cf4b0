package api

import (
	"crypto/sha256"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// TestSizeGuardDigests: with Digests, a unary request decoded by the
// guard's codec carries the SHA-256 of its wire bytes, which TakeDigest
// returns once and strips; a stream's message is not hashed; a digest
// field sent by the client is not taken for the guard's.
func TestSizeGuardDigests(t *testing.T) {
	g := NewSizeGuard(SizeGuardOptions{Limits: TableServerLimits().Merge(MasterLimits()), Digests: true})
	c := guardCodec{g}
	req := &GetRequest{Header: &RequestHeader{Tenant: "acme", Table: "t", PartitionId: 3}, Key: []byte("k")}
	wire, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var got GetRequest
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, &got); err != nil {
		t.Fatal(err)
	}
	d, ok := g.TakeDigest(&got)
	if !ok || d != sha256.Sum256(wire) {
		t.Fatalf("digest %x %v, want %x", d, ok, sha256.Sum256(wire))
	}
	if !proto.Equal(&got, req) {
		t.Fatalf("after TakeDigest the request is %v, want %v", &got, req)
	}
	if _, ok := g.TakeDigest(&got); ok {
		t.Fatal("a digest was taken twice")
	}

	// A forged digest field (the client does not know the guard's nonce)
	// stays an unknown field; the guard's own comes after it.
	forged := protowire.AppendTag(append([]byte(nil), wire...), digestField, protowire.BytesType)
	forged = protowire.AppendBytes(forged, make([]byte, 40))
	var f GetRequest
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(forged)}, &f); err != nil {
		t.Fatal(err)
	}
	if d, ok := g.TakeDigest(&f); !ok || d != sha256.Sum256(forged) {
		t.Fatalf("with a forged field: digest %x %v, want the bytes' own", d, ok)
	}
	if _, ok := g.TakeDigest(&f); ok {
		t.Fatal("the forged field was taken for the guard's")
	}

	// A stream's message is not hashed.
	var up BulkUploadRequest
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(nil)}, &up); err != nil {
		t.Fatal(err)
	}
	if _, ok := g.TakeDigest(&up); ok {
		t.Fatal("a stream's message carries a digest")
	}
	// Without Digests nothing is hashed.
	g2 := NewSizeGuard(SizeGuardOptions{Limits: TableServerLimits()})
	var plain GetRequest
	if err := (guardCodec{g2}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, &plain); err != nil {
		t.Fatal(err)
	}
	if len(plain.ProtoReflect().GetUnknown()) != 0 {
		t.Fatal("a guard without Digests added a field")
	}
}

// FuzzGuardDigest: any bytes decoded through a digesting guard either
// fail to decode or carry exactly their own digest, taken once.
func FuzzGuardDigest(f *testing.F) {
	g := NewSizeGuard(SizeGuardOptions{Limits: TableServerLimits(), Digests: true})
	seed, _ := proto.Marshal(&GetRequest{Header: &RequestHeader{Tenant: "a", Table: "t"}, Key: []byte("k")})
	f.Add(seed)
	f.Add(protowire.AppendBytes(protowire.AppendTag(nil, digestField, protowire.BytesType), make([]byte, 40)))
	f.Fuzz(func(t *testing.T, wire []byte) {
		var m GetRequest
		if err := (guardCodec{g}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, &m); err != nil {
			return
		}
		d, ok := g.TakeDigest(&m)
		if !ok || d != sha256.Sum256(wire) {
			t.Fatalf("digest %x %v, want the bytes' own", d, ok)
		}
		if _, ok := g.TakeDigest(&m); ok {
			t.Fatal("a digest taken twice")
		}
	})
}
