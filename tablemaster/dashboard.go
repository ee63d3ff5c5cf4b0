package tablemaster

import (
	"cmp"
	"embed"
	"encoding/json"
	"io/fs"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/replication/stream"
)

// The operator dashboard: one self-contained page (dashboard/, embedded:
// no external script, style or font) that polls /api/cluster every second
// and draws the cluster from it. The snapshot is this master's view:
// the published State, the liveness table and the servers' last reports
// (ReplicaStatus), quotas and usage, the stream manager, and the recent
// events (events.go). A raft follower hears no heartbeats: its snapshot
// says which member leads, and the page says so.
//
// The handler has no authentication of its own (the binary serves it only
// when asked to, on an address the operator chooses). It never shows a
// key: tenants are rendered by tenantInfo without them.

//go:embed dashboard
var dashboardFiles embed.FS

// Bounds on the snapshot, so that a large cluster's page stays a few
// hundred KiB: past them the snapshot says how many it left out.
const (
	dashMaxPartitions   = 2000 // partitions, over every table
	dashMaxStreams      = 200
	dashMaxStreamExtent = 8 // the last extents of each stream
	dashMaxEvents       = 200
)

// DashboardHandler returns the operator dashboard: the page at "/" and
// its JSON snapshot at "/api/cluster". It is safe for concurrent use and
// answers until the Master is closed (then with what it last knew).
func (m *Master) DashboardHandler() http.Handler {
	static, err := fs.Sub(dashboardFiles, "dashboard")
	if err != nil {
		panic(err) // the embedded directory is part of the binary
	}
	files := http.FileServerFS(static)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/cluster", func(w http.ResponseWriter, r *http.Request) {
		b, err := json.Marshal(m.dashboardSnapshot())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(b)
	})
	mux.Handle("GET /", files)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		// Everything the page needs is its own: refuse anything else.
		h.Set("Content-Security-Policy", "default-src 'self'; connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		mux.ServeHTTP(w, r)
	})
}

// dashSnapshot is the JSON the page draws (field names are the page's
// vocabulary; see dashboard/app.js).
type dashSnapshot struct {
	NowMs        int64            `json:"now_ms"`
	Master       dashMaster       `json:"master"`
	FaultDomains []dashDomain     `json:"fault_domains"`
	Tenants      []dashTenant     `json:"tenants"`
	Tables       []dashTable      `json:"tables"`
	Partitions   int              `json:"partitions"`
	Omitted      int              `json:"partitions_omitted,omitempty"`
	Streams      dashStreams      `json:"streams"`
	Events       []Event          `json:"events"`
	Summary      map[string]int64 `json:"summary"`
	// Hot: the busiest partitions (reads + writes per second, at most
	// dashHot), and their share of the cluster's operations.
	Hot []dashHot `json:"hot"`
	// Changes: the partitions moving a replica or splitting now.
	Changes []dashChange `json:"changes"`
}

type dashMaster struct {
	Leads      bool   `json:"leads"`
	Raft       bool   `json:"raft"`
	Member     uint64 `json:"member,omitempty"`
	Term       uint64 `json:"term,omitempty"`
	LeaderID   uint64 `json:"leader_id,omitempty"`
	LeaderAddr string `json:"leader_addr,omitempty"`
	MapVersion uint64 `json:"map_version"`
	// Note tells the operator what this view lacks (a follower's).
	Note string `json:"note,omitempty"`
}

type dashDomain struct {
	Name    string       `json:"name"`
	Servers []dashServer `json:"servers"`
}

