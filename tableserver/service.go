package tableserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/bulk"
	"github.com/tabuladb/tabula/internal/keyspace"
)

// scanChunkBytes and scanChunkRecords bound one ScanResponse.
const (
	scanChunkBytes   = 1 << 20
	scanChunkRecords = 1000
)

// internalCall reports whether method is cluster traffic (extent
// replication and coding, replica copies), which is admitted apart from
// clients' calls: client load never refuses replication.
func internalCall(method string) bool {
	return strings.HasPrefix(method, "/tabula.stream.v1.ExtentNode/") || method == "/tabula.v1.TableServer/CopyReplica"
}

// admit refuses work while draining or over the in-flight limit. Cluster
// traffic has a limit of its own and is served while draining (other
// servers' extents still replicate here until their streams move).
func (s *Server) admit(method string) (release func(), err error) {
	if internalCall(method) {
		if n := s.internalInflight.Add(1); n > int64(s.opts.MaxInternalInFlight) {
			s.internalInflight.Add(-1)
			return nil, api.Status(&api.ErrorDetail{
				Code:         api.ErrorCode_ERROR_CODE_SERVER_BUSY,
				Reason:       "too_many_internal_requests",
				RetryAfterMs: uint64(s.opts.BusyRetryAfter.Milliseconds()),
			}, "server busy: more than "+itoa(s.opts.MaxInternalInFlight)+" cluster requests in flight")
		}
		return func() { s.internalInflight.Add(-1) }, nil
	}
	if s.draining.Load() {
		return nil, api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "draining", "server %s is draining", s.id())
	}
	if n := s.inflight.Add(1); n > int64(s.opts.MaxInFlight) {
		s.inflight.Add(-1)
		return nil, api.Status(&api.ErrorDetail{
			Code:         api.ErrorCode_ERROR_CODE_SERVER_BUSY,
			Reason:       "too_many_requests",
			RetryAfterMs: uint64(s.opts.BusyRetryAfter.Milliseconds()),
		}, "server busy: more than "+itoa(s.opts.MaxInFlight)+" requests in flight")
	}
	return func() { s.inflight.Add(-1) }, nil
}

func (s *Server) admitUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	release, err := s.admit(info.FullMethod)
	if err != nil {
		return nil, err
	}
	defer release()
	return h(ctx, req)
}

func (s *Server) admitStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if info.FullMethod == api.TableServer_Calls_FullMethodName {
		// Its calls are admitted one by one (callChain); the stream
		// itself holds no slot.
		if s.draining.Load() {
			return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "draining", "server %s is draining", s.id())
		}
		return h(srv, ss)
	}
	release, err := s.admit(info.FullMethod)
	if err != nil {
		return err
	}
	defer release()
	return h(srv, ss)
}

func itoa(n int) string { return strconv.Itoa(n) }

func u64(n uint64) string { return strconv.FormatUint(n, 10) }

