package tableserver

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc/status"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/bulk"
	"github.com/tabuladb/tabula/internal/streamerr"
	"github.com/tabuladb/tabula/replication/stream"
)

// Bulk files from streams. Every file of a bulk version is also in a stream
// of its own (tablemaster: BulkStreamName, recorded by OpBulkStored). A
// bulk partition hosted here that lacks a retained version — it moved here,
// its file was lost or did not load at a restart, or its publisher only
// wrote the stream — fetches the file from the stream into the same .part
// file an upload writes, and finishes it the same way: the whole file's
// CRC32C against the one published, then Verify, then the load beside the
// versions served and a heartbeat that reports it. The fetcher is one
// goroutine owned by the server (Close stops it); it fetches at most
// bulkFetchParallel partitions at once, each partition's versions in
// order (the serving version's chain first: a delta loads over its base).

// bulkFetchParallel bounds the partitions fetching at once.
const bulkFetchParallel = 2

// bulkFetchRetry is how soon a round that left something to fetch (a file
// not stored yet, a failure) runs again without a map change.
const bulkFetchRetry = time.Second

// bulkFetchLogEvery is how many bytes of a fetch go between progress logs.
const bulkFetchLogEvery = 256 << 20

// kickBulkFetch asks the fetcher for a round (after a map change).
func (s *Server) kickBulkFetch() {
	select {
	case s.fetchKick <- struct{}{}:
	default:
	}
}

// bulkFetchLoop runs fetch rounds on kicks, and again after bulkFetchRetry
// while a round leaves something to do, until Close.
func (s *Server) bulkFetchLoop() {
	defer s.wg.Done()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	sem := make(chan struct{}, bulkFetchParallel)
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.fetchKick:
		case <-retry.C:
		}
		if s.bulkFetchRound(sem) {
			retry.Reset(bulkFetchRetry)
		}
	}
}

// bulkMissing lists the retained versions of r neither loaded here nor
// being uploaded or fetched, nor refused.
func (r *replica) bulkMissing() []uint64 {
	b := r.bulk
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fetching {
		return nil // the running fetch's end starts another round
	}
	var out []uint64
	for _, v := range r.bulkRetained {
		if _, err := b.Version(v); errors.Is(err, bulk.ErrVersionNotLoaded) && !b.Staging(v) && b.rejected[v] == nil {
			out = append(out, v)
		}
	}
	return out
}

// bulkFetchRound starts a fetch for every hosted bulk partition that
// misses a retained version whose file is stored; it reports whether
// anything is left for a later round.
func (s *Server) bulkFetchRound(sem chan struct{}) (pending bool) {
	h := s.hosting.Load()
	status := map[string]*api.BulkInfo{} // by table, fetched at its first need
	for _, r := range h.replicas {
		if r.bulk == nil {
			continue
		}
		missing := r.bulkMissing()
		if len(missing) == 0 {
			continue
		}
		key := tableKey(r.table.GetTenant(), r.table.GetName())
		info, ok := status[key]
		if !ok {
			ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
			err := s.withMaster(ctx, func(mc api.MasterClient) error {
				resp, err := mc.BulkStatus(ctx, &api.BulkStatusRequest{Tenant: r.table.GetTenant(), Table: r.table.GetName()})
				info = resp.GetBulk()
				return err
			})
			cancel()
			if err != nil {
				s.log.Warn("bulk status for a fetch failed; retrying", "table", key, "err", err)
				return true
			}
			status[key] = info
		}
		jobs, wait := bulkFetchPlan(info, int(r.part.GetIndex()), missing)
		pending = pending || wait
		if len(jobs) == 0 {
			continue
		}
		b := r.bulk
		b.mu.Lock()
		if b.fetching {
			b.mu.Unlock()
			pending = true // the running fetch may leave work: look again
			continue
		}
		b.fetching = true
		b.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			again := false
			defer func() {
				b.mu.Lock()
				b.fetching = false
				b.mu.Unlock()
				// Only now: a round kicked while fetching was still set
				// skipped this partition (a version published meanwhile
				// was never fetched).
				if again {
					s.kickBulkFetch()
				}
			}()
			select {
			case sem <- struct{}{}:
			case <-s.ctx.Done():
				return
			}
			defer func() { <-sem }()
			failed := false
			for _, j := range jobs {
				if err := s.fetchBulk(r, j.version, j.file); err != nil {
					if s.ctx.Err() != nil {
						return
					}
					s.log.Error("bulk version fetch from its stream failed; retrying", "partition", r.part.GetId(), "version", j.version, "stream", j.file.GetStream(), "err", err)
					failed = true
					break
				}
			}
			if failed {
				// Retry after a pause, not in a tight loop.
				t := time.NewTimer(bulkFetchRetry)
				defer t.Stop()
				select {
				case <-t.C:
				case <-s.ctx.Done():
					return
				}
			}
			again = true
		}()
	}
	return pending
}