type dashServer struct {
	ID          string `json:"id"`
	Addr        string `json:"addr"`
	FaultDomain string `json:"fault_domain"`
	// State: "alive", "draining", "dead".
	State       string `json:"state"`
	DownSinceMs int64  `json:"down_since_ms,omitempty"`
	// HeardAgoMs is how long ago its last heartbeat came (-1: never, on
	// this master).
	HeardAgoMs  int64  `json:"heard_ago_ms"`
	Incarnation uint64 `json:"incarnation,omitempty,string"` // past 2^53: a string for JavaScript
	Primaries   int    `json:"primaries"`
	Secondaries int    `json:"secondaries"`
	Replicas    int    `json:"replicas"`
	// From its last report: totals over its replicas (reads and writes
	// are counters; the page turns them into rates).
	Keys       uint64 `json:"keys"`
	Bytes      uint64 `json:"bytes"`
	IndexBytes uint64 `json:"index_bytes"`
	Reads      uint64 `json:"reads"`
	Writes     uint64 `json:"writes"`
	// From the stream manager: bytes its extent node uses.
	StreamBytes int64 `json:"stream_bytes"`
}

type dashTenant struct {
	Name          string     `json:"name"`
	CreatedUnixMs int64      `json:"created_unix_ms"`
	Tables        uint32     `json:"tables"`
	Quota         dashQuota  `json:"quota"`
	Usage         *dashUsage `json:"usage,omitempty"`
	Throttled     bool       `json:"throttled,omitempty"`
}

type dashQuota struct {
	StoredBytes       uint64 `json:"stored_bytes"`
	MemoryBytes       uint64 `json:"memory_bytes"`
	ReadOpsPerSec     uint64 `json:"read_ops_per_sec"`
	WriteOpsPerSec    uint64 `json:"write_ops_per_sec"`
	CoprocCPUMsPerSec uint64 `json:"coproc_cpu_ms_per_sec"`
}

type dashUsage struct {
	StoredBytes        uint64  `json:"stored_bytes"`
	MemoryBytes        uint64  `json:"memory_bytes"`
	ReadOpsPerSec      float64 `json:"read_ops_per_sec"`
	WriteOpsPerSec     float64 `json:"write_ops_per_sec"`
	CoprocCPUMsPerSec  float64 `json:"coproc_cpu_ms_per_sec"`
	ThrottledPerSec    float64 `json:"throttled_per_sec"`
	QuotaRefusedPerSec float64 `json:"quota_refused_per_sec"`
}

type dashTable struct {
	Tenant      string          `json:"tenant"`
	Name        string          `json:"name"`
	ID          uint64          `json:"id"`
	Kind        string          `json:"kind"`
	Storage     string          `json:"storage"`
	Durability  string          `json:"durability,omitempty"`
	Replication uint32          `json:"replication"`
	Partitions  []dashPartition `json:"partitions"`
	Bulk        *dashBulk       `json:"bulk,omitempty"`
	Coprocs     []dashCoproc    `json:"coprocs,omitempty"`
}

// dashHot is one of the busiest partitions.
type dashHot struct {
	Tenant       string  `json:"tenant"`
	Table        string  `json:"table"`
	Index        uint32  `json:"index"`
	ID           uint64  `json:"id"`
	Primary      string  `json:"primary"`
	ReadsPerSec  float64 `json:"reads_per_sec"`
	WritesPerSec float64 `json:"writes_per_sec"`
	// Share is its part of every partition's reads and writes (0..1).
	Share float64 `json:"share"`
}

// dashChange is a partition changing shape or place now.
type dashChange struct {
	Tenant string `json:"tenant"`
	Table  string `json:"table"`
	Index  uint32 `json:"index"`
	ID     uint64 `json:"id"`
	// Kind is "move" (a replica From → To) or "split" (into Into).
	Kind    string   `json:"kind"`
	From    string   `json:"from,omitempty"`
	To      string   `json:"to,omitempty"`
	Into    []uint64 `json:"into,omitempty"`
	SinceMs int64    `json:"since_ms,omitempty"`
}

// dashHotMax is how many hot partitions the dashboard lists.
const dashHotMax = 5

