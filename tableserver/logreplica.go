package tableserver

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/coproc"
	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/replication/partition"
	"github.com/tabuladb/tabula/replication/stream"
	"github.com/tabuladb/tabula/replication/stream/streampb"
)

// logReplica is one replicated partition's life on this server: the
// replica core (replication/partition), the pump that appends the
// primary's records to the commit log on the local extent node and applies
// what is durable, the tailer that feeds a secondary (or a new primary
// catching up) the committed records, and the overlay of writes in flight
// that a primary decides outcomes against. It outlives map changes (the
// hosting snapshots share it) until the partition leaves this server.
//
// Safe for concurrent use. Lock order: mu before nothing; no I/O under mu
// except reads of the engine (memory or mapped: microseconds) while a
// write's outcome is decided, which must be atomic with its numbering.
type logReplica struct {
	s *Server
	// load is the replica's (partload.go): apply counts its engine time.
	load   *partLoad
	pid    uint64
	tenant string
	table  string
	memory bool // a memory table (quotas count its bytes as memory too)
	stream string
	engine engines.Engine
	writer engines.Writer
	// tableOpts is the table as the replica was opened (a split opens its
	// children's engines like it).
	tableOpts *api.Table
	// re is engine when it can be reopened in place after a disk error
	// (reopen.go); nil otherwise.
	re  *reopenable
	log *slog.Logger

	kick chan struct{} // wakes the pump
	// acks carries the appends the pump started, in order, to the
	// acker (ackLoop).
	acks chan pendingAppend
	tick chan struct{} // wakes the tailer
	// followAgain: the tailer's last round waited on the open extent's
	// commit point (follow); it starts the next at once.
	followAgain atomic.Bool
	ctx         context.Context
	stop        context.CancelFunc
	wg          sync.WaitGroup

	// applyMu is held by the pump from taking records off the core to
	// advancing it, and by a reopen while it installs the new engine and
	// resets the core: records of the old core never reach the new engine.
	applyMu sync.Mutex

	mu sync.Mutex
	// Guarded by mu:
	core    *partition.Replica
	want    roleWant
	extent  uint64 // the open extent appended to (primary) or tailed
	overlay map[string]overlayEntry
	waiters map[uint64]chan writeResult
	nextTok uint64
	// appliedCh, when a retry waits for its request in flight, is closed
	// (and set to nil) after the next records apply or the overlay is
	// dropped.
	appliedCh chan struct{}
	// appended maps the LSNs sent to the current extent to where their
	// entries end, for the seal-and-continue point.
	appended []lsnEnd
	// resealing: the log refused an append; the master is sealing it.
	resealing bool
	// failedExtent: an append to this extent failed; the outcomes of the
	// appends started after it are ignored.
	failedExtent uint64
	// caughtUp: a new primary applied the whole sealed log.
	caughtUp bool
	// handoff: the map fences this term (Partition.handoff_from): the
	// previous primary, alive, may still serve from an older map, so
	// this one catches up but neither writes nor serves strong reads
	// until the master clears it (tablemaster/handoff.go).
	handoff string
	// tail position: the extent being read and the offset in it.
	tailExtent uint64
	tailOff    int64
	fatal      error
	// needCopy: a replica that has applied nothing copies a snapshot
	// before it tails the log as a secondary (copy.go); copied and
	// copyTotal are its progress in bytes.
	needCopy          bool
	copied, copyTotal uint64
	// synced: as a secondary, the tailer reached the commit point of the
	// open extent since it last became one.
	synced bool
	// step: when a secondary was last in step with its primary (instep.go).
	step stepTracker
	// durable: the engine keeps files (truncate.go); flushed is the
	// applied LSN its last Sync covered, starts the first LSN of the log
	// extents read or appended since the replica started.
	durable bool
	flushed uint64
	starts  []extentStart
	// reopening is the disk error the engine is being reopened after
	// (reopen.go); nil when it is not. faults are the times of recent
	// ones; incarnation counts the resets that followed; holdUntil, if
	// not 0, is the applied LSN the reopened engine must reach before
	// the request path may use it.
	reopening   error
	faults      []time.Time
	incarnation uint64
	holdUntil   uint64
	// split is the replica's part in a split of the partition (split.go).
	split splitState
	// merge is the replica's part in a merge of the partition (merge.go).
	merge mergeState
}

// roleWant is what the map says this replica is.
type roleWant struct {
	role   partition.Role
	epoch  uint64
	extent uint64
	source string // the primary's address, when another server's
}

type lsnEnd struct {
	lsn uint64
	end int64
}

// overlayEntry is a write in flight: the state a key will have once it is
// applied.
type overlayEntry struct {
	lsn     uint64
	deleted bool
	value   []byte
	expires int64
}

type writeResult struct {
	lsn    uint64
	result []byte
	err    error
}

// Reserved keys the replication keeps in the engine, applied atomically
// with each record (the prefix is the platform's: clients can neither read
// nor write these keys and scans skip them).
var (
	appliedLSNKey = []byte(api.ReservedKeyPrefix + "log/applied")
	requestPrefix = api.ReservedKeyPrefix + "req/"
)