// replicaFor checks the header against the hosted replicas: lease, owner,
// epoch. It does not check keys.
func (s *Server) replicaFor(hdr *api.RequestHeader) (*replica, *hosting, error) {
	if hdr == nil {
		return nil, nil, api.InvalidArgument("header", "header_missing", 0, "request header is missing")
	}
	if err := api.ValidateName("header.tenant", hdr.GetTenant()); err != nil {
		return nil, nil, err
	}
	if err := api.ValidateName("header.table", hdr.GetTable()); err != nil {
		return nil, nil, err
	}
	if !s.leaseValid() {
		return nil, nil, api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "lease_expired", "server %s holds no lease from the master", s.id())
	}
	h := s.hosting.Load()
	if min := s.lease.MinMapVersion(); h.version < min {
		return nil, nil, api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "map_behind", "server %s has map version %d; it serves from version %d on", s.id(), h.version, min)
	}
	r := h.replicas[hdr.GetPartitionId()]
	if r == nil || r.table.GetTenant() != hdr.GetTenant() || r.table.GetName() != hdr.GetTable() {
		if err := h.failed[hdr.GetPartitionId()]; err != nil {
			return nil, nil, api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "partition_open_failed", "partition %d cannot be opened on %s: %v", hdr.GetPartitionId(), s.id(), err)
		}
		// A table this server does not know may be new (its map is behind)
		// or dropped (the client's is): either way the master's map is the
		// authority, so NOT_OWNER sends the client there, and the master
		// answers NOT_FOUND for a table that does not exist.
		reason := "partition_not_here"
		if _, ok := h.tables[tableKey(hdr.GetTenant(), hdr.GetTable())]; !ok {
			reason = "table_not_here"
		}
		return nil, nil, api.Status(&api.ErrorDetail{
			Code:       api.ErrorCode_ERROR_CODE_NOT_OWNER,
			Reason:     reason,
			Partition:  h.part(hdr.GetPartitionId()),
			MapVersion: h.version,
		}, "partition "+u64(hdr.GetPartitionId())+" of "+hdr.GetTenant()+"/"+hdr.GetTable()+" is not served by "+s.id())
	}
	switch ep := r.part.GetEpoch(); {
	case hdr.GetEpoch() < ep:
		return nil, nil, api.Status(&api.ErrorDetail{
			Code:         api.ErrorCode_ERROR_CODE_STALE_EPOCH,
			Reason:       "stale_epoch",
			Partition:    r.part,
			CurrentEpoch: ep,
			MapVersion:   h.version,
		}, "request epoch "+u64(hdr.GetEpoch())+" is older than partition epoch "+u64(ep))
	case hdr.GetEpoch() > ep:
		return nil, nil, api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "map_behind", "server %s has not seen epoch %d of partition %d yet", s.id(), hdr.GetEpoch(), hdr.GetPartitionId())
	}
	return r, h, nil
}

// rangeScanner is an engine that scans a key range in order
// (engines/ordered).
type rangeScanner interface {
	Range(lo, hi []byte, reverse bool, fn func(engines.Record) error) error
}

// errNoRange: the engine under a reopenable scans no key range.
var errNoRange = errors.New("tableserver: the engine scans no key range")

// errScanLimit stops a scan that sent its limit of records.
var errScanLimit = errors.New("tableserver: scan limit reached")

// checkKeyAt is checkKey of keys[i], naming the field only on error.
func checkKeyAt(r *replica, h *hosting, i int, key []byte) error {
	if err := checkKey(r, h, "", key); err != nil {
		return checkKey(r, h, "keys["+itoa(i)+"]", key)
	}
	return nil
}

// checkKey validates key and that it belongs to r's partition: its hash
// in the partition's hash range, or, for an ordered table, the key in the
// partition's key range.
func checkKey(r *replica, h *hosting, field string, key []byte) error {
	if err := api.ValidateKey(field, key); err != nil {
		return err
	}
	m := h.tables[tableKey(r.table.GetTenant(), r.table.GetName())]
	if r.table.GetKind() == api.TableKind_TABLE_KIND_ORDERED {
		if keyInRange(key, r.part.GetKeyStart(), r.part.GetKeyEnd()) {
			r.load.sample(0, key)
			return nil
		}
		d := &api.ErrorDetail{Code: api.ErrorCode_ERROR_CODE_NOT_OWNER, Reason: "key_not_in_partition", MapVersion: h.version}
		for _, p := range m.GetPartitions() {
			if keyInRange(key, p.GetKeyStart(), p.GetKeyEnd()) {
				d.Partition = p
			}
		}
		return api.Status(d, field+" does not belong to partition "+u64(r.part.GetId()))
	}
	hash := keyspace.Hash(key)
	if hash >= r.part.GetStart() && hash <= r.part.GetEnd() {
		r.load.sample(hash, nil)
		return nil
	}
	d := &api.ErrorDetail{Code: api.ErrorCode_ERROR_CODE_NOT_OWNER, Reason: "key_not_in_partition", MapVersion: h.version}
	for _, p := range m.GetPartitions() {
		// By range: after a split the partitions are no longer the
		// table's even cut (keyspace.Index).
		if hash >= p.GetStart() && hash <= p.GetEnd() {
			d.Partition = p
			break
		}
	}
	return api.Status(d, field+" does not belong to partition "+u64(r.part.GetId()))
}

// keyInRange reports whether start <= key < end (empty end: unbounded).
func keyInRange(key, start, end []byte) bool {
	return bytes.Compare(start, key) <= 0 && (len(end) == 0 || bytes.Compare(key, end) < 0)
}

