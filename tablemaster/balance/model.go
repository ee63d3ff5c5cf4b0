package balance

import (
	"fmt"
	"slices"
	"strings"
)

// Dim is one dimension of load.
type Dim int

// The dimensions, in the order of a Vec.
const (
	DimReplicas Dim = iota
	DimReads        // reads per second
	DimWrites       // writes per second
	DimBusy         // engine busy time per second (cores)
	DimDisk         // bytes on disk
	DimMemory       // bytes in memory
	NumDims
)

var dimNames = [NumDims]string{"replicas", "reads/s", "writes/s", "busy", "disk", "memory"}

func (d Dim) String() string { return dimNames[d] }

// Vec is a load vector, indexed by Dim.
type Vec [NumDims]float64

func (v Vec) add(w Vec) Vec {
	for i := range v {
		v[i] += w[i]
	}
	return v
}

func (v Vec) sub(w Vec) Vec {
	for i := range v {
		v[i] -= w[i]
	}
	return v
}

// Capacity is what a server reports it has (0: not known, no limit).
type Capacity struct {
	DiskBytes     float64
	DiskFreeBytes float64
	MemoryBytes   float64
}

// Server is a live server. Dead servers are left out of the Snapshot.
type Server struct {
	ID string
	// Domain is the fault domain; empty is a domain of the server's own.
	Domain   string
	Draining bool // everything on it moves off; it receives nothing
	Capacity Capacity
}

func (s Server) domain() string {
	if s.Domain == "" {
		return "\x00server:" + s.ID // cannot collide with a named domain
	}
	return s.Domain
}

// Replica is one replica of a partition.
type Replica struct {
	Server  string
	Primary bool
	// InSync: a full replica, current with the log: it may take the
	// primary role, and its partition may move.
	InSync bool
	// Load is this replica's own load; Load[DimReplicas] is set to 1 by
	// the planner whatever it holds.
	Load Vec
}

// Partition is one partition and its replicas.
type Partition struct {
	ID uint64
	// Name labels the partition in reasons ("tenant/table#index").
	Name     string
	Replicas []Replica
	// Moving: a replica move is under way. It counts against the move
	// limits, and the partition stays as it is until it ends.
	Moving bool
	// MovingFrom and MovingTo are that move's ends, for the per-server
	// limit.
	MovingFrom, MovingTo string
	// Settling: its primary role moved recently (the master remembers its
	// transfers for a while). The role moves no further (no transfer, no
	// move of the primary replica) unless off a draining server: planning
	// on noisy rates right after would hand roles back and forth. Its
	// secondaries may move.
	Settling bool
}

func (p *Partition) primary() int {
	return slices.IndexFunc(p.Replicas, func(r Replica) bool { return r.Primary })
}

func (p *Partition) hosts(id string) bool {
	return slices.ContainsFunc(p.Replicas, func(r Replica) bool { return r.Server == id })
}

// Snapshot is the cluster as the planner sees it.
type Snapshot struct {
	Servers    []Server
	Partitions []Partition
	// Left names, per partition id, servers the partition's replicas
	// left recently (moves the master made, within its cooldown): the
	// plan does not move it back onto them.
	Left map[uint64][]string
}

// Clone returns a deep copy of s.
func (s Snapshot) Clone() Snapshot {
	out := Snapshot{Servers: slices.Clone(s.Servers), Partitions: make([]Partition, len(s.Partitions))}
	for i, p := range s.Partitions {
		p.Replicas = slices.Clone(p.Replicas)
		out.Partitions[i] = p
	}
	if s.Left != nil {
		out.Left = make(map[uint64][]string, len(s.Left))
		for k, v := range s.Left {
			out.Left[k] = slices.Clone(v)
		}
	}
	return out
}

// Kind is what an Action does.
type Kind int

// The kinds of action.
const (
	// TransferPrimary hands the primary role from From to To, an in-sync
	// secondary: a live handoff, nothing copied.
	TransferPrimary Kind = iota + 1
	// MoveReplica moves the replica on From to To with its data (copy,
	// catch up, the source leaves; the role goes with it).
	MoveReplica
)

