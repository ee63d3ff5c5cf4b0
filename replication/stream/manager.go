package stream

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Op names a stream manager command. The strings are written to the
// master's log: never change or reuse one.
type Op string

const (
	// OpAddNode registers extent node Node (Addr, FaultDomain) or brings a
	// known one back alive with its new address, then re-replicates what
	// it can.
	OpAddNode Op = "add_node"
	// OpNodeDown marks Node dead: its replicas stop counting; sealed
	// extents get replacement replicas, unsealed ones a seal task.
	OpNodeDown Op = "node_down"
	// OpNodeLoad records Node's UsedBytes (from its heartbeat).
	OpNodeLoad Op = "node_load"
	// OpCreateStream creates the empty stream Stream with Replicas replicas
	// per extent (1-5; 0: ManagerOptions.Replicas) and ack policy Ack
	// (AckAll or AckQuorum; "": AckAll).
	OpCreateStream Op = "create_stream"
	// OpDeleteStream removes Stream; extents no stream references any
	// more are garbage: every replica gets a delete task.
	OpDeleteStream Op = "delete_stream"
	// OpTrimStream removes every extent of Stream before Extent, the first
	// one to keep, which must be in the stream: a prefix truncation, e.g.
	// of a partition's commit log below what every replica has flushed.
	// Extents no stream references any more are garbage, as with
	// delete_stream: each replica and fragment gets a delete task. Only
	// sealed extents can precede another, so the open (last) extent always
	// stays. A trim to the stream's first extent changes nothing (a
	// repeated trim); to an extent not in the stream (trimmed already, or
	// never there) it fails with ErrUnknownExtent.
	OpTrimStream Op = "trim_stream"
	// OpConcat creates Stream as the concatenation of the extents of
	// Sources, in order: a pointer operation. Every source extent must be
	// sealed.
	OpConcat Op = "concat"
	// OpOpenWriter bumps Stream's writer epoch (Result.Epoch): allocations
	// by writers with an older epoch fail with ErrFenced.
	OpOpenWriter Op = "open_writer"
	// OpAllocate appends a new extent to Stream, whose last extent must be
	// sealed, on the stream's replica count of live nodes in distinct
	// fault domains, least loaded first; Node, if live, is preferred as
	// primary; Avoid lists nodes to use only if nothing else fits. Nodes,
	// if set, are the exact nodes instead, primary first: at most twice
	// the stream's replicas, known, alive and distinct (fault domains are the
	// caller's business). Epoch, if not 0, must be the stream's writer
	// epoch.
	OpAllocate Op = "allocate_extent"
	// OpSeal records that Extent is sealed at Length (LastSeq is its last
	// entry's sequence number). Nodes are the replicas that confirmed the
	// seal; the others are rebuilt from them.
	OpSeal Op = "seal_extent"
	// OpReportCorrupt marks Extent's replica on Node corrupt: it is
	// rebuilt in place from a good replica (after a seal if need be).
	OpReportCorrupt Op = "report_corrupt"
	// OpReplicaReady: the copy task for Extent on Node succeeded.
	OpReplicaReady Op = "replica_ready"
	// OpReplicaFailed: the copy task for Extent on Node failed; a new
	// replica is dropped (and its node cleaned), a repair is retried.
	OpReplicaFailed Op = "replica_failed"
	// OpReplicaDeleted: the delete task for Extent on Node is done.
	OpReplicaDeleted Op = "replica_deleted"
	// OpNodeExtents is Node's inventory (Extents): replicas it holds that
	// the manager does not place there are garbage and get delete tasks.
	OpNodeExtents Op = "node_extents"

	// Erasure coding (manager_coding.go).

	// OpSetCode sets Stream's coding policy to Code (CodeLRC12, or "" for
	// none): its sealed extents get coded. create_stream takes Code too.
	OpSetCode Op = "set_code"
	// OpCodeStart begins coding sealed Extent: the manager places its
	// fragments (Result.Extent echoes it); a TaskCode follows.
	OpCodeStart Op = "code_start"
	// OpCoded: the coordinator stored every fragment of Extent on Nodes
	// (which must be the placement), of FragmentSize bytes, with CRCs; the
	// data fragments start at Boundaries. The extent becomes coded and its
	// full replicas are deleted.
	OpCoded Op = "coded"
	// OpCodeAbort gives up coding Extent (e.g. an undecodable bug): its
	// fragments are deleted, the replicas stay. Only before OpCoded.
	OpCodeAbort Op = "code_abort"
	// OpFragmentReady: fragment Index of Extent was rebuilt on Node.
	OpFragmentReady Op = "fragment_ready"
	// OpFragmentCorrupt: fragment Index of Extent on Node failed a check;
	// it is rebuilt in place.
	OpFragmentCorrupt Op = "fragment_corrupt"
	// OpFragmentDeleted: the fragment delete task for Extent, Index on Node
	// is done.
	OpFragmentDeleted Op = "fragment_deleted"
)

// Command is one input of the Manager: a tagged union on Op, JSON-encoded
// in the master's log.
type Command struct {
	Op          Op       `json:"op"`
	Node        string   `json:"node,omitempty"`
	Addr        string   `json:"addr,omitempty"`
	FaultDomain string   `json:"fault_domain,omitempty"`
	UsedBytes   int64    `json:"used_bytes,omitempty"`
	Stream      string   `json:"stream,omitempty"`
	Sources     []string `json:"sources,omitempty"`
	Epoch       uint64   `json:"epoch,omitempty"`
	Avoid       []string `json:"avoid,omitempty"`
	Extent      uint64   `json:"extent,omitempty"`
	Length      int64    `json:"length,omitempty"`
	LastSeq     uint64   `json:"last_seq,omitempty"`
	Nodes       []string `json:"nodes,omitempty"`
	Extents     []uint64 `json:"extents,omitempty"`
	// Replicas and Ack: create_stream (added with partition logs).
	Replicas int       `json:"replicas,omitempty"`
	Ack      AckPolicy `json:"ack,omitempty"`

	// Coding fields (added; zero for the commands above).
	Code         string        `json:"code,omitempty"`
	Index        int           `json:"index,omitempty"`
	FragmentSize int64         `json:"fragment_size,omitempty"`
	Boundaries   []int64       `json:"boundaries,omitempty"`
	CRCs         []uint32      `json:"crcs,omitempty"`
	Fragments    []FragmentRef `json:"fragments,omitempty"` // node_extents: fragments the node holds
}