func (r *replica) writable() (engines.Writer, error) {
	if r.writer == nil {
		return nil, api.Errorf(api.ErrorCode_ERROR_CODE_WRONG_KIND, "read_only_kind", "table %s/%s of kind %s does not accept writes", r.table.GetTenant(), r.table.GetName(), api.KindName(r.table.GetKind()))
	}
	return r.writer, nil
}

// expiry turns a request TTL (0: the table default) into an absolute expiry.
func (r *replica) expiry(ttlMS uint64) int64 {
	if ttlMS == 0 {
		ttlMS = r.table.GetOptions().GetDefaultTtlMs()
	}
	if ttlMS == 0 {
		return 0
	}
	return time.Now().UnixMilli() + int64(ttlMS)
}

func (r *replica) maxValue() uint64 {
	if v := r.table.GetOptions().GetMaxValueBytes(); v > 0 {
		return v
	}
	return api.DefaultMaxValueBytes
}

// dataLost is the answer for a read that finds nothing on a partition
// that lost every copy of its data: the key may have existed, so "not
// found" would be a lie.
func dataLost(r *replica) error {
	if !r.part.GetDataLost() {
		return nil
	}
	return api.Errorf(api.ErrorCode_ERROR_CODE_DATA_LOSS, "partition_data_lost",
		"partition %d of %s/%s lost every copy of its data (an operator forgot the server that held it) and started again empty: absent keys may have existed; see tabula table describe",
		r.part.GetId(), r.table.GetTenant(), r.table.GetName())
}

// engineErr maps an engine error to the API's error model.
func engineErr(r *replica, err error) error {
	var gone *bulk.VersionGoneError
	switch {
	case errors.As(err, &gone): // a bulk version unloaded under the read
		return errVersionGone(r, gone.Version, gone.Current)
	case errors.Is(err, errReopening):
		return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "replica_reopening", "partition %d: %v", r.part.GetId(), err)
	case errors.Is(err, engines.ErrClosed):
		return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "partition_closed", "partition %d was closed (moved or server stopping)", r.part.GetId())
	case errors.Is(err, engines.ErrReadOnly):
		return api.Errorf(api.ErrorCode_ERROR_CODE_WRONG_KIND, "read_only_kind", "%v", err)
	case errors.Is(err, engines.ErrCorrupt):
		if r.log != nil && len(r.part.GetReplicas()) > 1 {
			// Data that fails its checksums is never served: the replica
			// reports itself failed (logged at error level) and is rebuilt
			// from a healthy one; the client's retry finds that one.
			r.log.fail(err)
			return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "corrupt", "partition %d: %v", r.part.GetId(), err)
		}
		// The only copy: nothing to rebuild from and nothing a retry
		// would change. The caller learns it at once.
		if r.logger != nil {
			r.logger.Error("a record failed its checksum; its partition has no other copy", "table", r.table.GetName(), "tenant", r.table.GetTenant(), "err", err)
		}
		return api.Errorf(api.ErrorCode_ERROR_CODE_DATA_LOSS, "corrupt", "partition %d of %s/%s: %v (its only copy)", r.part.GetId(), r.table.GetTenant(), r.table.GetName(), err)
	}
	return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "engine_error", "partition %d: %v", r.part.GetId(), err)
}

// Get implements api.TableServerServer.
func (s *service) Get(ctx context.Context, req *api.GetRequest) (*api.GetResponse, error) {
	r, h, err := s.replicaFor(req.GetHeader())
	if err != nil {
		return nil, err
	}
	if err := checkKey(r, h, "key", req.GetKey()); err != nil {
		return nil, err
	}
	if err := s.quota.read(r.table.GetTenant(), r.part.GetId(), 1, time.Now()); err != nil {
		return nil, err
	}
	if r.bulk != nil {
		return s.bulkGet(r, req)
	}
	lsn, err := readable(r, h, req.GetHeader(), s.id())
	if err != nil {
		return nil, err
	}
	start := time.Now()
	v, exp, err := r.engine.Get(req.GetKey())
	r.load.since(start)
	if errors.Is(err, engines.ErrNotFound) {
		if err := dataLost(r); err != nil {
			return nil, err
		}
		return &api.GetResponse{Lsn: lsn}, nil
	}
	if err != nil {
		return nil, engineErr(r, err)
	}
	return &api.GetResponse{Found: true, Value: v, ExpiresUnixMs: exp, Lsn: lsn}, nil
}

