package client

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/replication/stream"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// BulkFile is one partition's file of a bulk version to publish (what
// engines/bulk.DescribeDir reports).
type BulkFile struct {
	Path    string
	Size    uint64
	CRC32C  uint32
	Records uint64
}

// BulkPublish is a version to publish: its number, its base when it is a
// delta (0 for a full version) and one file per partition, in order.
type BulkPublish struct {
	Version, Base uint64
	Files         []BulkFile
}

// PublishProgress is what PublishBulk reports as it goes.
type PublishProgress struct {
	// Partitions; how many files are stored (written into their streams
	// and sealed); how many are loaded by the server hosting the
	// partition.
	Partitions, Stored, Loaded int
	// Bytes of all files, and how many have been written into streams
	// (Stored) and, with PublishOptions.DirectUpload, sent to the servers
	// (Sent). A resumed publish counts what was there already.
	Bytes, StoredBytes, Sent uint64
	// Serving is set once the table serves the version.
	Serving bool
	// Rows is the copies per partition the version rolls out to, row by
	// row, and RowsDone how many rows serve it (0, 0 without a rollout: a
	// version without streams switches every copy at once).
	Rows, RowsDone int
}

// PublishOptions tune PublishBulk. The zero value works.
type PublishOptions struct {
	// Progress, when set, is called as the publish advances (from several
	// goroutines, one call at a time).
	Progress func(PublishProgress)
	// Parallel is how many partitions are written at once. Default 4.
	Parallel int
	// ChunkBytes is the size of one upload message. Default 1 MiB; at
	// most api.MaxBulkChunkBytes (8 MiB).
	ChunkBytes int
	// DirectUpload also sends each file straight to the server hosting
	// its partition, beside writing it into its stream, so that server
	// need not fetch it from the stream. Default false: every server
	// fetches its file from the stream (see RATIONALE.md, "Bulk files go
	// through streams", for the times of both).
	DirectUpload bool
}

// uploadRetries bounds the attempts at one partition's upload.
const uploadRetries = 20

// streamEntryBlocks is how many blocks of stream.MaxBlockBytes one append
// of a file into its stream carries: 16 MiB per round trip and fsync.
const streamEntryBlocks = 4

