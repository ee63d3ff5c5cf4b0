package ordered

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/cockroachdb/pebble/v2"
	pebblevfs "github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/vfs"
)

var (
	_ engines.Splitter = (*Engine)(nil)
	_ engines.Merger   = (*Engine)(nil)
)

// splitHook, when set (tests), runs after each step of a disk split or
// merge; an error it returns stops the operation there, as a crash would.
var splitHook func(step string) error

func hook(step string) error {
	if splitHook != nil {
		return splitHook(step)
	}
	return nil
}

// span is a key range [start, end); end nil: unbounded.
type span struct{ start, end []byte }

// sharedSpan is where engines.SharedKey's keys are.
var sharedSpan = span{[]byte(engines.SharedPrefix), prefixEnd([]byte(engines.SharedPrefix))}

// prefixEnd is the least key above every key with prefix p.
func prefixEnd(p []byte) []byte {
	end := bytes.Clone(p)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// minus is s without cut: at most two spans.
func (s span) minus(cut span) []span {
	var out []span
	// Before cut.
	if e := minEnd(s.end, cut.start); e == nil || bytes.Compare(s.start, e) < 0 {
		out = append(out, span{s.start, e})
	}
	// After cut.
	if cut.end != nil {
		st := s.start
		if bytes.Compare(cut.end, st) > 0 {
			st = cut.end
		}
		if s.end == nil || bytes.Compare(st, s.end) < 0 {
			out = append(out, span{st, s.end})
		}
	}
	return out
}

// minEnd is the lesser of two span ends (nil: unbounded).
func minEnd(a, b []byte) []byte {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	case bytes.Compare(a, b) < 0:
		return a
	}
	return b
}

// Split divides the engine at spec.Key (see engines.Splitter). An engine
// in memory copies its records into two new ones. One on disk flushes its
// memtables and makes each child a pebble checkpoint (its sstables hard
// linked, restricted to the ones that overlap the child's keys), closes,
// then opens each child and excises the other child's keys (pebble's
// Excise: the sstables that straddle the split point become virtual ones
// over the same files, so nothing is rewritten; RATIONALE.md, "Splitting
// and merging partitions"). The SPLIT marker then commits the split.
func (e *Engine) Split(spec engines.SplitSpec) (left, right engines.Engine, err error) {
	if len(spec.Key) == 0 {
		return nil, nil, errors.Join(fmt.Errorf("split ordered engine: %w: empty split key", engines.ErrSplitSpec), e.Close())
	}
	if !e.enter() {
		return nil, nil, engines.ErrClosed
	}
	disk := !e.memory && e.fs == pebblevfs.Default
	e.exit()
	if !disk {
		return e.splitCopy(spec)
	}
	return e.splitDisk(spec)
}

func (e *Engine) splitCopy(spec engines.SplitSpec) (_, _ engines.Engine, err error) {
	var kids [2]*Engine
	defer func() {
		if err != nil {
			for _, k := range kids {
				if k != nil {
					err = errors.Join(err, k.Close())
				}
			}
		}
		err = errors.Join(err, e.Close())
	}()
	for i, o := range []engines.Options{spec.Left, spec.Right} {
		if kids[i], err = Open(o); err != nil {
			return nil, nil, fmt.Errorf("split ordered engine: open child: %w", err)
		}
		left := i == 0
		keep := func(key []byte) bool {
			l, r := engines.SplitSide(spec, false, key, 0)
			return left && l || !left && r
		}
		if err = engines.CopyRecords(kids[i], e, keep); err != nil {
			return nil, nil, fmt.Errorf("split ordered engine: %w", err)
		}
	}
	return kids[0], kids[1], nil
}

// checkpoint flushes the memtables and makes dir (cleared first) a
// checkpoint of the engine restricted to the sstables overlapping keep.
func (e *Engine) checkpoint(dir string, keep []span) error {
	if !e.enter() {
		return engines.ErrClosed
	}
	defer e.exit()
	if err := e.db.Flush(); err != nil {
		return fmt.Errorf("flush memtables: %w", wrapPebble(err))
	}
	if err := engines.RemoveDir(vfs.Default, dir); err != nil {
		return err
	}
	if err := vfs.Default.MkdirAll(filepath.Dir(filepath.Clean(dir)), 0o755); err != nil {
		return fmt.Errorf("make parent of %s: %w", dir, err)
	}
	var opts []pebble.CheckpointOption
	last, err := e.upper()
	if err != nil {
		return err
	}
	if keep != nil && last != nil {
		var spans []pebble.CheckpointSpan
		for _, s := range keep {
			end := s.end
			if end == nil {
				end = last
			}
			spans = append(spans, pebble.CheckpointSpan{Start: s.start, End: end})
		}
		opts = append(opts, pebble.WithRestrictToSpans(spans))
	}
	if err := e.db.Checkpoint(dir, opts...); err != nil {
		return fmt.Errorf("checkpoint into %s: %w", dir, wrapPebble(err))
	}
	// The checkpoint's name in its parent.
	if err := vfs.Default.SyncDir(filepath.Dir(filepath.Clean(dir))); err != nil {
		return fmt.Errorf("checkpoint into %s: %w", dir, err)
	}
	return nil
}

// upper is the least key above every key stored (nil: none stored).
func (e *Engine) upper() ([]byte, error) {
	it, err := e.db.NewIter(nil)
	if err != nil {
		return nil, wrapPebble(err)
	}
	var last []byte
	if it.Last() {
		last = append(bytes.Clone(it.Key()), 0)
	}
	if err := it.Close(); err != nil {
		return nil, wrapPebble(err)
	}
	return last, nil
}