type dashPartition struct {
	ID       uint64        `json:"id"`
	Index    uint32        `json:"index"`
	Epoch    uint64        `json:"epoch"`
	Primary  string        `json:"primary"`
	Replicas []dashReplica `json:"replicas"`
	// Log is the commit-log stream and its open extent (0: being
	// reconfigured).
	LogStream string `json:"log_stream,omitempty"`
	LogExtent uint64 `json:"log_extent,omitempty"`
	MoveFrom  string `json:"move_from,omitempty"`
	MoveTo    string `json:"move_to,omitempty"`
	DataLost  bool   `json:"data_lost,omitempty"`
	// UnderReplicated: fewer replicas in sync (Sync) than the table's
	// replication factor, now (the gauge and the log wait out the
	// in-sync bound first); UnderReason says which and why.
	UnderReplicated bool   `json:"under_replicated,omitempty"`
	UnderReason     string `json:"under_reason,omitempty"`
	// The partition's smoothed load (replicated partitions).
	ReadsPerSec  float64 `json:"reads_per_sec,omitempty"`
	WritesPerSec float64 `json:"writes_per_sec,omitempty"`
	// SplitInto: the children of a split under way.
	SplitInto []uint64 `json:"split_into,omitempty"`
}

type dashReplica struct {
	Server      string `json:"server"`
	Role        string `json:"role"`
	FaultDomain string `json:"fault_domain,omitempty"`
	ServerState string `json:"server_state"`
	// Reported: the server's last heartbeat reported this replica; the
	// fields below are from that report.
	Reported   bool   `json:"reported"`
	State      string `json:"state,omitempty"`
	AppliedLSN uint64 `json:"applied_lsn,omitempty"`
	CommitLSN  uint64 `json:"commit_lsn,omitempty"`
	// Lag is the primary's commit LSN minus this replica's applied LSN
	// (a dropped secondary does not know the commit point moved on).
	Lag uint64 `json:"lag"`
	// The master's judgement of a replicated partition's replica
	// (insync.go): Sync is "in_sync", "dropped", "catching_up",
	// "copying", "failed" or "" (not reported); InAckSet is the primary's
	// view; LagMs how long since it was last in step (-1: never); Reason
	// why it is not in sync.
	Sync       string `json:"sync,omitempty"`
	InAckSet   bool   `json:"in_ack_set,omitempty"`
	LagMs      int64  `json:"lag_ms"`
	Reason     string `json:"reason,omitempty"`
	CopiedB    uint64 `json:"copied_bytes,omitempty"`
	CopyTotalB uint64 `json:"copy_total_bytes,omitempty"`
	Keys       uint64 `json:"keys"`
	Bytes      uint64 `json:"bytes"`
}

type dashBulk struct {
	Current  uint64            `json:"current"`
	Versions []dashBulkVersion `json:"versions"`
}

type dashBulkVersion struct {
	Version            uint64 `json:"version"`
	Base               uint64 `json:"base,omitempty"`
	State              string `json:"state"`
	CreatedUnixMs      int64  `json:"created_unix_ms,omitempty"`
	ServingSinceUnixMs int64  `json:"serving_since_unix_ms,omitempty"`
	Files              int    `json:"files"`
	Bytes              uint64 `json:"bytes"`
	Loaded             int    `json:"loaded"`
	Error              string `json:"error,omitempty"`
}

type dashCoproc struct {
	Name     string              `json:"name"`
	Live     uint64              `json:"live"`
	Versions []dashCoprocVersion `json:"versions"`
}

type dashCoprocVersion struct {
	Version       uint64   `json:"version"`
	SHA256        string   `json:"sha256"`
	Size          uint64   `json:"size"`
	CreatedUnixMs int64    `json:"created_unix_ms,omitempty"`
	Methods       []string `json:"methods,omitempty"`
	Writes        bool     `json:"writes,omitempty"`
	ReadyOn       int      `json:"ready_on"`
	Hosts         int      `json:"hosts"`
}

type dashStreams struct {
	Streams int                     `json:"streams"`
	Extents int                     `json:"extents"`
	Tasks   map[stream.TaskKind]int `json:"tasks"`
	// Coding counts extents by coding state ("replicated", "coding",
	// "coded").
	Coding  map[string]int `json:"coding"`
	List    []dashStream   `json:"list"`
	Omitted int            `json:"omitted,omitempty"`
}

