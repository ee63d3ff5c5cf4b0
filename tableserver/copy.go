package tableserver

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/replication/partition"
)

// A new replica of a replicated partition (a secondary whose engine has
// applied nothing) does not replay the whole commit log: it copies a
// snapshot from the primary, then applies the log from the snapshot's LSN.
//
// The snapshot is a scan read while writes go on (no pause anywhere): the
// source reads its applied LSN L first, then streams every record. The
// scan holds every effect of records up to L and maybe some of later ones;
// records carry their outcomes (absolute values and expiry times), so the
// new replica applying the log from L+1 rewrites every key those touched,
// in order, and ends in exactly the partition's state. The copy writes its
// applied LSN last: a replica found with applied LSN 0 and records (a copy
// cut short by a crash or a broken stream) is emptied and copied again, so
// a key deleted at the source meanwhile cannot come back.

// copyChunkBytes bounds one CopyReplicaChunk's records.
const copyChunkBytes = 1 << 20

// copyWindowBytes is the flow-control window of a copy's connection:
// this many bytes are in flight before the source waits.
const copyWindowBytes = 8 * copyChunkBytes

// copyReadAhead is how many chunks a copy receives ahead of applying.
const copyReadAhead = 4

// DefaultRepairBandwidth is how many bytes per second a server copies
// into new replicas, all copies together, unless Options.RepairBandwidth
// says otherwise.
const DefaultRepairBandwidth = 64 << 20

// newRepairLimiter is the token bucket of Options.RepairBandwidth, with
// a burst of up to a chunk (a tenth of a second's worth when that is
// less, and at least 4 KiB).
func newRepairLimiter(bw int64) *rate.Limiter {
	if bw < 0 {
		return rate.NewLimiter(rate.Inf, copyChunkBytes)
	}
	return rate.NewLimiter(rate.Limit(bw), int(max(min(bw/10, copyChunkBytes), 4<<10)))
}

// throttle waits until the repair bandwidth allows n more bytes.
func (s *Server) throttle(ctx context.Context, n int) error {
	for n > 0 {
		k := min(n, s.repair.Burst())
		if err := s.repair.WaitN(ctx, k); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// CopyReplica implements api.TableServerServer: the source side.
func (s *service) CopyReplica(req *api.CopyReplicaRequest, stream grpc.ServerStreamingServer[api.CopyReplicaChunk]) error {
	r, _, err := s.replicaFor(req.GetHeader())
	if err != nil {
		return err
	}
	if r.log == nil {
		return api.Errorf(api.ErrorCode_ERROR_CODE_WRONG_KIND, "not_replicated", "partition %d is not replicated through a commit log; there is nothing to copy", r.part.GetId())
	}
	if state, _, _ := r.log.progress(); state == api.ReplicaState_REPLICA_STATE_COPYING {
		return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "replica_copying", "partition %d on %s is itself still copying", r.part.GetId(), s.id())
	}
	lsn, err := readAppliedLSN(r.engine)
	if err != nil {
		return engineErr(r, err)
	}
	if lsn > 0 {
		s.log.Info("copying a snapshot to a new replica", "partition", r.part.GetId(), "to", req.GetCopier(), "lsn", lsn)
	}
	chunk := &api.CopyReplicaChunk{Lsn: lsn, TotalBytes: r.engine.Stats().Bytes}
	size := 0
	var sent uint64
	ctx := stream.Context()
	err = r.engine.Scan(func(rec engines.Record) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if string(rec.Key) == string(appliedLSNKey) {
			return nil // the copy's own is L, written last
		}
		chunk.Records = append(chunk.Records, &api.KeyValue{
			Key: append([]byte(nil), rec.Key...), Value: append([]byte(nil), rec.Value...), ExpiresUnixMs: rec.ExpiresAt,
		})
		sent++
		size += len(rec.Key) + len(rec.Value)
		if size < copyChunkBytes {
			return nil
		}
		if err := stream.Send(chunk); err != nil {
			return err
		}
		chunk, size = &api.CopyReplicaChunk{}, 0
		return nil
	})
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return engineErr(r, err)
	}
	chunk.Done, chunk.SentRecords = true, sent
	return stream.Send(chunk)
}