// PublishBulk makes p the table's serving version: it registers the version
// with the master, writes each partition file into the stream the master
// names for it (sealed once complete, and recorded with the version: a
// partition that moves to another server is reloaded from there), and
// waits until the server hosting each partition has fetched, verified and
// loaded its file and the master has switched the table to the version.
// Files already stored are not written again, so running it again after an
// interruption continues where it stopped. Reads keep going to the
// previous version until that switch, and never fail because of it. ctx
// bounds the whole publish. Streams are the cluster's: with a tenant's
// credential each file goes to the server hosting its partition instead,
// which loads it and writes it into the stream itself. Publishing a retained version again is a
// no-op that waits for it to be loaded everywhere.
func (t *Table) PublishBulk(ctx context.Context, p BulkPublish, opts PublishOptions) error {
	const op = "publish to"
	if t.err != nil {
		return t.errf(op, t.err)
	}
	if opts.Parallel <= 0 {
		opts.Parallel = 4
	}
	if opts.ChunkBytes <= 0 {
		opts.ChunkBytes = 1 << 20
	}
	if opts.ChunkBytes > api.MaxBulkChunkBytes {
		return t.errf(op, api.InvalidArgument("chunk_bytes", "chunk_too_large", api.MaxBulkChunkBytes,
			"upload chunks of %d bytes; the servers take at most %d per message", opts.ChunkBytes, api.MaxBulkChunkBytes))
	}
	for i, f := range p.Files {
		if f.Size == 0 {
			return t.errf(op, api.InvalidArgument(fmt.Sprintf("files[%d].size", i), "file_size", 0, "partition %d's file is empty", i))
		}
	}
	req := &api.BulkPublishRequest{Tenant: t.c.opts.Tenant, Table: t.name, Version: p.Version, BaseVersion: p.Base}
	var total uint64
	for i, f := range p.Files {
		req.Files = append(req.Files, &api.BulkFile{Partition: uint32(i), Size: f.Size, Crc32C: f.CRC32C, Records: f.Records})
		total += f.Size
	}
	var resp *api.BulkPublishResponse
	err := t.c.masterCall(ctx, fmt.Sprintf("client: publish version %d to %q", p.Version, t.name), func(ctx context.Context, mc api.MasterClient) error {
		var err error
		resp, err = mc.BulkPublish(ctx, req)
		return err
	})
	if err != nil {
		return err
	}
	t.ts.store(resp.GetMap())
	useStreams := len(resp.GetStreams()) > 0
	switch {
	case useStreams && len(resp.GetStreams()) != len(p.Files):
		return t.errf(op, api.Errorf(api.ErrorCode_ERROR_CODE_UNSPECIFIED, "bad_response", "the master named %d streams for %d files", len(resp.GetStreams()), len(p.Files)))
	case !useStreams:
		// Too few servers for a stream's 3 replicas when the version was
		// registered: the files go to the servers only.
		t.c.log.Warn("tabula: bulk files are uploaded to their servers only, not stored in streams (fewer than 3 servers in distinct fault domains); a partition that moves needs the version published again",
			"table", t.name, "version", p.Version)
		opts.DirectUpload = true
	}
	st, err := t.BulkStatus(ctx)
	if err != nil {
		return err
	}
	stored := make([]bool, len(p.Files))
	for _, v := range st.GetVersions() {
		if v.GetVersion() == p.Version {
			for i, f := range v.GetFiles() {
				if i < len(stored) && f.GetStream() != "" {
					stored[i] = true
				}
			}
		}
	}

	var (
		mu                sync.Mutex
		storedBytes, sent atomic.Uint64
		storedN, loaded   atomic.Int64
		rows, rowsDone    atomic.Int64
		progress          = func(serving bool) {
			if opts.Progress == nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			opts.Progress(PublishProgress{Partitions: len(p.Files), Stored: int(storedN.Load()), Loaded: int(loaded.Load()),
				Bytes: total, StoredBytes: storedBytes.Load(), Sent: sent.Load(), Serving: serving,
				Rows: int(rows.Load()), RowsDone: int(rowsDone.Load())})
		}
	)
	// A tenant may not write streams: each file goes to its partition's
	// server, which stores it in the stream (BulkUploadRequest.store).
	serverStores := useStreams && !t.c.opts.Credential.zero() && !t.c.opts.Credential.auth().IsCluster()
	conns := t.c.StreamConns()
	defer conns.Close()
	sc := stream.NewClient(t.c.Streams(), stream.ClientOptions{Logger: t.c.log, Conns: conns})
	defer sc.Close()
	sem := make(chan struct{}, opts.Parallel)
	// Without streams every serving copy needs the file from the publisher
	// (with them, the copies fetch it from the stream).
	copies := 1
	if !useStreams {
		copies = max(1, int(resp.GetMap().GetTable().GetOptions().GetReplication()))
	}
	errs := make([]error, (1+copies)*len(p.Files))
	var wg sync.WaitGroup
	for i := range p.Files {
		if !useStreams {
			break
		}
		if stored[i] {
			storedN.Add(1)
			storedBytes.Add(p.Files[i].Size)
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if serverStores {
				errs[i] = t.uploadPartition(ctx, p, i, opts.ChunkBytes, true, 0, func(n uint64) { sent.Add(n); storedBytes.Add(n); progress(false) })
			} else {
				errs[i] = t.storePartition(ctx, sc, p, i, resp.GetStreams()[i], func(n uint64) { storedBytes.Add(n); progress(false) })
			}
			if errs[i] == nil {
				storedN.Add(1)
				progress(false)
			}
		})
	}
	if opts.DirectUpload && !serverStores {
		for i := range p.Files {
			for k := range copies {
				sem <- struct{}{}
				wg.Go(func() {
					defer func() { <-sem }()
					err := t.uploadPartition(ctx, p, i, opts.ChunkBytes, false, k, func(n uint64) { sent.Add(n); progress(false) })
					errs[len(p.Files)*(1+k)+i] = err
				})
			}
		}
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("client: publish version %d to %q: %w", p.Version, t.name, err)
	}
	// Every file is stored; the servers fetch theirs (or have them from
	// the upload), load them and report; the master switches on the last
	// report. Wait for it. A version published again (retained, not
	// serving) is done once loaded everywhere: it is served after a
	// rollback to it.
	for attempt := 0; ; attempt++ {
		st, err := t.BulkStatus(ctx)
		if err != nil {
			return err
		}
		done := st.GetCurrent() > p.Version // superseded meanwhile
		found := false
		if ro := st.GetRollout(); ro.GetVersion() == p.Version {
			rows.Store(int64(ro.GetRows()))
			rowsDone.Store(int64(ro.GetRowsDone()))
		}
		for _, v := range st.GetVersions() {
			if v.GetVersion() != p.Version {
				continue
			}
			found = true
			loaded.Store(int64(v.GetLoadedPartitions()))
			if v.GetError() != "" {
				return t.errf(op, api.InvalidArgument("file", "bad_file", 0, "version %d is refused: %s", p.Version, v.GetError()))
			}
			if v.GetState() != api.BulkVersionState_BULK_VERSION_STATE_LOADING && int(v.GetLoadedPartitions()) == len(p.Files) {
				done = true
			}
		}
		if done {
			progress(st.GetCurrent() == p.Version)
			return nil
		}
		if !found {
			return t.errf(op, api.Errorf(api.ErrorCode_ERROR_CODE_NOT_FOUND, "version_abandoned",
				"version %d is no longer published (a newer publish abandoned it, or it was dropped)", p.Version))
		}
		progress(false)
		if !sleepCtx(ctx, t.c.jitter.backoff(attempt, 20*time.Millisecond, 500*time.Millisecond)) {
			return fmt.Errorf("client: publish version %d to %q: every file is stored, %d of %d partitions loaded it, the table did not switch yet: %w",
				p.Version, t.name, loaded.Load(), len(p.Files), ctx.Err())
		}
	}
}