// Result is what Apply reports.
type Result struct {
	// Changed is false for a valid command that changed nothing (a repeated
	// seal, say); such a command need not be logged.
	Changed bool
	// Epoch is the new writer epoch of OpOpenWriter.
	Epoch uint64
	// Extent is the extent OpAllocate made.
	Extent uint64
}

// ReplicaState is the state of one replica in the manager.
type ReplicaState string

// Replica states: strings in snapshots, never change or reuse.
const (
	// ReplicaOK: a replica that holds the extent.
	ReplicaOK ReplicaState = "ok"
	// ReplicaCopying: a new replica being copied from a good one.
	ReplicaCopying ReplicaState = "copying"
	// ReplicaRepair: a replica to rebuild in place (corrupt, or it missed
	// the seal).
	ReplicaRepair ReplicaState = "repair"
)

// NodeMeta is an extent node as the manager sees it.
type NodeMeta struct {
	ID          string `json:"id"`
	Addr        string `json:"addr"`
	FaultDomain string `json:"fault_domain"`
	Alive       bool   `json:"alive"`
	UsedBytes   int64  `json:"used_bytes,omitempty"`
}

// StreamMeta is a stream: a name and an ordered list of extents.
type StreamMeta struct {
	Name    string   `json:"name"`
	Extents []uint64 `json:"extents"`
	Epoch   uint64   `json:"epoch,omitempty"`
	// Restarts are the indexes in Extents, ascending, where a new sequence
	// number space starts: the first extent of each concatenated source
	// after the first. A reader dropping duplicates forgets the sequence
	// numbers seen before each.
	Restarts []int `json:"restarts,omitempty"`
	// Code is the erasure code its sealed extents get (CodeLRC12), or "".
	Code string `json:"code,omitempty"`
	// Replicas per extent (0: ManagerOptions.Replicas) and the ack policy
	// of its extents ("": AckAll).
	Replicas int       `json:"replicas,omitempty"`
	Ack      AckPolicy `json:"ack,omitempty"`
}

// Replica is one replica of an extent.
type Replica struct {
	Node  string       `json:"node"`
	State ReplicaState `json:"state"`
}

// ExtentMeta is an extent: its replicas (the primary first while it is
// open) and, once sealed, its length.
type ExtentMeta struct {
	ID       uint64    `json:"id"`
	Primary  string    `json:"primary"`
	Replicas []Replica `json:"replicas"`
	Sealed   bool      `json:"sealed,omitempty"`
	Length   int64     `json:"length,omitempty"`
	LastSeq  uint64    `json:"last_seq,omitempty"`
	// Coding is set once coding starts; Replicas is empty once coded.
	Coding *Coding `json:"coding,omitempty"`
	// Copies is how many replicas it keeps (its stream's at allocation;
	// 0: ManagerOptions.Replicas); Ack its ack policy ("": AckAll).
	Copies int       `json:"copies,omitempty"`
	Ack    AckPolicy `json:"ack,omitempty"`
}

// MaxStreamReplicas is the most replicas a stream's extents may have.
const MaxStreamReplicas = 5

// PendingDelete is a replica to remove from a node.
type PendingDelete struct {
	Extent uint64 `json:"extent"`
	Node   string `json:"node"`
}

// ManagerOptions configure a Manager; the zero value works.
type ManagerOptions struct {
	// Replicas per extent. Default 3.
	Replicas int `json:"replicas"`
}

// Manager is the stream manager's state machine (WAS §4.1):
// streams → extents → replicas, the node registry, placement, seals,
// re-replication, repair and garbage collection. It is deterministic and
// does no I/O: its owner applies Commands (through a replicated log in the
// master, directly in the Driver), runs the Tasks it lists and reports
// their outcomes as Commands.
//
// Its state is persistent (ptree.go): Clone costs O(1) and a command
// copies only the nodes, streams and extents it changes, so the master
// applies each command to a clone of the published manager at a cost
// independent of the cluster's size.
//
// Not safe for concurrent use, except that any number of goroutines may
// read (and Clone) a manager nobody modifies.
type Manager struct {
	opts       ManagerOptions
	nextExtent uint64
	nodes      ptree[string, NodeMeta]
	streams    ptree[string, StreamMeta]
	extents    ptree[uint64, ExtentMeta]
	deletes    ptree[PendingDelete, struct{}]
	fragDels   ptree[PendingFragmentDelete, struct{}]

	// Derived, rebuilt from the above on load.
	refs   ptree[uint64, int] // stream references per extent
	hosted ptree[string, int] // replicas and fragments per node
	// onNode counts the replicas and fragments of each extent on each
	// node: the extents a node's death concerns.
	onNode ptree[nodeExtent, int]
	// unsettled holds the extents that are not settled: those plan may
	// change, which planAll plans (and only those).
	unsettled ptree[uint64, struct{}]

	// own is the writer this manager is: it modifies in place the tree
	// nodes it owns. Clone gives both copies new owners. (Not an atomic:
	// tests compare states with reflect.DeepEqual, which compares the
	// owners a plain pointer points to, all alike.)
	own *owner
}

// nodeExtent keys Manager.onNode.
type nodeExtent struct {
	Node   string
	Extent uint64
}

