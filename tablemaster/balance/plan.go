package balance

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
)

// Options tune the planner. The zero value works: every field's default
// is in its comment.
type Options struct {
	// Band: a server is balanced on a dimension within mean*(1 ± Band).
	// Default 0.15.
	Band float64
	// Floors: a dimension whose mean per server is below its floor is not
	// balanced. Default DefaultFloors.
	Floors *Vec
	// MaxMoves bounds the replica moves in flight in the cluster, those
	// under way (Partition.Moving) included. Default 8.
	MaxMoves int
	// MaxMovesPerServer bounds the moves in flight from or to one
	// server (each copy reads the source's disk and fills the target's),
	// as the master's drain does (move.go's movesPerServer). Default 4.
	MaxMovesPerServer int
	// MaxTransfers bounds the primary transfers in one plan. Default 16.
	MaxTransfers int
	// DiskLimit and MemoryLimit: a target is never filled past this
	// fraction of its reported capacity, and a server past it sheds
	// replicas. Default 0.8 each.
	DiskLimit, MemoryLimit float64
	// MinGain: an action must lower the cost by more than this. Default
	// 1e-6.
	MinGain float64
}

// DefaultFloors: below 1 read or write a second, 10% of a core, 64 MiB on
// disk or 16 MiB in memory per server on average, a dimension is noise.
var DefaultFloors = Vec{
	DimReplicas: 0,
	DimReads:    1,
	DimWrites:   1,
	DimBusy:     0.1,
	DimDisk:     64 << 20,
	DimMemory:   16 << 20,
}

func (o Options) withDefaults() Options {
	if o.Band <= 0 {
		o.Band = 0.15
	}
	if o.Floors == nil {
		f := DefaultFloors
		o.Floors = &f
	}
	if o.MaxMoves <= 0 {
		o.MaxMoves = 8
	}
	if o.MaxMovesPerServer <= 0 {
		o.MaxMovesPerServer = 4
	}
	if o.MaxTransfers <= 0 {
		o.MaxTransfers = 16
	}
	if o.DiskLimit <= 0 {
		o.DiskLimit = 0.8
	}
	if o.MemoryLimit <= 0 {
		o.MemoryLimit = 0.8
	}
	if o.MinGain <= 0 {
		o.MinGain = 1e-6
	}
	return o
}

// Costs of the score (see doc.go).
const (
	capacityWeight = 100
	drainingCost   = 100
)

// srv is a server in the model.
type srv struct {
	Server
	load      Vec
	primaries int
	// diskUsed and memUsed: bytes against the capacity limits. Disk
	// starts from what the server reports used (other files count);
	// memory from its replicas.
	diskUsed, memUsed float64
	moves             int // moves in flight from or to it
}

type model struct {
	o        Options
	servers  []*srv
	byID     map[string]*srv
	parts    []Partition
	frozen   []bool
	touched  []bool
	left     map[uint64][]string
	mean     Vec
	balanced [NumDims]bool
	band     Vec // per dimension
	receive  int // servers that take replicas
	moves    int // in flight, plan included
}