// requestTTL is how long a write's outcome is kept for retries of its
// request id, by each replica's own clock from when it applied the write
// (keptExpiry): never shorter on a replica whose clock is ahead of the
// primary's (RATIONALE.md, "A retry's window is each replica's own").
const requestTTL = 10 * time.Minute

func requestKey(id string) []byte { return []byte(requestPrefix + id) }

// requestKeyPrefix is requestPrefix as bytes.
var requestKeyPrefix = []byte(requestPrefix)

// Kept outcome: the value of requestKey(id), replicated with the write,
// little-endian:
//
//	version 0: | word (8) | result |
//	version 1: | word (8) | 0 (1) | fingerprint (8) | result |
//
// The word's low 56 bits are the write's LSN, its top byte the layout's
// version: 0, written before fingerprints were kept (a retry gets the
// outcome whatever it asks), or 1, with the write's fingerprint
// (fingerprint.go): a retry with another one is refused as a reused
// request id. The zero byte is where earlier builds read the outcome's
// kind (writes.go): mid-upgrade they refuse a version 1 outcome
// (request_id_reused) rather than misread it. Never change a version's
// layout: replicas read what others wrote. (LSNs reach 2^56 after 2,000
// years at a million writes a second.)
const (
	keptV0       = 0
	keptV1       = 1
	keptLSNMask  = 1<<56 - 1
	keptV1Header = 17
)

// encodeKept appends a version 1 kept outcome to dst.
func encodeKept(dst []byte, lsn, fp uint64, result []byte) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, lsn&keptLSNMask|keptV1<<56)
	dst = append(dst, 0)
	dst = binary.LittleEndian.AppendUint64(dst, fp)
	return append(dst, result...)
}

// keptOutcome is a decoded kept outcome; result aliases the value.
type keptOutcome struct {
	lsn    uint64
	hasFP  bool
	fp     uint64
	result []byte
}

func decodeKept(v []byte) (keptOutcome, error) {
	if len(v) < 8 {
		return keptOutcome{}, fmt.Errorf("kept outcome of %d bytes: %w", len(v), engines.ErrCorrupt)
	}
	w := binary.LittleEndian.Uint64(v)
	k := keptOutcome{lsn: w & keptLSNMask}
	switch w >> 56 {
	case keptV0:
		k.result = v[8:]
	case keptV1:
		if len(v) < keptV1Header || v[8] != 0 {
			return keptOutcome{}, fmt.Errorf("kept outcome (version 1) of %d bytes: %w", len(v), engines.ErrCorrupt)
		}
		k.hasFP, k.fp, k.result = true, binary.LittleEndian.Uint64(v[9:]), v[keptV1Header:]
	default:
		return keptOutcome{}, fmt.Errorf("kept outcome of version %d, this build reads 0 and 1: %w", w>>56, engines.ErrCorrupt)
	}
	return k, nil
}

// check refuses a retry whose write differs from the one kept under its
// request id. Outcomes kept without a fingerprint answer any retry.
func (k keptOutcome) check(pid uint64, reqID string, fp uint64) error {
	if !k.hasFP || k.fp == fp {
		return nil
	}
	return api.InvalidArgument("request_id", "request_id_reused", 0,
		"partition %d: request id %q was used for another write (LSN %d); a retry must repeat its write exactly, and a new write needs a new request id", pid, reqID, k.lsn)
}

// keptExpiry is when a replica lets go of a kept outcome it applies now:
// requestTTL from now by its own clock, or the expiry the primary logged
// if that is later. The window then starts on each replica no earlier
// than the write was decided, whatever the primary's clock said: a replica
// whose clock is ahead (a new primary after a failover) does not drop
// outcomes early and apply a retried write twice.
func (l *logReplica) keptExpiry(logged int64) int64 {
	return max(logged, l.s.nowMs()+requestTTL.Milliseconds())
}

// fromCopy is a record copied from another replica's snapshot as this one
// applies it: a kept outcome's expiry was the source's, by its clock, and
// becomes this replica's (keptExpiry).
func (l *logReplica) fromCopy(m engines.Mutation) engines.Mutation {
	if bytes.HasPrefix(m.Key, requestKeyPrefix) {
		m.ExpiresAt, m.Cold = l.keptExpiry(m.ExpiresAt), true
	}
	return m
}

// nowMs is the server's clock (Options.Now) in Unix milliseconds.
func (s *Server) nowMs() int64 { return s.opts.Now().UnixMilli() }

// maxWriteWait bounds how long a write waits for the log when its caller
// set no deadline.
const maxWriteWait = 30 * time.Second

// maxRecordBytes bounds one log record: one append of the stream layer.
const maxRecordBytes = stream.MaxAppendBytes - 1<<20