type dashStream struct {
	Name     string       `json:"name"`
	Code     string       `json:"code,omitempty"`
	Replicas int          `json:"replicas,omitempty"`
	Extents  int          `json:"extents"`
	Last     []dashExtent `json:"last"`
}

type dashExtent struct {
	ID       uint64   `json:"id"`
	Sealed   bool     `json:"sealed"`
	Length   int64    `json:"length"`
	Primary  string   `json:"primary,omitempty"`
	Replicas []string `json:"replicas"` // "node:state"
	// Coding: "" (replicated), "coding" or "coded", and its fragments.
	Coding      string `json:"coding,omitempty"`
	Scheme      string `json:"scheme,omitempty"`
	FragmentsOK int    `json:"fragments_ok,omitempty"`
	Fragments   int    `json:"fragments,omitempty"`
	Rebuilding  int    `json:"rebuilding,omitempty"`
}

// heard is a copy of one server's liveness entry.
type heard struct {
	at       time.Time
	dead     bool
	statuses []*api.ReplicaStatus // shared, never modified
}

// dashboardSnapshot builds the page's snapshot of the cluster as this
// master sees it now.
func (m *Master) dashboardSnapshot() *dashSnapshot {
	now := m.opts.Now()
	st := m.State()
	out := &dashSnapshot{NowMs: now.UnixMilli(), Summary: map[string]int64{}}
	out.Master = m.dashMaster(st)

	live := map[string]heard{}
	m.liveMu.Lock()
	for id, l := range m.live {
		if l != nil {
			live[id] = heard{at: l.lastHeard, dead: l.dead, statuses: l.statuses}
		}
	}
	m.liveMu.Unlock()
	reports := map[string]map[uint64]*api.ReplicaStatus{} // server → partition → status
	for id, h := range live {
		r := make(map[uint64]*api.ReplicaStatus, len(h.statuses))
		for _, s := range h.statuses {
			r[s.GetPartitionId()] = s
		}
		reports[id] = r
	}

	serverState := func(id string) string {
		srv := st.Servers[id]
		switch {
		case srv == nil:
			return "unknown"
		case !srv.Alive:
			return "dead"
		case srv.Draining:
			return "draining"
		}
		return "alive"
	}

	// Servers, by fault domain.
	nodeBytes := map[string]int64{}
	sm := st.StreamManager()
	for _, n := range sm.Nodes() {
		nodeBytes[n.ID] = n.UsedBytes
	}
	servers := map[string]*dashServer{}
	for _, id := range st.ServerIDs() {
		srv := st.Servers[id]
		ds := &dashServer{ID: id, Addr: srv.Addr, FaultDomain: srv.FaultDomain, State: serverState(id),
			DownSinceMs: srv.DownSinceMs, Incarnation: srv.Incarnation, HeardAgoMs: -1, StreamBytes: nodeBytes[id]}
		if h, ok := live[id]; ok && !h.at.IsZero() {
			ds.HeardAgoMs = max(0, now.Sub(h.at).Milliseconds())
			for _, s := range h.statuses {
				ds.Keys += s.GetKeys()
				ds.Bytes += s.GetBytes()
				ds.IndexBytes += s.GetIndexBytes()
				ds.Reads += s.GetReads()
				ds.Writes += s.GetWrites()
			}
		}
		servers[id] = ds
		out.Summary["servers_"+ds.State]++
	}

	// Tables, partitions and replicas.
	sr := m.syncReports(st, now)
	shown := 0
	var total float64 // every partition's reads and writes per second
	out.Hot, out.Changes = []dashHot{}, []dashChange{}
	for _, t := range st.TablesOf("") {
		dt := dashTable{Tenant: t.Tenant, Name: t.Name, ID: t.ID, Kind: enumLabel(t.Kind.String(), "TABLE_KIND_"),
			Storage: t.Options.Storage, Durability: t.Options.Durability, Replication: t.Options.Replication,
			Partitions: []dashPartition{}}
		hosts := map[string]bool{}
		for i := range t.Partitions {
			p := &t.Partitions[i]
			out.Partitions++
			for _, r := range p.Replicas {
				hosts[r.ServerID] = true
				if ds := servers[r.ServerID]; ds != nil {
					ds.Replicas++
					if r.Role == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
						ds.Primaries++
					} else {
						ds.Secondaries++
					}
				}
			}
			if primaryID(p) == "" {
				out.Summary["partitions_without_primary"]++
			}
			var ps *partitionSync
			if p.Log != nil {
				j := sr.judge(t, p)
				ps = &j
				if j.short {
					out.Summary["partitions_under_replicated"]++
				}
			}
			var reads, writes float64
			if p.Log != nil {
				reads, writes = m.load.partitionRates(p)
				total += reads + writes
				out.Hot = append(out.Hot, dashHot{Tenant: t.Tenant, Table: t.Name, Index: p.Index, ID: p.ID, Primary: primaryID(p), ReadsPerSec: reads, WritesPerSec: writes})
			}
			if p.Move != nil {
				out.Changes = append(out.Changes, dashChange{Tenant: t.Tenant, Table: t.Name, Index: p.Index, ID: p.ID, Kind: "move", From: p.Move.From, To: p.Move.To})
			}
			if p.Split != nil {
				out.Changes = append(out.Changes, dashChange{Tenant: t.Tenant, Table: t.Name, Index: p.Index, ID: p.ID, Kind: "split", Into: []uint64{p.Split.Left, p.Split.Right}, SinceMs: p.Split.SinceMs})
			}
			if shown >= dashMaxPartitions {
				out.Omitted++
				continue
			}
			shown++
			dp := dashPartitionOf(p, reports, serverState, ps)
			dp.ReadsPerSec, dp.WritesPerSec = reads, writes
			dt.Partitions = append(dt.Partitions, dp)
		}
		if t.Bulk != nil {
			dt.Bulk = dashBulkOf(t)
		}
		dt.Coprocs = dashCoprocsOf(t.Coprocs, len(hosts))
		out.Tables = append(out.Tables, dt)
	}
	// The busiest partitions, with at least one operation a second.
	slices.SortStableFunc(out.Hot, func(a, b dashHot) int {
		return cmp.Compare(b.ReadsPerSec+b.WritesPerSec, a.ReadsPerSec+a.WritesPerSec)
	})
	out.Hot = slices.DeleteFunc(out.Hot, func(h dashHot) bool { return h.ReadsPerSec+h.WritesPerSec < 1 })
	out.Hot = out.Hot[:min(len(out.Hot), dashHotMax)]
	for i := range out.Hot {
		out.Hot[i].Share = (out.Hot[i].ReadsPerSec + out.Hot[i].WritesPerSec) / total
	}
	out.Summary["changes_in_progress"] = int64(len(out.Changes))
	out.Summary["tables"] = int64(len(st.Tables))
	out.Summary["partitions"] = int64(out.Partitions)
	out.Summary["tenants"] = int64(len(st.Tenants))

	byFD := map[string][]dashServer{}
	for _, id := range st.ServerIDs() {
		ds := servers[id]
		byFD[ds.FaultDomain] = append(byFD[ds.FaultDomain], *ds)
	}
	for _, fd := range slices.Sorted(maps.Keys(byFD)) {
		out.FaultDomains = append(out.FaultDomains, dashDomain{Name: fd, Servers: byFD[fd]})
	}

	// Tenants: with quota and usage, never keys.
	m.events.mu.Lock()
	throttled := m.events.throttled
	m.events.mu.Unlock()
	for _, name := range slices.Sorted(maps.Keys(st.Tenants)) {
		ti := m.tenantInfo(st, st.Tenants[name], false)
		dt := dashTenant{Name: ti.GetName(), CreatedUnixMs: ti.GetCreatedUnixMs(), Tables: ti.GetTables(), Throttled: throttled[name]}
		if q := ti.GetQuota(); q != nil {
			dt.Quota = dashQuota{StoredBytes: q.GetStoredBytes(), MemoryBytes: q.GetMemoryBytes(), ReadOpsPerSec: q.GetReadOpsPerSec(),
				WriteOpsPerSec: q.GetWriteOpsPerSec(), CoprocCPUMsPerSec: q.GetCoprocCpuMsPerSec()}
		}
		if u := ti.GetUsage(); u != nil {
			dt.Usage = &dashUsage{StoredBytes: u.GetStoredBytes(), MemoryBytes: u.GetMemoryBytes(), ReadOpsPerSec: u.GetReadOpsPerSec(),
				WriteOpsPerSec: u.GetWriteOpsPerSec(), CoprocCPUMsPerSec: u.GetCoprocCpuMsPerSec(),
				ThrottledPerSec: u.GetThrottledPerSec(), QuotaRefusedPerSec: u.GetQuotaRefusedPerSec()}
		}
		out.Tenants = append(out.Tenants, dt)
	}

	out.Streams = dashStreamsOf(sm)
	out.Events = m.events.recent(dashMaxEvents)
	if out.FaultDomains == nil {
		out.FaultDomains = []dashDomain{}
	}
	if out.Tables == nil {
		out.Tables = []dashTable{}
	}
	return out
}

