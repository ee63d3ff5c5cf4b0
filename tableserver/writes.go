package tableserver

import (
	"bytes"
	"context"
	"time"

	"google.golang.org/grpc/status"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/engines"
)

// The write path of partitions replicated through a commit log: each
// handler decides its write's outcome against the partition's state
// (including writes in flight), and the log replica numbers, appends and
// applies it. The outcome is kept under the request id, encoded as
//
//	| kind (1) | kind-specific |
//	put, batch: nothing
//	delete:     | existed (1) |
//	cas:        | swapped (1) | existed (1) | current |
//
// never change a kind's number or layout: replicas read what others wrote.
const (
	outcomePut    = 1
	outcomeDelete = 2
	outcomeCAS    = 3
	outcomeBatch  = 4
)

func b2b(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// logged runs a write through r's log and checks the outcome's kind (a
// request id reused for another kind of write is refused; for another
// write of the same kind, its fingerprint fp is: fingerprint.go).
func logged(ctx context.Context, r *replica, hdr *api.RequestHeader, reqID string, kind byte, fp uint64, fn decide) (uint64, []byte, error) {
	lsn, res, err := r.log.write(ctx, hdr.GetEpoch(), reqID, fp, fn)
	if err != nil {
		if _, ok := status.FromError(err); !ok {
			// An engine's own error (a read of the kept outcome or of the
			// key meeting a reopen, say): the API's code for it, not
			// Unknown, so the client knows to retry.
			err = engineErr(r, err)
		}
		return 0, nil, err
	}
	if len(res) == 0 || res[0] != kind {
		return 0, nil, api.InvalidArgument("request_id", "request_id_reused", 0, "request id %q was used for another kind of write", reqID)
	}
	return lsn, res[1:], nil
}

func (s *Server) loggedPut(ctx context.Context, r *replica, req *api.PutRequest) (*api.PutResponse, error) {
	m := engines.Mutation{Key: req.GetKey(), Value: req.GetValue(), ExpiresAt: r.expiry(req.GetTtlMs())}
	lsn, _, err := logged(ctx, r, req.GetHeader(), req.GetRequestId(), outcomePut, putFingerprint(req), func(func([]byte) ([]byte, bool, error)) ([]engines.Mutation, []byte, error) {
		return []engines.Mutation{m}, []byte{outcomePut}, nil
	})
	if err != nil {
		return nil, err
	}
	return &api.PutResponse{Lsn: lsn}, nil
}

func (s *Server) loggedDelete(ctx context.Context, r *replica, req *api.DeleteRequest) (*api.DeleteResponse, error) {
	key := req.GetKey()
	lsn, res, err := logged(ctx, r, req.GetHeader(), req.GetRequestId(), outcomeDelete, deleteFingerprint(req), func(get func([]byte) ([]byte, bool, error)) ([]engines.Mutation, []byte, error) {
		_, found, err := get(key)
		if err != nil {
			return nil, nil, engineErr(r, err)
		}
		return []engines.Mutation{{Key: key, Delete: true}}, []byte{outcomeDelete, b2b(found)}, nil
	})
	if err != nil {
		return nil, err
	}
	if len(res) != 1 {
		return nil, api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "corrupt", "partition %d: kept delete outcome of %d bytes", r.part.GetId(), len(res))
	}
	return &api.DeleteResponse{Existed: res[0] == 1, Lsn: lsn}, nil
}

