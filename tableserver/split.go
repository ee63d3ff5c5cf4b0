package tableserver

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/replication/partition"
)

// Splits (tablemaster/split.go has the whole protocol). The map marks a
// partition with a pending split; its primary appends one split record
// to the partition's log: a write whose single mutation puts splitKey,
// valued with the split (below), and refuses writes from then on
// (UNAVAILABLE partition_splitting). Every replica, primary and
// secondaries, applies that record at the same LSN and then, with nothing
// else to apply (the primary writes nothing after it), splits its engine
// into the children's directories (engines.Splitter: files shared, no
// record copied; memory engines split in RAM and are handed over), and
// reports the record's LSN in its heartbeat, sent at once. When the map
// replaces the parent by its children, each server opens its children
// from the split output: their applied LSN is the split record's, and
// each child's own log continues the LSNs after it, so nothing is reset
// and a secondary's tailer reads the child's log from its start.
//
// A server restarted while the split is pending recovers it: after the
// SPLIT marker, openSplitParent reports the split from the children on
// disk; before it, the log replays the record, or redoSplit splits at
// the record the engine already applied. A replica that had not split
// when the children appeared (it lagged, or was down until then) opens
// them empty and copies a snapshot from the child's primary, as any new
// replica does.

// splitKey is the reserved key of the split record's mutation. It lands
// in the parent's engine (the record applies like any other) and, as a
// reserved key, in both children, which delete it.
var splitKey = []byte(api.ReservedKeyPrefix + "log/split")

// The split record's value, little-endian; never change a version's
// layout:
//
//	| version (1, =1) | parent id (8) | api.PartitionSplit (protobuf) |
const splitRecordV1 = 1

func encodeSplitRecord(parent uint64, sp *api.PartitionSplit) ([]byte, error) {
	return encodeLogRecord(splitRecordV1, parent, sp)
}

// encodeLogRecord and decodeLogRecord are the layout the split and the
// merge records share: | version (1) | partition id (8) | protobuf m |.
func encodeLogRecord(version byte, pid uint64, m proto.Message) ([]byte, error) {
	b := binary.LittleEndian.AppendUint64([]byte{version}, pid)
	return proto.MarshalOptions{Deterministic: true}.MarshalAppend(b, m)
}

// decodeLogRecord decodes v into m; errors wrap bad.
func decodeLogRecord(v []byte, version byte, m proto.Message, bad error) (pid uint64, err error) {
	if len(v) < 9 || v[0] != version {
		return 0, fmt.Errorf("%w: %d bytes, version %v", bad, len(v), v[:min(1, len(v))])
	}
	if err := proto.Unmarshal(v[9:], m); err != nil {
		return 0, fmt.Errorf("%w: %v", bad, err)
	}
	return binary.LittleEndian.Uint64(v[1:]), nil
}

// logRecordOf is the record a write carries under key, decoded, if it is
// partition pid's.
func logRecordOf[M any](pid uint64, w partition.Write, key []byte, decode func([]byte) (uint64, M, error)) (m M, ok bool) {
	for _, mu := range w.Mutations {
		if mu.Kind == partition.MutPut && bytes.Equal(mu.Key, key) {
			if p, rec, err := decode(mu.Value); err == nil && p == pid {
				return rec, true
			}
		}
	}
	return m, false
}

// errSplitRecord: a split record this build cannot read.
var errSplitRecord = errors.New("tableserver: bad split record")

func decodeSplitRecord(v []byte) (parent uint64, sp *api.PartitionSplit, err error) {
	sp = &api.PartitionSplit{}
	if parent, err = decodeLogRecord(v, splitRecordV1, sp, errSplitRecord); err != nil {
		return 0, nil, err
	}
	if sp.GetLeftId() == 0 || sp.GetRightId() == 0 || sp.GetLeftId() == sp.GetRightId() || sp.GetHash() == 0 && len(sp.GetKey()) == 0 {
		return 0, nil, fmt.Errorf("%w: children %d and %d, hash %#x, key %q", errSplitRecord, sp.GetLeftId(), sp.GetRightId(), sp.GetHash(), sp.GetKey())
	}
	return parent, sp, nil
}