func newLogReplica(s *Server, t *api.Table, pid uint64, streamName string, e engines.Engine) (*logReplica, error) {
	w, _ := e.(engines.Writer)
	if w == nil {
		return nil, fmt.Errorf("partition %d: engine %T takes no writes; it cannot apply a log", pid, e)
	}
	applied, err := readAppliedLSN(e)
	if err != nil {
		return nil, fmt.Errorf("partition %d: read the applied LSN: %w", pid, err)
	}
	l := &logReplica{
		s: s, pid: pid, tenant: t.GetTenant(), table: t.GetName(), tableOpts: t, memory: t.GetOptions().GetStorage() == "memory", stream: streamName, engine: e, writer: w,
		needCopy: applied == 0,
		durable:  durable(t),
		log:      s.log.With("partition", pid),
		kick:     make(chan struct{}, 1),
		acks:     make(chan pendingAppend, 64),
		tick:     make(chan struct{}, 1),
		core:     partition.New(partition.Config{}, applied),
		overlay:  map[string]overlayEntry{},
		waiters:  map[uint64]chan writeResult{},
	}
	if re, ok := e.(*reopenable); ok {
		l.re = re
		re.onFault = l.engineFault
		// The replica's own calls go through while the reopened engine
		// is held back from the request path (reopen.go).
		l.engine = re.inner()
		l.writer = l.engine.(engines.Writer)
	}
	l.ctx, l.stop = context.WithCancel(s.ctx)
	if g, ok := e.(*splitGone); ok {
		l.split.lsn, l.split.kids = g.lsn, g.kids
	}
	if err := l.redoSplit(applied); err != nil {
		return nil, err
	}
	if g, ok := e.(*mergeGone); ok {
		l.merge.applied, l.merge.lsn, l.merge.rec, l.merge.child = g.lsn, g.lsn, g.mg, g.take()
	} else if err := l.redoMerge(applied); err != nil {
		return nil, err
	}
	l.wg.Add(3)
	go l.pumpLoop()
	go l.ackLoop()
	go l.tailLoop()
	if l.merge.applied != 0 {
		s.mergeReady(l, l.merge.rec)
	}
	return l, nil
}

func readAppliedLSN(e engines.Engine) (uint64, error) {
	v, _, err := e.Get(appliedLSNKey)
	switch {
	case errors.Is(err, engines.ErrNotFound):
		return 0, nil
	case err != nil:
		return 0, err
	case len(v) != 8:
		return 0, fmt.Errorf("applied LSN of %d bytes: %w", len(v), engines.ErrCorrupt)
	}
	return binary.LittleEndian.Uint64(v), nil
}

// close stops the goroutines; writes waiting fail as of unknown outcome.
// The engine is the caller's to close.
func (l *logReplica) close() {
	l.s.forgetMerge(l)
	l.stop()
	l.wg.Wait()
	l.mu.Lock()
	l.core.Close()
	l.answerLocked(l.core.Ready())
	l.mu.Unlock()
}

// update applies the partition's map entry: role, epoch, open extent.
func (l *logReplica) update(p *api.Partition, serverID string) {
	w := roleWant{role: partition.RoleNone, epoch: p.GetEpoch(), extent: p.GetLog().GetExtent()}
	for _, r := range p.GetReplicas() {
		if r.GetServerId() != serverID {
			continue
		}
		switch r.GetRole() {
		case api.ReplicaRole_REPLICA_ROLE_PRIMARY:
			w.role = partition.RolePrimary
		case api.ReplicaRole_REPLICA_ROLE_SECONDARY:
			w.role = partition.RoleSecondary
		}
	}
	if p := primaryOf(p); p != nil && p.GetServerId() != serverID {
		w.source = p.GetAddr()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	// Not part of the role: lifting the fence does not start a new term.
	l.handoff = p.GetHandoffFrom()
	if sp := p.GetSplit(); (sp == nil) != (l.split.pending == nil) {
		l.split.pending = sp
		l.wake() // a primary appends the split record (tailOnce)
	}
	if w == l.want {
		return
	}
	if l.split.lsn == 0 {
		// A new role or term: a split record this primary proposed and
		// the log did not keep is proposed again once caught up.
		l.split.launched, l.split.numbered = false, false
	}
	if l.merge.applied == 0 {
		l.merge.launched, l.merge.numbered = false, false
	}
	prev := l.want
	l.want = w
	switch {
	case w.role == partition.RoleSecondary:
		if l.core.Role() != partition.RoleSecondary || l.core.Epoch() != w.epoch {
			if err := l.core.BecomeSecondary(w.epoch); err != nil {
				l.log.Error("cannot become secondary", "err", err)
			}
			clear(l.overlay)
			l.notifyAppliedLocked()
			l.appended = nil
			l.resealing = false
			l.caughtUp = false
			l.synced = false
		}
		l.extent = w.extent
	case w.role == partition.RolePrimary && l.core.Role() == partition.RolePrimary && l.caughtUp && w.epoch == l.core.Epoch():
		// Still the primary in its term: the log continues on the next
		// extent once the last is sealed (the tailer does it: it asks the
		// master for the sealed length).
	case w.role == partition.RolePrimary:
		// A new term (a new primary, or this one again at a later epoch:
		// another primary may have written the log meanwhile). In-flight
		// writes fail as of unknown outcome; the tailer applies the
		// sealed log, then promotes the core (catchUp).
		if l.core.Role() == partition.RolePrimary {
			if err := l.core.BecomeSecondary(w.epoch); err != nil {
				l.log.Error("end the previous term", "err", err)
			}
		}
		clear(l.overlay)
		l.notifyAppliedLocked()
		l.appended = nil
		l.resealing = false
		l.caughtUp = false
		l.extent = 0
	default:
		l.core.Close()
		clear(l.overlay)
		l.notifyAppliedLocked()
		l.caughtUp = false
	}
	if prev.role != w.role || prev.extent != w.extent {
		l.log.Debug("replica role", "role", w.role, "epoch", w.epoch, "extent", w.extent)
	}
	l.wake()
}

func (l *logReplica) wake() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
	select {
	case l.tick <- struct{}{}:
	default:
	}
}

