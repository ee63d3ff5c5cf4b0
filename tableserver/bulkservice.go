package tableserver

import (
	"time"

	"context"
	"errors"
	"io"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/engines/bulk"
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
func (r *replica) bulkVersionFor(v uint64) (*bulk.Version, error) {
	lv, err := r.bulk.Version(v)
	switch {
	case err == nil:
		return lv, nil
	case errors.Is(err, bulk.ErrNoVersion):
		return nil, api.Errorf(api.ErrorCode_ERROR_CODE_NOT_FOUND, "no_version", "bulk table %s/%s has no serving version yet: publish one", r.table.GetTenant(), r.table.GetName())
	case errors.Is(err, bulk.ErrVersionNotLoaded):
		// Retained but not loaded here (this server took the partition
		// over, or is still loading), or newer than this server's map.
		if v == 0 {
			v = r.bulk.Serving()
		}
		return nil, api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "version_not_loaded", "partition %d does not have version %d loaded on this server", r.part.GetId(), v)
	}
	return nil, engineErr(r, err)
}

func errVersionGone(r *replica, v, cur uint64) error {
	return api.Status(&api.ErrorDetail{Code: api.ErrorCode_ERROR_CODE_VERSION_GONE, Reason: "version_gone", CurrentVersion: cur},
		"bulk table "+r.table.GetTenant()+"/"+r.table.GetName()+" no longer holds version "+u64(v)+"; the serving version is "+u64(cur))
}

// bulkGet answers Get on a bulk partition.
func (s *Server) bulkGet(r *replica, req *api.GetRequest) (*api.GetResponse, error) {
	lv, err := r.bulkVersionFor(req.GetHeader().GetBulkVersion())
	if err != nil {
		return nil, err
	}
	start := time.Now()
	v, ok, err := lv.AppendGet(nil, req.GetKey())
	r.load.since(start)
	if err != nil {
		return nil, engineErr(r, err)
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
	vals := make([][]byte, len(keys))
	found := make([]bool, len(keys))
	start := time.Now()
	_, err = lv.AppendGetBatch(nil, keys, vals, found)
	r.load.since(start)
	if err != nil {
		return nil, engineErr(r, err)
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
	if slices.Contains(r.bulkPublished, v) {
		return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "not_this_copy",
			"partition %d: this copy does not hold version %d; upload it to the copy the map gives it (bulk_holds)", r.part.GetId(), v)
	}
	if v > slices.Max(append(r.bulkPublished, 0)) {
		return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "map_behind", "server has not seen version %d of the table published yet", v)
	}
	return api.InvalidArgument("version", "version_not_published", 0, "version %d of %s/%s is not being published or retained; publish it first", v, r.table.GetTenant(), r.table.GetName())
}

// BulkUploadStatus implements api.TableServerServer.
func (s *service) BulkUploadStatus(ctx context.Context, req *api.BulkUploadStatusRequest) (*api.BulkUploadResponse, error) {
	r, _, err := s.bulkReplica(req.GetHeader())
	if err != nil {
		return nil, err
	}
	if err := r.checkUploadVersion(req.GetVersion()); err != nil {
		return nil, err
	}
	if lv, err := r.bulk.Version(req.GetVersion()); err == nil {
		return &api.BulkUploadResponse{Received: lv.Describe().Size, Loaded: true}, nil
	}
	return &api.BulkUploadResponse{Received: r.bulk.StagedBytes(req.GetVersion())}, nil
}