func (s *Server) loggedCAS(ctx context.Context, r *replica, req *api.CompareAndSwapRequest) (*api.CompareAndSwapResponse, error) {
	key := req.GetKey()
	next := engines.Mutation{Key: key, Delete: req.GetDelete(), Value: req.GetValue(), ExpiresAt: r.expiry(req.GetTtlMs())}
	if next.Delete {
		next.Value, next.ExpiresAt = nil, 0
	}
	lsn, res, err := logged(ctx, r, req.GetHeader(), req.GetRequestId(), outcomeCAS, casFingerprint(req), func(get func([]byte) ([]byte, bool, error)) ([]engines.Mutation, []byte, error) {
		cur, found, err := get(key)
		if err != nil {
			return nil, nil, engineErr(r, err)
		}
		swapped := found == req.GetExpectExists() && (!found || bytes.Equal(cur, req.GetExpected()))
		out := append([]byte{outcomeCAS, b2b(swapped), b2b(found)}, cur...)
		if !swapped {
			return nil, out, nil
		}
		return []engines.Mutation{next}, out, nil
	})
	if err != nil {
		return nil, err
	}
	if len(res) < 2 {
		return nil, api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "corrupt", "partition %d: kept CAS outcome of %d bytes", r.part.GetId(), len(res))
	}
	resp := &api.CompareAndSwapResponse{Swapped: res[0] == 1, Existed: res[1] == 1, Lsn: lsn}
	if resp.Existed {
		resp.Current = res[2:]
	}
	return resp, nil
}

// loggedBatch decides a batch against conds (none: it always applies). A
// failed condition decides nothing, so nothing is logged or kept under the
// request id: a retry checks the conditions again.
func (s *Server) loggedBatch(ctx context.Context, r *replica, req *api.BatchWriteRequest, batch []engines.Mutation, conds []batchCond) (*api.BatchWriteResponse, error) {
	lsn, _, err := logged(ctx, r, req.GetHeader(), req.GetRequestId(), outcomeBatch, batchFingerprint(req), func(get func([]byte) ([]byte, bool, error)) ([]engines.Mutation, []byte, error) {
		if err := checkConditions(conds, req.GetMutations(), get); err != nil {
			if api.CodeOf(err) != api.ErrorCode_ERROR_CODE_FAILED_PRECONDITION {
				err = engineErr(r, err)
			}
			return nil, nil, err
		}
		return batch, []byte{outcomeBatch}, nil
	})
	if err != nil {
		return nil, err
	}
	return &api.BatchWriteResponse{Lsn: lsn}, nil
}

// readable checks that r may answer a read: the primary (serving) by
// default, with read_any any replica in step with its primary within
// hdr's staleness bound that has applied hdr's min_lsn. It
// returns the LSN the read reflects (0 for tables without a log).
func readable(r *replica, h *hosting, hdr *api.RequestHeader, serverID string) (uint64, error) {
	if r.log == nil {
		return 0, nil
	}
	applied, serving, copying, failed := r.log.readState()
	if failed != nil {
		return 0, api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "replica_failed", "partition %d on %s failed (%v): it serves nothing until it is replaced", r.part.GetId(), serverID, failed)
	}
	if err := r.log.reopeningErr(serverID); err != nil {
		return 0, err
	}
	if !hdr.GetReadAny() && (roleOf(r.part, serverID) != api.ReplicaRole_REPLICA_ROLE_PRIMARY || !serving) {
		if roleOf(r.part, serverID) == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
			if from := r.log.handoffFrom(); from != "" {
				return 0, api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "handoff_pending", "partition %d: the primary role is being handed over from %s, which may still serve until it lets go; retry shortly", r.part.GetId(), from)
			}
			return 0, api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "log_reconfiguring", "partition %d: its new primary is still applying the log; retry shortly", r.part.GetId())
		}
		return 0, api.Status(&api.ErrorDetail{
			Code: api.ErrorCode_ERROR_CODE_NOT_OWNER, Reason: "not_primary", Partition: r.part, MapVersion: h.version,
		}, "partition "+u64(r.part.GetId())+" is served by its primary; this server holds a secondary (read_any reads it)")
	}
	if copying {
		return 0, api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "replica_copying", "partition %d on %s is a new replica still copying its data; read another replica", r.part.GetId(), serverID)
	}
	if !serving {
		// A read_any read on a secondary (or a primary still applying
		// the log it inherited): only within the staleness bound
		// (instep.go), so a replica dropped from the log's ack set, or
		// cut off from its primary, answers nothing older.
		if err := r.log.behindErr(hdr, serverID, time.Now()); err != nil {
			return 0, err
		}
	}
	if min := hdr.GetMinLsn(); applied < min {
		return 0, api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "behind_min_lsn", "partition %d on %s has applied LSN %d, the read asks for %d", r.part.GetId(), serverID, applied, min)
	}
	return applied, nil
}
