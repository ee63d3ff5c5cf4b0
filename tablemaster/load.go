package tablemaster

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/tablemaster/balance"
)

// The load view: what each replica costs its server, from heartbeats, for
// load-aware placement (tablemaster/balance, BalancePlan, describe). Like
// the in-sync reports (insync.go) it is soft state of the member that
// receives heartbeats, never in the command log: a new leader rebuilds it
// from the next heartbeats (rates are warm after two full reports, ~1 s).

// loadHalfLife is the rates' smoothing window: a load change shows half
// in 10 s, so a burst does not move data and a lasting shift does within
// the 120 s the rebalancing target allows.
const loadHalfLife = 10 * time.Second

// loadView holds each replica's smoothed load and each server's
// capacity. The zero value is ready. Safe for concurrent use.
type loadView struct {
	mu sync.Mutex
	// Guarded by mu:
	replicas map[string]map[uint64]*replicaLoad // server -> partition
	capacity map[string]*api.ServerCapacity
}

// replicaLoad is one replica's load as its server reported it.
type replicaLoad struct {
	reads, writes, busy balance.Rate
	disk, memory        float64
	inSync              bool
}

// report takes a heartbeat's full statuses (not one with
// replicas_omitted): the rates advance, and replicas the server no
// longer reports are forgotten. A dead server's reports stay until it
// reports again (the plan looks at live servers only); its restarted
// replicas' counters start lower, which restarts their rates.
func (v *loadView) report(server string, now time.Time, statuses []*api.ReplicaStatus, c *api.ServerCapacity) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.replicas == nil {
		v.replicas = map[string]map[uint64]*replicaLoad{}
		v.capacity = map[string]*api.ServerCapacity{}
	}
	if c != nil {
		v.capacity[server] = c
	}
	old := v.replicas[server]
	next := make(map[uint64]*replicaLoad, len(statuses))
	for _, s := range statuses {
		rl := old[s.GetPartitionId()]
		if rl == nil {
			rl = &replicaLoad{}
		}
		rl.reads.Observe(s.GetReads(), now, loadHalfLife)
		rl.writes.Observe(s.GetWrites(), now, loadHalfLife)
		rl.busy.Observe(s.GetBusyNs(), now, loadHalfLife)
		rl.disk, rl.memory = replicaBytes(s)
		// Unreplicated tables report no state: their one copy is whole.
		rl.inSync = s.GetState() == api.ReplicaState_REPLICA_STATE_IN_SYNC || s.GetState() == api.ReplicaState_REPLICA_STATE_UNSPECIFIED
		next[s.GetPartitionId()] = rl
	}
	v.replicas[server] = next
}

// replicaBytes is a replica's bytes on disk and in memory: a disk store
// reports live and garbage bytes (its index is in memory); a memory
// engine holds everything in memory.
func replicaBytes(s *api.ReplicaStatus) (disk, memory float64) {
	if onDisk := s.GetLiveBytes() + s.GetGarbageBytes(); onDisk > 0 || s.GetSegments() > 0 {
		return float64(onDisk), float64(s.GetIndexBytes())
	}
	return 0, float64(s.GetBytes() + s.GetIndexBytes())
}

// vec is the replica's load vector; ok is false when its server has not
// reported it.
func (v *loadView) vecLocked(server string, pid uint64) (vec balance.Vec, inSync, ok bool) {
	rl := v.replicas[server][pid]
	if rl == nil {
		return vec, false, false
	}
	vec[balance.DimReads] = rl.reads.PerSec()
	vec[balance.DimWrites] = rl.writes.PerSec()
	vec[balance.DimBusy] = rl.busy.PerSec() / 1e9
	vec[balance.DimDisk] = rl.disk
	vec[balance.DimMemory] = rl.memory
	return vec, rl.inSync, true
}

// partitionRates is partition p's smoothed reads and writes per second
// as its replicas reported them: the reads of all (ReadAny reads land on
// secondaries), the writes of its primary (each replica applies them).
func (v *loadView) partitionRates(p *Partition) (reads, writes float64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, r := range p.Replicas {
		vec, _, ok := v.vecLocked(r.ServerID, p.ID)
		if !ok {
			continue
		}
		reads += vec[balance.DimReads]
		if r.Role == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
			writes = vec[balance.DimWrites]
		}
	}
	return reads, writes
}

// replicaLoadProto is the replica's smoothed rates for a DescribeTable
// answer; nil when its server has not reported it.
func (v *loadView) replicaLoadProto(server string, pid uint64) *api.ReplicaLoad {
	v.mu.Lock()
	defer v.mu.Unlock()
	vec, _, ok := v.vecLocked(server, pid)
	if !ok {
		return nil
	}
	return &api.ReplicaLoad{ReadsPerSec: vec[balance.DimReads], WritesPerSec: vec[balance.DimWrites], BusyCores: vec[balance.DimBusy]}
}