// copyIn makes this fresh secondary a copy of the primary at want.source:
// empty the engine, stream the snapshot in (throttled by the server's
// repair bandwidth), write the applied LSN, and restart the core there.
func (l *logReplica) copyIn(want roleWant) error {
	if want.source == "" {
		return nil // no primary yet: the map will name one
	}
	if err := l.empty(); err != nil {
		return fmt.Errorf("empty the replica before copying: %w", err)
	}
	// The copy's own connection, with flow-control windows of several
	// chunks: gRPC's default window (64 KiB, grown by its bandwidth
	// estimate) had the source wait for window updates between the
	// pieces of every chunk.
	cc, err := grpc.NewClient(want.source, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), api.FastReconnect(), api.Keepalive(),
		grpc.WithInitialWindowSize(copyWindowBytes), grpc.WithInitialConnWindowSize(copyWindowBytes),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(api.MaxMessageBytes))}, l.s.dialOptions()...)...)
	if err != nil {
		return fmt.Errorf("copy source %s: %w", want.source, err)
	}
	defer cc.Close()
	ctx, cancel := context.WithCancel(l.ctx)
	defer cancel()
	stream, err := api.NewTableServerClient(cc).CopyReplica(ctx, &api.CopyReplicaRequest{
		Header: &api.RequestHeader{Tenant: l.tenant, Table: l.table, PartitionId: l.pid, Epoch: want.epoch},
		Copier: l.s.id(),
	})
	if err != nil {
		return fmt.Errorf("copy from %s: %w", want.source, err)
	}
	start := time.Now()
	// Chunks are received while earlier ones are applied: a goroutine
	// reads ahead up to copyReadAhead chunks.
	type received struct {
		chunk *api.CopyReplicaChunk
		err   error
	}
	chunks := make(chan received, copyReadAhead)
	go func() {
		defer close(chunks)
		for {
			chunk, err := stream.Recv()
			select {
			case chunks <- received{chunk, err}:
			case <-ctx.Done():
				return
			}
			if err != nil || chunk.GetDone() {
				return
			}
		}
	}()
	var lsn, got, bytes uint64
	first := true
	for {
		rc, ok := <-chunks
		if !ok {
			return fmt.Errorf("copy from %s (%d records in): %w", want.source, got, ctx.Err())
		}
		chunk, err := rc.chunk, rc.err
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("copy from %s: the stream ended without its last chunk (%d records in): %w", want.source, got, engines.ErrCorrupt)
		}
		if err != nil {
			return fmt.Errorf("copy from %s (%d records in): %w", want.source, got, err)
		}
		if first {
			lsn, first = chunk.GetLsn(), false
			l.mu.Lock()
			l.copyTotal = chunk.GetTotalBytes()
			l.mu.Unlock()
			if lsn > 0 {
				l.log.Info("copying a snapshot", "from", want.source, "lsn", lsn, "bytes", chunk.GetTotalBytes())
			}
		}
		batch := make([]engines.Mutation, 0, len(chunk.GetRecords()))
		n := 0
		for _, kv := range chunk.GetRecords() {
			batch = append(batch, l.fromCopy(engines.Mutation{Key: kv.GetKey(), Value: kv.GetValue(), ExpiresAt: kv.GetExpiresUnixMs()}))
			n += len(kv.GetKey()) + len(kv.GetValue())
		}
		if err := l.s.throttle(ctx, n); err != nil {
			return err
		}
		if len(batch) > 0 {
			if err := l.writer.Apply(batch); err != nil {
				return fmt.Errorf("copy: apply %d records: %w", len(batch), err)
			}
		}
		got += uint64(len(batch))
		bytes += uint64(n)
		l.mu.Lock()
		l.copied = bytes
		l.mu.Unlock()
		if chunk.GetDone() {
			if chunk.GetSentRecords() != got {
				return fmt.Errorf("copy from %s: %d records received, the source sent %d: %w", want.source, got, chunk.GetSentRecords(), engines.ErrCorrupt)
			}
			break
		}
	}
	// Last: the applied LSN. A crash before it leaves applied LSN 0 with
	// records, which the next attempt empties.
	if lsn > 0 {
		if err := l.writer.Apply([]engines.Mutation{{Key: appliedLSNKey, Value: binary.LittleEndian.AppendUint64(nil, lsn)}}); err != nil {
			return fmt.Errorf("copy: record the applied LSN: %w", err)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	// The tailer is the caller and observed nothing while copying, so the
	// core has nothing pending: start it again at the snapshot's LSN.
	l.core.Close()
	l.core = partition.New(partition.Config{}, lsn)
	if l.want.role == partition.RoleSecondary {
		if err := l.core.BecomeSecondary(l.want.epoch); err != nil {
			return err
		}
	}
	l.needCopy = false
	l.tailExtent, l.tailOff = 0, 0
	l.starts, l.flushed = nil, 0
	if lsn == 0 && got == 0 {
		l.log.Debug("the primary has applied nothing yet: nothing to copy", "from", want.source)
		return nil
	}
	l.log.Info("copied a snapshot; applying the log from its LSN", "from", want.source, "lsn", lsn,
		"records", got, "bytes", bytes, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// empty deletes every record of the engine (a copy cut short, or a
// replica promoted before its copy finished: it replays the log from its
// start). Keys are gathered first: a scan must not write.
func (l *logReplica) empty() error {
	var keys [][]byte
	if err := l.engine.Scan(func(rec engines.Record) error {
		keys = append(keys, append([]byte(nil), rec.Key...))
		return nil
	}); err != nil {
		return err
	}
	if len(keys) == 0 {
		return nil
	}
	l.log.Warn("emptying a replica whose copy did not finish", "records", len(keys))
	for len(keys) > 0 {
		n := min(len(keys), api.MaxBatchKeys)
		batch := make([]engines.Mutation, n)
		for i, k := range keys[:n] {
			batch[i] = engines.Mutation{Key: k, Delete: true}
		}
		if err := l.writer.Apply(batch); err != nil {
			return err
		}
		keys = keys[n:]
	}
	return nil
}

// progress is the replica's state for status reports.
func (l *logReplica) progress() (state api.ReplicaState, copied, total uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.releaseHoldLocked() // a copy may have passed the point (reopen.go)
	switch {
	case l.fatal != nil:
		return api.ReplicaState_REPLICA_STATE_FAILED, 0, 0
	case l.reopening != nil, l.holdUntil != 0:
		// Reopening its engine after a disk error (reopen.go): it then
		// replays the log from its restart point, which the master waits
		// for rather than replacing it.
		return api.ReplicaState_REPLICA_STATE_CATCHING_UP, 0, 0
	case l.needCopy && l.want.role == partition.RoleSecondary:
		return api.ReplicaState_REPLICA_STATE_COPYING, l.copied, l.copyTotal
	case l.want.role == partition.RolePrimary && l.caughtUp, l.want.role == partition.RoleSecondary && l.synced:
		return api.ReplicaState_REPLICA_STATE_IN_SYNC, 0, 0
	}
	return api.ReplicaState_REPLICA_STATE_CATCHING_UP, 0, 0
}

// fail marks the replica failed (its engine cannot be trusted): it serves
// nothing more and reports REPLICA_STATE_FAILED, so the master replaces
// it.
func (l *logReplica) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fatal == nil {
		l.fatal = err
		l.log.Error("replica failed; it serves nothing and will be replaced", "err", err)
	}
}