var (
	nodeTree   = &treeKind[string, NodeMeta]{cmp: strings.Compare, hash: hashString}
	streamTree = &treeKind[string, StreamMeta]{cmp: strings.Compare, hash: hashString, clone: func(s StreamMeta) StreamMeta {
		s.Extents, s.Restarts = slices.Clone(s.Extents), slices.Clone(s.Restarts)
		return s
	}}
	extentTree = &treeKind[uint64, ExtentMeta]{cmp: cmp.Compare[uint64], hash: hashU64, clone: func(e ExtentMeta) ExtentMeta { return e.clone() }}
	deleteTree = &treeKind[PendingDelete, struct{}]{cmp: comparePendingDelete, hash: func(k PendingDelete) uint64 {
		return hashU64(k.Extent ^ hashString(k.Node))
	}}
	fragDelTree = &treeKind[PendingFragmentDelete, struct{}]{cmp: comparePendingFragmentDelete, hash: func(k PendingFragmentDelete) uint64 {
		return hashU64(k.Extent ^ hashString(k.Node) ^ uint64(k.Index)<<56)
	}}
	refsTree   = &treeKind[uint64, int]{cmp: cmp.Compare[uint64], hash: hashU64}
	hostedTree = &treeKind[string, int]{cmp: strings.Compare, hash: hashString}
	onNodeTree = &treeKind[nodeExtent, int]{cmp: func(a, b nodeExtent) int {
		return cmp.Or(strings.Compare(a.Node, b.Node), cmp.Compare(a.Extent, b.Extent))
	}, hash: func(k nodeExtent) uint64 { return hashU64(k.Extent ^ hashString(k.Node)) }}
	idSetTree = &treeKind[uint64, struct{}]{cmp: cmp.Compare[uint64], hash: hashU64}
)

func comparePendingDelete(a, b PendingDelete) int {
	return cmp.Or(cmp.Compare(a.Extent, b.Extent), strings.Compare(a.Node, b.Node))
}

func comparePendingFragmentDelete(a, b PendingFragmentDelete) int {
	return cmp.Or(cmp.Compare(a.Extent, b.Extent), cmp.Compare(a.Index, b.Index), strings.Compare(a.Node, b.Node))
}

// NewManager returns an empty manager.
func NewManager(opts ManagerOptions) *Manager {
	if opts.Replicas <= 0 {
		opts.Replicas = 3
	}
	return &Manager{
		opts: opts, nextExtent: 1, own: new(owner),
		nodes: newTree(nodeTree), streams: newTree(streamTree), extents: newTree(extentTree),
		deletes: newTree(deleteTree), fragDels: newTree(fragDelTree), refs: newTree(refsTree), hosted: newTree(hostedTree),
		onNode: newTree(onNodeTree), unsettled: newTree(idSetTree),
	}
}

// o is the writer m is now.
func (m *Manager) o() *owner { return m.own }

func badCmd(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrBadCommand)
}

// Apply applies one command. An error leaves the state unchanged; the same
// command on the same state gives the same result on every replica of the
// manager.
func (m *Manager) Apply(c Command) (Result, error) {
	switch c.Op {
	case OpAddNode:
		return m.addNode(c)
	case OpNodeDown:
		n, err := m.node(c.Node)
		if err != nil {
			return Result{}, err
		}
		if !n.Alive {
			return Result{}, nil
		}
		m.nodes.Mut(m.o(), c.Node).Alive = false
		for k := range m.onNode.From(nodeExtent{Node: c.Node}) {
			if k.Node != c.Node {
				break
			}
			m.setUnsettled(k.Extent, true)
		}
		m.planAll()
		return Result{Changed: true}, nil
	case OpNodeLoad:
		n, err := m.node(c.Node)
		if err != nil {
			return Result{}, err
		}
		if n.UsedBytes == c.UsedBytes {
			return Result{}, nil
		}
		m.nodes.Mut(m.o(), c.Node).UsedBytes = c.UsedBytes
		return Result{Changed: true}, nil
	case OpCreateStream:
		if c.Stream == "" {
			return Result{}, badCmd("create_stream without a name")
		}
		if m.streams.Has(c.Stream) {
			return Result{}, fmt.Errorf("create stream %q: %w", c.Stream, ErrStreamExists)
		}
		if c.Code != "" {
			if _, err := codeOf(c.Code); err != nil {
				return Result{}, err
			}
		}
		if c.Replicas < 0 || c.Replicas > MaxStreamReplicas {
			return Result{}, badCmd("create_stream %q with %d replicas (1 to %d)", c.Stream, c.Replicas, MaxStreamReplicas)
		}
		if !c.Ack.Valid() {
			return Result{}, badCmd("create_stream %q with ack policy %q (%q or %q)", c.Stream, c.Ack, AckAll, AckQuorum)
		}
		m.streams.Set(m.o(), c.Stream, StreamMeta{Name: c.Stream, Extents: []uint64{}, Code: c.Code, Replicas: c.Replicas, Ack: c.Ack})
		return Result{Changed: true}, nil
	case OpDeleteStream:
		s, err := m.stream(c.Stream)
		if err != nil {
			return Result{}, err
		}
		ids := s.Extents // s is read only, never modified: a slice of the old version
		m.streams.Delete(m.o(), c.Stream)
		for _, id := range ids {
			m.unref(id)
		}
		return Result{Changed: true}, nil
	case OpTrimStream:
		return m.trim(c)
	case OpConcat:
		return m.concat(c)
	case OpOpenWriter:
		if _, err := m.stream(c.Stream); err != nil {
			return Result{}, err
		}
		s := m.streams.Mut(m.o(), c.Stream)
		s.Epoch++
		return Result{Changed: true, Epoch: s.Epoch}, nil
	case OpAllocate:
		return m.allocate(c)
	case OpSeal:
		return m.seal(c)
	case OpReportCorrupt, OpReplicaReady, OpReplicaFailed:
		return m.replicaEvent(c)
	case OpReplicaDeleted:
		if !m.deletes.Delete(m.o(), PendingDelete{Extent: c.Extent, Node: c.Node}) {
			return Result{}, nil
		}
		return Result{Changed: true}, nil
	case OpSetCode, OpCodeStart, OpCoded, OpCodeAbort, OpFragmentReady, OpFragmentCorrupt, OpFragmentDeleted:
		return m.applyCoding(c)
	case OpNodeExtents:
		if _, err := m.node(c.Node); err != nil {
			return Result{}, err
		}
		changed := m.orphanFragments(c)
		for _, id := range c.Extents {
			if e := m.extents.Get(id); e != nil && e.replica(c.Node) >= 0 {
				continue
			}
			if id >= m.nextExtent {
				continue // not allocated yet by this manager: not ours to judge
			}
			k := PendingDelete{Extent: id, Node: c.Node}
			if !m.deletes.Has(k) {
				m.deletes.Set(m.o(), k, struct{}{})
				changed = true
			}
		}
		return Result{Changed: changed}, nil
	}
	return Result{}, badCmd("unknown op %q", c.Op)
}