// restartLogLocked: the extent this primary appended to was sealed at
// sealedLen and the log continues on w.extent. The records the seal kept
// are durable; the rest are sent again to the new extent with the same
// LSNs. A record whose append had not returned when the seal came may be
// in the sealed extent and sent again too: readers drop the duplicate by
// its LSN.
func (l *logReplica) restartLogLocked(w roleWant, sealedLen int64) error {
	through := l.core.CommitPoint()
	for _, a := range l.appended {
		if a.end <= sealedLen {
			through = max(through, a.lsn)
		}
	}
	if err := l.core.LogRestarted(through); err != nil {
		return err
	}
	l.appended = nil
	l.resealing = false
	l.extent = w.extent
	return nil
}

// decide is a write's outcome, evaluated against the partition's state
// including every write in flight before it: the mutations to apply (none
// for a CAS that did not match) and the result to answer with.
type decide func(get func(key []byte) (value []byte, found bool, err error)) (muts []engines.Mutation, result []byte, err error)

// write numbers a write, waits until it is applied and returns its LSN
// and result. reqID, if not empty, makes a retry return the first result;
// fp is the write's fingerprint (fingerprint.go), kept with it: a write
// under the same id with another fingerprint is refused
// (request_id_reused), applied or still in flight.
func (l *logReplica) write(ctx context.Context, epoch uint64, reqID string, fp uint64, fn decide) (uint64, []byte, error) {
	l.mu.Lock()
	if err := l.writableLocked(epoch); err != nil {
		l.mu.Unlock()
		return 0, nil, err
	}
	if reqID != "" {
		if len(reqID) > partition.MaxRequestIDLen {
			l.mu.Unlock()
			return 0, nil, api.InvalidArgument("request_id", "request_id_too_long", partition.MaxRequestIDLen, "request id of %d bytes; the limit is %d", len(reqID), partition.MaxRequestIDLen)
		}
		if lsn, res, ok, err := l.committedRequest(reqID, fp); err != nil || ok {
			l.mu.Unlock()
			return lsn, res, err
		}
		if o, ok := l.overlay[string(requestKey(reqID))]; ok {
			// A retry of a write in flight: its outcome was decided when
			// it was numbered, and deciding again would see the write's
			// own mutations (a conditional write would fail against
			// itself). Wait for it to apply and return its outcome —
			// if it is the same write.
			k, err := decodeKept(o.value)
			if err == nil {
				err = k.check(l.pid, reqID, fp)
			}
			if err != nil {
				l.mu.Unlock()
				return 0, nil, err
			}
			return l.awaitRequest(ctx, epoch, reqID, fp, o.lsn) // unlocks l.mu
		}
	}
	muts, result, err := fn(l.getLocked)
	if err != nil {
		l.mu.Unlock()
		return 0, nil, err
	}
	// The tenant's size allowances are charged here, for a write that is
	// new (not a retry of one applied) and with what it really writes.
	var sized uint64
	for _, m := range muts {
		if !m.Delete {
			sized += uint64(len(m.Key) + len(m.Value))
		}
	}
	if err := l.s.quota.size(l.tenant, sized, l.memory); err != nil {
		l.mu.Unlock()
		return 0, nil, err
	}
	now := l.s.nowMs()
	w := partition.Write{Mutations: make([]partition.Mutation, 0, len(muts)+1)}
	for _, m := range muts {
		pm := partition.Mutation{Kind: partition.MutPut, Key: m.Key, Value: m.Value, ExpiresAt: m.ExpiresAt}
		if m.Delete {
			pm = partition.Mutation{Kind: partition.MutDelete, Key: m.Key}
		}
		w.Mutations = append(w.Mutations, pm)
	}
	next := l.core.Last() + 1 // the LSN Propose gives a new write
	if reqID != "" {
		// The outcome is kept under the request id, replicated with the
		// write, so a retry on any replica returns it. The expiry logged
		// is the primary's; each replica keeps it at least requestTTL by
		// its own clock (keptExpiry).
		kept := encodeKept(make([]byte, 0, keptV1Header+len(result)), next, fp, result)
		w.Mutations = append(w.Mutations, partition.Mutation{Kind: partition.MutPut, Key: requestKey(reqID), Value: kept, ExpiresAt: now + requestTTL.Milliseconds()})
	}
	w.Result = result
	body := partition.EncodeWrite(nil, w)
	if len(body) > maxRecordBytes {
		l.mu.Unlock()
		l.s.quota.unsize(l.tenant, sized, l.memory)
		return 0, nil, api.InvalidArgument("mutations", "write_too_large", maxRecordBytes, "the write is %d bytes encoded; one replicated write carries at most %d", len(body), maxRecordBytes)
	}
	l.nextTok++
	tok := l.nextTok
	lsn, joined, err := l.core.Propose(partition.Proposal{Epoch: epoch, RequestID: reqID, Body: body, Token: tok})
	if err != nil {
		l.mu.Unlock()
		l.s.quota.unsize(l.tenant, sized, l.memory)
		return 0, nil, l.proposeErr(err)
	}
	if joined {
		l.s.quota.unsize(l.tenant, sized, l.memory) // the request in flight carries it
	} else {
		// Reported as written once done (applied, or answered with an
		// unknown outcome): until then the usage beside it misses it.
		defer l.s.quota.settle(l.tenant, sized, l.memory)
	}
	if !joined && lsn != next {
		panic(fmt.Sprintf("tableserver: partition %d: proposal got LSN %d, expected %d", l.pid, lsn, next)) // broken invariant
	}
	done := make(chan writeResult, 1)
	l.waiters[tok] = done
	if !joined {
		for _, m := range w.Mutations {
			l.overlay[string(m.Key)] = overlayEntry{lsn: lsn, deleted: m.Kind == partition.MutDelete, value: m.Value, expires: m.ExpiresAt}
		}
	}
	l.mu.Unlock()
	select {
	case l.kick <- struct{}{}:
	default:
	}
	wait := time.NewTimer(maxWriteWait)
	defer wait.Stop()
	select {
	case <-wait.C:
		return 0, nil, api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "outcome_unknown", "partition %d: the write (LSN %d) was not acknowledged within %v (the log is being reconfigured?); it may still apply: retry with the same request id", l.pid, lsn, maxWriteWait)
	case r := <-done:
		if joined && r.err == nil {
			// Joined a request in flight with the same id: the result is
			// the first one's, kept under the id (if the write is the
			// same).
			l.mu.Lock()
			lsn, res, _, err := l.committedRequest(reqID, fp)
			l.mu.Unlock()
			return lsn, res, err
		}
		return r.lsn, r.result, r.err
	case <-ctx.Done():
		return 0, nil, api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "outcome_unknown", "partition %d: the write (LSN %d) was not acknowledged before the deadline; it may still apply: retry with the same request id", l.pid, lsn)
	}
}

