package tableserver

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/replication/partition"
)

// Merges (tablemaster/merge.go has the whole protocol): the inverse of a
// split. The map marks two adjacent partitions with a pending merge; once
// their replicas are on the same servers with the same primary (the
// master aligns them), each primary appends one merge record to its
// partition's log: a write whose single mutation puts mergeKey, valued
// with the merge (below), and refuses writes from then on (UNAVAILABLE
// partition_merging). Every replica applies its record and stops
// applying (the primary writes nothing after it). A server holding both
// parents, once both applied their records, merges the two engines into
// the child's directory (engines.Merger: the left's files shared, the
// right's records copied; memory engines copied in RAM) and reports both
// records' LSNs in its heartbeat. When the map replaces the parents by
// the child, the left's replica hands the merged engine over: its
// applied LSN is the larger of the two records' LSNs, and the child's log
// continues after it.
//
// Before merging, both parents' engines get that applied LSN and the two
// records' LSNs (mergeLSNsKey), so the merged engine holds them whichever
// side's reserved keys win. A server restarted while the merge is pending
// recovers it: after the MERGED marker, openMergeParent opens the merged
// engine (the left's files are shared with it and never reopened) and
// the right's replica, opened as usual, finds its record applied; before
// the marker, both parents reopen, find their records applied (the log
// replays them, or redoMerge reads them from the engine) and merge again.
// A replica that had not merged when the child appeared opens it empty
// and copies a snapshot from the child's primary.

// mergeKey is the reserved key of the merge record's mutation; the merged
// engine deletes it.
var mergeKey = []byte(api.ReservedKeyPrefix + "log/merge")

// mergeLSNsKey holds, in a merged engine, the LSNs of the left's and the
// right's merge records (16 bytes, little-endian).
var mergeLSNsKey = []byte(api.ReservedKeyPrefix + "log/merge-lsns")

// The merge record's value, little-endian; never change a version's
// layout:
//
//	| version (1, =1) | partition id (8) | api.PartitionMerge (protobuf) |
//
// The partition id is the partition whose log holds the record (the left
// or the right).
const mergeRecordV1 = 1

func encodeMergeRecord(pid uint64, mg *api.PartitionMerge) ([]byte, error) {
	return encodeLogRecord(mergeRecordV1, pid, mg)
}

// errMergeRecord: a merge record this build cannot read.
var errMergeRecord = errors.New("tableserver: bad merge record")

func decodeMergeRecord(v []byte) (pid uint64, mg *api.PartitionMerge, err error) {
	mg = &api.PartitionMerge{}
	if pid, err = decodeLogRecord(v, mergeRecordV1, mg, errMergeRecord); err != nil {
		return 0, nil, err
	}
	l, r, c := mg.GetLeftId(), mg.GetRightId(), mg.GetChildId()
	if l == 0 || r == 0 || c == 0 || l == r || c == l || c == r || pid != l && pid != r {
		return 0, nil, fmt.Errorf("%w: partition %d, left %d, right %d, child %d", errMergeRecord, pid, l, r, c)
	}
	return pid, mg, nil
}

// mergeOf returns the merge a record's write carries, if it is the merge
// record of partition pid.
func mergeOf(pid uint64, w partition.Write) *api.PartitionMerge {
	mg, _ := logRecordOf(pid, w, mergeKey, decodeMergeRecord)
	return mg
}

// mergeState is a log replica's part in a merge, under logReplica.mu.
type mergeState struct {
	// pending is the map's merge of this partition (nil: none); aligned:
	// the map has both partitions on the same servers with the same
	// primary (the records may be written).
	pending *api.PartitionMerge
	aligned bool
	// launched: this primary is appending the merge record; numbered:
	// the record has its LSN, and writes are refused from then on.
	launched, numbered bool
	// applied is the merge record's LSN once applied (nothing applies
	// after it); lsn is the same once both parents' engines merged here
	// (reported). child is the merged engine, open, held by the left's
	// replica until the child's replica takes it.
	applied, lsn uint64
	rec          *api.PartitionMerge
	child        engines.Engine
}