// node returns node id, read only.
func (m *Manager) node(id string) (*NodeMeta, error) {
	n := m.nodes.Get(id)
	if n == nil {
		return nil, fmt.Errorf("node %q: %w", id, ErrUnknownNode)
	}
	return n, nil
}

// stream returns stream name, read only.
func (m *Manager) stream(name string) (*StreamMeta, error) {
	s := m.streams.Get(name)
	if s == nil {
		return nil, fmt.Errorf("stream %q: %w", name, ErrStreamNotFound)
	}
	return s, nil
}

// extent returns extent id, read only.
func (m *Manager) extent(id uint64) (*ExtentMeta, error) {
	e := m.extents.Get(id)
	if e == nil {
		return nil, fmt.Errorf("extent %d: %w", id, ErrUnknownExtent)
	}
	return e, nil
}

// mutExtent returns extent id (which exists) for writing.
func (m *Manager) mutExtent(id uint64) *ExtentMeta { return m.extents.Mut(m.o(), id) }

// alive reports whether node id is alive (it must be known).
func (m *Manager) alive(id string) bool { return m.nodes.Get(id).Alive }

// hostedOn is how many replicas and fragments node id holds.
func (m *Manager) hostedOn(id string) int {
	if h := m.hosted.Get(id); h != nil {
		return *h
	}
	return 0
}

// host counts d more replicas or fragments of extent on node (d < 0:
// fewer).
func (m *Manager) host(node string, extent uint64, d int) {
	o := m.o()
	if h := m.hostedOn(node) + d; h != 0 {
		m.hosted.Set(o, node, h)
	} else {
		m.hosted.Delete(o, node)
	}
	k := nodeExtent{Node: node, Extent: extent}
	n := d
	if p := m.onNode.Get(k); p != nil {
		n += *p
	}
	if n != 0 {
		m.onNode.Set(o, k, n)
	} else {
		m.onNode.Delete(o, k)
	}
}

func (m *Manager) addDelete(k PendingDelete) {
	if !m.deletes.Has(k) {
		m.deletes.Set(m.o(), k, struct{}{})
	}
}

func (m *Manager) addFragDelete(k PendingFragmentDelete) {
	if !m.fragDels.Has(k) {
		m.fragDels.Set(m.o(), k, struct{}{})
	}
}

// replica returns the index of node's replica of e, or -1.
func (e *ExtentMeta) replica(node string) int {
	return slices.IndexFunc(e.Replicas, func(r Replica) bool { return r.Node == node })
}

func (m *Manager) addNode(c Command) (Result, error) {
	if c.Node == "" || c.Addr == "" {
		return Result{}, badCmd("add_node needs a node id and an address")
	}
	if !m.nodes.Has(c.Node) {
		m.nodes.Set(m.o(), c.Node, NodeMeta{ID: c.Node})
	}
	n := m.nodes.Mut(m.o(), c.Node)
	n.Addr, n.FaultDomain, n.Alive = c.Addr, c.FaultDomain, true
	m.planAll()
	return Result{Changed: true}, nil
}

func (m *Manager) concat(c Command) (Result, error) {
	if c.Stream == "" {
		return Result{}, badCmd("concat without a name")
	}
	if m.streams.Has(c.Stream) {
		return Result{}, fmt.Errorf("concat into %q: %w", c.Stream, ErrStreamExists)
	}
	ids := []uint64{}
	var restarts []int
	for _, src := range c.Sources {
		s, err := m.stream(src)
		if err != nil {
			return Result{}, err
		}
		for _, id := range s.Extents {
			if !m.extents.Get(id).Sealed {
				return Result{}, fmt.Errorf("concat %q: extent %d of %q: %w", c.Stream, id, src, ErrNotSealed)
			}
		}
		if len(ids) > 0 && len(s.Extents) > 0 {
			restarts = append(restarts, len(ids))
		}
		for _, r := range s.Restarts {
			restarts = append(restarts, len(ids)+r)
		}
		ids = append(ids, s.Extents...)
	}
	m.streams.Set(m.o(), c.Stream, StreamMeta{Name: c.Stream, Extents: ids, Restarts: restarts})
	for _, id := range ids {
		m.refs.Set(m.o(), id, *m.refs.Get(id)+1)
	}
	return Result{Changed: true}, nil
}

