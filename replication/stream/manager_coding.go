package stream

import (
	"cmp"
	"fmt"
	"slices"
)

// Erasure coding in the manager (LRC paper §5): a stream whose
// Code is set gets its sealed, non-empty extents coded. The extent goes
//
//	not coded ──code_start──▶ coding ──coded──▶ coded (replicas deleted)
//	                            │
//	                            └──code_abort──▶ not coded
//
// code_start places the fragments (one per slot, see placeFragment) and
// is durable before any fragment is written, so a driver that crashes
// mid-way finds the extent still coding and runs the same TaskCode again:
// the coordinator rewrites every fragment (the split is a function of the
// extent, so the bytes are the same) and reports coded. Only then are the
// three replicas dropped (delete tasks). A coded extent whose fragment's
// node dies gets the fragment placed on another node (state rebuild,
// TaskRebuild: the new node rebuilds it from its local group, or globally);
// the dead node's copy is deleted once the rebuild is done.

// CodingState is the state of an extent's coding. Strings in snapshots:
// never change or reuse.
type CodingState string

// Coding states.
const (
	// CodingStarted: fragments placed, being written; the replicas serve
	// reads.
	CodingStarted CodingState = "coding"
	// CodingDone: every fragment stored and recorded; no replicas.
	CodingDone CodingState = "coded"
)

// FragmentState is the state of one fragment. Strings in snapshots: never
// change or reuse.
type FragmentState string

// Fragment states.
const (
	// FragmentPending: placed, not yet confirmed (the extent is coding).
	FragmentPending FragmentState = "pending"
	// FragmentOK: the node holds the fragment.
	FragmentOK FragmentState = "ok"
	// FragmentRebuild: the node must rebuild the fragment from the others
	// (a new node after a loss, or in place after corruption).
	FragmentRebuild FragmentState = "rebuild"
)

// Fragment is one fragment slot of a coded extent.
type Fragment struct {
	Node  string        `json:"node"`
	State FragmentState `json:"state"`
	// Old is the node that held the fragment before it was moved for a
	// rebuild: its copy is deleted once the rebuild is done.
	Old string `json:"old,omitempty"`
}

// Coding is an extent's erasure coding.
type Coding struct {
	Scheme string      `json:"scheme"`
	State  CodingState `json:"state"`
	// Fragments[i] is fragment i (data 0..k-1, local parities, global
	// parities: replication/lrc's order).
	Fragments []Fragment `json:"fragments"`
	// Set by OpCoded: every fragment's size, where data fragment i starts
	// in the extent (Boundaries[k] is the length), each fragment's CRC32C.
	FragmentSize int64    `json:"fragment_size,omitempty"`
	Boundaries   []int64  `json:"boundaries,omitempty"`
	CRCs         []uint32 `json:"crcs,omitempty"`
}

func (c *Coding) clone() *Coding {
	if c == nil {
		return nil
	}
	o := *c
	o.Fragments = slices.Clone(c.Fragments)
	o.Boundaries = slices.Clone(c.Boundaries)
	o.CRCs = slices.Clone(c.CRCs)
	return &o
}

// FragmentRef names one fragment of an extent.
type FragmentRef struct {
	Extent uint64 `json:"extent"`
	Index  int    `json:"index"`
}

// PendingFragmentDelete is a fragment to remove from a node.
type PendingFragmentDelete struct {
	Extent uint64 `json:"extent"`
	Index  int    `json:"index"`
	Node   string `json:"node"`
}

// Coding task kinds.
const (
	// TaskCode: code Extent. With Fragments nil, apply OpCodeStart first
	// (it places the fragments), then take the task again. Otherwise ask
	// one of Sources (the coordinator: a node with a good replica) to code
	// it onto Fragments, then apply OpCoded with what it reports.
	TaskCode TaskKind = "code"
	// TaskRebuild: have Node (Addr) rebuild fragment Index of Extent from
	// Fragments (FragmentSize bytes, CRC), then apply OpFragmentReady.
	TaskRebuild TaskKind = "rebuild_fragment"
	// TaskDeleteFragment: delete fragment Index of Extent on Node (Addr),
	// then apply OpFragmentDeleted.
	TaskDeleteFragment TaskKind = "delete_fragment"
)