type bulkFetchJob struct {
	version uint64
	file    *api.BulkFile
}

// bulkFetchPlan orders the missing versions of partition index that can be
// fetched now: the serving version's chain first (base before delta), then
// the others by version; a missing base is fetched before its delta even
// when not listed missing here. wait reports versions whose file is not
// stored yet (their publisher is still writing them).
func bulkFetchPlan(info *api.BulkInfo, index int, missing []uint64) (jobs []bulkFetchJob, wait bool) {
	byVersion := map[uint64]*api.BulkVersion{}
	for _, v := range info.GetVersions() {
		byVersion[v.GetVersion()] = v
	}
	inChain := map[uint64]bool{}
	for v := info.GetCurrent(); v != 0 && byVersion[v] != nil; v = byVersion[v].GetBaseVersion() {
		inChain[v] = true
	}
	order := slices.Clone(missing)
	slices.SortFunc(order, func(a, b uint64) int {
		if inChain[a] != inChain[b] {
			if inChain[a] {
				return -1
			}
			return 1
		}
		return cmp.Compare(a, b)
	})
	// A delta whose base is missing too waits for the base: the base sorts
	// first (chain first, then ascending, and a base is older), except a
	// chain delta over a non-chain base, which cannot happen (the chain is
	// closed under bases).
	for _, v := range order {
		bv := byVersion[v]
		if bv == nil || index >= len(bv.GetFiles()) {
			continue // not in the status (dropped meanwhile): nothing to fetch
		}
		f := bv.GetFiles()[index]
		if f.GetStream() == "" {
			wait = true
			continue
		}
		jobs = append(jobs, bulkFetchJob{version: v, file: f})
	}
	return jobs, wait
}

// fetchBulk reads version's file from its stream and loads it, exactly as
// an upload is finished (the engine's Stage: the whole file's CRC32C
// against the one published, then Verify, then the load). It is the only
// writer of the version's file while it runs (the stage claims the
// version as an upload does).
func (s *Server) fetchBulk(r *replica, version uint64, file *api.BulkFile) error {
	b := r.bulk
	if _, err := b.Version(version); err == nil {
		return nil
	}
	if cur := s.hosting.Load().replicas[b.id]; cur == nil || cur.bulk != b || !slices.Contains(cur.bulkRetained, version) {
		return nil // moved away or no longer retained meanwhile
	}
	st, err := b.Stage(version, file.GetSize(), file.GetCrc32C(), 0)
	if errors.Is(err, bulk.ErrStageBusy) || errors.Is(err, engines.ErrClosed) {
		return nil // an upload of it is running (it loads it), or the partition closed
	}
	if err != nil {
		return err
	}
	start := time.Now()
	s.log.Info("bulk version missing here; fetching it from its stream", "partition", b.id, "version", version, "stream", file.GetStream(), "bytes", file.GetSize())
	logged := uint64(0)
	err = s.streams.ReadStream(s.ctx, file.GetStream(), func(e stream.Entry) error {
		for _, blk := range e.Blocks {
			if _, err := st.Write(blk); err != nil {
				return err
			}
		}
		if n := st.Received(); n-logged >= bulkFetchLogEvery {
			logged = n
			s.log.Info("bulk fetch progress", "partition", b.id, "version", version, "bytes", n, "of", file.GetSize())
		}
		return nil
	})
	if err != nil {
		aerr := st.Abort()
		if errors.Is(err, engines.ErrClosed) {
			return nil
		}
		if errors.Is(err, bulk.ErrStageTooLong) {
			err = stageErr(r, version, err)
			return s.refuse(b, version, file, err)
		}
		return errors.Join(fmt.Errorf("read stream %s: %w", file.GetStream(), err), aerr)
	}
	if st.Received() != file.GetSize() {
		_ = st.Abort()
		return s.refuse(b, version, file, api.InvalidArgument("stream", "stream_size", file.GetSize(),
			"stream %s holds %d bytes; the file is %d", file.GetStream(), st.Received(), file.GetSize()))
	}
	if _, err := st.Finish(s.ctx); err != nil {
		if errors.Is(err, engines.ErrClosed) {
			return nil
		}
		return s.refuse(b, version, file, stageErr(r, version, err))
	}
	s.log.Info("bulk version fetched from its stream and loaded", "partition", b.id, "version", version, "bytes", file.GetSize(), "took", time.Since(start).Round(time.Millisecond))
	if err := s.heartbeat(false); err != nil {
		s.log.Warn("heartbeat after bulk load failed; the next one reports it", "err", err)
	}
	return nil
}