// trim applies OpTrimStream.
func (m *Manager) trim(c Command) (Result, error) {
	s, err := m.stream(c.Stream)
	if err != nil {
		return Result{}, fmt.Errorf("trim: %w", err)
	}
	k := slices.Index(s.Extents, c.Extent)
	if k < 0 {
		held := "holds no extent"
		if n := len(s.Extents); n > 0 {
			held = fmt.Sprintf("holds extents %d to %d", s.Extents[0], s.Extents[n-1])
		}
		return Result{}, fmt.Errorf("trim stream %q before extent %d: the stream %s, and a trim keeps the extent it names: %w",
			s.Name, c.Extent, held, ErrUnknownExtent)
	}
	if k == 0 {
		return Result{}, nil
	}
	drop := s.Extents[:k] // of the read-only version: not modified below
	for _, id := range drop {
		if !m.extents.Get(id).Sealed { // a broken invariant: only the last extent is open
			return Result{}, fmt.Errorf("trim stream %q before extent %d: extent %d: %w", s.Name, c.Extent, id, ErrNotSealed)
		}
	}
	ms := m.streams.Mut(m.o(), c.Stream)
	ms.Extents = slices.Clone(ms.Extents[k:])
	var restarts []int
	for _, r := range ms.Restarts {
		if r > k { // a restart at k is the new first extent's: implicit
			restarts = append(restarts, r-k)
		}
	}
	ms.Restarts = restarts
	for _, id := range drop {
		m.unref(id)
	}
	return Result{Changed: true}, nil
}

// unref drops one stream reference to extent id; the last one makes it
// garbage.
func (m *Manager) unref(id uint64) {
	o := m.o()
	if r := *m.refs.Get(id) - 1; r > 0 {
		m.refs.Set(o, id, r)
		return
	}
	m.refs.Delete(o, id)
	e := m.extents.Get(id) // read only: the node leaves the tree next
	m.extents.Delete(o, id)
	m.unsettled.Delete(o, id)
	for _, r := range e.Replicas {
		m.host(r.Node, id, -1)
		m.addDelete(PendingDelete{Extent: id, Node: r.Node})
	}
	m.dropFragments(e)
}

// place picks up to n live nodes not in exclude, in fault domains not in
// usedFD and distinct from each other: prefer first if it qualifies, then
// by (in avoid, replicas hosted, used bytes, id).
func (m *Manager) place(n int, exclude, usedFD, avoid map[string]bool, prefer string) []string {
	var cands []*NodeMeta
	for _, nd := range m.nodes.All() {
		if nd.Alive && !exclude[nd.ID] && !usedFD[nd.FaultDomain] {
			cands = append(cands, nd)
		}
	}
	b2i := func(b bool) int {
		if b {
			return 1
		}
		return 0
	}
	slices.SortFunc(cands, func(a, b *NodeMeta) int {
		return cmp.Or(
			cmp.Compare(b2i(a.ID != prefer), b2i(b.ID != prefer)),
			cmp.Compare(b2i(avoid[a.ID]), b2i(avoid[b.ID])),
			cmp.Compare(m.hostedOn(a.ID), m.hostedOn(b.ID)),
			cmp.Compare(a.UsedBytes, b.UsedBytes),
			cmp.Compare(a.ID, b.ID),
		)
	})
	fds := maps.Clone(usedFD)
	if fds == nil {
		fds = map[string]bool{}
	}
	var out []string
	for _, nd := range cands {
		if len(out) == n {
			break
		}
		if fds[nd.FaultDomain] {
			continue
		}
		fds[nd.FaultDomain] = true
		out = append(out, nd.ID)
	}
	return out
}

func (m *Manager) allocate(c Command) (Result, error) {
	s, err := m.stream(c.Stream)
	if err != nil {
		return Result{}, err
	}
	if c.Epoch != 0 && c.Epoch != s.Epoch {
		return Result{}, fmt.Errorf("allocate in %q with epoch %d, stream at %d: %w", s.Name, c.Epoch, s.Epoch, ErrFenced)
	}
	if k := len(s.Extents); k > 0 && !m.extents.Get(s.Extents[k-1]).Sealed {
		return Result{}, fmt.Errorf("allocate in %q: last extent %d: %w", s.Name, s.Extents[k-1], ErrNotSealed)
	}
	want := cmp.Or(s.Replicas, m.opts.Replicas)
	var picks []string
	if len(c.Nodes) > 0 {
		// Fewer than the stream's replicas is a degraded extent (a
		// partition that lost a replica goes on with the rest); once
		// sealed it is re-replicated to the stream's count. More is a
		// partition's replica moving (its target joins before its source
		// leaves): up to twice the count.
		if len(c.Nodes) > 2*want {
			return Result{}, badCmd("allocate in %q on %d nodes %v: the stream has %d replicas, and an extent takes at most twice that", s.Name, len(c.Nodes), c.Nodes, want)
		}
		for i, id := range c.Nodes {
			nd, err := m.node(id)
			if err != nil {
				return Result{}, fmt.Errorf("allocate in %q: %w", s.Name, err)
			}
			if !nd.Alive {
				return Result{}, fmt.Errorf("allocate in %q: node %q is down: %w", s.Name, id, ErrNoPlacement)
			}
			if slices.Contains(c.Nodes[:i], id) {
				return Result{}, badCmd("allocate in %q: node %q named twice", s.Name, id)
			}
		}
		picks = slices.Clone(c.Nodes)
	} else {
		avoid := map[string]bool{}
		for _, a := range c.Avoid {
			avoid[a] = true
		}
		picks = m.place(want, nil, nil, avoid, c.Node)
		if len(picks) < want {
			return Result{}, fmt.Errorf("allocate in %q: %d of %d replicas placeable: %w", s.Name, len(picks), want, ErrNoPlacement)
		}
	}
	e := ExtentMeta{ID: m.nextExtent, Primary: picks[0], Ack: s.Ack}
	if s.Replicas != 0 {
		e.Copies = s.Replicas
	}
	m.nextExtent++
	for _, p := range picks {
		e.Replicas = append(e.Replicas, Replica{Node: p, State: ReplicaOK})
		m.host(p, e.ID, 1)
	}
	o := m.o()
	m.extents.Set(o, e.ID, e)
	ms := m.streams.Mut(o, c.Stream)
	ms.Extents = append(ms.Extents, e.ID)
	m.refs.Set(o, e.ID, 1)
	return Result{Changed: true, Extent: e.ID}, nil
}