// splitOf returns the split a record's write carries, if it is the split
// record of partition pid.
func splitOf(pid uint64, w partition.Write) *api.PartitionSplit {
	sp, _ := logRecordOf(pid, w, splitKey, decodeSplitRecord)
	return sp
}

// splitState is a log replica's part in a split, under logReplica.mu.
type splitState struct {
	// pending is the map's split of this partition (nil: none).
	pending *api.PartitionSplit
	// launched: this primary is appending the split record (proposeSplit
	// runs); numbered: the record has its LSN, and writes are refused
	// from then on.
	launched, numbered bool
	// lsn is the split record's LSN once applied and the engine split; kids
	// the children's engines, open, handed over to their replicas here
	// (a disk table's are also complete in their directories, where a
	// restart finds them).
	lsn  uint64
	kids map[uint64]engines.Engine
	err  error
}

// splitRefusal is the answer to a write on a partition splitting or split:
// retryable, the SDK retries on the map with the children.
func (l *logReplica) splitRefusalLocked() error {
	switch {
	case l.split.lsn != 0:
		return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "partition_split", "partition %d split; its children take its keys (retry on the new map)", l.pid)
	case l.split.numbered:
		return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "partition_splitting", "partition %d is splitting; retry shortly", l.pid)
	}
	return nil
}

// proposeSplit appends the split record (a goroutine of the tailer: the
// write waits for its own apply, which splits the engine).
func (l *logReplica) proposeSplit(epoch uint64, sp *api.PartitionSplit) {
	defer l.wg.Done()
	val, err := encodeSplitRecord(l.pid, sp)
	if err != nil {
		l.log.Error("encode the split record", "err", err)
		return
	}
	numbered := false
	_, _, err = l.write(l.ctx, epoch, "", 0, func(func([]byte) ([]byte, bool, error)) ([]engines.Mutation, []byte, error) {
		// Under l.mu, as the record is numbered: no write after it.
		l.split.numbered, numbered = true, true
		return []engines.Mutation{{Key: splitKey, Value: val}}, nil, nil
	})
	if err != nil && !numbered {
		// Refused before it was numbered (the log is being
		// reconfigured, say): the tailer tries again.
		l.mu.Lock()
		l.split.launched = false
		l.mu.Unlock()
	}
	if err != nil && l.ctx.Err() == nil {
		l.log.Info("split record not appended yet; retrying", "err", err)
	}
}

// splitEngine splits the engine at the split record just applied (lsn),
// from the pump with applyMu held: nothing else applies meanwhile. The
// parent engine is closed whatever the outcome.
func (l *logReplica) splitEngine(lsn uint64, sp *api.PartitionSplit) error {
	start := time.Now()
	if l.crashPoint(lsn, false) {
		return fmt.Errorf("split partition %d at LSN %d: stopped before the engine split", l.pid, lsn)
	}
	spec := engines.SplitSpec{Hash: sp.GetHash(), Key: sp.GetKey()}
	ids := [2]uint64{sp.GetLeftId(), sp.GetRightId()}
	opts := [2]*engines.Options{&spec.Left, &spec.Right}
	for i, id := range ids {
		dir := ""
		if l.durable {
			dir = l.s.partitionDir(id)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return fmt.Errorf("split partition %d: make child %d's directory: %w", l.pid, id, err)
			}
		}
		*opts[i] = l.s.engineOptions(l.tableOpts, id, dir, true)
	}
	var left, right engines.Engine
	var err error
	if re := l.re; re != nil {
		left, right, err = re.splitEngine(spec)
	} else if sp, ok := l.engine.(engines.Splitter); ok {
		left, right, err = sp.Split(spec)
	} else {
		err = fmt.Errorf("engine %T does not split", l.engine)
	}
	if err != nil {
		return fmt.Errorf("split partition %d at LSN %d: %w", l.pid, lsn, err)
	}
	kids := map[uint64]engines.Engine{}
	var errs []error
	for i, e := range []engines.Engine{left, right} {
		// The record's own key is the parent's; the children drop it.
		if w, ok := e.(engines.Writer); ok {
			errs = append(errs, w.Apply([]engines.Mutation{{Key: splitKey, Delete: true}}))
		}
		kids[ids[i]] = e
	}
	if err := errors.Join(errs...); err != nil {
		for _, e := range kids {
			_ = e.Close()
		}
		return fmt.Errorf("split partition %d: finish the children: %w", l.pid, err)
	}
	if l.crashPoint(lsn, true) {
		for _, e := range kids {
			_ = e.Close()
		}
		return fmt.Errorf("split partition %d at LSN %d: stopped before reporting it", l.pid, lsn)
	}
	l.mu.Lock()
	l.split.lsn, l.split.kids = lsn, kids
	l.mu.Unlock()
	l.log.Info("partition split", "lsn", lsn, "left", ids[0], "right", ids[1], "took", time.Since(start))
	go func() {
		// Report it now: the master replaces the parent by its children
		// on this report.
		if err := l.s.heartbeat(false); err != nil {
			l.log.Debug("report the split", "err", err)
		}
	}()
	return nil
}