// MultiGet implements api.TableServerServer: every get is answered as Get
// answers it alone, its error included. Values are summed as they are
// read; once they pass MaxBatchBytes the remaining gets are answered
// SERVER_BUSY (reason multiget_reply_budget), which the SDK retries alone,
// so the reply always fits one message.
func (s *service) MultiGet(ctx context.Context, req *api.MultiGetRequest) (*api.MultiGetResponse, error) {
	gets := req.GetGets()
	if len(gets) > api.MaxBatchKeys {
		return nil, api.InvalidArgument("gets", "batch_too_large", api.MaxBatchKeys, "%d gets in one MultiGet; the limit is %d", len(gets), api.MaxBatchKeys)
	}
	out := &api.MultiGetResponse{Results: make([]*api.MultiGetResult, len(gets))}
	var total int
	for i, g := range gets {
		var resp *api.GetResponse
		var err error
		if total > api.MaxBatchBytes {
			err = api.Errorf(api.ErrorCode_ERROR_CODE_SERVER_BUSY, "multiget_reply_budget", "get %d of a MultiGet: the reply already holds %d bytes of values; ask again alone", i, total)
		} else {
			resp, err = s.Get(ctx, g)
		}
		if err != nil {
			st, _ := status.FromError(err)
			b, merr := proto.Marshal(st.Proto())
			if merr != nil {
				return nil, fmt.Errorf("tableserver: encode the status of get %d: %w", i, merr)
			}
			out.Results[i] = &api.MultiGetResult{Status: b}
			continue
		}
		total += len(g.GetKey()) + len(resp.GetValue())
		out.Results[i] = &api.MultiGetResult{Response: resp}
	}
	return out, nil
}

// BatchGet implements api.TableServerServer.
func (s *service) BatchGet(ctx context.Context, req *api.BatchGetRequest) (*api.BatchGetResponse, error) {
	r, h, err := s.replicaFor(req.GetHeader())
	if err != nil {
		return nil, err
	}
	keys := req.GetKeys()
	if len(keys) > api.MaxBatchKeys {
		return nil, api.InvalidArgument("keys", "batch_too_large", api.MaxBatchKeys, "%d keys in one BatchGet; the limit is %d", len(keys), api.MaxBatchKeys)
	}
	for i, k := range keys {
		if err := checkKeyAt(r, h, i, k); err != nil {
			return nil, err
		}
	}
	if err := s.quota.read(r.table.GetTenant(), r.part.GetId(), len(keys), time.Now()); err != nil {
		return nil, err
	}
	if r.bulk != nil {
		return s.bulkBatchGet(r, req)
	}
	lsn, err := readable(r, h, req.GetHeader(), s.id())
	if err != nil {
		return nil, err
	}
	// The reply must fit one gRPC message: values are summed as they are
	// read, in chunks, so a batch of many large (or repeated) keys is
	// refused after reading at most one chunk past the budget, never after
	// materialising the whole reply.
	resp := &api.BatchGetResponse{Results: make([]*api.GetResponse, len(keys)), Lsn: lsn}
	var total uint64
	for lo := 0; lo < len(keys); lo += batchGetChunk {
		hi := min(lo+batchGetChunk, len(keys))
		if err := r.getChunk(keys[lo:hi], resp.Results[lo:hi]); err != nil {
			return nil, err
		}
		for _, g := range resp.Results[lo:hi] {
			total += uint64(len(g.GetValue()))
		}
		if total > api.MaxBatchBytes {
			return nil, api.InvalidArgument("keys", "reply_too_large", api.MaxBatchBytes,
				"the values of these %d keys exceed %d bytes, the most one reply carries; ask for fewer keys per call", len(keys), api.MaxBatchBytes)
		}
	}
	for _, g := range resp.Results {
		if !g.GetFound() {
			if err := dataLost(r); err != nil {
				return nil, err
			}
		}
	}
	return resp, nil
}

