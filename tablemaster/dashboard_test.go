package tablemaster

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
)

// getDash GETs path from the dashboard handler.
func getDash(t *testing.T, h http.Handler, path string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, rec.Code, rec.Body)
	}
	return rec
}

// snapshotOf decodes /api/cluster, and returns the raw body too.
func snapshotOf(t *testing.T, h http.Handler) (dashSnapshot, string) {
	t.Helper()
	rec := getDash(t, h, "/api/cluster")
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("content type %q", ct)
	}
	var s dashSnapshot
	if err := json.Unmarshal(rec.Body.Bytes(), &s); err != nil {
		t.Fatalf("snapshot does not decode: %v\n%s", err, rec.Body)
	}
	return s, rec.Body.String()
}

func dashServerOf(s dashSnapshot, id string) (dashServer, bool) {
	for _, fd := range s.FaultDomains {
		for _, sv := range fd.Servers {
			if sv.ID == id {
				return sv, true
			}
		}
	}
	return dashServer{}, false
}

func hasEvent(s dashSnapshot, kind EventKind, substr string) bool {
	for _, e := range s.Events {
		if e.Kind == kind && strings.Contains(e.Message, substr) {
			return true
		}
	}
	return false
}

// TestDashboardSnapshot drives a master through heartbeats (replica
// reports, tenant load) and a server's death, and checks what the
// dashboard's JSON says at each step.
func TestDashboardSnapshot(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	clk := newFakeClock()
	r := start(t, Options{
		DataDir:           t.TempDir(),
		Logger:            testLogger(t),
		HeartbeatInterval: 2 * time.Millisecond, // real ticker: how often the fake clock is checked
		LeaseDuration:     100 * time.Millisecond,
		DeadAfter:         300 * time.Millisecond,
		Now:               clk.Now,
	})
	defer r.stop(t)
	c := r.c
	h := r.m.DashboardHandler()

	// The page and its assets are served, with a policy that allows
	// nothing from elsewhere.
	page := getDash(t, h, "/")
	if !strings.Contains(page.Body.String(), `<script src="app.js"`) || !strings.Contains(page.Header().Get("Content-Security-Policy"), "default-src 'self'") {
		t.Fatalf("page: %s\nheaders %v", page.Body, page.Header())
	}
	for _, asset := range []string{"/app.js", "/app.css"} {
		if body := getDash(t, h, asset).Body.String(); strings.Contains(body, "http://") || strings.Contains(body, "https://") {
			t.Fatalf("%s refers to another origin", asset)
		}
	}

	var ids []string
	for _, fd := range []string{"fd-a", "fd-b", "fd-c"} {
		resp, err := c.RegisterServer(ctx, &api.RegisterServerRequest{Addr: "10.0.0.1:" + fd, FaultDomain: fd})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, resp.ServerId)
	}
	tenant, err := c.CreateTenant(ctx, &api.CreateTenantRequest{Tenant: "acme", Quota: &api.TenantQuota{WriteOpsPerSec: 100, StoredBytes: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	created, err := c.CreateTable(ctx, &api.CreateTableRequest{Tenant: "acme", Name: "orders", Kind: api.TableKind_TABLE_KIND_POINT,
		Options: &api.TableOptions{Partitions: 3, Storage: StorageMemory, Replication: 3}})
	if err != nil {
		t.Fatal(err)
	}

	// Every server reports its replicas (the secondaries 5 records behind
	// the commit point) and acme's load: over its write quota.
	beat := func(id string) {
		t.Helper()
		req := &api.HeartbeatRequest{ServerId: id, TenantLoad: []*api.TenantLoad{{Tenant: "acme",
			WriteOpsPerSec: 300, AdmittedWriteOpsPerSec: 33, ThrottledPerSec: 267, WrittenBytes: 4096}}}
		for _, p := range created.Map.Partitions {
			for _, rp := range p.Replicas {
				if rp.ServerId != id {
					continue
				}
				st := &api.ReplicaStatus{PartitionId: p.Id, Epoch: p.Epoch, Role: rp.Role, Keys: 10, Bytes: 1000,
					Reads: 50, Writes: 20, AppliedLsn: 100, CommitLsn: 100, State: api.ReplicaState_REPLICA_STATE_IN_SYNC}
				if rp.Role != api.ReplicaRole_REPLICA_ROLE_PRIMARY {
					st.AppliedLsn, st.State = 95, api.ReplicaState_REPLICA_STATE_CATCHING_UP
				}
				req.Replicas = append(req.Replicas, st)
			}
		}
		if resp, err := c.Heartbeat(ctx, req); err != nil || resp.Reregister {
			t.Fatalf("heartbeat %s: %v %v", id, resp, err)
		}
	}
	// step advances the clock by less than DeadAfter, the servers in
	// alive beating after each step.
	step := func(d time.Duration, alive ...string) {
		t.Helper()
		for d > 0 {
			s := min(d, 150*time.Millisecond)
			clk.Advance(s)
			d -= s
			for _, id := range alive {
				beat(id)
			}
		}
	}
	for _, id := range ids {
		beat(id)
	}
	// Over a second of heartbeats: the liveness loop notices the
	// throttling.
	var s dashSnapshot
	var raw string
	deadline := time.Now().Add(10 * time.Second)
	for {
		step(300*time.Millisecond, ids...)
		s, raw = snapshotOf(t, h)
		if hasEvent(s, EventThrottled, "tenant acme throttled") || time.Now().After(deadline) {
			break
		}
	}
	if !hasEvent(s, EventThrottled, "tenant acme throttled") {
		t.Fatalf("no throttling event: %+v", s.Events)
	}

	// Keys never leave the master, in any encoding.
	if len(tenant.Tenant.Keys) != 2 {
		t.Fatalf("created tenant has %d keys", len(tenant.Tenant.Keys))
	}
	for _, k := range tenant.Tenant.Keys {
		for _, enc := range []string{base64.StdEncoding.EncodeToString(k), base64.RawURLEncoding.EncodeToString(k)} {
			if strings.Contains(raw, enc) || strings.Contains(raw, enc[:20]) {
				t.Fatal("the snapshot holds a tenant key")
			}
		}
	}
	if strings.Contains(raw, `"keys":[`) {
		t.Fatalf("the snapshot has a keys list: %s", raw)
	}

	// Servers by fault domain, alive, with their load.
	if !s.Master.Leads || s.Master.Raft || s.Master.MapVersion == 0 {
		t.Fatalf("master %+v", s.Master)
	}
	if len(s.FaultDomains) != 3 || s.FaultDomains[0].Name != "fd-a" || s.FaultDomains[2].Name != "fd-c" {
		t.Fatalf("fault domains %+v", s.FaultDomains)
	}
	prim := 0
	for _, id := range ids {
		sv, ok := dashServerOf(s, id)
		if !ok || sv.State != "alive" || sv.Replicas != 3 || sv.HeardAgoMs < 0 || sv.HeardAgoMs > 300 || sv.Keys != 30 || sv.Reads != 150 || sv.Writes != 60 {
			t.Fatalf("server %s: %+v", id, sv)
		}
		prim += sv.Primaries
	}
	if prim != 3 {
		t.Fatalf("%d primaries, want 3", prim)
	}

	// The tenant, usage against quota.
	if len(s.Tenants) != 2 || s.Tenants[0].Name != "acme" || s.Tenants[1].Name != api.DefaultTenant {
		t.Fatalf("tenants %+v", s.Tenants)
	}
	acme := s.Tenants[0]
	if acme.Quota.WriteOpsPerSec != 100 || acme.Quota.StoredBytes != 1<<20 || acme.Tables != 1 || !acme.Throttled ||
		acme.Usage == nil || acme.Usage.ThrottledPerSec != 3*267 || acme.Usage.WriteOpsPerSec != 3*33 || acme.Usage.StoredBytes != 3*1000 {
		t.Fatalf("tenant acme %+v usage %+v", acme, acme.Usage)
	}

	// The table: partitions, roles and lag.
	if len(s.Tables) != 1 || s.Tables[0].Name != "orders" || s.Tables[0].Kind != "point" || len(s.Tables[0].Partitions) != 3 {
		t.Fatalf("tables %+v", s.Tables)
	}
	for _, p := range s.Tables[0].Partitions {
		if p.Primary == "" || len(p.Replicas) != 3 {
			t.Fatalf("partition %+v", p)
		}
		for _, rp := range p.Replicas {
			want := dashReplica{Server: rp.Server, Role: rp.Role, FaultDomain: rp.FaultDomain, ServerState: "alive", Reported: true,
				State: "in_sync", AppliedLSN: 100, CommitLSN: 100, Keys: 10, Bytes: 1000, Sync: "in_sync", InAckSet: true}
			if rp.Role != "primary" {
				// The master's judgement: catching up, 5 records behind
				// the primary's commit, since a report's age ago.
				want.State, want.AppliedLSN, want.Lag, want.Sync = "catching_up", 95, 5, "catching_up"
				if rp.LagMs < 0 || !strings.Contains(rp.Reason, "5 records behind") {
					t.Fatalf("partition %d replica %+v: want its lag and why", p.ID, rp)
				}
				want.LagMs, want.Reason = rp.LagMs, rp.Reason
			}
			if rp != want {
				t.Fatalf("partition %d replica %+v, want %+v", p.ID, rp, want)
			}
		}
	}
	if s.Streams.Extents < 0 || s.Streams.List == nil {
		t.Fatalf("streams %+v", s.Streams)
	}

	// The third server falls silent: declared dead, its primaries fail
	// over, and the events say so.
	dead := ids[2]
	var wasPrimaryOf []uint64
	for _, p := range s.Tables[0].Partitions {
		if p.Primary == dead {
			wasPrimaryOf = append(wasPrimaryOf, p.ID)
		}
	}
	if len(wasPrimaryOf) == 0 {
		t.Fatalf("server %s is primary of nothing", dead)
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		step(150*time.Millisecond, ids[:2]...)
		s, _ = snapshotOf(t, h)
		// The event is recorded once the command is published: wait for
		// both.
		if sv, _ := dashServerOf(s, dead); (sv.State == "dead" && hasEvent(s, EventServerDead, dead)) || time.Now().After(deadline) {
			break
		}
	}
	sv, _ := dashServerOf(s, dead)
	if sv.State != "dead" || sv.DownSinceMs == 0 || sv.Primaries != 0 {
		t.Fatalf("dead server %+v", sv)
	}
	if s.Summary["servers_dead"] != 1 || s.Summary["servers_alive"] != 2 {
		t.Fatalf("summary %v", s.Summary)
	}
	if !hasEvent(s, EventServerDead, "server "+dead+" declared dead") {
		t.Fatalf("no server_dead event: %+v", s.Events)
	}
	for _, pid := range wasPrimaryOf {
		var p dashPartition
		for _, q := range s.Tables[0].Partitions {
			if q.ID == pid {
				p = q
			}
		}
		if p.Primary == "" || p.Primary == dead {
			t.Fatalf("partition %d primary %q after %s died", pid, p.Primary, dead)
		}
		found := false
		for _, e := range s.Events {
			found = found || (e.Kind == EventFailover && e.Partition == pid && strings.Contains(e.Message, dead+" -> "+p.Primary))
		}
		if !found {
			t.Fatalf("no failover event for partition %d (%s -> %s): %+v", pid, dead, p.Primary, s.Events)
		}
		for _, rp := range p.Replicas {
			if rp.Server == dead && (rp.ServerState != "dead" || rp.Reported) {
				t.Fatalf("partition %d keeps a replica on the dead server shown as %+v", pid, rp)
			}
		}
	}
	// Newest first.
	for i := 1; i < len(s.Events); i++ {
		if s.Events[i].Seq >= s.Events[i-1].Seq {
			t.Fatalf("events out of order: %+v", s.Events)
		}
	}
}

// TestEventRing checks the ring keeps the newest maxEvents, newest first.
func TestEventRing(t *testing.T) {
	var r eventRing
	if got := r.recent(10); len(got) != 0 {
		t.Fatalf("empty ring: %v", got)
	}
	for i := range maxEvents + 7 {
		r.add(Event{UnixMs: int64(i)})
	}
	got := r.recent(maxEvents + 100)
	if len(got) != maxEvents {
		t.Fatalf("%d events kept, want %d", len(got), maxEvents)
	}
	for i, e := range got {
		if want := uint64(maxEvents + 7 - i); e.Seq != want || e.UnixMs != int64(want-1) {
			t.Fatalf("event %d: %+v, want seq %d", i, e, want)
		}
	}
	if got := r.recent(3); len(got) != 3 || got[0].Seq != maxEvents+7 {
		t.Fatalf("recent(3) = %+v", got)
	}
}

// TestDashboardFollower: a raft follower's dashboard names the leader and
// says what it cannot show; the leader's records its election.
func TestDashboardFollower(t *testing.T) {
	ms := startGroup(t, 3)
	leader := leaderOf(t, ms, 10*time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for _, mb := range ms {
		var s dashSnapshot
		for {
			s, _ = snapshotOf(t, mb.m.DashboardHandler())
			if mb == leader && hasEvent(s, EventLeader, fmt.Sprintf("member %d leads", leader.id)) ||
				mb != leader && s.Master.LeaderID == leader.id || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if !s.Master.Raft || s.Master.Member != mb.id {
			t.Fatalf("member %d: %+v", mb.id, s.Master)
		}
		if mb == leader {
			if !s.Master.Leads || s.Master.Note != "" || !hasEvent(s, EventLeader, fmt.Sprintf("member %d leads", leader.id)) {
				t.Fatalf("leader %d: %+v, events %+v", mb.id, s.Master, s.Events)
			}
			continue
		}
		if s.Master.Leads || s.Master.LeaderID != leader.id || !strings.Contains(s.Master.Note, fmt.Sprintf("member %d at %s", leader.id, leader.addr)) {
			t.Fatalf("follower %d: %+v (leader %d at %s)", mb.id, s.Master, leader.id, leader.addr)
		}
	}
}

// TestDashboardHotAndChanges: the snapshot lists the busiest partitions
// from the load view (reads of every replica, writes of the primary)
// with their share, the load on each partition's row, and the moves and
// splits under way.
func TestDashboardHotAndChanges(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := start(t, Options{DataDir: t.TempDir(), Logger: testLogger(t)})
	defer r.stop(t)
	var ids []string
	for _, fd := range []string{"fd-a", "fd-b", "fd-c", "fd-d"} {
		resp, err := r.c.RegisterServer(ctx, &api.RegisterServerRequest{Addr: "10.0.0.1:" + fd, FaultDomain: fd})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, resp.ServerId)
	}
	created, err := r.c.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: "t", Kind: api.TableKind_TABLE_KIND_POINT,
		Options: &api.TableOptions{Partitions: 3, Replication: 3}})
	if err != nil {
		t.Fatal(err)
	}
	parts := created.Map.Partitions
	// Two reports a second apart: partition 0 takes 900 reads/s on its
	// primary and 100 on a secondary and 300 writes/s; the others 10
	// reads/s.
	t0 := time.Unix(1_800_000_000, 0)
	for n, at := range []time.Time{t0, t0.Add(time.Second)} {
		for _, id := range ids {
			var sts []*api.ReplicaStatus
			for i, p := range parts {
				for _, rp := range p.Replicas {
					if rp.ServerId != id {
						continue
					}
					st := &api.ReplicaStatus{PartitionId: p.Id, Role: rp.Role, State: api.ReplicaState_REPLICA_STATE_IN_SYNC}
					primary := rp.Role == api.ReplicaRole_REPLICA_ROLE_PRIMARY
					switch {
					case i == 0 && primary:
						st.Reads, st.Writes = uint64(n*900), uint64(n*300)
					case i == 0 && rp.ServerId == p.Replicas[1].ServerId:
						st.Reads, st.Writes = uint64(n*100), uint64(n*300)
					case primary:
						st.Reads = uint64(n * 10)
					}
					sts = append(sts, st)
				}
			}
			r.m.load.report(id, at, sts, nil)
		}
	}
	// A split under way and a move.
	if _, _, err := r.m.propose(Command{UnixMs: 1, Payload: SplitPartition{PartitionID: parts[1].Id}}, nil, nil); err != nil {
		t.Fatal(err)
	}
	spare := ids[3]
	for _, rp := range parts[2].Replicas {
		if rp.ServerId == spare {
			spare = ""
		}
	}
	if spare != "" {
		if _, _, err := r.m.propose(Command{UnixMs: 2, Payload: MoveReplica{PartitionID: parts[2].Id, ServerID: parts[2].Replicas[1].ServerId, To: spare}}, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	s, _ := snapshotOf(t, r.m.DashboardHandler())
	if len(s.Hot) != 3 || s.Hot[0].ID != parts[0].Id || s.Hot[0].ReadsPerSec != 1000 || s.Hot[0].WritesPerSec != 300 {
		t.Fatalf("hot partitions %+v, want partition %d first with 1000 reads/s and 300 writes/s", s.Hot, parts[0].Id)
	}
	if share := s.Hot[0].Share; share < 1300.0/1320-1e-9 || share > 1300.0/1320+1e-9 {
		t.Fatalf("hot share %v, want %v", share, 1300.0/1320)
	}
	if p := s.Tables[0].Partitions[0]; p.ReadsPerSec != 1000 || p.WritesPerSec != 300 {
		t.Fatalf("partition row %+v: want its load", p)
	}
	kinds := map[string]dashChange{}
	for _, c := range s.Changes {
		kinds[c.Kind] = c
	}
	if c, ok := kinds["split"]; !ok || c.ID != parts[1].Id || len(c.Into) != 2 {
		t.Fatalf("changes %+v: want partition %d splitting", s.Changes, parts[1].Id)
	}
	if c, ok := kinds["move"]; spare != "" && (!ok || c.ID != parts[2].Id || c.To != spare) {
		t.Fatalf("changes %+v: want partition %d moving to %s", s.Changes, parts[2].Id, spare)
	}
	if s.Summary["changes_in_progress"] != int64(len(s.Changes)) {
		t.Fatalf("summary %v", s.Summary)
	}
}