func (m *Manager) applyCoding(c Command) (Result, error) {
	if c.Op == OpSetCode {
		s, err := m.stream(c.Stream)
		if err != nil {
			return Result{}, err
		}
		if c.Code != "" {
			if _, err := codeOf(c.Code); err != nil {
				return Result{}, err
			}
		}
		if s.Code == c.Code {
			return Result{}, nil
		}
		m.streams.Mut(m.o(), c.Stream).Code = c.Code
		return Result{Changed: true}, nil
	}
	if c.Op == OpFragmentDeleted {
		if !m.fragDels.Delete(m.o(), PendingFragmentDelete{Extent: c.Extent, Index: c.Index, Node: c.Node}) {
			return Result{}, nil
		}
		return Result{Changed: true}, nil
	}
	e, err := m.extent(c.Extent)
	if err != nil {
		return Result{}, err
	}
	switch c.Op {
	case OpCodeStart:
		return m.codeStart(e, c)
	case OpCoded:
		return m.coded(e, c)
	case OpCodeAbort:
		if e.Coding == nil {
			return Result{}, nil
		}
		if e.Coding.State != CodingStarted {
			return Result{}, badCmd("code_abort of extent %d: already coded", e.ID)
		}
		m.dropFragments(e)
		e = m.mutExtent(e.ID)
		e.Coding = nil
		m.setUnsettled(e.ID, !m.settled(e)) // its fragments' nodes no longer count
		return Result{Changed: true}, nil
	}
	// Fragment events.
	if e.Coding == nil || e.Coding.State != CodingDone {
		return Result{}, fmt.Errorf("%s of extent %d: not coded: %w", c.Op, e.ID, ErrBadCommand)
	}
	if c.Index < 0 || c.Index >= len(e.Coding.Fragments) {
		return Result{}, badCmd("%s of extent %d: fragment %d out of range", c.Op, e.ID, c.Index)
	}
	f := e.Coding.Fragments[c.Index]
	if f.Node != c.Node {
		return Result{}, fmt.Errorf("extent %d fragment %d is not on %q: %w", e.ID, c.Index, c.Node, ErrUnknownNode)
	}
	switch c.Op {
	case OpFragmentReady:
		if f.State != FragmentRebuild {
			return Result{}, nil
		}
		if f.Old != "" && f.Old != f.Node {
			m.addFragDelete(PendingFragmentDelete{Extent: e.ID, Index: c.Index, Node: f.Old})
		}
		mf := &m.mutExtent(e.ID).Coding.Fragments[c.Index]
		mf.State, mf.Old = FragmentOK, ""
	case OpFragmentCorrupt:
		if f.State != FragmentOK {
			return Result{}, nil
		}
		m.mutExtent(e.ID).Coding.Fragments[c.Index].State = FragmentRebuild
	}
	return Result{Changed: true}, nil
}

func (m *Manager) codeStart(e *ExtentMeta, c Command) (Result, error) {
	if e.Coding != nil {
		return Result{Extent: e.ID}, nil
	}
	if !e.Sealed || e.Length == 0 {
		return Result{}, fmt.Errorf("code extent %d (sealed %v, length %d): %w", e.ID, e.Sealed, e.Length, ErrNotSealed)
	}
	scheme := cmp.Or(c.Code, CodeLRC12)
	code, err := codeOf(scheme)
	if err != nil {
		return Result{}, err
	}
	if len(m.goodReplicas(e)) == 0 {
		return Result{}, fmt.Errorf("code extent %d: no good replica: %w", e.ID, ErrUnavailable)
	}
	// Placed on a scratch copy of e: a failure changes nothing.
	scratch := *e
	cd := &Coding{Scheme: scheme, State: CodingStarted, Fragments: make([]Fragment, code.TotalShards())}
	scratch.Coding = cd
	hosted := map[string]int{}
	for i := range cd.Fragments {
		n := m.placeFragment(&scratch, i, hosted)
		if n == "" {
			return Result{}, fmt.Errorf("code extent %d: %w", e.ID, ErrNoPlacement)
		}
		cd.Fragments[i] = Fragment{Node: n, State: FragmentPending}
		hosted[n]++
	}
	for _, f := range cd.Fragments {
		m.host(f.Node, e.ID, 1)
	}
	m.mutExtent(e.ID).Coding = cd
	return Result{Changed: true, Extent: e.ID}, nil
}