func (m *Manager) seal(c Command) (Result, error) {
	e, err := m.extent(c.Extent)
	if err != nil {
		return Result{}, err
	}
	if c.Length < 0 {
		return Result{}, badCmd("seal at %d", c.Length)
	}
	if e.Sealed {
		if e.Length != c.Length {
			return Result{}, fmt.Errorf("seal extent %d at %d, sealed at %d: %w", e.ID, c.Length, e.Length, ErrSealConflict)
		}
		return Result{}, nil
	}
	e = m.mutExtent(c.Extent)
	e.Sealed, e.Length, e.LastSeq = true, c.Length, c.LastSeq
	for i, r := range e.Replicas {
		if r.State == ReplicaOK && !slices.Contains(c.Nodes, r.Node) {
			e.Replicas[i].State = ReplicaRepair
		}
	}
	m.plan(e)
	return Result{Changed: true}, nil
}

func (m *Manager) replicaEvent(c Command) (Result, error) {
	e, err := m.extent(c.Extent)
	if err != nil {
		return Result{}, err
	}
	i := e.replica(c.Node)
	if i < 0 {
		return Result{}, fmt.Errorf("extent %d has no replica on %q: %w", e.ID, c.Node, ErrUnknownNode)
	}
	switch st := e.Replicas[i].State; c.Op {
	case OpReportCorrupt:
		if st != ReplicaOK {
			return Result{}, nil
		}
		e = m.mutExtent(c.Extent)
		e.Replicas[i].State = ReplicaRepair
	case OpReplicaReady:
		if st == ReplicaOK {
			return Result{}, nil
		}
		e = m.mutExtent(c.Extent)
		e.Replicas[i].State = ReplicaOK
	case OpReplicaFailed:
		if st != ReplicaCopying {
			return Result{}, nil // a repair stays to be retried
		}
		e = m.mutExtent(c.Extent)
		m.dropReplica(e, i)
	}
	m.plan(e)
	return Result{Changed: true}, nil
}

// dropReplica removes replica i of e (for writing) and queues its
// deletion.
func (m *Manager) dropReplica(e *ExtentMeta, i int) {
	r := e.Replicas[i]
	e.Replicas = slices.Delete(e.Replicas, i, i+1)
	m.host(r.Node, e.ID, -1)
	m.addDelete(PendingDelete{Extent: e.ID, Node: r.Node})
}

// planAll plans every extent, in id order. Only the unsettled ones can
// change: it plans those.
func (m *Manager) planAll() {
	for _, id := range m.unsettled.Keys() {
		if m.settled(m.extents.Get(id)) {
			m.setUnsettled(id, false)
			continue
		}
		m.plan(m.mutExtent(id))
	}
}

// settled reports whether plan(e) would change nothing: e is open, or
// every replica and fragment of e is on a live node and e has its copies
// (good or being made) or is coded. The state of one extent and the
// liveness of its nodes decide it: planning one extent never unsettles
// another, so planAll need only plan the extents that are not settled
// (Manager.unsettled holds them: an extent joins it when plan leaves it
// unsettled or when one of its nodes dies, leaves it when plan settles it;
// a command that changes an extent without planning it updates it too).
func (m *Manager) settled(e *ExtentMeta) bool {
	if !e.Sealed {
		return true
	}
	if cd := e.Coding; cd != nil {
		for _, f := range cd.Fragments {
			if !m.alive(f.Node) {
				return false
			}
		}
		if cd.State == CodingDone {
			return true
		}
	}
	for _, r := range e.Replicas {
		if !m.alive(r.Node) {
			return false
		}
	}
	return len(e.Replicas) >= cmp.Or(e.Copies, m.opts.Replicas)
}

func (m *Manager) setUnsettled(id uint64, on bool) {
	switch has := m.unsettled.Has(id); {
	case on && !has:
		m.unsettled.Set(m.o(), id, struct{}{})
	case !on && has:
		m.unsettled.Delete(m.o(), id)
	}
}

// plan brings a sealed extent (for writing) back to Replicas good
// replicas: it places new replicas (copying) in fault domains its live
// replicas do not use, drops pending ones on dead nodes, and once enough
// replicas are good, drops the ones on dead nodes. An open extent is
// sealed first (see Tasks).
func (m *Manager) plan(e *ExtentMeta) {
	defer func() { m.setUnsettled(e.ID, !m.settled(e)) }()
	if !e.Sealed {
		return
	}
	m.planFragments(e)
	if e.Coding != nil && e.Coding.State == CodingDone {
		return // no replicas any more
	}
	for i := len(e.Replicas) - 1; i >= 0; i-- {
		if r := e.Replicas[i]; r.State != ReplicaOK && !m.alive(r.Node) {
			m.dropReplica(e, i)
		}
	}
	healthy, pending := 0, 0
	exclude, usedFD := map[string]bool{}, map[string]bool{}
	for _, r := range e.Replicas {
		exclude[r.Node] = true
		nd := m.nodes.Get(r.Node)
		if !nd.Alive {
			continue
		}
		usedFD[nd.FaultDomain] = true
		if r.State == ReplicaOK {
			healthy++
		} else {
			pending++
		}
	}
	if healthy == 0 {
		return // nothing to copy from until a node with a good replica returns
	}
	copies := cmp.Or(e.Copies, m.opts.Replicas)
	if need := copies - healthy - pending; need > 0 {
		for _, p := range m.place(need, exclude, usedFD, nil, "") {
			e.Replicas = append(e.Replicas, Replica{Node: p, State: ReplicaCopying})
			m.host(p, e.ID, 1)
		}
	}
	if healthy >= copies {
		for i := len(e.Replicas) - 1; i >= 0; i-- {
			if !m.alive(e.Replicas[i].Node) {
				m.dropReplica(e, i)
			}
		}
	}
}

