package point

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"sync"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/diskstore"
	"github.com/tabuladb/tabula/engines/vfs"
	"github.com/tabuladb/tabula/internal/keyspace"
)

var (
	_ engines.Splitter = (*Engine)(nil)
	_ engines.Merger   = (*Engine)(nil)
)

// Split divides the engine at spec.Hash (see engines.Splitter). With the
// memory store the children are new memory engines the records are copied
// into. With the ssd store the parent is closed (its last index block
// written), each child's directory gets hard links to the parent's
// segments and index blocks and a VIEW file: the parent's view rules plus
// one that hides, in every segment up to the parent's last, the keys of
// the other child's hash range (diskstore.ViewRule). Nothing is copied;
// each child's collector later rewrites what it keeps of the shared
// segments into its own and drops its link. The children are opened
// (recovered through the index blocks, filtered) before the SPLIT marker
// commits the split.
func (e *Engine) Split(spec engines.SplitSpec) (left, right engines.Engine, err error) {
	if spec.Hash == 0 {
		return nil, nil, errors.Join(fmt.Errorf("split point engine: %w: hash split point 0 leaves the left child no keys", engines.ErrSplitSpec), e.Close())
	}
	if e.closed.Load() {
		return nil, nil, engines.ErrClosed
	}
	if e.disk == nil {
		return e.splitMemory(spec)
	}
	return e.splitDisk(spec)
}

func (e *Engine) splitMemory(spec engines.SplitSpec) (_, _ engines.Engine, err error) {
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
			return nil, nil, fmt.Errorf("split point engine: open child: %w", err)
		}
		left := i == 0
		keep := func(key []byte) bool {
			l, r := engines.SplitSide(spec, true, key, keyspace.Hash(key))
			return left && l || !left && r
		}
		if err = engines.CopyRecords(kids[i], e, keep); err != nil {
			return nil, nil, fmt.Errorf("split point engine: %w", err)
		}
	}
	return kids[0], kids[1], nil
}

func (e *Engine) fs() vfs.FS {
	if e.opts.FS != nil {
		return e.opts.FS
	}
	return vfs.Default
}