func (m *Manager) coded(e *ExtentMeta, c Command) (Result, error) {
	cd := e.Coding // read only until the checks pass
	if cd == nil {
		return Result{}, badCmd("coded extent %d: coding not started", e.ID)
	}
	if cd.State == CodingDone {
		return Result{}, nil
	}
	code, _ := codeOf(cd.Scheme)
	n, k := code.TotalShards(), code.DataShards()
	if len(c.Nodes) != n || len(c.CRCs) != n || len(c.Boundaries) != k+1 {
		return Result{}, badCmd("coded extent %d: %d nodes, %d crcs, %d boundaries", e.ID, len(c.Nodes), len(c.CRCs), len(c.Boundaries))
	}
	for i, f := range cd.Fragments {
		if c.Nodes[i] != f.Node {
			return Result{}, fmt.Errorf("coded extent %d: fragment %d written to %q, placed on %q: %w", e.ID, i, c.Nodes[i], f.Node, ErrPlacementChanged)
		}
	}
	if err := checkBoundaries(c.Boundaries, c.FragmentSize, e.Length); err != nil {
		return Result{}, fmt.Errorf("coded extent %d: %w", e.ID, err)
	}
	e = m.mutExtent(e.ID)
	cd = e.Coding
	cd.State, cd.FragmentSize = CodingDone, c.FragmentSize
	cd.Boundaries, cd.CRCs = slices.Clone(c.Boundaries), slices.Clone(c.CRCs)
	for i := range cd.Fragments {
		cd.Fragments[i].State = FragmentOK
	}
	for i := len(e.Replicas) - 1; i >= 0; i-- {
		m.dropReplica(e, i)
	}
	m.plan(e) // a fragment node may have died meanwhile
	return Result{Changed: true}, nil
}

func checkBoundaries(b []int64, size, length int64) error {
	if size <= 0 || b[0] != 0 || b[len(b)-1] != length {
		return badCmd("boundaries %v of a %d-byte extent, fragment size %d", b, length, size)
	}
	for i := 1; i < len(b); i++ {
		if b[i] < b[i-1] || b[i]-b[i-1] > size {
			return badCmd("boundaries %v not ascending or over fragment size %d", b, size)
		}
	}
	return nil
}

// goodReplicas are e's replicas that hold it on live nodes.
func (m *Manager) goodReplicas(e *ExtentMeta) []string {
	var out []string
	for _, r := range e.Replicas {
		if nd := m.nodes.Get(r.Node); r.State == ReplicaOK && nd.Alive {
			out = append(out, nd.Addr)
		}
	}
	return out
}

// placeFragment picks a live node for fragment slot i of e, given the
// other slots: the fault domain with the fewest of e's fragments, then the
// fewest of slot i's group (local group, or the global parities), so one
// lost domain costs each local group as few fragments as possible; then
// the node with the fewest of e's fragments, fewest replicas and fragments
// hosted, least used bytes, and id. With at least as many fault domains
// as fragments every fragment gets its own; with fewer, they spread as
// evenly as possible. "" if no node is alive. extra counts fragments
// placed but not counted in m.hosted yet (nil: none).
func (m *Manager) placeFragment(e *ExtentMeta, i int, extra map[string]int) string {
	code, _ := codeOf(e.Coding.Scheme)
	g := fragmentGroup(code, i)
	fdCount, fdGroup, nodeCount := map[string]int{}, map[string]int{}, map[string]int{}
	for j, f := range e.Coding.Fragments {
		nd := m.nodes.Get(f.Node)
		if j == i || nd == nil || !nd.Alive {
			continue
		}
		fdCount[nd.FaultDomain]++
		nodeCount[nd.ID]++
		if fragmentGroup(code, j) == g {
			fdGroup[nd.FaultDomain]++
		}
	}
	var best *NodeMeta
	less := func(a, b *NodeMeta) bool {
		return cmp.Or(
			cmp.Compare(fdCount[a.FaultDomain], fdCount[b.FaultDomain]),
			cmp.Compare(fdGroup[a.FaultDomain], fdGroup[b.FaultDomain]),
			cmp.Compare(nodeCount[a.ID], nodeCount[b.ID]),
			cmp.Compare(m.hostedOn(a.ID)+extra[a.ID], m.hostedOn(b.ID)+extra[b.ID]),
			cmp.Compare(a.UsedBytes, b.UsedBytes),
			cmp.Compare(a.ID, b.ID),
		) < 0
	}
	for _, nd := range m.nodes.All() {
		if nd.Alive && (best == nil || less(nd, best)) {
			best = nd
		}
	}
	if best == nil {
		return ""
	}
	return best.ID
}