// batchGetChunk is how many keys BatchGet reads before checking the reply
// budget: with 4 MiB values, at most 64 MiB past it.
const batchGetChunk = 16

// getChunk reads keys into out, through the engine's BatchGetter when it has one.
func (r *replica) getChunk(keys [][]byte, out []*api.GetResponse) error {
	defer r.load.since(time.Now())
	if r.batch != nil {
		vals := make([][]byte, len(keys))
		exps := make([]int64, len(keys))
		found := make([]bool, len(keys))
		if err := r.batch.GetBatch(keys, vals, exps, found); err != nil {
			return engineErr(r, err)
		}
		for i := range keys {
			out[i] = &api.GetResponse{Found: found[i], Value: vals[i], ExpiresUnixMs: exps[i]}
		}
		return nil
	}
	for i, k := range keys {
		v, exp, err := r.engine.Get(k)
		switch {
		case errors.Is(err, engines.ErrNotFound):
			out[i] = &api.GetResponse{}
		case err != nil:
			return engineErr(r, err)
		default:
			out[i] = &api.GetResponse{Found: true, Value: v, ExpiresUnixMs: exp}
		}
	}
	return nil
}

// Put implements api.TableServerServer.
func (s *service) Put(ctx context.Context, req *api.PutRequest) (*api.PutResponse, error) {
	r, h, err := s.replicaFor(req.GetHeader())
	if err != nil {
		return nil, err
	}
	if err := checkKey(r, h, "key", req.GetKey()); err != nil {
		return nil, err
	}
	if err := api.ValidateValue("value", req.GetValue(), r.maxValue()); err != nil {
		return nil, err
	}
	if err := api.ValidateTTL("ttl_ms", req.GetTtlMs()); err != nil {
		return nil, err
	}
	w, err := r.writable()
	if err != nil {
		return nil, err
	}
	settled, err := s.chargeWrite(r, 1, uint64(len(req.GetKey())+len(req.GetValue())))
	if err != nil {
		return nil, err
	}
	defer settled()
	if r.log != nil {
		return s.loggedPut(ctx, r, req)
	}
	r.order.RLock()
	start := time.Now()
	err = w.Apply([]engines.Mutation{{Key: req.GetKey(), Value: req.GetValue(), ExpiresAt: r.expiry(req.GetTtlMs())}})
	r.load.since(start)
	r.order.RUnlock()
	if err != nil {
		return nil, engineErr(r, err)
	}
	return &api.PutResponse{}, nil
}

// Delete implements api.TableServerServer.
func (s *service) Delete(ctx context.Context, req *api.DeleteRequest) (*api.DeleteResponse, error) {
	r, h, err := s.replicaFor(req.GetHeader())
	if err != nil {
		return nil, err
	}
	if err := checkKey(r, h, "key", req.GetKey()); err != nil {
		return nil, err
	}
	w, err := r.writable()
	if err != nil {
		return nil, err
	}
	settled, err := s.chargeWrite(r, 1, 0)
	if err != nil {
		return nil, err
	}
	defer settled()
	if r.log != nil {
		return s.loggedDelete(ctx, r, req)
	}
	r.order.RLock()
	existed, err := w.Delete(req.GetKey())
	r.order.RUnlock()
	if err != nil {
		return nil, engineErr(r, err)
	}
	return &api.DeleteResponse{Existed: existed}, nil
}

// CompareAndSwap implements api.TableServerServer.
func (s *service) CompareAndSwap(ctx context.Context, req *api.CompareAndSwapRequest) (*api.CompareAndSwapResponse, error) {
	r, h, err := s.replicaFor(req.GetHeader())
	if err != nil {
		return nil, err
	}
	if err := checkKey(r, h, "key", req.GetKey()); err != nil {
		return nil, err
	}
	if !req.GetDelete() {
		if err := api.ValidateValue("value", req.GetValue(), r.maxValue()); err != nil {
			return nil, err
		}
		if err := api.ValidateTTL("ttl_ms", req.GetTtlMs()); err != nil {
			return nil, err
		}
	}
	w, err := r.writable()
	if err != nil {
		return nil, err
	}
	var casBytes uint64
	if !req.GetDelete() {
		casBytes = uint64(len(req.GetKey()) + len(req.GetValue()))
	}
	settled, err := s.chargeWrite(r, 1, casBytes)
	if err != nil {
		return nil, err
	}
	defer settled()
	if r.log != nil {
		return s.loggedCAS(ctx, r, req)
	}
	r.order.RLock()
	defer r.order.RUnlock()
	res, err := w.CompareAndSwap(engines.CAS{
		Key:           req.GetKey(),
		ExpectExists:  req.GetExpectExists(),
		ExpectedValue: req.GetExpected(),
		New:           engines.Mutation{Delete: req.GetDelete(), Value: req.GetValue(), ExpiresAt: r.expiry(req.GetTtlMs())},
	})
	if err != nil {
		return nil, engineErr(r, err)
	}
	return &api.CompareAndSwapResponse{Swapped: res.Swapped, Existed: res.Existed, Current: res.Current}, nil
}