func newModel(s Snapshot, o Options) *model {
	m := &model{o: o, byID: map[string]*srv{}, left: s.Left}
	for _, sv := range s.Servers {
		x := &srv{Server: sv}
		if c := sv.Capacity; c.DiskBytes > 0 {
			x.diskUsed = c.DiskBytes - c.DiskFreeBytes
		}
		m.servers = append(m.servers, x)
		m.byID[sv.ID] = x
		if !sv.Draining {
			m.receive++
		}
	}
	slices.SortFunc(m.servers, func(a, b *srv) int { return cmp.Compare(a.ID, b.ID) })
	m.parts = make([]Partition, len(s.Partitions))
	m.frozen = make([]bool, len(s.Partitions))
	m.touched = make([]bool, len(s.Partitions))
	var total Vec
	for i, p := range s.Partitions {
		p.Replicas = slices.Clone(p.Replicas)
		for j := range p.Replicas {
			r := &p.Replicas[j]
			r.Load[DimReplicas] = 1
			x := m.byID[r.Server]
			if x == nil {
				m.frozen[i] = true // on a dead server: the repair path's
				continue
			}
			if !r.InSync {
				m.frozen[i] = true
			}
			x.load = x.load.add(r.Load)
			x.memUsed += r.Load[DimMemory]
			if r.Primary {
				x.primaries++
			}
			total = total.add(r.Load)
		}
		if p.Moving {
			m.frozen[i] = true
			m.moves++
			for _, id := range []string{p.MovingFrom, p.MovingTo} {
				if x := m.byID[id]; x != nil {
					x.moves++
				}
			}
		}
		m.parts[i] = p
	}
	for d := range NumDims {
		if m.receive > 0 {
			m.mean[d] = total[d] / float64(m.receive)
		}
		m.balanced[d] = m.mean[d] > 0 && m.mean[d] >= o.Floors[d]
		m.band[d] = o.Band
		if d == DimReplicas && m.mean[d] > 0 {
			m.band[d] = max(o.Band, 1/m.mean[d]) // at least one replica
		}
	}
	return m
}

// excess is how far v lies outside dimension d's band, in units of the
// mean (0 inside it).
func (m *model) excess(d Dim, v float64) float64 {
	if !m.balanced[d] {
		return 0
	}
	return max(0, math.Abs(v/m.mean[d]-1)-m.band[d])
}

// cost is a server's cost with the given load (see doc.go).
func (m *model) cost(x *srv, load Vec, primaries int, disk, mem float64) float64 {
	if x.Draining {
		return drainingCost * (load[DimReplicas] + float64(primaries))
	}
	var c float64
	for d := range NumDims {
		// Linear as well as square: the square spreads load evenly, the
		// linear term keeps a server just outside the band worth a move.
		e := m.excess(d, load[d])
		c += e + e*e
	}
	if x.Capacity.DiskBytes > 0 {
		if f := disk/x.Capacity.DiskBytes - m.o.DiskLimit; f > 0 {
			c += capacityWeight * (f + f*f)
		}
	}
	if x.Capacity.MemoryBytes > 0 {
		if f := mem/x.Capacity.MemoryBytes - m.o.MemoryLimit; f > 0 {
			c += capacityWeight * (f + f*f)
		}
	}
	return c
}

func (m *model) costNow(x *srv) float64 {
	return m.cost(x, x.load, x.primaries, x.diskUsed, x.memUsed)
}

// fits reports whether x may receive a replica of load l.
func (m *model) fits(x *srv, l Vec) bool {
	if x.Draining {
		return false
	}
	if c := x.Capacity.DiskBytes; c > 0 && x.diskUsed+l[DimDisk] > m.o.DiskLimit*c {
		return false
	}
	if c := x.Capacity.MemoryBytes; c > 0 && x.memUsed+l[DimMemory] > m.o.MemoryLimit*c {
		return false
	}
	return true
}

type candidate struct {
	a    Action
	pi   int // partition index
	from int // replica index
	to   int // replica index (transfers)
	gain float64
}

func (c candidate) better(o candidate) bool {
	if c.gain != o.gain {
		return c.gain > o.gain
	}
	if c.a.Partition != o.a.Partition {
		return c.a.Partition < o.a.Partition
	}
	if c.a.From != o.a.From {
		return c.a.From < o.a.From
	}
	return c.a.To < o.a.To
}

