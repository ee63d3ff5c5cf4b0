package tablemaster

import (
	"cmp"
	"context"
	"slices"

	"google.golang.org/grpc/metadata"
)

// Request ids make a retried catalog change take effect once. A client
// that lost the reply of CreateTable or DropTable (the leader died after
// committing it, a timeout) cannot tell whether it was applied, so it
// sends it again, to whichever master leads now. Without more, a retried
// create whose first attempt was applied, and whose table someone dropped
// in between, creates the table a second time (and a retried drop drops a
// table someone created in between): one call, two effects, which no
// single point in the call's time explains.
//
// So the client names each call with a random request id, the same on
// every attempt (gRPC metadata RequestIDHeader), the command carries it
// (Command.RequestID), and the State records the id of every applied
// command that carried one (State.Requests). A command whose id is
// recorded changes nothing and reports Result.Duplicate: the proposer
// answers as if it were the first attempt. The check is part of apply,
// so it holds on every member and on replay, also when two attempts were
// both logged (the first by a leader that then died).
//
// Records are bounded (maxRequests): past the bound, the oldest half is
// dropped. A client retries for seconds to minutes; thousands of catalog
// changes in that window are far beyond any real catalog.

// RequestIDHeader is the gRPC metadata key of a catalog change's request
// id (CreateTable, DropTable). The client package sends it.
const RequestIDHeader = "tabula-request-id"

// maxRequestIDLen bounds a request id (the client's are 32 hex digits).
const maxRequestIDLen = 64

// maxRequests bounds State.Requests.
const maxRequests = 4096

// Request is the record of an applied command that carried a request id.
// Never modified once recorded (successors share it).
type Request struct {
	// UnixMs is when the command was made.
	UnixMs int64 `json:"unix_ms"`
	Op     Op    `json:"op"`
	// TableID is the table OpCreateTable made.
	TableID uint64 `json:"table_id,omitempty"`
}

// requestIDOf returns the request id of an incoming call ("" if none).
func requestIDOf(ctx context.Context) string {
	if v := metadata.ValueFromIncomingContext(ctx, RequestIDHeader); len(v) > 0 {
		return v[0]
	}
	return ""
}

// checkRequestID validates a proposed command's request id: printable
// ASCII, at most maxRequestIDLen bytes.
func checkRequestID(id string) error {
	if len(id) > maxRequestIDLen {
		return errInvalid("request_id", "request_id_too_long", maxRequestIDLen, "a request id has at most %d bytes, not %d", maxRequestIDLen, len(id))
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] > '~' {
			return errInvalid("request_id", "request_id_invalid", 0, "a request id is printable ASCII without spaces")
		}
	}
	return nil
}

// requestDone reports whether cmd's request id was applied before, and
// what to answer then: for a create, the table it made if it still
// exists.
func (s *State) requestDone(cmd *Command) (Result, bool) {
	r, ok := s.Requests[cmd.RequestID]
	if !ok {
		return Result{}, false
	}
	res := Result{Duplicate: true}
	if ct, ok := cmd.payload().(CreateTable); ok && r.Op == OpCreateTable {
		if t := s.Tables[tableKey(ct.Tenant, ct.Table)]; t != nil && t.ID == r.TableID {
			res.Table = t
		}
	}
	return res, true
}

// recordRequest records that cmd (with a request id) was applied with res.
func (s *State) recordRequest(cmd *Command, res Result) {
	r := &Request{UnixMs: cmd.UnixMs, Op: cmd.Op()}
	if res.Table != nil {
		r.TableID = res.Table.ID
	}
	reqs := s.requestsW()
	reqs[cmd.RequestID] = r
	if len(reqs) <= maxRequests {
		return
	}
	ids := make([]string, 0, len(reqs))
	for id := range reqs {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b string) int {
		return cmp.Or(cmp.Compare(reqs[a].UnixMs, reqs[b].UnixMs), cmp.Compare(a, b))
	})
	for _, id := range ids[:len(ids)-maxRequests/2] {
		if id != cmd.RequestID {
			delete(reqs, id)
		}
	}
}

// requestsW returns the requests' map for writing.
func (s *State) requestsW() map[string]*Request {
	if s.Requests == nil {
		s.Requests = map[string]*Request{}
		if s.cow != nil {
			s.cow.requests = true
		}
	}
	if s.cow != nil && !s.cow.requests {
		s.Requests = cloneMap(s.Requests)
		s.cow.requests = true
	}
	return s.Requests
}