// BatchWrite implements api.TableServerServer.
func (s *service) BatchWrite(ctx context.Context, req *api.BatchWriteRequest) (*api.BatchWriteResponse, error) {
	r, h, err := s.replicaFor(req.GetHeader())
	if err != nil {
		return nil, err
	}
	muts := req.GetMutations()
	if len(muts) == 0 {
		return nil, api.InvalidArgument("mutations", "batch_empty", 0, "BatchWrite has no mutations")
	}
	if len(muts) > api.MaxBatchKeys {
		return nil, api.InvalidArgument("mutations", "batch_too_large", api.MaxBatchKeys, "%d mutations in one BatchWrite; the limit is %d", len(muts), api.MaxBatchKeys)
	}
	w, err := r.writable()
	if err != nil {
		return nil, err
	}
	batch := make([]engines.Mutation, len(muts))
	var total uint64
	for i, m := range muts {
		field := "mutations[" + itoa(i) + "]"
		if err := checkKey(r, h, field+".key", m.GetKey()); err != nil {
			return nil, err
		}
		switch m.GetOp() {
		case api.Mutation_OP_PUT:
			if err := api.ValidateValue(field+".value", m.GetValue(), r.maxValue()); err != nil {
				return nil, err
			}
			if err := api.ValidateTTL(field+".ttl_ms", m.GetTtlMs()); err != nil {
				return nil, err
			}
			batch[i] = engines.Mutation{Key: m.GetKey(), Value: m.GetValue(), ExpiresAt: r.expiry(m.GetTtlMs())}
		case api.Mutation_OP_DELETE:
			batch[i] = engines.Mutation{Key: m.GetKey(), Delete: true}
		default:
			return nil, api.InvalidArgument(field+".op", "op_invalid", 0, "%s has op %v; want OP_PUT or OP_DELETE", field, m.GetOp())
		}
		total += uint64(len(m.GetKey()) + len(m.GetValue()))
	}
	if total > api.MaxBatchBytes {
		return nil, api.InvalidArgument("mutations", "batch_too_large", api.MaxBatchBytes, "BatchWrite carries %d bytes; the limit is %d", total, api.MaxBatchBytes)
	}
	conds, err := parseConditions(muts, r.maxValue())
	if err != nil {
		return nil, err
	}
	settled, err := s.chargeWrite(r, len(muts), total)
	if err != nil {
		return nil, err
	}
	defer settled()
	if r.log != nil {
		return s.loggedBatch(ctx, r, req, batch, conds)
	}
	if len(conds) == 0 {
		r.order.RLock()
		start := time.Now()
		err = w.Apply(batch)
		r.load.since(start)
		r.order.RUnlock()
	} else {
		// Held exclusively, as a coprocessor's commit does: no other
		// write lands between the check and the batch.
		r.order.Lock()
		err = checkConditions(conds, muts, r.getPlain)
		if err == nil {
			err = w.Apply(batch)
		}
		r.order.Unlock()
		if api.CodeOf(err) == api.ErrorCode_ERROR_CODE_FAILED_PRECONDITION {
			return nil, err
		}
	}
	if err != nil {
		return nil, engineErr(r, err)
	}
	return &api.BatchWriteResponse{}, nil
}

// getPlain reads key from r's engine (a partition without a log: no
// writes in flight to see) in the form checkConditions takes.
func (r *replica) getPlain(key []byte) ([]byte, bool, error) {
	v, _, err := r.engine.Get(key)
	if errors.Is(err, engines.ErrNotFound) {
		return nil, false, nil
	}
	return v, err == nil, err
}