// mergeRefusalLocked is the answer to a write on a partition merging or
// merged: retryable, the SDK retries on the map with the child.
func (l *logReplica) mergeRefusalLocked() error {
	switch {
	case l.merge.applied != 0:
		return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "partition_merged", "partition %d merged; its child takes its keys (retry on the new map)", l.pid)
	case l.merge.numbered:
		return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "partition_merging", "partition %d is merging; retry shortly", l.pid)
	}
	return nil
}

// setMerge applies the map's merge of the partition: mg (nil: none) and
// whether the two partitions are aligned.
func (l *logReplica) setMerge(mg *api.PartitionMerge, aligned bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if (mg == nil) != (l.merge.pending == nil) || aligned != l.merge.aligned {
		l.merge.pending, l.merge.aligned = mg, aligned
		l.wake() // a primary appends the merge record (tailOnce)
	}
}

// mergeAligned reports whether partition p's pending merge may write its
// records by map m: both partitions have replicas on the same servers
// with the same primary.
func mergeAligned(m *api.PartitionMap, p *api.Partition) bool {
	mg := p.GetMerge()
	if mg == nil {
		return false
	}
	other := mg.GetLeftId()
	if other == p.GetId() {
		other = mg.GetRightId()
	}
	var q *api.Partition
	for _, x := range m.GetPartitions() {
		if x.GetId() == other {
			q = x
		}
	}
	if q == nil || len(q.GetReplicas()) != len(p.GetReplicas()) {
		return false
	}
	pp, qp := primaryOf(p), primaryOf(q)
	if pp == nil || qp == nil || pp.GetServerId() != qp.GetServerId() {
		return false
	}
	for _, r := range p.GetReplicas() {
		if !slices.ContainsFunc(q.GetReplicas(), func(x *api.Replica) bool { return x.GetServerId() == r.GetServerId() }) {
			return false
		}
	}
	return true
}

// proposeMerge appends the merge record (a goroutine of the tailer).
func (l *logReplica) proposeMerge(epoch uint64, mg *api.PartitionMerge) {
	defer l.wg.Done()
	val, err := encodeMergeRecord(l.pid, mg)
	if err != nil {
		l.log.Error("encode the merge record", "err", err)
		return
	}
	numbered := false
	_, _, err = l.write(l.ctx, epoch, "", 0, func(func([]byte) ([]byte, bool, error)) ([]engines.Mutation, []byte, error) {
		// Under l.mu, as the record is numbered: no write after it.
		l.merge.numbered, numbered = true, true
		return []engines.Mutation{{Key: mergeKey, Value: val}}, nil, nil
	})
	if err != nil && !numbered {
		l.mu.Lock()
		l.merge.launched = false
		l.mu.Unlock()
	}
	if err != nil && l.ctx.Err() == nil {
		l.log.Info("merge record not appended yet; retrying", "err", err)
	}
}

// mergeApplied: the replica applied its merge record at lsn (from the
// pump, or at open for a record applied before a restart). Nothing
// applies after it; the server merges once the other parent is there too.
func (l *logReplica) mergeApplied(lsn uint64, mg *api.PartitionMerge) {
	l.mu.Lock()
	if l.merge.applied != 0 {
		l.mu.Unlock()
		return
	}
	l.merge.applied, l.merge.rec = lsn, mg
	l.mu.Unlock()
	l.log.Info("merge record applied", "lsn", lsn, "child", mg.GetChildId())
	l.s.mergeReady(l, mg)
}

// redoMerge finds a merge record the engine applied before a restart: the
// record is the last the engine applied (applied).
func (l *logReplica) redoMerge(applied uint64) error {
	if l.split.lsn != 0 {
		return nil
	}
	v, _, err := l.engine.Get(mergeKey)
	if errors.Is(err, engines.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("partition %d: read its merge record: %w", l.pid, err)
	}
	pid, mg, err := decodeMergeRecord(v)
	if err != nil || pid != l.pid {
		// A merged engine holding a parent's record (its delete not yet
		// flushed): not a merge of this partition.
		return nil
	}
	l.log.Info("merge record applied before a restart", "lsn", applied)
	l.merge.applied, l.merge.rec = applied, mg
	return nil
}