// bestTransfer is the primary transfer that lowers the cost most.
func (m *model) bestTransfer() (best candidate, ok bool) {
	for pi := range m.parts {
		if m.frozen[pi] || m.touched[pi] {
			continue
		}
		p := &m.parts[pi]
		k := p.primary()
		if k < 0 {
			continue
		}
		a := m.byID[p.Replicas[k].Server]
		if p.Settling && !a.Draining {
			continue
		}
		ca := m.costNow(a)
		pl := p.Replicas[k].Load
		for j, r := range p.Replicas {
			b := m.byID[r.Server]
			if j == k || !r.InSync || b.Draining {
				continue
			}
			if ca == 0 && m.costNow(b) == 0 {
				continue // both inside the band: nothing to fix
			}
			// The roles swap, and with them the two replicas' loads.
			d := pl.sub(r.Load)
			gain := ca + m.costNow(b) -
				m.cost(a, a.load.sub(d), a.primaries-1, a.diskUsed-d[DimDisk], a.memUsed-d[DimMemory]) -
				m.cost(b, b.load.add(d), b.primaries+1, b.diskUsed+d[DimDisk], b.memUsed+d[DimMemory])
			c := candidate{a: Action{Kind: TransferPrimary, Partition: p.ID, Name: p.Name, From: a.ID, To: b.ID}, pi: pi, from: k, to: j, gain: gain}
			if gain > m.o.MinGain && (!ok || c.better(best)) {
				best, ok = c, true
			}
		}
	}
	return best, ok
}

// bestMove is the replica move that lowers the cost most.
func (m *model) bestMove() (best candidate, ok bool) {
	if m.moves >= m.o.MaxMoves {
		return best, false
	}
	var needy []*srv // receiving servers outside the band
	for _, x := range m.servers {
		if !x.Draining && m.costNow(x) > 0 {
			needy = append(needy, x)
		}
	}
	for pi := range m.parts {
		if m.frozen[pi] || m.touched[pi] {
			continue
		}
		p := &m.parts[pi]
		for k, r := range p.Replicas {
			a := m.byID[r.Server]
			if p.Settling && r.Primary && !a.Draining {
				continue
			}
			ca := m.costNow(a)
			if a.moves >= m.o.MaxMovesPerServer || ca == 0 && len(needy) == 0 {
				continue
			}
			prim := 0
			if r.Primary {
				prim = 1
			}
			l := r.Load
			after := m.cost(a, a.load.sub(l), a.primaries-prim, a.diskUsed-l[DimDisk], a.memUsed-l[DimMemory])
			targets := m.servers
			if ca == 0 {
				targets = needy // a server inside the band gives only to one outside
			}
			for _, b := range targets {
				if b.moves >= m.o.MaxMovesPerServer || !m.fits(b, l) || !m.mayHost(p, k, b) {
					continue
				}
				gain := ca + m.costNow(b) - after -
					m.cost(b, b.load.add(l), b.primaries+prim, b.diskUsed+l[DimDisk], b.memUsed+l[DimMemory])
				c := candidate{a: Action{Kind: MoveReplica, Partition: p.ID, Name: p.Name, From: a.ID, To: b.ID}, pi: pi, from: k, gain: gain}
				if gain > m.o.MinGain && (!ok || c.better(best)) {
					best, ok = c, true
				}
			}
		}
	}
	return best, ok
}

// mayHost reports whether b may take p's replica k: it holds none, no
// other replica uses its fault domain, and p did not leave it recently
// (unless k is on a draining server).
func (m *model) mayHost(p *Partition, k int, b *srv) bool {
	for j, r := range p.Replicas {
		if r.Server == b.ID {
			return false
		}
		if j != k {
			if o := m.byID[r.Server]; o != nil && o.domain() == b.domain() {
				return false
			}
		}
	}
	// A draining server's replicas must go somewhere: no flapping there.
	return m.byID[p.Replicas[k].Server].Draining || !slices.Contains(m.left[p.ID], b.ID)
}