func (m *Master) dashMaster(st *State) dashMaster {
	d := dashMaster{Leads: m.leads(), MapVersion: st.Version}
	if m.raft == nil {
		return d
	}
	rs := m.raft.node.Status()
	d.Raft, d.Member, d.Term, d.LeaderID, d.LeaderAddr = true, rs.ID, rs.Term, rs.Leader, rs.LeaderAddr
	if !d.Leads {
		switch {
		case rs.Leader == 0:
			d.Note = "this master is a raft follower and knows no leader yet: the catalog below is as it last applied it; liveness, load, usage and events are the leader's and are not shown"
		default:
			d.Note = "this master is a raft follower: the catalog below is replicated, but liveness, load, usage and events live on the leader, member " +
				strconv.FormatUint(rs.Leader, 10) + " at " + rs.LeaderAddr + " (open the dashboard its process serves)"
		}
	}
	return d
}

func dashPartitionOf(p *Partition, reports map[string]map[uint64]*api.ReplicaStatus, serverState func(string) string, ps *partitionSync) dashPartition {
	dp := dashPartition{ID: p.ID, Index: p.Index, Epoch: p.Epoch, Primary: primaryID(p), DataLost: p.DataLost != nil, Replicas: []dashReplica{}}
	if ps != nil && ps.short {
		dp.UnderReplicated, dp.UnderReason = true, ps.reason
	}
	if p.Log != nil {
		dp.LogStream, dp.LogExtent = p.Log.Stream, p.Log.Extent
	}
	if p.Move != nil {
		dp.MoveFrom, dp.MoveTo = p.Move.From, p.Move.To
	}
	if p.Split != nil {
		dp.SplitInto = []uint64{p.Split.Left, p.Split.Right}
	}
	for i, r := range p.Replicas {
		dr := dashReplica{Server: r.ServerID, Role: enumLabel(r.Role.String(), "REPLICA_ROLE_"), FaultDomain: r.FaultDomain, ServerState: serverState(r.ServerID), LagMs: -1}
		if s := reports[r.ServerID][p.ID]; s != nil && dr.ServerState != "dead" {
			dr.Reported = true
			if s.GetState() != api.ReplicaState_REPLICA_STATE_UNSPECIFIED {
				dr.State = enumLabel(s.GetState().String(), "REPLICA_STATE_")
			}
			dr.AppliedLSN, dr.CommitLSN = s.GetAppliedLsn(), s.GetCommitLsn()
			if dr.CommitLSN > dr.AppliedLSN {
				dr.Lag = dr.CommitLSN - dr.AppliedLSN
			}
			dr.CopiedB, dr.CopyTotalB = s.GetCopiedBytes(), s.GetCopyTotalBytes()
			dr.Keys, dr.Bytes = s.GetKeys(), s.GetBytes()
		}
		if ps != nil {
			js := ps.replicas[i]
			if js.GetState() != api.ReplicaState_REPLICA_STATE_UNSPECIFIED {
				dr.Sync = enumLabel(js.GetState().String(), "REPLICA_STATE_")
			}
			dr.InAckSet, dr.LagMs, dr.Reason = js.GetInAckSet(), js.GetLagMs(), js.GetReason()
			if dr.Reported {
				dr.Lag = js.GetLagRecords()
			}
		}
		dp.Replicas = append(dp.Replicas, dr)
	}
	return dp
}