// planFragments moves the fragments of e (for writing) off dead nodes: while coding, to a new
// node (the coordinator's next run writes it there); once coded, to a new
// node that rebuilds it. The dead node's copy is deleted when it returns
// (after the rebuild, for a coded fragment).
func (m *Manager) planFragments(e *ExtentMeta) {
	cd := e.Coding
	if cd == nil {
		return
	}
	for i := range cd.Fragments {
		f := &cd.Fragments[i]
		if m.alive(f.Node) {
			continue
		}
		n := m.placeFragment(e, i, nil)
		if n == "" {
			continue
		}
		dead := f.Node
		m.host(dead, e.ID, -1)
		m.host(n, e.ID, 1)
		f.Node = n
		switch {
		case cd.State == CodingStarted:
			m.addFragDelete(PendingFragmentDelete{Extent: e.ID, Index: i, Node: dead})
		case f.State == FragmentOK:
			f.State, f.Old = FragmentRebuild, dead
		default: // already rebuilding: the dead target held nothing useful
			if f.Old == "" || f.Old == n {
				f.Old = ""
			}
			if dead != f.Old {
				m.addFragDelete(PendingFragmentDelete{Extent: e.ID, Index: i, Node: dead})
			}
		}
	}
}

// dropFragments queues the deletion of every fragment of e (garbage, or an
// aborted coding). It does not modify e: the caller drops e.Coding.
func (m *Manager) dropFragments(e *ExtentMeta) {
	if e.Coding == nil {
		return
	}
	for i, f := range e.Coding.Fragments {
		m.host(f.Node, e.ID, -1)
		m.addFragDelete(PendingFragmentDelete{Extent: e.ID, Index: i, Node: f.Node})
		if f.Old != "" {
			m.addFragDelete(PendingFragmentDelete{Extent: e.ID, Index: i, Node: f.Old})
		}
	}
}

// orphanFragments queues deletes for fragments node c.Node holds that the
// manager does not place there.
func (m *Manager) orphanFragments(c Command) bool {
	changed := false
	for _, r := range c.Fragments {
		if r.Extent >= m.nextExtent || r.Index < 0 || r.Index > 255 {
			continue
		}
		if e := m.extents.Get(r.Extent); e != nil && e.Coding != nil && r.Index < len(e.Coding.Fragments) {
			if f := e.Coding.Fragments[r.Index]; f.Node == c.Node || f.Old == c.Node {
				continue
			}
		}
		k := PendingFragmentDelete{Extent: r.Extent, Index: r.Index, Node: c.Node}
		if !m.fragDels.Has(k) {
			m.addFragDelete(k)
			changed = true
		}
	}
	return changed
}