// take applies c to the model.
func (m *model) take(c candidate) {
	p := &m.parts[c.pi]
	m.touched[c.pi] = true
	a, b := m.byID[c.a.From], m.byID[c.a.To]
	switch c.a.Kind {
	case TransferPrimary:
		rf, rt := &p.Replicas[c.from], &p.Replicas[c.to]
		d := rf.Load.sub(rt.Load)
		a.load, b.load = a.load.sub(d), b.load.add(d)
		a.diskUsed, b.diskUsed = a.diskUsed-d[DimDisk], b.diskUsed+d[DimDisk]
		a.memUsed, b.memUsed = a.memUsed-d[DimMemory], b.memUsed+d[DimMemory]
		a.primaries--
		b.primaries++
		rf.Primary, rt.Primary = false, true
		rf.Load, rt.Load = rt.Load, rf.Load
	case MoveReplica:
		r := &p.Replicas[c.from]
		l := r.Load
		a.load, b.load = a.load.sub(l), b.load.add(l)
		a.diskUsed, b.diskUsed = a.diskUsed-l[DimDisk], b.diskUsed+l[DimDisk]
		a.memUsed, b.memUsed = a.memUsed-l[DimMemory], b.memUsed+l[DimMemory]
		if r.Primary {
			a.primaries--
			b.primaries++
		}
		r.Server = b.ID
		m.moves++
		a.moves++
		b.moves++
	}
}

// why explains what moving load d off a onto b fixes: the dimensions
// outside their band on either server that the action brings closer
// (the three furthest out per server), and capacity over its limit.
func (m *model) why(a, b *srv, d Vec) string {
	var parts []string
	if a.Draining {
		parts = append(parts, a.ID+" is draining")
	}
	side := func(x *srv, sign float64) {
		if x.Draining {
			return
		}
		type off struct {
			dim Dim
			e   float64
		}
		var offs []off
		for dim := range NumDims {
			v := x.load[dim]
			if e := m.excess(dim, v); e > 0 && m.excess(dim, v+sign*d[dim]) < e {
				offs = append(offs, off{dim, e})
			}
		}
		slices.SortStableFunc(offs, func(p, q off) int { return cmp.Compare(q.e, p.e) })
		var above, below []string
		for i, o := range offs {
			if i == 3 {
				break
			}
			v, mean, band := x.load[o.dim], m.mean[o.dim], m.band[o.dim]
			if v > mean {
				above = append(above, fmt.Sprintf("%s %s > %s", o.dim, formatDim(o.dim, v), formatDim(o.dim, mean*(1+band))))
			} else {
				below = append(below, fmt.Sprintf("%s %s < %s", o.dim, formatDim(o.dim, v), formatDim(o.dim, mean*(1-band))))
			}
		}
		if len(above) > 0 {
			parts = append(parts, x.ID+" above band: "+strings.Join(above, ", "))
		}
		if len(below) > 0 {
			parts = append(parts, x.ID+" below band: "+strings.Join(below, ", "))
		}
		if c := x.Capacity.DiskBytes; c > 0 && sign < 0 && x.diskUsed/c > m.o.DiskLimit {
			parts = append(parts, fmt.Sprintf("%s disk %.0f%% full (limit %.0f%%)", x.ID, 100*x.diskUsed/c, 100*m.o.DiskLimit))
		}
		if c := x.Capacity.MemoryBytes; c > 0 && sign < 0 && x.memUsed/c > m.o.MemoryLimit {
			parts = append(parts, fmt.Sprintf("%s memory %.0f%% full (limit %.0f%%)", x.ID, 100*x.memUsed/c, 100*m.o.MemoryLimit))
		}
	}
	side(a, -1)
	side(b, +1)
	if len(parts) == 0 {
		return "lowers the spread" // no dimension crossed its band's edge
	}
	return strings.Join(parts, "; ")
}

func (m *model) loads() []ServerLoad {
	out := make([]ServerLoad, len(m.servers))
	for i, x := range m.servers {
		out[i] = ServerLoad{Server: x.Server, Load: x.load, Primaries: x.primaries}
	}
	return out
}