// awaitRequest waits, l.mu held on entry and released, until the write
// of request id reqID, in flight with LSN lsn, applies, and returns its
// kept outcome (checked against fp). If the write leaves the overlay
// unapplied (the primary changed), its outcome is unknown.
func (l *logReplica) awaitRequest(ctx context.Context, epoch uint64, reqID string, fp, lsn uint64) (uint64, []byte, error) {
	wait := time.NewTimer(maxWriteWait)
	defer wait.Stop()
	for {
		if l.appliedCh == nil {
			l.appliedCh = make(chan struct{})
		}
		ch := l.appliedCh
		l.mu.Unlock()
		select {
		case <-wait.C:
			return 0, nil, api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "outcome_unknown", "partition %d: the write of request %q (LSN %d) was not applied within %v; it may still apply: retry with the same request id", l.pid, reqID, lsn, maxWriteWait)
		case <-ctx.Done():
			return 0, nil, api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "outcome_unknown", "partition %d: the write of request %q (LSN %d) was not applied before the deadline; it may still apply: retry with the same request id", l.pid, reqID, lsn)
		case <-ch:
		}
		l.mu.Lock()
		if lsn, res, ok, err := l.committedRequest(reqID, fp); err != nil || ok {
			l.mu.Unlock()
			return lsn, res, err
		}
		if o, ok := l.overlay[string(requestKey(reqID))]; !ok || o.lsn != lsn {
			err := l.writableLocked(epoch)
			l.mu.Unlock()
			if err != nil {
				return 0, nil, err
			}
			return 0, nil, api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "outcome_unknown", "partition %d: the write of request %q (LSN %d) was dropped unapplied (the log was reconfigured); it may still apply: retry with the same request id", l.pid, reqID, lsn)
		}
	}
}

// notifyAppliedLocked wakes the retries waiting for their requests in
// flight (awaitRequest).
func (l *logReplica) notifyAppliedLocked() {
	if l.appliedCh != nil {
		close(l.appliedCh)
		l.appliedCh = nil
	}
}

func (l *logReplica) writableLocked(epoch uint64) error {
	switch {
	case l.fatal != nil:
		return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "replica_failed", "partition %d: %v", l.pid, l.fatal)
	case l.reopening != nil:
		return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "replica_reopening", "partition %d: the primary is reopening its engine after a disk error (%v); retry shortly", l.pid, l.reopening)
	case l.want.role != partition.RolePrimary:
		return api.Errorf(api.ErrorCode_ERROR_CODE_NOT_OWNER, "not_primary", "partition %d: this server is not its primary", l.pid)
	case !l.caughtUp || l.want.extent == 0 || l.extent == 0:
		return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "log_reconfiguring", "partition %d: its log is being reconfigured (failover or a replica change); retry shortly", l.pid)
	case l.handoff != "":
		return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "handoff_pending", "partition %d: the primary role is being handed over from %s, which may still serve until it lets go; retry shortly", l.pid, l.handoff)
	}
	if err := l.splitRefusalLocked(); err != nil {
		return err
	}
	return l.mergeRefusalLocked()
}