func (e *Engine) splitDisk(spec engines.SplitSpec) (_, _ engines.Engine, err error) {
	dir, fs := e.opts.Dir, e.fs()
	if err := engines.CheckSplitSpec(dir, spec); err != nil {
		return nil, nil, errors.Join(fmt.Errorf("split point engine: %w", err), e.Close())
	}
	rules, err := diskstore.ReadView(fs, dir)
	if err != nil {
		return nil, nil, errors.Join(fmt.Errorf("split point engine: %w", err), e.Close())
	}
	// The parent writes nothing more: its files are the children's now.
	if err := e.Close(); err != nil {
		return nil, nil, fmt.Errorf("split point engine: close parent: %w", err)
	}
	names, last, err := diskstore.SharedFiles(fs, dir)
	if err != nil {
		return nil, nil, fmt.Errorf("split point engine: %w", err)
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
	ranges := [2][2]uint64{{0, spec.Hash - 1}, {spec.Hash, math.MaxUint64}}
	// The partition refuses writes until the split is done: both children
	// are made with their syncs left pending, synced in one round, and
	// opened at once.
	var pend engines.Pending
	for i, o := range []engines.Options{spec.Left, spec.Right} {
		if err := makeChild(fs, dir, o.Dir, names, rules, diskstore.ViewRule{UpTo: last, Lo: ranges[i][0], Hi: ranges[i][1]}, &pend); err != nil {
			return nil, nil, errors.Join(fmt.Errorf("split point engine: %w", err), pend.Sync(fs))
		}
	}
	if err := pend.Sync(fs); err != nil {
		return nil, nil, fmt.Errorf("split point engine: %w", err)
	}
	var errs [2]error
	var wg sync.WaitGroup
	for i, o := range []engines.Options{spec.Left, spec.Right} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if kids[i], errs[i] = e.openLike(o); errs[i] != nil {
				errs[i] = fmt.Errorf("open child in %s: %w", o.Dir, errs[i])
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		return nil, nil, fmt.Errorf("split point engine: %w", err)
	}
	if err := engines.CommitSplit(fs, dir, spec.Left.Dir, spec.Right.Dir); err != nil {
		return nil, nil, fmt.Errorf("split point engine: %w", err)
	}
	return kids[0], kids[1], nil
}

// openLike opens the ssd engine in o.Dir with the store options e was
// opened with (its segment size, durability, collector tuning), o's FS.
func (e *Engine) openLike(o engines.Options) (*Engine, error) {
	ds := e.ds
	ds.FS = o.FS
	return OpenDisk(o, ds)
}

// makeChild makes dir a new store sharing names of parent, with the
// parent's view rules and rule more (none when the parent had no segment),
// its syncs left in pend.
func makeChild(fs vfs.FS, parent, dir string, names []string, rules []diskstore.ViewRule, rule diskstore.ViewRule, pend *engines.Pending) error {
	if err := engines.StageDir(fs, dir, pend); err != nil {
		return err
	}
	if err := engines.StageLinks(fs, parent, dir, func(n string) bool { return slices.Contains(names, n) }, pend); err != nil {
		return err
	}
	if rule.UpTo != 0 {
		rules = append(slices.Clip(rules), rule)
	}
	if len(rules) == 0 {
		return nil
	}
	return diskstore.StageView(fs, dir, rules, pend)
}

// Merge makes one engine in opts.Dir of e and right (see engines.Merger).
// With the memory store both are copied into a new memory engine. With
// the ssd store the merged engine starts as e's files, hard-linked (its
// view rules still hide what e's split hid, in e's segments only), and
// right's live records are copied in after them; then the MERGED marker
// commits it.
func (e *Engine) Merge(right engines.Engine, opts engines.Options) (_ engines.Engine, err error) {
	if e.closed.Load() {
		return nil, errors.Join(engines.ErrClosed, right.Close())
	}
	var m *Engine
	defer func() {
		if err != nil && m != nil {
			err = errors.Join(err, m.Close())
		}
		err = errors.Join(err, e.Close(), right.Close())
	}()
	if e.disk == nil {
		if m, err = Open(opts); err != nil {
			return nil, fmt.Errorf("merge point engines: %w", err)
		}
		if err = engines.CopyRecords(m, e, nil); err != nil {
			return nil, fmt.Errorf("merge point engines: %w", err)
		}
		if err = engines.CopyRecords(m, right, nil); err != nil {
			return nil, fmt.Errorf("merge point engines: %w", err)
		}
		return m, nil
	}
	dir, fs := e.opts.Dir, e.fs()
	rdir := ""
	if r, ok := right.(*Engine); ok {
		rdir = r.opts.Dir
	}
	if opts.Dir == "" || filepath.Clean(opts.Dir) == filepath.Clean(dir) || filepath.Clean(opts.Dir) == filepath.Clean(rdir) {
		return nil, fmt.Errorf("merge point engines: %w: merged Dir %q must be new", engines.ErrSplitSpec, opts.Dir)
	}
	rules, err := diskstore.ReadView(fs, dir)
	if err != nil {
		return nil, fmt.Errorf("merge point engines: %w", err)
	}
	if err := e.Close(); err != nil {
		return nil, fmt.Errorf("merge point engines: close left: %w", err)
	}
	names, _, err := diskstore.SharedFiles(fs, dir)
	if err != nil {
		return nil, fmt.Errorf("merge point engines: %w", err)
	}
	var pend engines.Pending
	err = makeChild(fs, dir, opts.Dir, names, rules, diskstore.ViewRule{}, &pend)
	if err = errors.Join(err, pend.Sync(fs)); err != nil {
		return nil, fmt.Errorf("merge point engines: %w", err)
	}
	if m, err = e.openLike(opts); err != nil {
		return nil, fmt.Errorf("merge point engines: open merged: %w", err)
	}
	if err = engines.CopyRecords(m, right, nil); err != nil {
		return nil, fmt.Errorf("merge point engines: %w", err)
	}
	if err = m.Sync(); err != nil {
		return nil, fmt.Errorf("merge point engines: %w", err)
	}
	if err = engines.CommitMerge(fs, opts.Dir, dir, rdir); err != nil {
		return nil, fmt.Errorf("merge point engines: %w", err)
	}
	return m, nil
}