// TaskKind names what a Task asks of the owner.
type TaskKind string

// Task kinds.
const (
	// TaskSeal: seal the open Extent (probe its replicas' commit lengths,
	// apply OpSeal, seal the replicas): one of its replicas is dead or bad.
	TaskSeal TaskKind = "seal"
	// TaskCopy: have Node (Addr) copy sealed Extent of Length from one of
	// Sources, then apply OpReplicaReady (or OpReplicaFailed).
	TaskCopy TaskKind = "copy"
	// TaskDelete: delete Extent's replica on Node (Addr), then apply
	// OpReplicaDeleted.
	TaskDelete TaskKind = "delete"
)

// Task is work the manager's owner does outside the state machine.
type Task struct {
	Kind    TaskKind
	Extent  uint64
	Node    string
	Addr    string
	Length  int64
	Sources []string // addresses of good replicas

	// Coding tasks (TaskCode, TaskRebuild, TaskDeleteFragment).
	Scheme string
	// Index is the fragment to rebuild or delete.
	Index int
	// Fragments[i] is the address of fragment i's node; "" if it is not
	// available (dead node, or itself being rebuilt).
	Fragments    []string
	FragmentSize int64
	// CRC is the CRC32C the rebuilt fragment must have.
	CRC uint32
}

// Tasks lists the work pending now, in a deterministic order: seals, then
// copies, then deletes. Work for dead nodes waits until they return.
func (m *Manager) Tasks() []Task {
	var seals, copies, dels []Task
	for id, e := range m.extents.All() {
		if !e.Sealed {
			for _, r := range e.Replicas {
				if r.State != ReplicaOK || !m.alive(r.Node) {
					seals = append(seals, Task{Kind: TaskSeal, Extent: id})
					break
				}
			}
			continue
		}
		var sources []string
		for _, r := range e.Replicas {
			if nd := m.nodes.Get(r.Node); r.State == ReplicaOK && nd.Alive {
				sources = append(sources, nd.Addr)
			}
		}
		if len(sources) == 0 {
			continue
		}
		for _, r := range e.Replicas {
			if nd := m.nodes.Get(r.Node); r.State != ReplicaOK && nd.Alive {
				copies = append(copies, Task{Kind: TaskCopy, Extent: id, Node: r.Node, Addr: nd.Addr, Length: e.Length, Sources: sources})
			}
		}
	}
	for k := range m.deletes.All() {
		if nd := m.nodes.Get(k.Node); nd != nil && nd.Alive {
			dels = append(dels, Task{Kind: TaskDelete, Extent: k.Extent, Node: k.Node, Addr: nd.Addr})
		}
	}
	codes, rebuilds, fdels := m.codingTasks()
	return slices.Concat(seals, copies, codes, rebuilds, dels, fdels)
}

// Stream returns a copy of stream name and its extents.
func (m *Manager) Stream(name string) (StreamMeta, []ExtentMeta, error) {
	s, err := m.stream(name)
	if err != nil {
		return StreamMeta{}, nil, err
	}
	out := *s
	out.Extents, out.Restarts = slices.Clone(s.Extents), slices.Clone(s.Restarts)
	es := make([]ExtentMeta, len(s.Extents))
	for i, id := range s.Extents {
		es[i] = m.extents.Get(id).clone()
	}
	return out, es, nil
}

func (e *ExtentMeta) clone() ExtentMeta {
	c := *e
	c.Replicas = slices.Clone(e.Replicas)
	c.Coding = e.Coding.clone()
	return c
}

// Extent returns a copy of extent id.
func (m *Manager) Extent(id uint64) (ExtentMeta, error) {
	e, err := m.extent(id)
	if err != nil {
		return ExtentMeta{}, err
	}
	return e.clone(), nil
}

// Node returns a copy of node id.
func (m *Manager) Node(id string) (NodeMeta, error) {
	n, err := m.node(id)
	if err != nil {
		return NodeMeta{}, err
	}
	return *n, nil
}

// Nodes returns copies of every node, by id.
func (m *Manager) Nodes() []NodeMeta {
	var out []NodeMeta
	for _, n := range m.nodes.All() {
		out = append(out, *n)
	}
	return out
}

// Streams returns the stream names, sorted.
func (m *Manager) Streams() []string { return m.streams.Keys() }

// ExtentIDs returns the ids of the live extents, sorted.
func (m *Manager) ExtentIDs() []uint64 { return m.extents.Keys() }

// snapshotVersion is the snapshot format version; bump on an incompatible
// change and keep reading the old one.
const snapshotVersion = 1

type snapshot struct {
	Version    int             `json:"version"`
	Options    ManagerOptions  `json:"options"`
	NextExtent uint64          `json:"next_extent"`
	Nodes      []NodeMeta      `json:"nodes"`
	Streams    []StreamMeta    `json:"streams"`
	Extents    []ExtentMeta    `json:"extents"`
	Deletes    []PendingDelete `json:"deletes"`
	// FragmentDeletes: added with erasure coding; absent in older
	// snapshots.
	FragmentDeletes []PendingFragmentDelete `json:"fragment_deletes,omitempty"`
}