func (l *logReplica) proposeErr(err error) error {
	switch {
	case errors.Is(err, partition.ErrStaleEpoch):
		return api.Errorf(api.ErrorCode_ERROR_CODE_STALE_EPOCH, "stale_epoch", "partition %d: %v", l.pid, err)
	case errors.Is(err, partition.ErrNotPrimary):
		return api.Errorf(api.ErrorCode_ERROR_CODE_NOT_OWNER, "not_primary", "partition %d: %v", l.pid, err)
	case errors.Is(err, partition.ErrBusy):
		return api.Status(&api.ErrorDetail{Code: api.ErrorCode_ERROR_CODE_SERVER_BUSY, Reason: "log_busy", RetryAfterMs: 5}, fmt.Sprintf("partition %d: %v", l.pid, err))
	}
	return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "not_ready", "partition %d: %v", l.pid, err)
}

// getLocked reads key as it will be once every write in flight applies.
func (l *logReplica) getLocked(key []byte) ([]byte, bool, error) {
	if o, ok := l.overlay[string(key)]; ok {
		if o.deleted || (o.expires != 0 && o.expires <= l.s.nowMs()) {
			return nil, false, nil
		}
		return o.value, true, nil
	}
	v, _, err := l.engine.Get(key)
	if errors.Is(err, engines.ErrNotFound) {
		return nil, false, nil
	}
	return v, err == nil, err
}

// committedRequest looks up the kept outcome of request id, refusing it
// (request_id_reused) if it was kept for a write with another fingerprint
// than fp.
func (l *logReplica) committedRequest(id string, fp uint64) (uint64, []byte, bool, error) {
	v, _, err := l.engine.Get(requestKey(id))
	switch {
	case errors.Is(err, engines.ErrNotFound):
		return 0, nil, false, nil
	case err != nil:
		return 0, nil, false, err
	}
	k, err := decodeKept(v)
	if err != nil {
		return 0, nil, false, fmt.Errorf("partition %d: request %q: %w", l.pid, id, err)
	}
	if err := k.check(l.pid, id, fp); err != nil {
		return 0, nil, false, err
	}
	return k.lsn, k.result, true, nil
}

// pumpLoop does the core's work: append, apply, answer.
func (l *logReplica) pumpLoop() {
	defer l.wg.Done()
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-l.kick:
		}
		l.pump()
	}
}

func (l *logReplica) pump() {
	for l.ctx.Err() == nil {
		l.applyMu.Lock()
		l.mu.Lock()
		if l.reopening != nil || l.split.lsn != 0 || l.merge.applied != 0 {
			// A split engine applies nothing more: the children do.
			// Nothing applies until the engine is back (reopen.go resets
			// the core).
			l.mu.Unlock()
			l.applyMu.Unlock()
			return
		}
		rd := l.core.Ready()
		ext := l.extent
		l.mu.Unlock()
		if rd.Empty() {
			l.applyMu.Unlock()
			return
		}
		if err := l.apply(rd.Apply); err != nil {
			l.applyMu.Unlock()
			if l.applyFailed(err) {
				return
			}
			l.mu.Lock()
			l.fatal = fmt.Errorf("apply the log: %w", err)
			l.mu.Unlock()
			l.log.Error("cannot apply the log; the replica stops", "err", err)
			return
		}
		l.mu.Lock()
		for _, rec := range rd.Apply {
			w, _ := partition.DecodeWrite(rec.Body)
			for _, m := range w.Mutations {
				if o, ok := l.overlay[string(m.Key)]; ok && o.lsn == rec.LSN {
					delete(l.overlay, string(m.Key))
				}
			}
		}
		l.notifyAppliedLocked()
		l.core.Advance(rd)
		l.releaseHoldLocked()
		l.answerLocked(rd)
		promoting := l.want.role == partition.RolePrimary && !l.caughtUp
		l.mu.Unlock()
		l.applyMu.Unlock()
		if promoting && len(rd.Apply) > 0 {
			// A new primary serves once it applied the log it inherited:
			// let the tailer see it now, not at its next tick.
			select {
			case l.tick <- struct{}{}:
			default:
			}
		}
		if len(rd.Append) > 0 {
			l.appendRecords(ext, rd.Append)
		}
	}
}

// answerLocked answers the callers of acked and failed writes.
func (l *logReplica) answerLocked(rd partition.Ready) {
	for _, a := range rd.Acks {
		if ch := l.waiters[a.Token]; ch != nil {
			delete(l.waiters, a.Token)
			ch <- writeResult{lsn: a.LSN, result: l.resultOf(a.LSN, rd)}
		}
	}
	for _, f := range rd.Fails {
		if ch := l.waiters[f.Token]; ch != nil {
			delete(l.waiters, f.Token)
			ch <- writeResult{err: api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "outcome_unknown", "partition %d: %v", l.pid, f.Err)}
		}
	}
}

