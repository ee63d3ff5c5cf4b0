package stream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/replication/lrc"
	"github.com/tabuladb/tabula/replication/stream/streampb"
)

// fragmentMsg is how many fragment bytes one PutFragment or ReadFragment
// message carries at most.
const fragmentMsg = 4 << 20

// maxCodeBytes bounds the extent a coordinator codes in memory (it holds
// the extent and its 16 fragments: about 2.4x this).
const maxCodeBytes = 1 << 30

// Code implements streampb.ExtentNodeServer: this node, holding a good
// sealed replica, codes it onto r.Fragments.
func (n *Node) Code(ctx context.Context, r *streampb.CodeRequest) (*streampb.CodeResponse, error) {
	code, err := codeOf(r.Scheme)
	if err != nil {
		return nil, toStatus(err)
	}
	if len(r.Fragments) != code.TotalShards() {
		return nil, toStatus(badCmd("code extent %d: %d fragment nodes for %s", r.Extent, len(r.Fragments), r.Scheme))
	}
	ext, err := n.store.Get(r.Extent)
	if err != nil {
		return nil, toStatus(err)
	}
	info := ext.Info()
	switch {
	case !info.Sealed:
		return nil, toStatus(fmt.Errorf("code extent %d: %w", r.Extent, ErrNotSealed))
	case info.Length != r.Length:
		return nil, toStatus(fmt.Errorf("code extent %d: sealed at %d, want %d: %w", r.Extent, info.Length, r.Length, ErrSealConflict))
	case info.Length == 0 || info.Length > maxCodeBytes:
		return nil, toStatus(fmt.Errorf("code extent %d of %d bytes (at most %d): %w", r.Extent, info.Length, maxCodeBytes, ErrTooLarge))
	}
	raw := make([]byte, 0, info.Length)
	var starts []int64
	for off := int64(0); off < info.Length; {
		b, _, _, err := ext.Read(off, MaxAppendBytes)
		if err != nil {
			return nil, toStatus(err)
		}
		if len(b) == 0 {
			return nil, toStatus(fmt.Errorf("code extent %d: read at %d returned nothing: %w", r.Extent, off, ErrShort))
		}
		if err := DecodeBlocks(b, r.Extent, off, func(o int64, _ uint64, _ bool, _ []byte) error {
			starts = append(starts, o)
			return nil
		}); err != nil {
			return nil, toStatus(err)
		}
		raw = append(raw, b...)
		off += int64(len(b))
	}
	bounds := splitAtBlocks(starts, info.Length, code.DataShards())
	shards, size, err := encodeExtent(code, raw, bounds)
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &streampb.CodeResponse{FragmentSize: size, Boundaries: bounds, Crcs: make([]uint32, len(shards))}
	for i, s := range shards {
		resp.Crcs[i] = crc32c(s)
	}
	errs := make([]error, len(shards))
	var wg sync.WaitGroup
	for i, addr := range r.Fragments {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if fragmentStored(ctx, n.conns, addr, r.Extent, i, int64(len(shards[i])), resp.Crcs[i]) {
				return // a resumed coding: this one is durable already
			}
			errs[i] = putFragment(ctx, n.conns, addr, r.Extent, i, shards[i], resp.Crcs[i])
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, toStatus(fmt.Errorf("code extent %d: %w", r.Extent, err))
	}
	return resp, nil
}

// fragmentStored says whether the node at addr holds fragment index of
// extent with that size and CRC, readable (its chunk table checked at
// open; a corrupt one reads as an error).
func fragmentStored(ctx context.Context, conns *Conns, addr string, extent uint64, index int, size int64, crc uint32) bool {
	c, err := conns.Node(addr)
	if err != nil {
		return false
	}
	resp, err := c.ReadFragment(ctx, &streampb.ReadFragmentRequest{Extent: extent, Index: uint32(index)})
	return err == nil && resp.Size == size && resp.FragmentCrc == crc
}