// storePartition writes partition i's file into stream name (afresh: what
// an interrupted attempt left is deleted first) and has the master seal
// and record it. The file is read once and each append carries its blocks'
// CRC32C; the server that fetches it checks the whole file's CRC32C.
func (t *Table) storePartition(ctx context.Context, sc *stream.Client, p BulkPublish, i int, name string, stored func(uint64)) error {
	f := p.Files[i]
	fh, err := os.Open(f.Path)
	if err != nil {
		return fmt.Errorf("partition %d: %w", i, err)
	}
	defer fh.Close()
	if fi, err := fh.Stat(); err != nil {
		return fmt.Errorf("partition %d: %w", i, err)
	} else if uint64(fi.Size()) != f.Size {
		return fmt.Errorf("partition %d: %s is %d bytes; the version describes %d", i, f.Path, fi.Size(), f.Size)
	}
	streams := t.c.Streams()
	if err := streams.Delete(ctx, name); err != nil && !errors.Is(err, stream.ErrStreamNotFound) {
		return fmt.Errorf("partition %d: delete what an earlier attempt left in stream %s: %w", i, name, err)
	}
	if _, err := streams.Create(ctx, name, ""); err != nil {
		return fmt.Errorf("partition %d: create stream %s: %w", i, name, err)
	}
	buf := make([]byte, streamEntryBlocks*stream.MaxBlockBytes)
	blocks := make([][]byte, 0, streamEntryBlocks)
	crc := uint32(0)
	for off := uint64(0); off < f.Size; {
		n := min(uint64(len(buf)), f.Size-off)
		if _, err := fh.ReadAt(buf[:n], int64(off)); err != nil {
			return fmt.Errorf("partition %d: read %s at %d: %w", i, f.Path, off, err)
		}
		crc = crc32.Update(crc, castagnoli, buf[:n])
		blocks = blocks[:0]
		for b := uint64(0); b < n; b += stream.MaxBlockBytes {
			blocks = append(blocks, buf[b:min(n, b+stream.MaxBlockBytes)])
		}
		if _, err := sc.Append(ctx, name, blocks...); err != nil {
			return fmt.Errorf("partition %d: append to stream %s at file offset %d: %w", i, name, off, err)
		}
		off += n
		stored(n)
	}
	if crc != f.CRC32C {
		// The file changed since it was described: nothing is recorded,
		// and the stream goes.
		_ = streams.Delete(ctx, name)
		return fmt.Errorf("partition %d: %s has CRC32C %08x; the version describes %08x (the file changed?)", i, f.Path, crc, f.CRC32C)
	}
	req := &api.BulkStoredRequest{Tenant: t.c.opts.Tenant, Table: t.name, Version: p.Version, Partition: uint32(i), Stream: name}
	return t.c.masterCall(ctx, fmt.Sprintf("client: record partition %d of version %d of %q as stored", i, p.Version, t.name), func(ctx context.Context, mc api.MasterClient) error {
		resp, err := mc.BulkStored(ctx, req)
		if err == nil {
			t.ts.store(resp.GetMap())
		}
		return err
	})
}