// Scan implements api.TableServerServer.
func (s *service) Scan(req *api.ScanRequest, stream grpc.ServerStreamingServer[api.ScanResponse]) error {
	r, h, err := s.replicaFor(req.GetHeader())
	if err != nil {
		return err
	}
	if r.bulk == nil {
		if _, err := readable(r, h, req.GetHeader(), s.id()); err != nil {
			return err
		}
		if err := dataLost(r); err != nil {
			return err // a scan cannot show what is missing
		}
	}
	// A scan is admitted on one read; every row it returns is charged as
	// it is sent.
	if err := s.quota.read(r.table.GetTenant(), r.part.GetId(), 1, time.Now()); err != nil {
		return err
	}
	ctx := stream.Context()
	chunk := &api.ScanResponse{}
	size := 0
	flush := func() error {
		if len(chunk.Records) == 0 {
			return nil
		}
		s.quota.chargeRead(r.table.GetTenant(), len(chunk.Records), time.Now())
		if err := stream.Send(chunk); err != nil {
			return err
		}
		chunk = &api.ScanResponse{}
		size = 0
		return nil
	}
	scan := r.engine.Scan
	ordered := r.table.GetKind() == api.TableKind_TABLE_KIND_ORDERED
	limit := int(req.GetLimit())
	switch {
	case ordered:
		rg, ok := r.engine.(rangeScanner)
		if !ok {
			return api.Errorf(api.ErrorCode_ERROR_CODE_UNIMPLEMENTED, "engine_cannot_range", "partition %d: its engine %T scans no key range", r.part.GetId(), r.engine)
		}
		lo, hi := req.GetStart(), req.GetEnd()
		if len(hi) > 0 && bytes.Compare(lo, hi) >= 0 {
			return api.InvalidArgument("end", "range_empty", 0, "scan range [%q, %q) is empty", lo, hi)
		}
		// Clamped to the partition's range: the caller may ask for more.
		if ks := r.part.GetKeyStart(); bytes.Compare(lo, ks) < 0 {
			lo = ks
		}
		if ke := r.part.GetKeyEnd(); len(ke) > 0 && (len(hi) == 0 || bytes.Compare(ke, hi) < 0) {
			hi = ke
		}
		if len(hi) > 0 && bytes.Compare(lo, hi) >= 0 {
			return nil // the range misses this partition
		}
		scan = func(fn func(engines.Record) error) error { return rg.Range(lo, hi, req.GetReverse(), fn) }
	case len(req.GetStart()) > 0 || len(req.GetEnd()) > 0 || req.GetReverse() || limit > 0:
		return api.InvalidArgument("start", "scan_range_not_ordered", 0, "a %s table scans whole partitions in no order: start, end, reverse and limit apply to ordered tables", api.KindName(r.table.GetKind()))
	}
	sent := 0
	if r.bulk != nil {
		// A bulk partition scans the version the request names (0: the
		// serving one), held for the whole scan, as a BatchGet would.
		lv, err := r.bulkVersionFor(req.GetHeader().GetBulkVersion())
		if err != nil {
			return err
		}
		scan = func(fn func(engines.Record) error) error { return lv.Scan(ctx, fn) }
	}
	err = scan(func(rec engines.Record) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if api.IsReservedKey(rec.Key) {
			return nil // the platform's own records (ABI.md, Reserved keys)
		}
		// The record's slices are only valid during the call: copy.
		kv := &api.KeyValue{
			Key:           append([]byte(nil), rec.Key...),
			Value:         append([]byte(nil), rec.Value...),
			ExpiresUnixMs: rec.ExpiresAt,
		}
		chunk.Records = append(chunk.Records, kv)
		size += len(kv.Key) + len(kv.Value)
		sent++
		if limit > 0 && sent >= limit {
			return errScanLimit
		}
		if size >= scanChunkBytes || len(chunk.Records) >= scanChunkRecords {
			return flush()
		}
		return nil
	})
	if errors.Is(err, errScanLimit) {
		err = nil
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return engineErr(r, err)
	}
	return flush()
}