func (k Kind) String() string {
	switch k {
	case TransferPrimary:
		return "transfer"
	case MoveReplica:
		return "move"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Action is one step of a plan.
type Action struct {
	Kind      Kind
	Partition uint64
	Name      string
	From, To  string
	// Reason says which dimensions of which servers it brings back
	// towards the band.
	Reason string
}

func (a Action) String() string {
	name := ""
	if a.Name != "" {
		name = " (" + a.Name + ")"
	}
	return fmt.Sprintf("%s p%d%s %s -> %s: %s", a.Kind, a.Partition, name, a.From, a.To, a.Reason)
}

// Apply returns s after a, as the planner models it: a transfer swaps
// the two replicas' roles and loads, a move carries the replica (role and
// load) to the target, and the source is recorded in Left. It refuses an
// action that does not fit s.
func (s Snapshot) Apply(a Action) (Snapshot, error) {
	out := s.Clone()
	k := slices.IndexFunc(out.Partitions, func(p Partition) bool { return p.ID == a.Partition })
	if k < 0 {
		return s, fmt.Errorf("balance: apply %v: no partition %d", a, a.Partition)
	}
	p := &out.Partitions[k]
	from := slices.IndexFunc(p.Replicas, func(r Replica) bool { return r.Server == a.From })
	if from < 0 {
		return s, fmt.Errorf("balance: apply %v: %s holds no replica", a, a.From)
	}
	switch a.Kind {
	case TransferPrimary:
		to := slices.IndexFunc(p.Replicas, func(r Replica) bool { return r.Server == a.To })
		if to < 0 || !p.Replicas[from].Primary || p.Replicas[to].Primary {
			return s, fmt.Errorf("balance: apply %v: not a primary and a secondary", a)
		}
		rf, rt := &p.Replicas[from], &p.Replicas[to]
		rf.Primary, rt.Primary = false, true
		rf.Load, rt.Load = rt.Load, rf.Load
	case MoveReplica:
		if p.hosts(a.To) {
			return s, fmt.Errorf("balance: apply %v: %s holds a replica already", a, a.To)
		}
		p.Replicas[from].Server = a.To
		if out.Left == nil {
			out.Left = map[uint64][]string{}
		}
		out.Left[p.ID] = append(out.Left[p.ID], a.From)
	default:
		return s, fmt.Errorf("balance: apply %v: unknown kind", a)
	}
	return out, nil
}

// ServerLoad is a server's totals as the planner saw them.
type ServerLoad struct {
	Server
	Load      Vec
	Primaries int
}

// Result is a plan: the actions in order and the servers' loads before
// and after them.
type Result struct {
	Actions       []Action
	Before, After []ServerLoad
	// Mean is the mean per receiving server of each dimension; Balanced
	// says which dimensions were balanced (mean above its floor).
	Mean     Vec
	Balanced [NumDims]bool
	Band     float64
	// Note says why the plan stopped where it did.
	Note string
}

// String prints the servers' loads as a table.
func FormatLoads(ls []ServerLoad) string {
	var b strings.Builder
	for _, l := range ls {
		fmt.Fprintf(&b, "%-4s %-3s repl=%-3.0f prim=%-3d reads=%-6.0f writes=%-6.0f busy=%-5.2f disk=%-8s mem=%s",
			l.ID, l.Domain, l.Load[DimReplicas], l.Primaries, l.Load[DimReads], l.Load[DimWrites], l.Load[DimBusy],
			Bytes(l.Load[DimDisk]), Bytes(l.Load[DimMemory]))
		if l.Draining {
			b.WriteString(" draining")
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// Bytes formats a byte count with a binary unit.
func Bytes(v float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0fB", v)
	}
	return fmt.Sprintf("%.1f%s", v, units[i])
}

func formatDim(d Dim, v float64) string {
	switch d {
	case DimDisk, DimMemory:
		return Bytes(v)
	case DimBusy:
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.1f", v)
}