// Snapshot encodes the whole state (JSON, deterministic: sorted).
func (m *Manager) Snapshot() []byte {
	s := snapshot{Version: snapshotVersion, Options: m.opts, NextExtent: m.nextExtent,
		Nodes: m.Nodes(), Streams: make([]StreamMeta, 0, m.streams.Len()), Extents: make([]ExtentMeta, 0, m.extents.Len()), Deletes: m.deletes.Keys()}
	if s.Nodes == nil {
		s.Nodes = []NodeMeta{}
	}
	for _, st := range m.streams.All() {
		s.Streams = append(s.Streams, *st)
	}
	for _, e := range m.extents.All() {
		s.Extents = append(s.Extents, *e)
	}
	s.FragmentDeletes = m.sortedFragDels()
	b, err := json.Marshal(s)
	if err != nil {
		panic(fmt.Sprintf("stream: encode manager snapshot: %v", err)) // plain data: cannot fail
	}
	return b
}

// LoadSnapshot decodes a Snapshot and checks it is consistent: every
// reference resolves, no extent is unreferenced, replicas are on known
// nodes, once each. A bad snapshot is an error wrapping ErrBadCommand.
func LoadSnapshot(b []byte) (*Manager, error) {
	var s snapshot
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, badCmd("decode manager snapshot: %v", err)
	}
	if s.Version != snapshotVersion {
		return nil, badCmd("manager snapshot version %d (this build reads %d)", s.Version, snapshotVersion)
	}
	if s.Options.Replicas <= 0 || s.Options.Replicas > 16 {
		return nil, badCmd("snapshot with %d replicas per extent", s.Options.Replicas)
	}
	if s.NextExtent == 0 {
		return nil, badCmd("snapshot with next extent 0")
	}
	m := NewManager(s.Options)
	o := m.o()
	m.nextExtent = s.NextExtent
	for _, n := range s.Nodes {
		if n.ID == "" || m.nodes.Has(n.ID) {
			return nil, badCmd("snapshot node %q empty or repeated", n.ID)
		}
		m.nodes.Set(o, n.ID, n)
	}
	for _, e := range s.Extents {
		if e.ID == 0 || e.ID >= m.nextExtent || m.extents.Has(e.ID) {
			return nil, badCmd("snapshot extent %d out of range or repeated", e.ID)
		}
		if e.Copies < 0 || e.Copies > MaxStreamReplicas || !e.Ack.Valid() {
			return nil, badCmd("snapshot extent %d: %d copies, ack %q", e.ID, e.Copies, e.Ack)
		}
		if e.Length < 0 || (!e.Sealed && (e.Length != 0 || e.LastSeq != 0)) {
			return nil, badCmd("snapshot extent %d: length %d, sealed %v", e.ID, e.Length, e.Sealed)
		}
		for i, r := range e.Replicas {
			if !m.nodes.Has(r.Node) || e.replica(r.Node) != i {
				return nil, badCmd("snapshot extent %d: replica on %q unknown or repeated", e.ID, r.Node)
			}
			if r.State != ReplicaOK && r.State != ReplicaCopying && r.State != ReplicaRepair {
				return nil, badCmd("snapshot extent %d: replica state %q", e.ID, r.State)
			}
			if !e.Sealed && r.State == ReplicaCopying {
				return nil, badCmd("snapshot extent %d: copying an open extent", e.ID)
			}
			m.host(r.Node, e.ID, 1)
		}
		if e.replica(e.Primary) < 0 && !e.Sealed {
			return nil, badCmd("snapshot extent %d: primary %q not a replica", e.ID, e.Primary)
		}
		if err := m.loadCoding(&e); err != nil {
			return nil, err
		}
		m.extents.Set(o, e.ID, e)
		m.setUnsettled(e.ID, !m.settled(&e))
	}
	for _, st := range s.Streams {
		if st.Name == "" || m.streams.Has(st.Name) {
			return nil, badCmd("snapshot stream %q empty or repeated", st.Name)
		}
		if st.Extents == nil {
			st.Extents = []uint64{}
		}
		if st.Replicas < 0 || st.Replicas > MaxStreamReplicas || !st.Ack.Valid() {
			return nil, badCmd("snapshot stream %q: %d replicas, ack %q", st.Name, st.Replicas, st.Ack)
		}
		for i, r := range st.Restarts {
			if r <= 0 || r >= len(st.Extents) || (i > 0 && r <= st.Restarts[i-1]) {
				return nil, badCmd("snapshot stream %q: restart %d", st.Name, r)
			}
		}
		for i, id := range st.Extents {
			e := m.extents.Get(id)
			if e == nil {
				return nil, badCmd("snapshot stream %q: unknown extent %d", st.Name, id)
			}
			if !e.Sealed && i != len(st.Extents)-1 {
				return nil, badCmd("snapshot stream %q: open extent %d not last", st.Name, id)
			}
			r := 0
			if p := m.refs.Get(id); p != nil {
				r = *p
			}
			m.refs.Set(o, id, r+1)
		}
		if st.Code != "" {
			if _, err := codeOf(st.Code); err != nil {
				return nil, err
			}
		}
		m.streams.Set(o, st.Name, st)
	}
	for id, e := range m.extents.All() {
		r := m.refs.Get(id)
		if r == nil {
			return nil, badCmd("snapshot extent %d referenced by no stream", id)
		}
		if !e.Sealed && *r > 1 {
			return nil, badCmd("snapshot open extent %d in %d streams", id, *r)
		}
	}
	for _, d := range s.Deletes {
		if !m.nodes.Has(d.Node) || m.deletes.Has(d) {
			return nil, badCmd("snapshot delete of %d on %q: unknown node or repeated", d.Extent, d.Node)
		}
		m.deletes.Set(o, d, struct{}{})
	}
	for _, d := range s.FragmentDeletes {
		if !m.nodes.Has(d.Node) || m.fragDels.Has(d) || d.Index < 0 || d.Index > 255 {
			return nil, badCmd("snapshot fragment delete of %d.%d on %q: unknown node, bad index or repeated", d.Extent, d.Index, d.Node)
		}
		m.fragDels.Set(o, d, struct{}{})
	}
	return m, nil
}
