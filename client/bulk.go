package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tabuladb/tabula/api"
)

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
	// Partitions, and how many of them are loaded by their server.
	Partitions, Loaded int
	// Bytes of all files, and how many have reached the servers (a resumed
	// upload counts what was there already).
	Bytes, Sent uint64
	// Serving is set once the table serves the version.
	Serving bool
}

// PublishOptions tune PublishBulk. The zero value works.
type PublishOptions struct {
	// Progress, when set, is called as the publish advances (from several
	// goroutines, one call at a time).
	Progress func(PublishProgress)
	// Parallel is how many partitions upload at once. Default 4.
	Parallel int
	// ChunkBytes is the size of one upload message. Default 1 MiB.
	ChunkBytes int
}

// uploadRetries bounds the attempts at one partition's upload.
const uploadRetries = 20

// PublishBulk makes p the table's serving version: it registers the version
// with the master, uploads each partition file to the server hosting the
// partition (resuming from what the server already holds, so running it
// again after an interruption continues where it stopped), and waits until
// every server has verified and loaded its file and the master has switched
// the table to the version. Reads keep going to the previous version until
// that switch, and never fail because of it. ctx bounds the whole publish.
// Publishing a retained version again reloads it where a partition lost it
// (a partition moved) without switching to it.
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
	req := &api.BulkPublishRequest{Tenant: t.c.opts.Tenant, Table: t.name, Version: p.Version, BaseVersion: p.Base}
	var total uint64
	for i, f := range p.Files {
		req.Files = append(req.Files, &api.BulkFile{Partition: uint32(i), Size: f.Size, Crc32C: f.CRC32C, Records: f.Records})
		total += f.Size
	}
	var pm *api.PartitionMap
	err := t.c.masterCall(ctx, fmt.Sprintf("client: publish version %d to %q", p.Version, t.name), func(ctx context.Context, mc api.MasterClient) error {
		resp, err := mc.BulkPublish(ctx, req)
		pm = resp.GetMap()
		return err
	})
	if err != nil {
		return err
	}
	t.ts.store(pm)

	var (
		mu       sync.Mutex
		sent     atomic.Uint64
		loaded   atomic.Int64
		progress = func(serving bool) {
			if opts.Progress == nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			opts.Progress(PublishProgress{Partitions: len(p.Files), Loaded: int(loaded.Load()), Bytes: total, Sent: sent.Load(), Serving: serving})
		}
	)
	sem := make(chan struct{}, opts.Parallel)
	errs := make([]error, len(p.Files))
	var wg sync.WaitGroup
	for i := range p.Files {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = t.uploadPartition(ctx, p, i, opts.ChunkBytes, func(n uint64) { sent.Add(n); progress(false) })
			if errs[i] == nil {
				loaded.Add(1)
				progress(false)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("client: publish version %d to %q: %w", p.Version, t.name, err)
	}
	// Every server has loaded and reported its file; the master switches
	// on the last report. Wait for it (a report can take a heartbeat). A
	// version published again (retained, not serving) is done once loaded
	// everywhere: it is served after a rollback to it.
	for attempt := 0; ; attempt++ {
		st, err := t.BulkStatus(ctx)
		if err != nil {
			return err
		}
		done := st.GetCurrent() > p.Version // superseded meanwhile
		for _, v := range st.GetVersions() {
			if v.GetVersion() == p.Version && v.GetState() != api.BulkVersionState_BULK_VERSION_STATE_LOADING &&
				int(v.GetLoadedPartitions()) == len(p.Files) {
				done = true
			}
		}
		if done {
			progress(st.GetCurrent() == p.Version)
			return nil
		}
		if !sleepCtx(ctx, t.c.jitter.backoff(attempt, 20*time.Millisecond, 500*time.Millisecond)) {
			return fmt.Errorf("client: publish version %d to %q: every partition loaded, but the table did not switch: %w", p.Version, t.name, ctx.Err())
		}
	}
}

// uploadPartition sends partition i's file to the server hosting it,
// resuming and retrying until it is loaded there.
func (t *Table) uploadPartition(ctx context.Context, p BulkPublish, i, chunk int, sent func(uint64)) error {
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
		r := primaryOf(part)
		if r == nil {
			last = unavailable("no_primary", "partition %d has no server", part.GetId())
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
		if err == nil && st.GetLoaded() {
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
		if from > f.Size {
			from = 0
		}
		if from > counted {
			sent(from - counted)
			counted = from
		}
		done, err := t.sendFile(ctx, ts, hdr, p, file, fh, from, chunk, func(n uint64) { counted += n; sent(n) })
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

// sendFile streams the file from offset from; done reports that the server
// loaded it.
func (t *Table) sendFile(ctx context.Context, ts api.TableServerClient, hdr *api.RequestHeader, p BulkPublish,
	file *api.BulkFile, fh *os.File, from uint64, chunk int, sent func(uint64)) (done bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := ts.BulkUpload(ctx)
	if err != nil {
		return false, err
	}
	msg := &api.BulkUploadRequest{Header: hdr, Version: p.Version, BaseVersion: p.Base, File: file, Offset: from}
	buf := make([]byte, chunk)
	off := from
	for {
		n, rerr := fh.ReadAt(buf[:min(uint64(chunk), file.GetSize()-off)], int64(off))
		if rerr != nil && !(rerr == io.EOF && n > 0) {
			if off == file.GetSize() {
				break
			}
			return false, fmt.Errorf("read %d bytes at %d: %w", chunk, off, rerr)
		}
		msg.Offset, msg.Data = off, buf[:n]
		if err := stream.Send(msg); err != nil {
			_, rerr := stream.CloseAndRecv() // the server's reason, if it sent one
			if rerr != nil {
				return false, rerr
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
	return resp.GetLoaded(), nil
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

// BulkRollback switches the bulk table to version, which must be retained
// and loaded on every partition's server.
func (t *Table) BulkRollback(ctx context.Context, version uint64) error {
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
	return nil
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
