package stream

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/tabuladb/tabula/replication/stream/streampb"
)

// CodingPlacement is an extent's erasure coding as a reader sees it.
type CodingPlacement struct {
	Scheme string
	// Coded: every fragment is stored; reads go to the fragments. False
	// while coding is under way (the replicas serve reads).
	Coded bool
	// FragmentSize is every fragment's size; data fragment i holds the
	// extent's bytes [Boundaries[i], Boundaries[i+1]) (whole blocks),
	// padded with zeros.
	FragmentSize int64
	Boundaries   []int64
	// Fragments in the code's order (data, local parities, global
	// parities).
	Fragments []FragmentAddr
	// FaultDomains is how many distinct fault domains hold the fragments,
	// MaxPerDomain the most fragments any one holds (1 when there are at
	// least as many domains as fragments).
	FaultDomains, MaxPerDomain int
}

// FragmentAddr is where one fragment is.
type FragmentAddr struct {
	Index       int
	Node        string
	Addr        string
	FaultDomain string
	// OK: the node holds the fragment (not being rebuilt) and is alive.
	OK bool
	// CRC is the fragment's CRC32C (0 until coded).
	CRC uint32
}

// Spread says how the fragments are spread over fault domains, for
// `tabula extent stat`: "16 fragments in 16 fault domains", or with fewer
// domains than fragments "16 fragments in 8 fault domains (fewer domains
// than fragments: at most 2 per domain)".
func (c *CodingPlacement) Spread() string {
	s := fmt.Sprintf("%d fragments in %d fault domains", len(c.Fragments), c.FaultDomains)
	if c.FaultDomains < len(c.Fragments) {
		s += fmt.Sprintf(" (fewer domains than fragments: at most %d per domain)", c.MaxPerDomain)
	}
	return s
}

func codingPlacementOf(m *Manager, e ExtentMeta) *CodingPlacement {
	cd := e.Coding
	if cd == nil {
		return nil
	}
	p := &CodingPlacement{Scheme: cd.Scheme, Coded: cd.State == CodingDone, FragmentSize: cd.FragmentSize, Boundaries: slices.Clone(cd.Boundaries)}
	perFD := map[string]int{}
	for i, f := range cd.Fragments {
		nd := m.nodes.Get(f.Node)
		fa := FragmentAddr{Index: i, Node: f.Node, Addr: nd.Addr, FaultDomain: nd.FaultDomain, OK: f.State == FragmentOK && nd.Alive}
		if i < len(cd.CRCs) {
			fa.CRC = cd.CRCs[i]
		}
		p.Fragments = append(p.Fragments, fa)
		perFD[nd.FaultDomain]++
	}
	p.FaultDomains = len(perFD)
	for n := range maps.Values(perFD) {
		p.MaxPerDomain = max(p.MaxPerDomain, n)
	}
	return p
}

// ReportCorruptFragment tells the manager fragment index of extent on node
// failed a check (OpFragmentCorrupt): it is rebuilt in place.
func (d *Driver) ReportCorruptFragment(ctx context.Context, extent uint64, index int, node string) error {
	_, err := d.log.Apply(ctx, Command{Op: OpFragmentCorrupt, Extent: extent, Index: index, Node: node})
	return err
}

// codeTask returns the manager's TaskCode for extent, if any.
func (d *Driver) codeTask(extent uint64) (t Task, ok bool, nodes []string) {
	d.log.View(func(m *Manager) {
		e := m.extents.Get(extent)
		if e == nil || e.Coding == nil {
			return
		}
		for _, x := range m.Tasks() {
			if x.Kind == TaskCode && x.Extent == extent {
				t, ok = x, true
				break
			}
		}
		for _, f := range e.Coding.Fragments {
			nodes = append(nodes, f.Node)
		}
	})
	return t, ok && t.Fragments != nil, nodes
}

// code runs a TaskCode: start the coding (placing the fragments) if need
// be, have a coordinator code the extent, record the result. A crash
// anywhere leaves the extent coding (or not started), and the next
// RunTasks does the same again.
func (d *Driver) code(ctx context.Context, t Task) error {
	if t.Fragments == nil {
		if _, err := d.log.Apply(ctx, Command{Op: OpCodeStart, Extent: t.Extent, Code: t.Scheme}); err != nil {
			return err
		}
	}
	id := t.Extent
	t, ok, nodes := d.codeTask(id)
	if !ok {
		return fmt.Errorf("code extent %d: no coding task after code_start (a fragment node or every replica is down): %w", id, ErrUnavailable)
	}
	var errs []error
	for _, src := range t.Sources {
		c, err := d.conns.Node(src)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, d.opts.CopyTimeout)
		resp, err := c.Code(cctx, &streampb.CodeRequest{Extent: t.Extent, Length: t.Length, Scheme: t.Scheme, Fragments: t.Fragments})
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("coordinator %s: %w", src, fromStatus(err)))
			if ctx.Err() != nil {
				break
			}
			continue
		}
		_, err = d.log.Apply(ctx, Command{Op: OpCoded, Extent: t.Extent, Nodes: nodes, FragmentSize: resp.FragmentSize, Boundaries: resp.Boundaries, CRCs: resp.Crcs})
		return err
	}
	return fmt.Errorf("code extent %d: %w", t.Extent, errors.Join(errs...))
}

// rebuild runs a TaskRebuild.
func (d *Driver) rebuild(ctx context.Context, t Task) error {
	c, err := d.conns.Node(t.Addr)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, d.opts.CopyTimeout)
	_, err = c.RebuildFragment(cctx, &streampb.RebuildFragmentRequest{Extent: t.Extent, Index: uint32(t.Index), Scheme: t.Scheme,
		FragmentSize: t.FragmentSize, Crc: t.CRC, Sources: t.Fragments})
	cancel()
	if err != nil {
		return fromStatus(err)
	}
	_, err = d.log.Apply(ctx, Command{Op: OpFragmentReady, Extent: t.Extent, Index: t.Index, Node: t.Node})
	return err
}