// codingTasks lists code, rebuild and fragment delete tasks, by extent.
func (m *Manager) codingTasks() (codes, rebuilds, dels []Task) {
	want := map[uint64]string{}
	for _, s := range m.streams.All() {
		if s.Code == "" {
			continue
		}
		for _, id := range s.Extents {
			if _, ok := want[id]; !ok {
				want[id] = s.Code
			}
		}
	}
	for id, e := range m.extents.All() {
		cd := e.Coding
		if cd == nil {
			scheme, ok := want[id]
			if ok && e.Sealed && e.Length > 0 && len(m.goodReplicas(e)) > 0 {
				codes = append(codes, Task{Kind: TaskCode, Extent: id, Scheme: scheme, Length: e.Length})
			}
			continue
		}
		addrs := make([]string, len(cd.Fragments))
		all := true
		for i, f := range cd.Fragments {
			nd := m.nodes.Get(f.Node)
			switch {
			case !nd.Alive:
				all = false
			case cd.State == CodingStarted || f.State == FragmentOK:
				addrs[i] = nd.Addr
			}
		}
		if cd.State == CodingStarted {
			if src := m.goodReplicas(e); all && len(src) > 0 {
				codes = append(codes, Task{Kind: TaskCode, Extent: id, Scheme: cd.Scheme, Length: e.Length, Sources: src, Fragments: addrs})
			}
			continue
		}
		for i, f := range cd.Fragments {
			if nd := m.nodes.Get(f.Node); f.State == FragmentRebuild && nd.Alive {
				rebuilds = append(rebuilds, Task{Kind: TaskRebuild, Extent: id, Index: i, Node: f.Node, Addr: nd.Addr,
					Scheme: cd.Scheme, Length: e.Length, Fragments: addrs, FragmentSize: cd.FragmentSize, CRC: cd.CRCs[i]})
			}
		}
	}
	for _, k := range m.sortedFragDels() {
		if nd := m.nodes.Get(k.Node); nd != nil && nd.Alive {
			dels = append(dels, Task{Kind: TaskDeleteFragment, Extent: k.Extent, Index: k.Index, Node: k.Node, Addr: nd.Addr})
		}
	}
	return codes, rebuilds, dels
}

func (m *Manager) sortedFragDels() []PendingFragmentDelete { return m.fragDels.Keys() }

// FragmentDeletes lists the fragment deletes pending, sorted.
func (m *Manager) FragmentDeletes() []PendingFragmentDelete { return m.sortedFragDels() }

// loadCoding checks a snapshot extent's coding and counts its fragments.
func (m *Manager) loadCoding(e *ExtentMeta) error {
	cd := e.Coding
	if cd == nil {
		return nil
	}
	code, err := codeOf(cd.Scheme)
	if err != nil {
		return err
	}
	if !e.Sealed || e.Length == 0 || len(cd.Fragments) != code.TotalShards() {
		return badCmd("snapshot extent %d: coding of an open or empty extent, or %d fragments", e.ID, len(cd.Fragments))
	}
	switch cd.State {
	case CodingStarted:
		if cd.FragmentSize != 0 || cd.Boundaries != nil || cd.CRCs != nil {
			return badCmd("snapshot extent %d: coding with results", e.ID)
		}
	case CodingDone:
		if len(e.Replicas) != 0 || len(cd.CRCs) != code.TotalShards() || len(cd.Boundaries) != code.DataShards()+1 {
			return badCmd("snapshot extent %d: coded with %d replicas, %d crcs, %d boundaries", e.ID, len(e.Replicas), len(cd.CRCs), len(cd.Boundaries))
		}
		if err := checkBoundaries(cd.Boundaries, cd.FragmentSize, e.Length); err != nil {
			return fmt.Errorf("snapshot extent %d: %w", e.ID, err)
		}
	default:
		return badCmd("snapshot extent %d: coding state %q", e.ID, cd.State)
	}
	for i, f := range cd.Fragments {
		okState := f.State == FragmentPending
		if cd.State == CodingDone {
			okState = f.State == FragmentOK || f.State == FragmentRebuild
		}
		if !m.nodes.Has(f.Node) || (f.Old != "" && !m.nodes.Has(f.Old)) || !okState || (f.Old != "" && f.State != FragmentRebuild) {
			return badCmd("snapshot extent %d fragment %d: node %q (old %q), state %q", e.ID, i, f.Node, f.Old, f.State)
		}
		m.host(f.Node, e.ID, 1)
	}
	return nil
}
