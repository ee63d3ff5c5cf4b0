package tableserver

import (
	"context"
	"errors"
	"io"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/engines"
)

// bulkReplica checks a bulk request's header and returns its partition.
func (s *Server) bulkReplica(hdr *api.RequestHeader) (*replica, *hosting, error) {
	r, h, err := s.replicaFor(hdr)
	if err != nil {
		return nil, nil, err
	}
	if r.bulk == nil {
		return nil, nil, api.Errorf(api.ErrorCode_ERROR_CODE_WRONG_KIND, "not_bulk", "table %s/%s is a %s table, not bulk", r.table.GetTenant(), r.table.GetName(), api.KindName(r.table.GetKind()))
	}
	return r, h, nil
}

// bulkVersionFor returns the loaded version a read names (0: the serving
// one), or the error that tells the client what to do.
func (r *replica) bulkVersionFor(v uint64) (*bulkVersion, error) {
	lv, v := r.bulk.version(v)
	if lv != nil {
		return lv, nil
	}
	cur := r.bulk.current.Load()
	switch {
	case v == 0:
		return nil, api.Errorf(api.ErrorCode_ERROR_CODE_NOT_FOUND, "no_version", "bulk table %s/%s has no serving version yet: publish one", r.table.GetTenant(), r.table.GetName())
	case slices.Contains(r.bulkRetained, v) || v > slices.Max(append(r.bulkRetained, 0)):
		// Retained but not loaded here (this server took the partition
		// over, or is still loading), or newer than this server's map.
		return nil, api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "version_not_loaded", "partition %d does not have version %d loaded on this server", r.part.GetId(), v)
	}
	return nil, errVersionGone(r, v, cur)
}

func errVersionGone(r *replica, v, cur uint64) error {
	return api.Status(&api.ErrorDetail{Code: api.ErrorCode_ERROR_CODE_VERSION_GONE, Reason: "version_gone", CurrentVersion: cur},
		"bulk table "+r.table.GetTenant()+"/"+r.table.GetName()+" no longer holds version "+u64(v)+"; the serving version is "+u64(cur))
}

// bulkErr maps a read error of loaded version v: a version unloaded under
// the read is VERSION_GONE.
func (r *replica) bulkErr(v uint64, err error) error {
	if errors.Is(err, engines.ErrClosed) {
		return errVersionGone(r, v, r.bulk.current.Load())
	}
	return engineErr(r, err)
}

// bulkGet answers Get on a bulk partition.
func (s *Server) bulkGet(r *replica, req *api.GetRequest) (*api.GetResponse, error) {
	lv, err := r.bulkVersionFor(req.GetHeader().GetBulkVersion())
	if err != nil {
		return nil, err
	}
	r.bulk.reads.Add(1)
	v, ok, err := lv.appendGet(nil, req.GetKey())
	if err != nil {
		return nil, r.bulkErr(lv.version, err)
	}
	if !ok {
		return &api.GetResponse{}, nil
	}
	return &api.GetResponse{Found: true, Value: v}, nil
}

// bulkBatchGet answers BatchGet on a bulk partition: every key from one
// version.
func (s *Server) bulkBatchGet(r *replica, req *api.BatchGetRequest) (*api.BatchGetResponse, error) {
	lv, err := r.bulkVersionFor(req.GetHeader().GetBulkVersion())
	if err != nil {
		return nil, err
	}
	keys := req.GetKeys()
	r.bulk.reads.Add(uint64(len(keys)))
	vals := make([][]byte, len(keys))
	found := make([]bool, len(keys))
	if _, err := lv.appendGetBatch(nil, keys, vals, found); err != nil {
		return nil, r.bulkErr(lv.version, err)
	}
	resp := &api.BatchGetResponse{Results: make([]*api.GetResponse, len(keys))}
	var total uint64
	for i := range keys {
		resp.Results[i] = &api.GetResponse{Found: found[i], Value: vals[i]}
		total += uint64(len(vals[i]))
	}
	if total > api.MaxBatchBytes {
		return nil, api.InvalidArgument("keys", "reply_too_large", api.MaxBatchBytes,
			"the values of these %d keys exceed %d bytes, the most one reply carries; ask for fewer keys per call", len(keys), api.MaxBatchBytes)
	}
	return resp, nil
}

