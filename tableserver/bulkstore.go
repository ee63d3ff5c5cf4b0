package tableserver

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/replication/stream"
)

// Storing an uploaded bulk file (BulkUploadRequest.store). A publisher
// with the cluster credential writes each file into its stream itself; a
// tenant may not write streams (they are the cluster's), so it uploads
// each file to its partition's server with store set, and the server —
// which checked the upload's signature and tenant, and has verified and
// loaded the file — writes it into the stream the master names for it
// (api.BulkStreamName: this server never writes a stream a caller names)
// and records it with the master, which seals it. The version then
// switches as for any publish, and a partition that moves reloads it from
// the stream.

// bulkStoreBlocks is how many blocks of stream.MaxBlockBytes one append
// of a stored file carries: 16 MiB per round trip and fsync, as the SDK's
// own store.
const bulkStoreBlocks = 4

// storeBulkFile writes the loaded file of version of r's partition into
// its stream and records it, unless the master has it recorded already.
// One store per partition runs at a time.
func (s *Server) storeBulkFile(ctx context.Context, r *replica, version uint64, file *api.BulkFile) error {
	b := r.bulk
	b.storeMu.Lock()
	defer b.storeMu.Unlock()
	tenant, table, index := r.table.GetTenant(), r.table.GetName(), int(r.part.GetIndex())
	name := api.BulkStreamName(r.table.GetId(), version, index)
	var info *api.BulkInfo
	if err := s.withMaster(ctx, func(mc api.MasterClient) error {
		resp, err := mc.BulkStatus(ctx, &api.BulkStatusRequest{Tenant: tenant, Table: table})
		info = resp.GetBulk()
		return err
	}); err != nil {
		return fmt.Errorf("bulk status before storing version %d: %w", version, err)
	}
	found := false
	for _, v := range info.GetVersions() {
		if v.GetVersion() != version {
			continue
		}
		found = true
		if fs := v.GetFiles(); index < len(fs) && fs[index].GetStream() != "" {
			return nil // stored already (an earlier upload, or the publisher)
		}
		if !v.GetStreams() {
			// Registered without streams (too few servers in distinct
			// fault domains at publish): the upload is all there is.
			return nil
		}
	}
	if !found {
		return api.InvalidArgument("version", "version_not_published", 0, "version %d of %s/%s is not being published; publish it first", version, tenant, table)
	}
	lv, err := b.Version(version)
	if err != nil {
		return fmt.Errorf("version %d is not loaded here: %w", version, err)
	}
	start := time.Now()
	streams := masterStreams{s}
	if err := streams.call(ctx, &api.StreamRequest{Op: api.StreamOp_STREAM_OP_DELETE, Stream: name}, nil); err != nil && !errors.Is(err, stream.ErrStreamNotFound) {
		return fmt.Errorf("delete what an earlier attempt left in stream %s: %w", name, err)
	}
	if err := streams.call(ctx, &api.StreamRequest{Op: api.StreamOp_STREAM_OP_CREATE, Stream: name}, nil); err != nil {
		return fmt.Errorf("create stream %s: %w", name, err)
	}
	size := file.GetSize()
	buf := make([]byte, bulkStoreBlocks*stream.MaxBlockBytes)
	blocks := make([][]byte, 0, bulkStoreBlocks)
	crc := uint32(0)
	for off := uint64(0); off < size; {
		n := min(uint64(len(buf)), size-off)
		if k, err := lv.ReadFileAt(buf[:n], int64(off)); uint64(k) != n && (err == nil || errors.Is(err, io.EOF)) {
			return fmt.Errorf("read version %d's file at %d: %d of %d bytes", version, off, k, n)
		} else if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("read version %d's file at %d: %w", version, off, err)
		}
		crc = crc32.Update(crc, castagnoliTable, buf[:n])
		blocks = blocks[:0]
		for o := uint64(0); o < n; o += stream.MaxBlockBytes {
			blocks = append(blocks, buf[o:min(n, o+stream.MaxBlockBytes)])
		}
		if _, err := s.streams.Append(ctx, name, blocks...); err != nil {
			return fmt.Errorf("append to stream %s at file offset %d: %w", name, off, err)
		}
		off += n
	}
	if crc != file.GetCrc32C() {
		// The loaded file was verified against this CRC: a mismatch is
		// a local read going wrong. Nothing is recorded.
		_ = streams.call(ctx, &api.StreamRequest{Op: api.StreamOp_STREAM_OP_DELETE, Stream: name}, nil)
		return fmt.Errorf("version %d's file read back with CRC32C %08x; it loaded with %08x", version, crc, file.GetCrc32C())
	}
	req := &api.BulkStoredRequest{Tenant: tenant, Table: table, Version: version, Partition: uint32(index), Stream: name}
	if err := s.withMaster(ctx, func(mc api.MasterClient) error {
		_, err := mc.BulkStored(ctx, req)
		return err
	}); err != nil {
		return fmt.Errorf("record stream %s as version %d's partition %d: %w", name, version, index, err)
	}
	s.log.Info("uploaded bulk file stored in its stream", "partition", b.id, "version", version, "stream", name,
		"bytes", size, "took", time.Since(start).Round(time.Millisecond))
	return nil
}