// Plan returns the actions that bring snap's servers towards the band,
// in the order to take them (see doc.go). It does not modify snap.
func Plan(snap Snapshot, o Options) Result {
	o = o.withDefaults()
	m := newModel(snap, o)
	res := Result{Before: m.loads(), Mean: m.mean, Balanced: m.balanced, Band: o.Band}
	if m.receive == 0 {
		res.After = res.Before
		res.Note = "no server takes replicas"
		return res
	}
	transfers := 0
	for {
		var c candidate
		var ok bool
		if transfers < o.MaxTransfers {
			c, ok = m.bestTransfer()
		}
		if !ok {
			c, ok = m.bestMove()
		}
		if !ok {
			break
		}
		a, b := m.byID[c.a.From], m.byID[c.a.To]
		p := &m.parts[c.pi]
		d := p.Replicas[c.from].Load
		if c.a.Kind == TransferPrimary {
			d = d.sub(p.Replicas[c.to].Load)
		}
		c.a.Reason = m.why(a, b, d)
		m.take(c)
		if c.a.Kind == TransferPrimary {
			transfers++
		}
		res.Actions = append(res.Actions, c.a)
	}
	res.After = m.loads()
	var out []string
	for _, x := range m.servers {
		if m.costNow(x) > 0 {
			out = append(out, x.ID)
		}
	}
	switch {
	case len(out) == 0 && len(res.Actions) == 0:
		res.Note = "balanced: every server within the band"
	case len(out) == 0:
		res.Note = "within the band after these actions"
	case m.moves >= o.MaxMoves:
		res.Note = fmt.Sprintf("move limit (%d in flight) reached; outside the band still: %s", o.MaxMoves, strings.Join(out, ", "))
	default:
		res.Note = "no action within the rules improves further; outside the band still: " + strings.Join(out, ", ")
	}
	return res
}

// Place picks up to n servers for new replicas of a partition whose
// replicas are on hosts now (a create, a split, a replacement), each of
// expected load l: the server whose cost rises least (or falls most)
// with the replica, under the same rules as Plan (fault domains,
// capacity, not draining); ties go to fewer replicas, then the smaller
// id, so the result is a pure function of the arguments.
func Place(snap Snapshot, o Options, l Vec, hosts []string, n int) []string {
	o = o.withDefaults()
	l[DimReplicas] = 1
	// The new replicas count in the means.
	m := newModel(snap, o)
	if m.receive > 0 {
		for d := range NumDims {
			m.mean[d] += l[d] * float64(n) / float64(m.receive)
			m.balanced[d] = m.mean[d] > 0 && m.mean[d] >= o.Floors[d]
			if d == DimReplicas {
				m.band[d] = max(o.Band, 1/m.mean[d])
			}
		}
	}
	taken := map[string]bool{}
	for _, h := range hosts {
		if x := m.byID[h]; x != nil {
			taken[x.domain()] = true
		} else {
			taken[Server{ID: h}.domain()] = true
		}
	}
	var picks []string
	for len(picks) < n {
		var best *srv
		var bestDelta float64
		for _, x := range m.servers {
			if taken[x.domain()] || !m.fits(x, l) {
				continue
			}
			delta := m.cost(x, x.load.add(l), x.primaries, x.diskUsed+l[DimDisk], x.memUsed+l[DimMemory]) - m.costNow(x)
			if best == nil || delta < bestDelta ||
				delta == bestDelta && (x.load[DimReplicas] < best.load[DimReplicas] ||
					x.load[DimReplicas] == best.load[DimReplicas] && x.ID < best.ID) {
				best, bestDelta = x, delta
			}
		}
		if best == nil {
			break
		}
		taken[best.domain()] = true
		best.load = best.load.add(l)
		best.diskUsed += l[DimDisk]
		best.memUsed += l[DimMemory]
		picks = append(picks, best.ID)
	}
	return picks
}