// checkUploadVersion refuses an upload of a version the map does not list
// for the table (unpublished, or unloaded since).
func (r *replica) checkUploadVersion(v uint64) error {
	if v == 0 {
		return api.InvalidArgument("version", "version_zero", 0, "version must be 1 or more")
	}
	if slices.Contains(r.bulkRetained, v) {
		return nil
	}
	if v > slices.Max(append(r.bulkRetained, 0)) {
		return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "map_behind", "server has not seen version %d of the table published yet", v)
	}
	return api.InvalidArgument("version", "version_not_published", 0, "version %d of %s/%s is not being published or retained; publish it first", v, r.table.GetTenant(), r.table.GetName())
}

// BulkUploadStatus implements api.TableServerServer.
func (s *Server) BulkUploadStatus(ctx context.Context, req *api.BulkUploadStatusRequest) (*api.BulkUploadResponse, error) {
	r, _, err := s.bulkReplica(req.GetHeader())
	if err != nil {
		return nil, err
	}
	if err := r.checkUploadVersion(req.GetVersion()); err != nil {
		return nil, err
	}
	if lv, _ := r.bulk.version(req.GetVersion()); lv != nil {
		return &api.BulkUploadResponse{Received: lv.size, Loaded: true}, nil
	}
	return &api.BulkUploadResponse{Received: r.bulk.partSize(req.GetVersion())}, nil
}

// BulkUpload implements api.TableServerServer.
func (s *Server) BulkUpload(stream grpc.ClientStreamingServer[api.BulkUploadRequest, api.BulkUploadResponse]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	r, _, err := s.bulkReplica(first.GetHeader())
	if err != nil {
		return err
	}
	version, file := first.GetVersion(), first.GetFile()
	if err := r.checkUploadVersion(version); err != nil {
		return err
	}
	if file == nil || file.GetSize() == 0 {
		return api.InvalidArgument("file", "file_missing", 0, "the first upload message must describe the file (size, crc32c)")
	}
	if file.GetPartition() != r.part.GetIndex() {
		return api.InvalidArgument("file.partition", "wrong_partition", 0, "file of partition %d sent to partition %d (index %d)", file.GetPartition(), r.part.GetId(), r.part.GetIndex())
	}
	if lv, _ := r.bulk.version(version); lv != nil {
		if lv.crc != file.GetCrc32C() || lv.size != file.GetSize() {
			return api.InvalidArgument("file", "version_loaded_differs", 0, "version %d is loaded here with another file (%d bytes, crc %08x)", version, lv.size, lv.crc)
		}
		return stream.SendAndClose(&api.BulkUploadResponse{Received: lv.size, Loaded: true})
	}
	end, err := r.bulk.beginUpload(version)
	if err != nil {
		return err
	}
	defer end()
	u, err := r.bulk.openUpload(version, file, first.GetOffset())
	if err != nil {
		return uploadErr(r, err)
	}
	closed := false
	defer func() {
		if !closed {
			_ = u.close()
		}
	}()
	msg := first
	for {
		if off := msg.GetOffset(); len(msg.GetData()) > 0 && off != u.size {
			return api.InvalidArgument("offset", "offset_mismatch", u.size, "data at offset %d; the upload is at %d", off, u.size)
		}
		if err := u.write(msg.GetData()); err != nil {
			return uploadErr(r, err)
		}
		if u.size == file.GetSize() {
			break
		}
		msg, err = stream.Recv()
		if err == io.EOF {
			// The sender stopped early: keep what arrived (synced) for a
			// resume.
			if err := u.sync(); err != nil {
				return uploadErr(r, err)
			}
			return stream.SendAndClose(&api.BulkUploadResponse{Received: u.size})
		}
		if err != nil {
			_ = u.sync()
			return err
		}
	}
	closed = true
	lv, err := u.finish(stream.Context())
	if err != nil {
		return uploadErr(r, err)
	}
	// Tell the master now rather than at the next heartbeat: the version
	// switches as soon as the last partition reports.
	if err := s.heartbeat(false); err != nil {
		s.log.Warn("heartbeat after bulk load failed; the next one reports it", "err", err)
	}
	return stream.SendAndClose(&api.BulkUploadResponse{Received: lv.size, Loaded: true})
}

func uploadErr(r *replica, err error) error {
	if _, ok := status.FromError(err); ok {
		return err // already a status
	}
	return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "upload_failed", "partition %d: upload: %v", r.part.GetId(), err)
}