// refuse records err as why version's file is refused when the file
// itself is bad (INVALID_ARGUMENT), and then heartbeats, so the master
// learns at once that the version cannot load here; it returns err.
func (s *Server) refuse(b *bulkPart, version uint64, file *api.BulkFile, err error) error {
	if b.reject(version, file, err); api.CodeOf(err) == api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT {
		if herr := s.heartbeat(false); herr != nil {
			s.log.Warn("heartbeat after a refused bulk file failed; the next one reports it", "err", herr)
		}
	}
	return err
}

// masterStreams is the stream manager reached through the master's Stream
// RPC: the stream.ManagerClient of the server's stream client.
type masterStreams struct{ s *Server }

var _ stream.ManagerClient = masterStreams{}

func (m masterStreams) call(ctx context.Context, req *api.StreamRequest, out any) error {
	var resp *api.StreamResponse
	err := m.s.withMaster(ctx, func(mc api.MasterClient) error {
		var err error
		resp, err = mc.Stream(ctx, req)
		return err
	})
	if err != nil {
		return streamerr.FromStatus(err)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(resp.GetJson(), out); err != nil {
		return fmt.Errorf("stream %s: decode the answer: %w", req.Op, err)
	}
	return nil
}

// Stream implements stream.ManagerClient.
func (m masterStreams) Stream(ctx context.Context, name string) (stream.StreamInfo, error) {
	var info stream.StreamInfo
	err := m.call(ctx, &api.StreamRequest{Op: api.StreamOp_STREAM_OP_GET, Stream: name}, &info)
	return info, err
}

// Extent implements stream.ManagerClient.
func (m masterStreams) Extent(ctx context.Context, id uint64) (stream.ExtentPlacement, error) {
	var out struct {
		Placement stream.ExtentPlacement `json:"placement"`
	}
	err := m.call(ctx, &api.StreamRequest{Op: api.StreamOp_STREAM_OP_EXTENT, Extent: id}, &out)
	return out.Placement, err
}

// OpenWriter implements stream.ManagerClient.
func (m masterStreams) OpenWriter(ctx context.Context, name string) (stream.StreamInfo, error) {
	var info stream.StreamInfo
	err := m.call(ctx, &api.StreamRequest{Op: api.StreamOp_STREAM_OP_OPEN_WRITER, Stream: name}, &info)
	return info, err
}

// SealAndAllocate implements stream.ManagerClient.
func (m masterStreams) SealAndAllocate(ctx context.Context, name string, epoch, extent uint64) (stream.StreamInfo, error) {
	var info stream.StreamInfo
	err := m.call(ctx, &api.StreamRequest{Op: api.StreamOp_STREAM_OP_SEAL_AND_ALLOCATE, Stream: name, Epoch: epoch, Extent: extent}, &info)
	return info, err
}

// ReportCorrupt implements stream.ManagerClient.
func (m masterStreams) ReportCorrupt(ctx context.Context, extent uint64, node string) error {
	return m.call(ctx, &api.StreamRequest{Op: api.StreamOp_STREAM_OP_REPORT_CORRUPT, Extent: extent, Node: node}, nil)
}

// reject records err as why version's file is refused when the file
// itself is bad (INVALID_ARGUMENT: checksum, size, format, contents), so
// it is reported and not fetched again; other errors pass through.
func (b *bulkPart) reject(version uint64, file *api.BulkFile, err error) error {
	if api.CodeOf(err) != api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT {
		return err
	}
	b.mu.Lock()
	b.rejected[version] = &api.BulkLoaded{Version: version, Size: file.GetSize(), Crc32C: file.GetCrc32C(), Error: status.Convert(err).Message()}
	b.mu.Unlock()
	return err
}

// bulkAllInStreams reports whether every version m lists has its files
// in streams (so a copy on this server is never the only one).
func bulkAllInStreams(m *api.PartitionMap) bool {
	if m == nil {
		return false
	}
	for _, v := range m.GetBulk().GetVersions() {
		if !v.GetStreams() {
			return false
		}
	}
	return true
}