// BulkUpload implements api.TableServerServer.
func (s *service) BulkUpload(stream grpc.ClientStreamingServer[api.BulkUploadRequest, api.BulkUploadResponse]) error {
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
	if lv, err := r.bulk.Version(version); err == nil {
		if d := lv.Describe(); d.CRC != file.GetCrc32C() || d.Size != file.GetSize() {
			return api.InvalidArgument("file", "version_loaded_differs", 0, "version %d is loaded here with another file (%d bytes, crc %08x)", version, d.Size, d.CRC)
		}
		return s.uploaded(stream, r, version, file, first.GetStore())
	}
	st, err := r.bulk.Stage(version, file.GetSize(), file.GetCrc32C(), first.GetOffset())
	if err != nil {
		return stageErr(r, version, err)
	}
	defer st.Close() // keeps what arrived for a resume; nothing after Finish
	msg := first
	for {
		if off := msg.GetOffset(); len(msg.GetData()) > 0 && off != st.Received() {
			return api.InvalidArgument("offset", "offset_mismatch", st.Received(), "data at offset %d; the upload is at %d", off, st.Received())
		}
		if _, err := st.Write(msg.GetData()); err != nil {
			return stageErr(r, version, err)
		}
		if st.Received() == file.GetSize() {
			break
		}
		msg, err = stream.Recv()
		if err == io.EOF {
			// The sender stopped early: keep what arrived (synced) for a
			// resume.
			if err := st.Sync(); err != nil {
				return stageErr(r, version, err)
			}
			return stream.SendAndClose(&api.BulkUploadResponse{Received: st.Received()})
		}
		if err != nil {
			_ = st.Sync()
			return err
		}
	}
	if _, err := st.Finish(stream.Context()); err != nil {
		return stageErr(r, version, err)
	}
	// Tell the master now rather than at the next heartbeat: the version
	// switches as soon as the last partition reports.
	if err := s.heartbeat(false); err != nil {
		s.log.Warn("heartbeat after bulk load failed; the next one reports it", "err", err)
	}
	return s.uploaded(stream, r, version, file, first.GetStore())
}

// uploaded answers an upload whose file is loaded, after storing it into
// its stream if the sender asked (bulkstore.go).
func (s *service) uploaded(stream grpc.ClientStreamingServer[api.BulkUploadRequest, api.BulkUploadResponse], r *replica, version uint64, file *api.BulkFile, store bool) error {
	resp := &api.BulkUploadResponse{Received: file.GetSize(), Loaded: true}
	if store {
		if err := s.storeBulkFile(stream.Context(), r, version, file); err != nil {
			if api.CodeOf(err) != api.ErrorCode_ERROR_CODE_UNSPECIFIED {
				return err
			}
			return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "store_failed", "partition %d: version %d is loaded here but not stored in its stream (upload it again to retry): %v", r.part.GetId(), version, err)
		}
		resp.Stored = true
	}
	return stream.SendAndClose(resp)
}

// stageErr maps an error writing or loading version's file (an upload or
// a fetch from its stream) to what the sender can act on: a bad file is
// INVALID_ARGUMENT (send it again, or fix it), anything else UNAVAILABLE.
func stageErr(r *replica, version uint64, err error) error {
	var off *bulk.StageOffsetError
	var gone *bulk.VersionGoneError
	switch {
	case errors.Is(err, bulk.ErrStageBusy):
		return api.Errorf(api.ErrorCode_ERROR_CODE_SERVER_BUSY, "upload_in_progress", "partition %d: an upload of version %d is already running", r.part.GetId(), version)
	case errors.As(err, &off):
		return api.InvalidArgument("offset", "offset_past_end", off.Held, "upload offset %d is past the %d bytes held; resume from BulkUploadStatus", off.Offset, off.Held)
	case errors.Is(err, bulk.ErrStageTooLong):
		return api.InvalidArgument("data", "upload_too_long", 0, "partition %d version %d: %v", r.part.GetId(), version, err)
	case errors.Is(err, bulk.ErrChecksum):
		return api.InvalidArgument("file.crc32c", "checksum_mismatch", 0,
			"partition %d version %d: %v; the upload was discarded, send it again", r.part.GetId(), version, err)
	case errors.Is(err, bulk.ErrBaseNotLoaded):
		return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "base_not_loaded", "partition %d version %d: %v; send it again shortly", r.part.GetId(), version, err)
	case errors.Is(err, bulk.ErrRefused):
		return api.InvalidArgument("data", "bad_file", 0, "partition %d version %d: the file is rejected: %v", r.part.GetId(), version, err)
	case errors.As(err, &gone):
		return errVersionGone(r, gone.Version, gone.Current)
	}
	if _, ok := status.FromError(err); ok {
		return err // already a status
	}
	return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "upload_failed", "partition %d: upload: %v", r.part.GetId(), err)
}