// snapshot is the cluster as the balancer sees it: live servers with
// their fault domains and reported capacity, and the partitions of
// log-replicated tables (the ones that move with their data, move.go)
// with their replicas' loads. A replica without a report counts as not
// in sync, which keeps its partition where it is; a partition moving is
// shown as it will be once the move ends.
func (v *loadView) snapshot(st *State) (balance.Snapshot, map[uint64]partRef) {
	v.mu.Lock()
	defer v.mu.Unlock()
	var snap balance.Snapshot
	for _, id := range st.ServerIDs() {
		srv := st.Servers[id]
		if !srv.Alive {
			continue
		}
		bs := balance.Server{ID: id, Domain: srv.FaultDomain, Draining: srv.Draining}
		if c := v.capacity[id]; c != nil {
			bs.Capacity = balance.Capacity{DiskBytes: float64(c.GetDiskBytes()), DiskFreeBytes: float64(c.GetDiskFreeBytes()), MemoryBytes: float64(c.GetMemoryBytes())}
		}
		snap.Servers = append(snap.Servers, bs)
	}
	refs := map[uint64]partRef{}
	for _, t := range st.tablesByID() {
		if !t.replicatesByLog() {
			continue
		}
		for i := range t.Partitions {
			p := &t.Partitions[i]
			bp := balance.Partition{ID: p.ID, Name: fmt.Sprintf("%s/%s#%d", t.Tenant, t.Name, p.Index)}
			if p.Move != nil {
				bp.Moving, bp.MovingFrom, bp.MovingTo = true, p.Move.From, p.Move.To
			}
			// A move whose two ends are both still replicas is shown as
			// done (see below); one whose source was dropped meanwhile (a
			// failed engine, a dead server replaced) as it is.
			moving := p.Move != nil && hostsReplica(p, p.Move.From) && hostsReplica(p, p.Move.To)
			for _, r := range p.Replicas {
				if moving && r.ServerID == p.Move.To {
					continue // counted where it ends: in the source's place, below
				}
				vec, inSync, _ := v.vecLocked(r.ServerID, p.ID)
				br := balance.Replica{Server: r.ServerID, Primary: r.Role == api.ReplicaRole_REPLICA_ROLE_PRIMARY, InSync: inSync, Load: vec}
				if moving && r.ServerID == p.Move.From {
					// A move under way is modelled as done (the source's
					// role and load on the target), so the next round does
					// not take more off a source already giving one up —
					// an overshoot that hysteresis (Left) could then not
					// undo. The partition is frozen while it moves.
					br.Server, br.InSync = p.Move.To, false
				}
				bp.Replicas = append(bp.Replicas, br)
			}
			byRole(bp.Replicas)
			snap.Partitions = append(snap.Partitions, bp)
			refs[p.ID] = partRef{tenant: t.Tenant, table: t.Name, index: p.Index}
		}
	}
	return snap, refs
}

// byRole gives a partition's load to its replicas by their roles now, not
// by what each reported: the strong reads (all the reads reported) to the
// primary, the primary's writes to every replica (each applies them; a
// replica copying or catching up reports its burst of applies), and of
// the engine time each secondary's share of applying (the least any
// replica reported) with the rest to the primary. What a replica reports
// is smoothed over seconds, so after its primary role moved the old
// primary still shows the reads for a while and the new one not yet;
// planning on that lag would move the role back. Bytes stay each
// replica's own.
func byRole(rs []balance.Replica) {
	k := slices.IndexFunc(rs, func(r balance.Replica) bool { return r.Primary })
	if k < 0 || len(rs) < 2 {
		return
	}
	var reads, busy float64
	writes := rs[k].Load[balance.DimWrites]
	minBusy := rs[0].Load[balance.DimBusy]
	for _, r := range rs {
		reads += r.Load[balance.DimReads]
		busy += r.Load[balance.DimBusy]
		minBusy = min(minBusy, r.Load[balance.DimBusy])
	}
	for i := range rs {
		rs[i].Load[balance.DimWrites] = writes
		rs[i].Load[balance.DimReads], rs[i].Load[balance.DimBusy] = 0, minBusy
	}
	rs[k].Load[balance.DimReads] = reads
	rs[k].Load[balance.DimBusy] = busy - float64(len(rs)-1)*minBusy
}

// partRef names a partition for an answer.
type partRef struct {
	tenant, table string
	index         uint32
}

// warm reports whether every live server has sent two full reports (its
// rates are measured).
func (v *loadView) warm(st *State) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	for id, srv := range st.Servers {
		if !srv.Alive {
			continue
		}
		for _, rl := range v.replicas[id] {
			if !rl.reads.Warm() {
				return false
			}
		}
	}
	return true
}