func dashBulkOf(t *Table) *dashBulk {
	b := t.Bulk
	out := &dashBulk{Current: b.Current, Versions: []dashBulkVersion{}}
	for _, v := range b.Versions {
		dv := dashBulkVersion{Version: v.Version, Base: v.Base, State: v.State, CreatedUnixMs: v.CreatedUnixMs,
			ServingSinceUnixMs: v.ServingSinceUnixMs, Files: len(v.Files), Error: v.Error}
		for _, f := range v.Files {
			dv.Bytes += f.Size
		}
		dv.Loaded = t.BulkLoadedCount(&v) // on every serving copy
		out.Versions = append(out.Versions, dv)
	}
	return out
}

func dashCoprocsOf(cs map[string]*Coproc, hosts int) []dashCoproc {
	var out []dashCoproc
	for _, name := range slices.Sorted(maps.Keys(cs)) {
		c := cs[name]
		dc := dashCoproc{Name: name, Live: c.Live}
		for _, v := range c.Versions {
			dc.Versions = append(dc.Versions, dashCoprocVersion{Version: v.Version, SHA256: v.SHA256, Size: v.Size,
				CreatedUnixMs: v.CreatedUnixMs, Methods: v.Methods, Writes: v.Writes, ReadyOn: len(v.ReadyOn), Hosts: hosts})
		}
		out = append(out, dc)
	}
	return out
}