// mergeJob pairs the two parents' replicas of a merge on this server. A
// replica closing leaves it (forgetMerge) before it waits for its
// goroutines, the merge's among them: a merge starts only with both
// replicas open.
type mergeJob struct {
	left, right *logReplica
	running     bool
	done        bool
}

// mergeReady registers l, whose merge record applied, with its merge; the
// second of the two parents starts the engines' merge.
func (s *Server) mergeReady(l *logReplica, mg *api.PartitionMerge) {
	s.mergeMu.Lock()
	defer s.mergeMu.Unlock()
	if s.merges == nil {
		s.merges = map[uint64]*mergeJob{}
	}
	j := s.merges[mg.GetChildId()]
	if j == nil {
		j = &mergeJob{}
		s.merges[mg.GetChildId()] = j
	}
	if l.pid == mg.GetLeftId() {
		j.left = l
	} else {
		j.right = l
	}
	l.mu.Lock()
	leftDone := l.merge.lsn != 0 && l.pid == mg.GetLeftId()
	l.mu.Unlock()
	if leftDone {
		j.done = true // merged before a restart (openMergeParent)
	}
	switch {
	case j.left == nil || j.right == nil || j.running:
	case j.done:
		// The other side merged already (before a restart): this one's
		// part is done too.
		for _, x := range []*logReplica{j.left, j.right} {
			x.mu.Lock()
			if x.merge.lsn == 0 {
				x.merge.lsn = x.merge.applied
			}
			x.mu.Unlock()
		}
		go s.reportMerge()
	default:
		// Both replicas wait for the merge as they close (close waits for
		// wg): the child's replica takes the merged engine only once the
		// merge is over, and neither engine closes under it.
		j.running = true
		j.left.wg.Add(1)
		j.right.wg.Add(1)
		go func() {
			defer j.left.wg.Done()
			defer j.right.wg.Done()
			s.runMerge(j, mg)
		}()
	}
}

// forgetMerge drops l from the merges it waits in (it closes).
func (s *Server) forgetMerge(l *logReplica) {
	s.mergeMu.Lock()
	defer s.mergeMu.Unlock()
	for id, j := range s.merges {
		if j.left == l || j.right == l {
			delete(s.merges, id)
		}
	}
}

func (s *Server) reportMerge() {
	if err := s.heartbeat(false); err != nil {
		s.log.Debug("report the merge", "err", err)
	}
}

// runMerge merges the engines of job j's parents into the child's.
func (s *Server) runMerge(j *mergeJob, mg *api.PartitionMerge) {
	L, R := j.left, j.right
	child := mg.GetChildId()
	err := s.mergeEngines(L, R, child)
	s.mergeMu.Lock()
	j.running = false
	j.done = err == nil
	s.mergeMu.Unlock()
	if err != nil {
		if L.ctx.Err() == nil && R.ctx.Err() == nil {
			s.log.Error("merge partitions failed", "left", L.pid, "right", R.pid, "child", child, "err", err)
		}
		return
	}
	go s.reportMerge() // the master replaces the parents on this report
}

