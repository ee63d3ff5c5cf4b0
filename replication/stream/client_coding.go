package stream

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/tabuladb/tabula/engines"
)

// FragmentReporter is implemented by a ManagerClient that takes reports of
// corrupt fragments (Driver does); a Client uses it when it has one.
type FragmentReporter interface {
	ReportCorruptFragment(ctx context.Context, extent uint64, index int, node string) error
}

var _ FragmentReporter = (*Driver)(nil)

// coded says whether reads of p go to its fragments.
func coded(p ExtentPlacement) bool { return p.Coding != nil && p.Coding.Coded }

// readCoded returns the extent bytes [off, off+n) of coded extent p. Each
// data fragment holding part of the range is read directly; if its node is
// down, slow (ClientOptions.FragmentTimeout) or returns bad bytes, the part
// is rebuilt from other fragments: the fragment's local group (6 reads)
// when it is intact, else a global decode. The caller checks the block
// CRCs of the result, so nothing wrong is ever returned.
func (c *Client) readCoded(ctx context.Context, p ExtentPlacement, off, n int64) ([]byte, error) {
	cp := p.Coding
	code, err := codeOf(cp.Scheme)
	if err != nil {
		return nil, err
	}
	if off < 0 || n < 0 || off+n > p.Length || len(cp.Boundaries) != code.DataShards()+1 || len(cp.Fragments) != code.TotalShards() {
		return nil, fmt.Errorf("read coded extent %d [%d,+%d) of %d: %w", p.ID, off, n, p.Length, ErrBadRange)
	}
	addrs := make([]string, len(cp.Fragments))
	for i, f := range cp.Fragments {
		if f.OK {
			addrs[i] = f.Addr
		}
	}
	out := make([]byte, n)
	pieces := fragmentPieces(cp.Boundaries, off, n)
	errs := make([]error, len(pieces))
	var wg sync.WaitGroup
	for j, pc := range pieces {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[j] = c.readPiece(ctx, p, code.TotalShards(), addrs, pc, out[pc.at:pc.at+pc.length])
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// readPiece fills dst with one data fragment's part of a read.
func (c *Client) readPiece(ctx context.Context, p ExtentPlacement, total int, addrs []string, pc fragmentPiece, dst []byte) error {
	var direct error
	if addr := addrs[pc.index]; addr != "" {
		rctx, cancel := context.WithTimeout(ctx, c.opts.FragmentTimeout)
		b, err := readFragment(rctx, c.conns, addr, p.ID, pc.index, pc.offset, pc.length)
		cancel()
		if err == nil {
			copy(dst, b)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		direct = err
		if errors.Is(err, engines.ErrCorrupt) {
			c.reportFragment(ctx, p, pc.index)
		}
	}
	others := make([]string, total)
	copy(others, addrs)
	others[pc.index] = ""
	code, _ := codeOf(p.Coding.Scheme)
	c.reconstructions.Add(1)
	b, err := reconstructRange(ctx, code, c.conns, p.ID, others, pc.index, pc.offset, pc.length, c.opts.FragmentTimeout)
	if err != nil {
		return fmt.Errorf("coded extent %d fragment %d: %w", p.ID, pc.index, errors.Join(direct, err))
	}
	copy(dst, b)
	return nil
}

func (c *Client) reportFragment(ctx context.Context, p ExtentPlacement, index int) {
	r, ok := c.mgr.(FragmentReporter)
	if !ok {
		return
	}
	if err := r.ReportCorruptFragment(ctx, p.ID, index, p.Coding.Fragments[index].Node); err != nil {
		c.lg.Warn("report corrupt fragment", "extent", p.ID, "index", index, "err", err)
	}
}

// Reconstructions is how many fragment reads this client served by
// reconstruction (the fragment's node down, slow or corrupt).
func (c *Client) Reconstructions() int64 { return c.reconstructions.Load() }

// wholeBlocks is the length of the longest prefix of raw made of whole
// blocks (headers only are looked at; the caller checks CRCs), and the
// size of the first block past it (0 if its header is incomplete).
func wholeBlocks(raw []byte) (n int64, next int64) {
	for {
		rest := raw[n:]
		if len(rest) < BlockHeaderLen {
			return n, 0
		}
		_, _, size, _, err := parseBlockHeader(rest[:BlockHeaderLen])
		if err != nil {
			return n, 0
		}
		bs := blockSize(size)
		if int64(len(rest)) < bs {
			return n, bs
		}
		n += bs
	}
}

// readCodedBlocks returns whole blocks of coded extent p from off, up to
// max bytes but at least one block, ending at or before end.
func (c *Client) readCodedBlocks(ctx context.Context, p ExtentPlacement, off, maxLen, end int64) ([]byte, error) {
	raw, err := c.readCoded(ctx, p, off, min(maxLen, end-off))
	if err != nil {
		return nil, err
	}
	k, next := wholeBlocks(raw)
	if k > 0 {
		return raw[:k], nil
	}
	if next == 0 || off+next > end {
		return nil, fmt.Errorf("coded extent %d: no whole block at %d: %w", p.ID, off, engines.ErrCorrupt)
	}
	return c.readCoded(ctx, p, off, next)
}