// uploadPartition sends partition i's file to serving copy k of it (0:
// the primary; then the others in the map's order), resuming and retrying
// until it is loaded there; with store, until that server has also stored
// it in its stream (BulkUploadRequest.store).
func (t *Table) uploadPartition(ctx context.Context, p BulkPublish, i, chunk int, store bool, k int, sent func(uint64)) error {
	f := p.Files[i]
	fh, err := os.Open(f.Path)
	if err != nil {
		return fmt.Errorf("partition %d: %w", i, err)
	}
	defer fh.Close()
	file := &api.BulkFile{Partition: uint32(i), Size: f.Size, Crc32C: f.CRC32C, Records: f.Records}
	counted := uint64(0) // bytes reported to sent
	var last error
	for attempt := 0; attempt < uploadRetries; attempt++ {
		if attempt > 0 {
			if !sleepCtx(ctx, t.c.jitter.backoff(attempt, backoffBase, backoffCap)) {
				break
			}
			t.refreshQuietly(ctx)
		}
		m, err := t.ts.current(ctx)
		if err != nil {
			return err
		}
		if i >= len(m.GetPartitions()) {
			return fmt.Errorf("partition %d: the table has %d partitions", i, len(m.GetPartitions()))
		}
		part := m.GetPartitions()[i]
		r := copyOf(part, k)
		if h := holderOf(part, p.Version); store && h != nil {
			r = h // the copy the master gives the upload (rows: one copy holds each version)
		}
		if r == nil && k > 0 {
			return nil // the partition has fewer copies now: nothing to send
		}
		if r == nil {
			last = unavailable("no_primary", "partition %d has no serving copy %d", part.GetId(), k)
			continue
		}
		cc, err := t.c.conn(r.GetAddr())
		if err != nil {
			last = err
			continue
		}
		ts := api.NewTableServerClient(cc)
		hdr := &api.RequestHeader{Tenant: t.c.opts.Tenant, Table: t.name, PartitionId: part.GetId(), Epoch: part.GetEpoch()}
		st, err := ts.BulkUploadStatus(ctx, &api.BulkUploadStatusRequest{Header: hdr, Version: p.Version})
		if err == nil && st.GetLoaded() && !store {
			sent(f.Size - counted)
			return nil
		}
		if err != nil {
			if !retryableUpload(err) {
				return fmt.Errorf("partition %d at %s: %w", i, r.GetAddr(), err)
			}
			last = err
			continue
		}
		from := st.GetReceived()
		if from > f.Size || (st.GetLoaded() && from != f.Size) {
			from = 0
		}
		if from > counted {
			sent(from - counted)
			counted = from
		}
		done, err := t.sendFile(ctx, ts, hdr, p, file, fh, from, chunk, store, func(n uint64) { counted += n; sent(n) })
		if err == nil && done {
			sent(f.Size - counted)
			return nil
		}
		if err != nil && !retryableUpload(err) {
			if api.DetailOf(err).GetReason() == "checksum_mismatch" && attempt == 0 {
				last = err // the server discarded it: send it all again, once
				continue
			}
			return fmt.Errorf("partition %d at %s: %w", i, r.GetAddr(), err)
		}
		last = err
	}
	if last == nil {
		last = ctx.Err()
	}
	return fmt.Errorf("partition %d: upload did not complete: %w", i, last)
}