func (l *logReplica) resultOf(lsn uint64, rd partition.Ready) []byte {
	for _, rec := range rd.Apply {
		if rec.LSN == lsn {
			if w, err := partition.DecodeWrite(rec.Body); err == nil {
				return w.Result
			}
		}
	}
	return nil
}

// apply applies committed records to the engine, each atomically with
// the applied LSN.
func (l *logReplica) apply(recs []partition.Record) error {
	defer l.load.since(time.Now())
	for _, rec := range recs {
		w, err := partition.DecodeWrite(rec.Body)
		if err != nil {
			return fmt.Errorf("record %d: %w", rec.LSN, err)
		}
		batch := make([]engines.Mutation, 0, len(w.Mutations)+1)
		for _, m := range w.Mutations {
			// A request's kept outcome is read only by a retry: it stays
			// out of the read cache, as the applied LSN does, and stays
			// requestTTL by this replica's clock.
			cold := bytes.HasPrefix(m.Key, requestKeyPrefix)
			exp := m.ExpiresAt
			if cold && m.Kind == partition.MutPut {
				exp = l.keptExpiry(exp)
			}
			batch = append(batch, engines.Mutation{Key: m.Key, Value: m.Value, ExpiresAt: exp, Delete: m.Kind == partition.MutDelete, Cold: cold})
		}
		batch = append(batch, engines.Mutation{Key: appliedLSNKey, Value: binary.LittleEndian.AppendUint64(nil, rec.LSN), Cold: true})
		if err := l.writer.Apply(batch); err != nil {
			return fmt.Errorf("record %d: %w", rec.LSN, err)
		}
		if sp := splitOf(l.pid, w); sp != nil {
			// The primary writes nothing after the split record: the
			// engine splits at it (split.go).
			return l.splitEngine(rec.LSN, sp)
		}
		if mg := mergeOf(l.pid, w); mg != nil {
			// Likewise after the merge record: the engines merge once
			// both parents applied theirs (merge.go).
			l.mergeApplied(rec.LSN, mg)
			return nil
		}
	}
	return nil
}

var castagnoliTable = crc32.MakeTable(crc32.Castagnoli)

// appendRecords appends recs to extent on this server's extent node (the
// extent's primary), which replicates them and answers once enough
// replicas have them durably. It only starts the appends, in LSN order,
// and hands their waits to the acker: the next records go out while these
// are synced and replicated.
func (l *logReplica) appendRecords(extent uint64, recs []partition.Record) {
	l.mu.Lock()
	core := l.core
	l.mu.Unlock()
	for len(recs) > 0 && l.ctx.Err() == nil {
		req := &streampb.AppendRequest{Extent: extent}
		size := 0
		n := 0
		for n < len(recs) {
			b := partition.EncodeRecord(nil, recs[n])
			if n > 0 && size+len(b) > maxRecordBytes {
				break
			}
			size += len(b)
			en := &streampb.Entry{Seq: recs[n].LSN}
			for len(b) > 0 || len(en.Blocks) == 0 {
				k := min(len(b), stream.MaxBlockBytes)
				en.Blocks = append(en.Blocks, b[:k])
				en.Crcs = append(en.Crcs, crc32.Checksum(b[:k], castagnoliTable))
				b = b[k:]
			}
			req.Entries = append(req.Entries, en)
			n++
		}
		p := pendingAppend{core: core, extent: extent, recs: recs[:n]}
		p.wait, p.err = l.s.extents.StartAppend(req)
		select {
		case l.acks <- p:
		case <-l.ctx.Done():
			return
		}
		if p.err != nil {
			return // the acker handles the failure; nothing after it may go
		}
		recs = recs[n:]
	}
}

// pendingAppend is an append started on the extent node, waiting in the
// acker's queue.
type pendingAppend struct {
	core   *partition.Replica // the core that handed the records out
	extent uint64
	recs   []partition.Record
	wait   func(context.Context) (*streampb.AppendResponse, error)
	err    error // StartAppend refused it
}

// ackLoop takes the outcomes of the appends started, in the order they
// were started, to the core.
func (l *logReplica) ackLoop() {
	defer l.wg.Done()
	for {
		var p pendingAppend
		select {
		case p = <-l.acks:
		case <-l.ctx.Done():
			return
		}
		var resp *streampb.AppendResponse
		err := p.err
		if err == nil {
			resp, err = p.wait(l.ctx)
		}
		l.appendDone(p, resp, err)
		select {
		case l.kick <- struct{}{}:
		default:
		}
	}
}

