package api

import (
	"testing"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// BenchmarkSizeGuard: what the guard adds to decoding a request: the
// limit lookup, the mark check and (with a budget) proto.Size and the
// reservation. Reported in RATIONALE.md, "Request size limits".
func BenchmarkSizeGuard(b *testing.B) {
	hdr := &RequestHeader{Tenant: "tenant", Table: "table", PartitionId: 7, Epoch: 3}
	reqs := map[string]proto.Message{
		"get": &GetRequest{Header: hdr, Key: []byte("user:12345678")},
		"batch1000": func() proto.Message {
			r := &BatchWriteRequest{Header: hdr}
			for i := 0; i < 1000; i++ {
				r.Mutations = append(r.Mutations, &Mutation{Op: Mutation_OP_PUT, Key: []byte("user:12345678"), Value: make([]byte, 100)})
			}
			return r
		}(),
	}
	for name, req := range reqs {
		wire, _ := proto.Marshal(req)
		data := mem.BufferSlice{mem.SliceBuffer(wire)}
		plain := encoding.GetCodecV2("proto")
		g := NewSizeGuard(SizeGuardOptions{Limits: TableServerLimits(), Budget: NewByteBudget(1 << 30)})
		gc := guardCodec{g}
		b.Run(name+"/plain", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				m := req.ProtoReflect().New().Interface()
				if err := plain.Unmarshal(data, m); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/guarded", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				m := req.ProtoReflect().New().Interface()
				if err := gc.Unmarshal(data, m); err != nil {
					b.Fatal(err)
				}
				release, err := g.admit("/m", m)
				if err != nil {
					b.Fatal(err)
				}
				release()
			}
		})
	}
}