// copyOf is serving copy k of p: 0 is the primary, then the other
// replicas in the map's order; nil if p has no such copy.
func copyOf(p *api.Partition, k int) *api.Replica {
	if k == 0 {
		return primaryOf(p)
	}
	for _, r := range p.GetReplicas() {
		if r.GetRole() == api.ReplicaRole_REPLICA_ROLE_PRIMARY || r.GetAddr() == "" {
			continue
		}
		if k--; k == 0 {
			return r
		}
	}
	return nil
}

// retryableUpload: the server may answer differently after a map refresh
// and a pause.
func retryableUpload(err error) bool {
	switch api.CodeOf(err) {
	case api.ErrorCode_ERROR_CODE_UNAVAILABLE, api.ErrorCode_ERROR_CODE_NOT_OWNER,
		api.ErrorCode_ERROR_CODE_STALE_EPOCH, api.ErrorCode_ERROR_CODE_SERVER_BUSY:
		return true
	}
	return false
}

// sendFile streams the file from offset from (the first message, which
// describes the file, goes even with no data left to send); done reports
// that the server loaded it, and with store that it stored it too.
func (t *Table) sendFile(ctx context.Context, ts api.TableServerClient, hdr *api.RequestHeader, p BulkPublish,
	file *api.BulkFile, fh *os.File, from uint64, chunk int, store bool, sent func(uint64)) (done bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := ts.BulkUpload(ctx)
	if err != nil {
		return false, err
	}
	finished := func(resp *api.BulkUploadResponse) bool { return resp.GetLoaded() && (!store || resp.GetStored()) }
	msg := &api.BulkUploadRequest{Header: hdr, Version: p.Version, BaseVersion: p.Base, File: file, Offset: from, Store: store}
	buf := make([]byte, chunk)
	off := from
	for first := true; ; first = false {
		n, rerr := fh.ReadAt(buf[:min(uint64(chunk), file.GetSize()-off)], int64(off))
		if rerr != nil && !(rerr == io.EOF && n > 0) && !(first && off == file.GetSize()) {
			if off == file.GetSize() {
				break
			}
			return false, fmt.Errorf("read %d bytes at %d: %w", chunk, off, rerr)
		}
		msg.Offset, msg.Data = off, buf[:n]
		if err := stream.Send(msg); err != nil {
			resp, rerr := stream.CloseAndRecv() // the server's reason, if it sent one
			if rerr != nil {
				return false, rerr
			}
			if finished(resp) {
				return true, nil // loaded meanwhile (fetched from its stream)
			}
			return false, err
		}
		off += uint64(n)
		sent(uint64(n))
		msg = &api.BulkUploadRequest{}
		if off >= file.GetSize() {
			break
		}
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return false, err
	}
	return finished(resp), nil
}

// BulkStatus returns the bulk table's versions, with each partition's file
// and load state.
func (t *Table) BulkStatus(ctx context.Context) (*api.BulkInfo, error) {
	if t.err != nil {
		return nil, t.errf("bulk status of", t.err)
	}
	var resp *api.BulkStatusResponse
	err := t.c.masterCall(ctx, fmt.Sprintf("client: bulk status of %q", t.name), func(ctx context.Context, mc api.MasterClient) error {
		var err error
		resp, err = mc.BulkStatus(ctx, &api.BulkStatusRequest{Tenant: t.c.opts.Tenant, Table: t.name})
		return err
	})
	if err != nil {
		return nil, err
	}
	t.ts.store(resp.GetMap())
	return resp.GetBulk(), nil
}