// appendDone takes one append's outcome to the core: its records are
// durable, or the log is to be sealed and continued.
func (l *logReplica) appendDone(p pendingAppend, resp *streampb.AppendResponse, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.core != p.core || l.extent != p.extent || l.core.Role() != partition.RolePrimary || l.failedExtent == p.extent {
		// The log moved on meanwhile, the core was reset, or an earlier
		// append to this extent failed: the appends after a failure are
		// not acknowledged in order (the seal decides what the extent
		// keeps, and the core re-sends what it must).
		return
	}
	extent, recs := p.extent, p.recs
	if err != nil {
		l.failedExtent = extent
		l.core.AppendFailed()
		start := !l.resealing
		l.resealing = true
		epoch := l.core.Epoch()
		if start {
			l.log.Warn("commit log append failed; asking the master to seal and continue", "extent", extent, "err", err)
			l.wg.Add(1)
			go l.reseal(epoch, extent, err)
		}
		return
	}
	if len(resp.GetEntries()) > 0 && resp.GetEntries()[0].GetOffset() == 0 {
		_ = l.noteExtentLocked(extent, recs[0].LSN) // a primary appends after all it applied
	}
	var extEnd int64
	for i, en := range resp.GetEntries() {
		end := en.GetOffset()
		for _, s := range en.GetBlockSizes() {
			end += s
		}
		l.appended = append(l.appended, lsnEnd{lsn: recs[i].LSN, end: end})
		extEnd = max(extEnd, end)
	}
	last := recs[len(recs)-1].LSN
	l.core.Durable(last)
	if extEnd >= l.s.opts.LogExtentBytes && !l.resealing {
		// The log moves to a new extent now and then, so the master
		// can delete whole extents below what every replica flushed
		// (truncate.go). Writes pause for the seal and the next
		// extent's allocation, tens of milliseconds.
		l.resealing = true
		epoch := l.core.Epoch()
		l.log.Info("commit log extent full; moving to the next", "extent", extent, "bytes", extEnd)
		l.wg.Add(1)
		go l.reseal(epoch, extent, fmt.Errorf("extent %d holds %d bytes, the most one extent of a commit log takes (rolling over)", extent, extEnd))
	}
	// Forget positions below the commit point: only the in-flight
	// tail matters for a seal.
	k := 0
	for k < len(l.appended) && l.appended[k].lsn <= last {
		k++
	}
	l.appended = l.appended[k:]
}

// reseal asks the master to seal the failed extent and continue the log;
// the answer (or the map watch) brings the next extent.
func (l *logReplica) reseal(epoch, extent uint64, cause error) {
	defer l.wg.Done()
	for attempt := 0; l.ctx.Err() == nil; attempt++ {
		ctx, cancel := context.WithTimeout(l.ctx, 10*time.Second)
		var resp *api.PartitionLogFailedResponse
		err := l.s.withMaster(ctx, func(mc api.MasterClient) error {
			var err error
			resp, err = mc.PartitionLogFailed(ctx, &api.PartitionLogFailedRequest{
				ServerId: l.s.id(), PartitionId: l.pid, Epoch: epoch, Extent: extent, Reason: cause.Error(),
			})
			return err
		})
		cancel()
		if err == nil {
			l.s.raiseMinMapVersion(resp.GetMapVersion())
			if p := resp.GetPartition(); p != nil {
				l.update(p, l.s.id())
			}
			return
		}
		if !l.s.backoff(attempt) {
			return
		}
	}
}

// positions are the applied LSN and the commit point, for status reports.
func (l *logReplica) positions() (applied, commit uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.core.Applied(), l.core.CommitPoint()
}

// logCoprocPartition is a replicated partition as coprocessors see it:
// reads from the engine, and a call's commit as one log record whose reads
// are checked against the state including every write in flight.
type logCoprocPartition struct {
	*coproc.EnginePartition
	l *logReplica
}

// Info implements coproc.Partition: Primary follows the replica's role.
func (p *logCoprocPartition) Info() coproc.PartitionInfo {
	info := p.EnginePartition.Info()
	p.l.mu.Lock()
	info.Primary = p.l.want.role == partition.RolePrimary
	info.Epoch = p.l.want.epoch
	p.l.mu.Unlock()
	return info
}

// Commit implements coproc.Partition.
func (p *logCoprocPartition) Commit(ctx context.Context, reads []coproc.Read, batch []engines.Mutation) error {
	p.l.mu.Lock()
	want := p.l.want
	p.l.mu.Unlock()
	if want.role != partition.RolePrimary {
		return coproc.ErrReadOnly
	}
	if len(batch) == 0 {
		// Nothing to write: the reads are checked against what is
		// applied, as a read-only call sees it.
		return p.EnginePartition.Commit(ctx, reads, nil)
	}
	_, _, err := p.l.write(ctx, want.epoch, "", 0, func(get func([]byte) ([]byte, bool, error)) ([]engines.Mutation, []byte, error) {
		for _, r := range reads {
			v, found, err := get(r.Key)
			if err != nil {
				return nil, nil, fmt.Errorf("check read of %q: %w", r.Key, err)
			}
			if found != r.Existed || (found && !bytes.Equal(v, r.Value)) {
				return nil, nil, coproc.ErrConflict
			}
		}
		return batch, nil, nil
	})
	return err
}

// handoffFrom is the server a live handoff fences this term from, or
// "" when the map fences nothing.
func (l *logReplica) handoffFrom() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.handoff
}

// readState is the applied LSN and whether the replica serves as primary
// (caught up on the log it inherited, and not fenced by a live handoff).
func (l *logReplica) readState() (applied uint64, serving, copying bool, failed error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	serving = l.caughtUp && l.want.role == partition.RolePrimary && l.fatal == nil && l.reopening == nil && l.handoff == ""
	return l.core.Applied(), serving, l.needCopy && l.want.role == partition.RoleSecondary, l.fatal
}