// putFragment stores data as fragment index of extent on the node at addr.
func putFragment(ctx context.Context, conns *Conns, addr string, extent uint64, index int, data []byte, crc uint32) error {
	c, err := conns.Node(addr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := c.PutFragment(ctx)
	if err != nil {
		return fmt.Errorf("put fragment %d.%d on %s: %w", extent, index, addr, fromStatus(err))
	}
	first := true
	for off := 0; first || off < len(data); first = false {
		end := min(off+fragmentMsg, len(data))
		m := &streampb.PutFragmentChunk{Data: data[off:end]}
		if first {
			m.Extent, m.Index, m.Size, m.Crc = extent, uint32(index), int64(len(data)), crc
		}
		if err := s.Send(m); err != nil {
			break // the real error comes from CloseAndRecv
		}
		off = end
	}
	if _, err := s.CloseAndRecv(); err != nil {
		return fmt.Errorf("put fragment %d.%d on %s: %w", extent, index, addr, fromStatus(err))
	}
	return nil
}

// PutFragment implements streampb.ExtentNodeServer.
func (n *Node) PutFragment(s grpc.ClientStreamingServer[streampb.PutFragmentChunk, streampb.PutFragmentResponse]) error {
	first, err := s.Recv()
	if err != nil {
		return toStatus(err)
	}
	err = n.frags.Put(first.Extent, int(first.Index), first.Size, first.Crc, func(write func([]byte) error) error {
		if err := write(first.Data); err != nil {
			return err
		}
		for {
			m, err := s.Recv()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
			if err := write(m.Data); err != nil {
				return err
			}
		}
	})
	if err != nil {
		return toStatus(err)
	}
	return s.SendAndClose(&streampb.PutFragmentResponse{})
}

// ReadFragment implements streampb.ExtentNodeServer.
func (n *Node) ReadFragment(_ context.Context, r *streampb.ReadFragmentRequest) (*streampb.ReadFragmentResponse, error) {
	data, err := n.frags.Read(r.Extent, int(r.Index), r.Offset, min(max(r.Length, 0), fragmentMsg))
	if err != nil {
		return nil, toStatus(err)
	}
	info, err := n.frags.Stat(r.Extent, int(r.Index))
	if err != nil {
		return nil, toStatus(err)
	}
	return &streampb.ReadFragmentResponse{Data: data, Crc: crc32c(data), Size: info.Size, FragmentCrc: info.CRC}, nil
}

// DeleteFragment implements streampb.ExtentNodeServer.
func (n *Node) DeleteFragment(_ context.Context, r *streampb.DeleteFragmentRequest) (*streampb.DeleteFragmentResponse, error) {
	if err := n.frags.Delete(r.Extent, int(r.Index)); err != nil {
		return nil, toStatus(err)
	}
	return &streampb.DeleteFragmentResponse{}, nil
}

// RebuildFragment implements streampb.ExtentNodeServer.
func (n *Node) RebuildFragment(ctx context.Context, r *streampb.RebuildFragmentRequest) (*streampb.RebuildFragmentResponse, error) {
	code, err := codeOf(r.Scheme)
	if err != nil {
		return nil, toStatus(err)
	}
	idx := int(r.Index)
	if len(r.Sources) != code.TotalShards() || idx >= code.TotalShards() || r.FragmentSize <= 0 {
		return nil, toStatus(badCmd("rebuild fragment %d.%d: %d sources, size %d", r.Extent, idx, len(r.Sources), r.FragmentSize))
	}
	addrs := append([]string(nil), r.Sources...)
	addrs[idx] = ""
	data, err := reconstructRange(ctx, code, n.conns, r.Extent, addrs, idx, 0, r.FragmentSize, 0)
	if err != nil {
		return nil, toStatus(fmt.Errorf("rebuild fragment %d.%d: %w", r.Extent, idx, err))
	}
	if got := crc32c(data); got != r.Crc {
		return nil, toStatus(fmt.Errorf("rebuild fragment %d.%d: crc %08x, want %08x: %w", r.Extent, idx, got, r.Crc, engines.ErrCorrupt))
	}
	if err := n.frags.Put(r.Extent, idx, int64(len(data)), r.Crc, func(write func([]byte) error) error { return write(data) }); err != nil {
		return nil, toStatus(err)
	}
	return &streampb.RebuildFragmentResponse{}, nil
}

// readFragment reads [off, off+length) of fragment index of extent from
// the node at addr, checking the CRC of what arrives. timeout, if not 0,
// bounds each message.
func readFragment(ctx context.Context, conns *Conns, addr string, extent uint64, index int, off, length int64) ([]byte, error) {
	c, err := conns.Node(addr)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, length)
	for got := int64(0); got < length; {
		resp, err := c.ReadFragment(ctx, &streampb.ReadFragmentRequest{Extent: extent, Index: uint32(index), Offset: off + got, Length: min(length-got, fragmentMsg)})
		if err != nil {
			return nil, fmt.Errorf("read fragment %d.%d on %s: %w", extent, index, addr, fromStatus(err))
		}
		if crc32c(resp.Data) != resp.Crc || len(resp.Data) == 0 {
			return nil, fmt.Errorf("read fragment %d.%d on %s: %d bytes fail their crc: %w", extent, index, addr, len(resp.Data), engines.ErrCorrupt)
		}
		out = append(out, resp.Data...)
		got += int64(len(resp.Data))
	}
	return out, nil
}

// reconstructRange rebuilds [off, off+length) of fragment want from the
// other fragments: addrs[i] is fragment i's node, "" if unavailable. It
// fetches what lrc's RepairPlan asks for (the local group when it is
// intact, else more), in parallel; a fetch that fails makes its fragment
// unavailable and the plan is redone. Each fetch is bounded by timeout if
// not 0. Fails with ErrUnavailable when the survivors do not determine it.
func reconstructRange(ctx context.Context, code *lrc.Code, conns *Conns, extent uint64, addrs []string, want int, off, length int64, timeout time.Duration) ([]byte, error) {
	avail := make([]bool, len(addrs))
	for i, a := range addrs {
		avail[i] = a != "" && i != want
	}
	shards := make([][]byte, len(addrs))
	var errs []error
	for {
		plan, err := code.RepairPlan([]int{want}, avail)
		if err != nil {
			return nil, fmt.Errorf("fragment %d.%d: %w: %w", extent, want, ErrUnavailable, errors.Join(append(errs, err)...))
		}
		fetchErrs := make([]error, len(addrs))
		var wg sync.WaitGroup
		for _, i := range plan {
			if shards[i] != nil {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				fctx, cancel := ctx, context.CancelFunc(func() {})
				if timeout > 0 {
					fctx, cancel = context.WithTimeout(ctx, timeout)
				}
				defer cancel()
				shards[i], fetchErrs[i] = readFragment(fctx, conns, addrs[i], extent, i, off, length)
			}()
		}
		wg.Wait()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		failed := false
		for i, err := range fetchErrs {
			if err != nil {
				avail[i], shards[i], failed = false, nil, true
				errs = append(errs, err)
			}
		}
		if failed {
			continue
		}
		have := make([][]byte, len(addrs))
		for _, i := range plan {
			have[i] = shards[i]
		}
		required := make([]bool, len(addrs))
		required[want] = true
		if err := code.ReconstructSome(have, required); err != nil {
			return nil, fmt.Errorf("fragment %d.%d: %w", extent, want, err)
		}
		return have[want], nil
	}
}