// splitLSN is the LSN the replica split at (0: not split).
func (l *logReplica) splitLSN() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.split.lsn
}

// takeChild stops the (parent) replica and hands over child id's engine,
// open, or nil if the parent did not split here (the child copies).
// split reports whether the parent split on this server.
func (l *logReplica) takeChild(id uint64) (e engines.Engine, split bool) {
	l.close()
	l.mu.Lock()
	defer l.mu.Unlock()
	e = l.split.kids[id]
	delete(l.split.kids, id)
	return e, l.split.lsn != 0
}

// closeKids closes the children's engines never handed over.
func (l *logReplica) closeKids() {
	l.mu.Lock()
	kids := l.split.kids
	l.split.kids = nil
	l.mu.Unlock()
	for _, e := range kids {
		_ = e.Close()
	}
}

// splitEngine splits the current incarnation once the calls on it are
// done; the reopenable is closed after (every call: ErrClosed).
func (r *reopenable) splitEngine(spec engines.SplitSpec) (engines.Engine, engines.Engine, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.cur.Swap(nil)
	r.closed.Store(true)
	if g == nil {
		return nil, nil, engines.ErrClosed
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
	sp, ok := g.e.(engines.Splitter)
	if !ok {
		return nil, nil, errors.Join(fmt.Errorf("engine %T does not split", g.e), g.e.Close())
	}
	return sp.Split(spec)
}

// prepareChild readies a split child's directory before its replica
// opens it, on a server that held the parent (parent) or may have. A
// child directory is the split's output only if the parent's directory
// holds the SPLIT marker, or is gone (removed after the split finished);
// a parent directory without the marker means the split did not finish
// here: whatever the child's directory holds is discarded, and the
// replica opens empty and copies.
func (s *Server) prepareChild(p *api.Partition) error {
	parentDir := s.partitionDir(p.GetSplitFrom())
	if _, err := os.Stat(parentDir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	_, _, done, err := engines.SplitDone(s.opts.EngineFS, parentDir)
	if err != nil {
		return fmt.Errorf("partition %d: read its parent's split marker: %w", p.GetId(), err)
	}
	if !done {
		return s.removePartitionDir(p.GetId())
	}
	return nil
}

// redoSplit finishes a split whose record the engine applied before a
// restart but did not commit (no SPLIT marker): the record is the last
// the engine applied, so the log will not apply it again. It splits at it
// now, before the pump runs. applied is the engine's applied LSN, the
// record's (the record and the LSN apply in one batch).
func (l *logReplica) redoSplit(applied uint64) error {
	if _, ok := l.engine.(*mergeGone); l.split.lsn != 0 || ok {
		return nil
	}
	v, _, err := l.engine.Get(splitKey)
	if errors.Is(err, engines.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("partition %d: read its split record: %w", l.pid, err)
	}
	parent, sp, err := decodeSplitRecord(v)
	if err != nil || parent != l.pid {
		// A child holding its parent's record (the delete after the
		// split not yet flushed): not a split of this partition.
		return nil
	}
	l.log.Info("redoing the split applied before a restart", "lsn", applied)
	return l.splitEngine(applied, sp)
}

// openSplitParent stands in for the engine of partition p, which split
// here (its directory holds the SPLIT marker naming leftDir and rightDir)
// before a restart, while the map still shows the split pending: it opens
// the children from the split output, to be handed over when the map
// shows them, and reports the split at the children's applied LSN (the
// split record's: it applied in the same batch, and the children are
// durable once the marker is written).
func (s *Server) openSplitParent(t *api.Table, p *api.Partition, leftDir, rightDir string) (engines.Engine, error) {
	sp := p.GetSplit()
	if sp == nil {
		return nil, fmt.Errorf("partition %d split here (SPLIT marker) but the map shows no split pending; waiting for the map's children", p.GetId())
	}
	kind := engines.Kind(api.KindName(t.GetKind()))
	ids := [2]uint64{sp.GetLeftId(), sp.GetRightId()}
	g := &splitGone{kids: map[uint64]engines.Engine{}}
	for i, dir := range []string{leftDir, rightDir} {
		if filepath.Clean(dir) != filepath.Clean(s.partitionDir(ids[i])) {
			_ = g.closeKids()
			return nil, fmt.Errorf("partition %d: its SPLIT marker names %q, not child %d's directory", p.GetId(), dir, ids[i])
		}
		e, err := engines.Open(kind, s.engineOptions(t, ids[i], dir, true))
		if err != nil {
			_ = g.closeKids()
			return nil, fmt.Errorf("partition %d: open child %d from the split output: %w", p.GetId(), ids[i], err)
		}
		g.kids[ids[i]] = e
	}
	lsn, err := readAppliedLSN(g.kids[ids[0]])
	if err == nil && lsn == 0 {
		err = fmt.Errorf("no applied LSN: %w", engines.ErrCorrupt)
	}
	if err != nil {
		_ = g.closeKids()
		return nil, fmt.Errorf("partition %d: read the split LSN from child %d: %w", p.GetId(), ids[0], err)
	}
	g.lsn = lsn
	s.log.Info("partition split before a restart; reporting it", "partition", p.GetId(), "lsn", lsn)
	go func() {
		if err := s.heartbeat(false); err != nil {
			s.log.Debug("report the split", "err", err)
		}
	}()
	return g, nil
}

// splitGone is the engine of a partition that split before a restart: its
// files are the children's. It answers the applied LSN (the split's) and
// refuses everything else as a split engine does (closed). kids are the
// children's engines, handed to the log replica (which owns them from
// then on). Safe for concurrent use (immutable).
type splitGone struct {
	lsn  uint64
	kids map[uint64]engines.Engine
}

func (g *splitGone) Get(key []byte) ([]byte, int64, error) {
	if bytes.Equal(key, appliedLSNKey) {
		return binary.LittleEndian.AppendUint64(nil, g.lsn), 0, nil
	}
	return nil, 0, engines.ErrClosed
}
func (g *splitGone) Scan(func(engines.Record) error) error { return engines.ErrClosed }
func (g *splitGone) Stats() engines.Stats                  { return engines.Stats{} }
func (g *splitGone) Close() error                          { return nil }
func (g *splitGone) Apply([]engines.Mutation) error        { return engines.ErrClosed }
func (g *splitGone) Delete([]byte) (bool, error)           { return false, engines.ErrClosed }
func (g *splitGone) CompareAndSwap(engines.CAS) (engines.CASResult, error) {
	return engines.CASResult{}, engines.ErrClosed
}

func (g *splitGone) closeKids() error {
	var errs []error
	for _, e := range g.kids {
		errs = append(errs, e.Close())
	}
	return errors.Join(errs...)
}

// crashPoint runs Options.OnSplit and reports whether the replica stopped
// meanwhile (the split goes no further, as after a crash there).
func (l *logReplica) crashPoint(lsn uint64, committed bool) bool {
	if f := l.s.opts.OnSplit; f != nil {
		f(l.ctx, l.pid, lsn, committed)
	}
	return l.ctx.Err() != nil
}