// excise removes the keys of drop from e, durably.
func (e *Engine) excise(drop []span) error {
	if !e.enter() {
		return engines.ErrClosed
	}
	defer e.exit()
	last, err := e.upper()
	if err != nil {
		return err
	}
	if last == nil {
		return nil // empty
	}
	for _, s := range drop {
		end := s.end
		if end == nil {
			end = last
		}
		if bytes.Compare(s.start, end) >= 0 {
			continue
		}
		if err := e.db.Excise(context.Background(), pebble.KeyRange{Start: s.start, End: end}); err != nil {
			return fmt.Errorf("excise [%q, %q): %w", s.start, end, wrapPebble(err))
		}
	}
	if err := e.db.Flush(); err != nil {
		return fmt.Errorf("flush: %w", wrapPebble(err))
	}
	return e.count()
}

func (e *Engine) splitDisk(spec engines.SplitSpec) (_, _ engines.Engine, err error) {
	dir := e.opts.Dir
	if err := engines.CheckSplitSpec(dir, spec); err != nil {
		return nil, nil, errors.Join(fmt.Errorf("split ordered engine: %w", err), e.Close())
	}
	keys := [2]span{{[]byte{}, spec.Key}, {spec.Key, nil}}
	for i, o := range []engines.Options{spec.Left, spec.Right} {
		if err := e.checkpoint(o.Dir, []span{keys[i], sharedSpan}); err != nil {
			return nil, nil, errors.Join(fmt.Errorf("split ordered engine: %w", err), e.Close())
		}
		if err := hook("checkpoint"); err != nil {
			return nil, nil, errors.Join(err, e.Close())
		}
	}
	if err := e.Close(); err != nil {
		return nil, nil, fmt.Errorf("split ordered engine: close parent: %w", err)
	}
	var kids [2]*Engine
	defer func() {
		if err != nil {
			for _, k := range kids {
				if k != nil {
					err = errors.Join(err, k.Close())
				}
			}
		}
	}()
	for i, o := range []engines.Options{spec.Left, spec.Right} {
		if kids[i], err = openFS(o, pebblevfs.Default, nil); err != nil {
			return nil, nil, fmt.Errorf("split ordered engine: open child in %s: %w", o.Dir, err)
		}
		var drop []span
		for _, s := range (span{[]byte{}, nil}).minus(keys[i]) {
			drop = append(drop, s.minus(sharedSpan)...)
		}
		if err = kids[i].excise(drop); err != nil {
			return nil, nil, fmt.Errorf("split ordered engine: child in %s: %w", o.Dir, err)
		}
		if err := hook("excise"); err != nil {
			return nil, nil, err
		}
	}
	if err := engines.CommitSplit(vfs.Default, dir, spec.Left.Dir, spec.Right.Dir); err != nil {
		return nil, nil, fmt.Errorf("split ordered engine: %w", err)
	}
	return kids[0], kids[1], nil
}

// Merge makes one engine in opts.Dir of e and right (see engines.Merger).
// In memory both are copied into a new engine; on disk the merged engine
// is a checkpoint of e (its sstables hard-linked) into which right's live
// records are copied, then the MERGED marker commits it.
func (e *Engine) Merge(right engines.Engine, opts engines.Options) (_ engines.Engine, err error) {
	if !e.enter() {
		return nil, errors.Join(engines.ErrClosed, right.Close())
	}
	disk := !e.memory && e.fs == pebblevfs.Default
	e.exit()
	var m *Engine
	defer func() {
		if err != nil && m != nil {
			err = errors.Join(err, m.Close())
		}
		err = errors.Join(err, e.Close(), right.Close())
	}()
	if !disk {
		if m, err = Open(opts); err != nil {
			return nil, fmt.Errorf("merge ordered engines: %w", err)
		}
		if err = engines.CopyRecords(m, e, nil); err != nil {
			return nil, fmt.Errorf("merge ordered engines: %w", err)
		}
		if err = engines.CopyRecords(m, right, nil); err != nil {
			return nil, fmt.Errorf("merge ordered engines: %w", err)
		}
		return m, nil
	}
	rdir := ""
	if r, ok := right.(*Engine); ok {
		rdir = r.opts.Dir
	}
	if opts.Dir == "" || filepath.Clean(opts.Dir) == filepath.Clean(e.opts.Dir) || filepath.Clean(opts.Dir) == filepath.Clean(rdir) {
		return nil, fmt.Errorf("merge ordered engines: %w: merged Dir %q must be new", engines.ErrSplitSpec, opts.Dir)
	}
	if err = e.checkpoint(opts.Dir, nil); err != nil {
		return nil, fmt.Errorf("merge ordered engines: %w", err)
	}
	if err = e.Close(); err != nil {
		return nil, fmt.Errorf("merge ordered engines: close left: %w", err)
	}
	if m, err = openFS(opts, pebblevfs.Default, nil); err != nil {
		return nil, fmt.Errorf("merge ordered engines: open merged: %w", err)
	}
	if err = engines.CopyRecords(m, right, nil); err != nil {
		return nil, fmt.Errorf("merge ordered engines: %w", err)
	}
	if err = m.db.Flush(); err != nil {
		return nil, fmt.Errorf("merge ordered engines: flush: %w", wrapPebble(err))
	}
	if err := hook("copied"); err != nil {
		return nil, err
	}
	if err = engines.CommitMerge(vfs.Default, opts.Dir, e.opts.Dir, rdir); err != nil {
		return nil, fmt.Errorf("merge ordered engines: %w", err)
	}
	return m, nil
}