func dashStreamsOf(sm *stream.Manager) dashStreams {
	streams, extents := sm.Counts()
	out := dashStreams{Streams: streams, Extents: extents, Tasks: map[stream.TaskKind]int{}, Coding: map[string]int{}, List: []dashStream{}}
	for _, t := range sm.Tasks() {
		out.Tasks[t.Kind]++
	}
	for _, id := range sm.ExtentIDs() {
		e, err := sm.Extent(id)
		if err != nil {
			continue
		}
		switch {
		case e.Coding == nil:
			out.Coding["replicated"]++
		default:
			out.Coding[string(e.Coding.State)]++
		}
	}
	names := sm.Streams()
	// Streams with erasure coding and bulk streams first: the partition
	// logs are many and alike.
	slices.SortStableFunc(names, func(a, b string) int {
		return cmp.Compare(btoi(strings.HasPrefix(a, "log/")), btoi(strings.HasPrefix(b, "log/")))
	})
	for _, name := range names {
		if len(out.List) >= dashMaxStreams {
			out.Omitted++
			continue
		}
		meta, es, err := sm.Stream(name)
		if err != nil {
			continue
		}
		ds := dashStream{Name: name, Code: meta.Code, Replicas: meta.Replicas, Extents: len(es), Last: []dashExtent{}}
		for _, e := range es[max(0, len(es)-dashMaxStreamExtent):] {
			de := dashExtent{ID: e.ID, Sealed: e.Sealed, Length: e.Length, Primary: e.Primary, Replicas: []string{}}
			for _, r := range e.Replicas {
				de.Replicas = append(de.Replicas, r.Node+":"+string(r.State))
			}
			if c := e.Coding; c != nil {
				de.Coding, de.Scheme, de.Fragments = string(c.State), c.Scheme, len(c.Fragments)
				for _, f := range c.Fragments {
					switch f.State {
					case stream.FragmentOK:
						de.FragmentsOK++
					case stream.FragmentRebuild:
						de.Rebuilding++
					}
				}
			}
			ds.Last = append(ds.Last, de)
		}
		out.List = append(out.List, ds)
	}
	return out
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