func (s *Server) mergeEngines(L, R *logReplica, child uint64) error {
	start := time.Now()
	L.mu.Lock()
	lsnL := L.merge.applied
	L.mu.Unlock()
	R.mu.Lock()
	lsnR := R.merge.applied
	R.mu.Unlock()
	if s.mergeCrashPoint(L, child, false) {
		return fmt.Errorf("merge into %d: stopped before the engines' merge", child)
	}
	// Both parents get the child's applied LSN and the records' LSNs: the
	// merged engine has them whichever side's reserved keys win.
	hi := max(lsnL, lsnR)
	lsns := binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, lsnL), lsnR)
	for _, x := range []*logReplica{L, R} {
		if err := x.writer.Apply([]engines.Mutation{
			{Key: appliedLSNKey, Value: binary.LittleEndian.AppendUint64(nil, hi), Cold: true},
			{Key: mergeLSNsKey, Value: lsns, Cold: true},
		}); err != nil {
			return fmt.Errorf("merge into %d: record the LSNs in partition %d: %w", child, x.pid, err)
		}
	}
	dir := ""
	if L.durable {
		dir = s.partitionDir(child)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("merge into %d: make its directory: %w", child, err)
		}
	}
	le, err := L.detachEngine()
	if err != nil {
		return fmt.Errorf("merge into %d: %w", child, err)
	}
	re, err := R.detachEngine()
	if err != nil {
		return errors.Join(fmt.Errorf("merge into %d: %w", child, err), le.Close())
	}
	mr, ok := le.(engines.Merger)
	if !ok {
		return errors.Join(fmt.Errorf("merge into %d: engine %T does not merge", child, le), le.Close(), re.Close())
	}
	merged, err := mr.Merge(re, s.engineOptions(L.tableOpts, child, dir, true))
	if err != nil {
		return fmt.Errorf("merge partitions %d and %d into %d: %w", L.pid, R.pid, child, err)
	}
	if w, ok := merged.(engines.Writer); ok {
		// The records' own key is the parents'; the child drops it.
		if err := w.Apply([]engines.Mutation{{Key: mergeKey, Delete: true}}); err != nil {
			return errors.Join(fmt.Errorf("merge into %d: finish the child: %w", child, err), merged.Close())
		}
	}
	if s.mergeCrashPoint(L, child, true) {
		return errors.Join(fmt.Errorf("merge into %d: stopped before reporting it", child), merged.Close())
	}
	L.mu.Lock()
	L.merge.lsn, L.merge.child = lsnL, merged
	L.mu.Unlock()
	R.mu.Lock()
	R.merge.lsn = lsnR
	R.mu.Unlock()
	s.log.Info("partitions merged", "left", L.pid, "right", R.pid, "child", child, "left_lsn", lsnL, "right_lsn", lsnR, "took", time.Since(start))
	return nil
}

// detachEngine takes the replica's engine away for a merge: the calls on
// it done, every later one fails (ErrClosed).
func (l *logReplica) detachEngine() (engines.Engine, error) {
	if re := l.re; re != nil {
		return re.detach()
	}
	return l.engine, nil
}

// detach takes the current incarnation away once the calls on it are
// done; the reopenable is closed after (every call: ErrClosed).
func (r *reopenable) detach() (engines.Engine, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.cur.Swap(nil)
	r.closed.Store(true)
	if g == nil {
		return nil, engines.ErrClosed
	}
	g.closing.Store(true)
	if g.refs.Load() == 0 {
		g.once.Do(func() { close(g.drained) })
	}
	t := time.NewTimer(closeDrainWait)
	defer t.Stop()
	select {
	case <-g.drained:
	case <-t.C:
	}
	return g.e, nil
}

// mergeLSN is the LSN of the partition's merge record once its engine
// merged here (0: not merged).
func (l *logReplica) mergeLSN() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.merge.lsn
}

// takeMerged stops the (left parent's) replica and hands over the merged
// engine, open, or nil if the parents did not merge here (the child
// copies).
func (l *logReplica) takeMerged() engines.Engine {
	l.close()
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.merge.child
	l.merge.child = nil
	return e
}

// closeMerged closes a merged engine never handed over.
func (l *logReplica) closeMerged() {
	l.mu.Lock()
	e := l.merge.child
	l.merge.child = nil
	l.mu.Unlock()
	if e != nil {
		_ = e.Close()
	}
}

// prepareMergeChild readies a merge child's directory before its replica
// opens it. The directory is the merge's output if it holds the MERGED
// marker; otherwise, if the left parent's directory is still here, the
// merge did not finish here: whatever the child's directory holds is
// discarded, and the replica opens empty and copies.
func (s *Server) prepareMergeChild(p *api.Partition) error {
	_, _, done, err := engines.MergeDone(s.opts.EngineFS, s.partitionDir(p.GetId()))
	if err != nil {
		return fmt.Errorf("partition %d: read its merge marker: %w", p.GetId(), err)
	}
	if done {
		return nil
	}
	if _, err := os.Stat(s.partitionDir(p.GetMergeLeft())); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return s.removePartitionDir(p.GetId())
}