// BulkRollback makes the bulk table serve version, which must be
// retained, and returns once it does: the version rolls out again row by
// row from its streams (a table without streams switches at once to a
// version loaded everywhere). progress, if not nil, is called with the
// rollout as it goes.
func (t *Table) BulkRollback(ctx context.Context, version uint64, progress ...func(*api.BulkRollout)) error {
	if t.err != nil {
		return t.errf("roll back", t.err)
	}
	var resp *api.BulkRollbackResponse
	err := t.c.masterCall(ctx, fmt.Sprintf("client: roll back %q to version %d", t.name, version), func(ctx context.Context, mc api.MasterClient) error {
		var err error
		resp, err = mc.BulkRollback(ctx, &api.BulkRollbackRequest{Tenant: t.c.opts.Tenant, Table: t.name, Version: version})
		return err
	})
	if err != nil {
		return err
	}
	t.ts.store(resp.GetMap())
	return t.waitServing(ctx, version, progress...)
}

// waitServing waits until the bulk table serves version, calling progress
// with the rollout as it goes.
func (t *Table) waitServing(ctx context.Context, version uint64, progress ...func(*api.BulkRollout)) error {
	for attempt := 0; ; attempt++ {
		st, err := t.BulkStatus(ctx)
		if err != nil {
			return err
		}
		ro := st.GetRollout()
		if st.GetCurrent() == version && ro == nil {
			return nil
		}
		if ro == nil || ro.GetVersion() != version {
			return t.errf("roll back", api.Errorf(api.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, "rollout_replaced",
				"the rollout of version %d ended without serving it (aborted, or replaced by another): the table serves version %d", version, st.GetCurrent()))
		}
		for _, f := range progress {
			f(ro)
		}
		if !sleepCtx(ctx, t.c.jitter.backoff(attempt, 20*time.Millisecond, 500*time.Millisecond)) {
			return fmt.Errorf("client: roll back %q to version %d: %d of %d rows switched (%s): %w", t.name, version, ro.GetRowsDone(), ro.GetRows(), rolloutWaiting(ro), ctx.Err())
		}
	}
}

// rolloutWaiting says what a rollout is doing, for errors and progress.
func rolloutWaiting(ro *api.BulkRollout) string {
	switch {
	case ro.GetPaused():
		return "paused"
	case ro.GetWaiting() != "":
		return "waiting: " + ro.GetWaiting()
	}
	return fmt.Sprintf("row %d loading, %d of %d partitions loaded", ro.GetRowsDone()+1, ro.GetRowLoaded(), ro.GetPartitions())
}

// BulkRollout pauses, resumes or aborts the bulk table's rollout (action
// "pause", "resume" or "abort") and returns the rollout as it is then (nil
// once none is under way).
func (t *Table) BulkRollout(ctx context.Context, action string) (*api.BulkRollout, error) {
	if t.err != nil {
		return nil, t.errf("bulk rollout", t.err)
	}
	var a api.BulkRolloutAction
	switch action {
	case "pause":
		a = api.BulkRolloutAction_BULK_ROLLOUT_ACTION_PAUSE
	case "resume":
		a = api.BulkRolloutAction_BULK_ROLLOUT_ACTION_RESUME
	case "abort":
		a = api.BulkRolloutAction_BULK_ROLLOUT_ACTION_ABORT
	default:
		return nil, t.errf("bulk rollout", api.InvalidArgument("action", "rollout_action", 0, "rollout action %q: want pause, resume or abort", action))
	}
	var resp *api.BulkRolloutResponse
	err := t.c.masterCall(ctx, fmt.Sprintf("client: bulk rollout %s on %q", action, t.name), func(ctx context.Context, mc api.MasterClient) error {
		var err error
		resp, err = mc.BulkRollout(ctx, &api.BulkRolloutRequest{Tenant: t.c.opts.Tenant, Table: t.name, Action: a})
		return err
	})
	if err != nil {
		return nil, err
	}
	t.ts.store(resp.GetMap())
	return resp.GetMap().GetBulk().GetRollout(), nil
}

// AtVersion returns a handle whose reads of a bulk table all come from
// version (which must be retained): a read of a version no longer held
// fails with VERSION_GONE (api.CodeOf) instead of moving to the current
// one. Version 0 is the usual behaviour: each request reads the serving
// version, and a BatchGet that meets an unloaded version retries whole on
// the new one.
func (t *Table) AtVersion(version uint64) *Table {
	c := *t
	c.pin = version
	return &c
}
