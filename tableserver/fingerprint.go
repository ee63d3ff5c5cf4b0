package tableserver

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"

	"github.com/tabuladb/tabula/api"
)

// A write's fingerprint is kept with its outcome under its request id
// (logreplica.go) so that a request id reused for another write is
// refused, not answered with the first write's outcome. It is xxhash64
// over the outcome kind and what the request asks — keys, values, TTLs as
// given, conditions — never over its routing (the header: a retry after a
// failover carries a new epoch) or the id itself:
//
//	| kind (1) | field | field | ...
//	field: bytes as | len (8) | bytes |, integers and flags as 8 bytes
//
// Replicas of other builds compare fingerprints they did not compute:
// never change what a kind hashes or in which order. A new request field
// that changes what a write does joins its kind's fingerprint only with a
// new outcome kind or kept-outcome version. Two different writes share a
// fingerprint with probability 2^-64.
type fingerprint struct {
	d   xxhash.Digest
	buf [8]byte
}

func newFingerprint(kind byte) *fingerprint {
	f := &fingerprint{}
	f.d.Reset()
	f.buf[0] = kind
	_, _ = f.d.Write(f.buf[:1])
	return f
}

func (f *fingerprint) u64(x uint64) *fingerprint {
	binary.LittleEndian.PutUint64(f.buf[:], x)
	_, _ = f.d.Write(f.buf[:])
	return f
}

func (f *fingerprint) flag(b bool) *fingerprint { return f.u64(uint64(b2b(b))) }

func (f *fingerprint) bytes(b []byte) *fingerprint {
	f.u64(uint64(len(b)))
	_, _ = f.d.Write(b)
	return f
}

func (f *fingerprint) sum() uint64 { return f.d.Sum64() }

// The fingerprints of the writes with a request id (0 without one: no
// outcome is kept).

func putFingerprint(req *api.PutRequest) uint64 {
	if req.GetRequestId() == "" {
		return 0 // nothing is kept
	}
	return newFingerprint(outcomePut).bytes(req.GetKey()).bytes(req.GetValue()).u64(req.GetTtlMs()).sum()
}

func deleteFingerprint(req *api.DeleteRequest) uint64 {
	if req.GetRequestId() == "" {
		return 0 // nothing is kept
	}
	return newFingerprint(outcomeDelete).bytes(req.GetKey()).sum()
}

func casFingerprint(req *api.CompareAndSwapRequest) uint64 {
	if req.GetRequestId() == "" {
		return 0 // nothing is kept
	}
	return newFingerprint(outcomeCAS).bytes(req.GetKey()).flag(req.GetExpectExists()).bytes(req.GetExpected()).
		flag(req.GetDelete()).bytes(req.GetValue()).u64(req.GetTtlMs()).sum()
}

func batchFingerprint(req *api.BatchWriteRequest) uint64 {
	if req.GetRequestId() == "" {
		return 0 // nothing is kept
	}
	f := newFingerprint(outcomeBatch).u64(uint64(len(req.GetMutations())))
	for _, m := range req.GetMutations() {
		f.u64(uint64(m.GetOp())).bytes(m.GetKey()).bytes(m.GetValue()).u64(m.GetTtlMs()).
			u64(uint64(m.GetCondition().GetKind())).bytes(m.GetCondition().GetPrefix())
	}
	return f.sum()
}