// mergedHere reports whether the left parent p of a pending merge merged
// here before a restart: the child's directory holds the MERGED marker
// naming p's directory.
func (s *Server) mergedHere(p *api.Partition) (bool, error) {
	mg := p.GetMerge()
	if mg == nil || mg.GetLeftId() != p.GetId() {
		return false, nil
	}
	left, _, done, err := engines.MergeDone(s.opts.EngineFS, s.partitionDir(mg.GetChildId()))
	if err != nil {
		return false, fmt.Errorf("partition %d: read its merge's marker: %w", p.GetId(), err)
	}
	return done && filepath.Clean(left) == filepath.Clean(s.partitionDir(p.GetId())), nil
}

// openMergeParent stands in for the engine of partition p, the left
// parent of a merge that finished here before a restart (MERGED marker)
// while the map still shows it pending: it opens the merged engine, to be
// handed over when the map shows the child, and reports the merge.
func (s *Server) openMergeParent(t *api.Table, p *api.Partition) (engines.Engine, error) {
	mg := p.GetMerge()
	kind := engines.Kind(api.KindName(t.GetKind()))
	e, err := engines.Open(kind, s.engineOptions(t, mg.GetChildId(), s.partitionDir(mg.GetChildId()), true))
	if err != nil {
		return nil, fmt.Errorf("partition %d: open child %d from the merge output: %w", p.GetId(), mg.GetChildId(), err)
	}
	v, _, err := e.Get(mergeLSNsKey)
	if err == nil && len(v) != 16 {
		err = fmt.Errorf("merge LSNs of %d bytes: %w", len(v), engines.ErrCorrupt)
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("partition %d: read the merge LSNs from child %d: %w", p.GetId(), mg.GetChildId(), err), e.Close())
	}
	lsnL := binary.LittleEndian.Uint64(v)
	s.log.Info("partitions merged before a restart", "left", p.GetId(), "child", mg.GetChildId(), "lsn", lsnL)
	return &mergeGone{lsn: lsnL, mg: mg, child: e}, nil
}

// mergeGone is the engine of a left parent that merged before a restart:
// its files are the child's. It answers the applied LSN (its merge
// record's) and refuses everything else (closed). child is the merged
// engine, handed to the log replica.
type mergeGone struct {
	lsn   uint64
	mg    *api.PartitionMerge
	child engines.Engine
	// taken: the log replica took child (else Close closes it).
	taken atomic.Bool
}

// take hands child over to the log replica, once.
func (g *mergeGone) take() engines.Engine {
	if g.taken.CompareAndSwap(false, true) {
		return g.child
	}
	return nil
}

func (g *mergeGone) Get(key []byte) ([]byte, int64, error) {
	if bytes.Equal(key, appliedLSNKey) {
		return binary.LittleEndian.AppendUint64(nil, g.lsn), 0, nil
	}
	return nil, 0, engines.ErrClosed
}
func (g *mergeGone) Scan(func(engines.Record) error) error { return engines.ErrClosed }
func (g *mergeGone) Stats() engines.Stats                  { return engines.Stats{} }
func (g *mergeGone) Close() error {
	if e := g.take(); e != nil {
		return e.Close() // never handed over (the replica did not open)
	}
	return nil
}
func (g *mergeGone) Apply([]engines.Mutation) error { return engines.ErrClosed }
func (g *mergeGone) Delete([]byte) (bool, error)    { return false, engines.ErrClosed }
func (g *mergeGone) CompareAndSwap(engines.CAS) (engines.CASResult, error) {
	return engines.CASResult{}, engines.ErrClosed
}

// mergeCrashPoint runs Options.OnMerge and reports whether a replica of
// the merge stopped meanwhile (the merge goes no further, as after a
// crash there).
func (s *Server) mergeCrashPoint(l *logReplica, child uint64, committed bool) bool {
	if f := s.opts.OnMerge; f != nil {
		f(l.ctx, child, committed)
	}
	return l.ctx.Err() != nil
}
