package tableserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/testcluster"
	"github.com/tabuladb/tabula/tablemaster"
	"github.com/tabuladb/tabula/tableserver"
)

// replicateHold holds the replicate calls a server receives (as a
// secondary extent node) while it is on: the server stalls as its
// primaries see it, and they drop it from their logs' ack sets.
type replicateHold struct {
	mu      sync.Mutex
	release chan struct{} // nil: not holding
	held    int           // calls or batches held so far
}

func (h *replicateHold) hold() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.release == nil {
		h.release = make(chan struct{})
	}
}

func (h *replicateHold) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.release != nil {
		close(h.release)
		h.release = nil
	}
}

func (h *replicateHold) heldCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held
}

func (h *replicateHold) wait(ctx context.Context) error {
	h.mu.Lock()
	ch := h.release
	if ch != nil {
		h.held++
	}
	h.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func isReplicate(method string) bool {
	return strings.HasSuffix(method, "/Replicate") || strings.HasSuffix(method, "/ReplicateBatch") || strings.HasSuffix(method, "/ReplicateStream")
}

func (h *replicateHold) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if isReplicate(info.FullMethod) {
		if err := h.wait(ctx); err != nil {
			return nil, err
		}
	}
	return handler(ctx, req)
}

func (h *replicateHold) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if !isReplicate(info.FullMethod) {
		return handler(srv, ss)
	}
	return handler(srv, heldStream{ss, h})
}

type heldStream struct {
	grpc.ServerStream
	h *replicateHold
}

func (s heldStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return s.h.wait(s.Context())
}

// A secondary held out of its log's ack set falls behind: it refuses
// read_any reads once it is past their staleness bound (so the SDK's
// ReadAny reads see the latest write or are served elsewhere), describe,
// the dashboard and the metrics show it dropped with its lag, the
// partition is counted under-replicated, and once the hold ends and the
// log reaches it again it is in sync and counted no more.
func TestDroppedSecondaryIsVisibleAndServesNoStaleReads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	holds := []*replicateHold{{}, {}, {}}
	reg := prometheus.NewRegistry()
	c, err := testcluster.Start(ctx, testcluster.Options{Servers: 3,
		ServerOptions: func(i int, o *tableserver.Options) {
			o.UnaryInterceptors = append(o.UnaryInterceptors, holds[i].unary)
			o.StreamInterceptors = append(o.StreamInterceptors, holds[i].stream)
			// The log moves to a new extent after a few writes, on every
			// replica: the way back in for a dropped secondary even
			// without the stream layer's rejoin.
			o.LogExtentBytes = 64 << 10
		},
		MasterOptions: func(o *tablemaster.Options) {
			o.Metrics = reg
			o.SyncLag = 500 * time.Millisecond
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	defer func() {
		for _, h := range holds {
			h.stop()
		}
	}()
	f := &fixture{c: c, conns: map[string]*grpc.ClientConn{}}
	f.master = api.NewMasterClient(f.dial(t, c.MasterAddr()))
	resp, err := f.master.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: "t", Kind: api.TableKind_TABLE_KIND_POINT,
		Options: &api.TableOptions{Partitions: 1, Replication: 3}})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(ctx, c.ClientOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	tbl := cl.Table("t")
	key := []byte("k")
	if err := tbl.Put(ctx, key, []byte("v1")); err != nil {
		t.Fatal(err)
	}

	// Every replica in sync first.
	p := resp.GetMap().GetPartitions()[0]
	describe := func() (*api.PartitionMap, map[string]*api.ReplicaStatus) {
		d, err := cl.DescribeTable(ctx, "t")
		if err != nil {
			t.Fatal(err)
		}
		by := map[string]*api.ReplicaStatus{}
		for _, s := range d.GetReplicas() {
			by[s.GetServerId()] = s
		}
		return d.GetMap(), by
	}
	waitFor(t, "every replica in sync", func() (bool, string) {
		m, by := describe()
		p = m.GetPartitions()[0]
		n := 0
		for _, r := range p.GetReplicas() {
			if by[r.GetServerId()].GetSync().GetState() == api.ReplicaState_REPLICA_STATE_IN_SYNC {
				n++
			}
		}
		return n == 3, fmt.Sprint(by)
	})
	var sec *api.Replica
	for _, r := range p.GetReplicas() {
		if r.GetRole() == api.ReplicaRole_REPLICA_ROLE_SECONDARY {
			sec = r
			break
		}
	}
	idx := -1
	for i, id := range c.ServerIDs() {
		if id == sec.GetServerId() {
			idx = i
		}
	}

	// Hold it: the next write drops it from the ack set (quorum).
	holds[idx].hold()
	var wrote uint64
	if err := tbl.Put(ctx, key, []byte("v2"), client.ReportLSN(&wrote)); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if err := tbl.Put(ctx, fmt.Appendf(nil, "other-%d", i), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if holds[idx].heldCount() == 0 {
		t.Fatal("no replicate call reached the held secondary")
	}

	// The secondary itself refuses read_any reads once past the bound.
	bound := 200 * time.Millisecond
	sc := api.NewTableServerClient(f.dial(t, sec.GetAddr()))
	h := hdr(p)
	h.ReadAny, h.MaxStalenessMs = true, uint32(bound.Milliseconds())
	waitFor(t, "the held secondary refuses read_any", func() (bool, string) {
		g, err := sc.Get(ctx, &api.GetRequest{Header: h, Key: key})
		if err == nil && string(g.GetValue()) == "v2" {
			t.Fatalf("the held secondary answered v2 at LSN %d: it was not held", g.GetLsn())
		}
		return api.DetailOf(err).GetReason() == "replica_behind", fmt.Sprint(g, err)
	})
	_, err = sc.Get(ctx, &api.GetRequest{Header: h, Key: key})
	if d := api.DetailOf(err); api.CodeOf(err) != api.ErrorCode_ERROR_CODE_UNAVAILABLE || !strings.Contains(err.Error(), "behind its primary") {
		t.Fatalf("read_any at the held secondary: %v (%v)", err, d)
	}
	// Every ReadAny read of the SDK sees v2: the held secondary sends
	// it elsewhere, with the bound set and with the default one (1 s,
	// passed by now too once the master counts it, below).
	for range 40 {
		var lsn uint64
		v, err := tbl.Get(ctx, key, client.ReadAny(), client.MaxStaleness(bound), client.ReportLSN(&lsn))
		if err != nil || string(v) != "v2" || lsn < wrote {
			t.Fatalf("ReadAny with MaxStaleness(%v): %q at LSN %d (wrote %d), %v", bound, v, lsn, wrote, err)
		}
	}

	// Describe: dropped, with its lag in records and time; the gauge
	// counts the partition.
	waitFor(t, "describe shows the secondary dropped", func() (bool, string) {
		_, by := describe()
		js := by[sec.GetServerId()].GetSync()
		return js.GetState() == api.ReplicaState_REPLICA_STATE_DROPPED && !js.GetInAckSet() && js.GetLagRecords() >= 21 && js.GetLagMs() > 0 &&
			strings.Contains(js.GetReason(), "ack set"), fmt.Sprint(js)
	})
	waitFor(t, "tabula_partitions_under_replicated is 1", func() (bool, string) {
		v := gauge(t, reg, "tabula_partitions_under_replicated")
		return v == 1, fmt.Sprint(v)
	})
	// The default bound (1 s) runs from the secondary's last commit
	// notice (every 250 ms while it was in the ack set): wait until the
	// held secondary is past it too.
	hd := hdr(p)
	hd.ReadAny = true
	waitFor(t, "the held secondary refuses read_any with the default bound", func() (bool, string) {
		g, err := sc.Get(ctx, &api.GetRequest{Header: hd, Key: key})
		return api.DetailOf(err).GetReason() == "replica_behind", fmt.Sprint(g, err)
	})
	for range 40 {
		v, err := tbl.Get(ctx, key, client.ReadAny())
		if err != nil || string(v) != "v2" {
			t.Fatalf("ReadAny with the default bound: %q, %v", v, err)
		}
	}
	dash := dashboardReplica(t, c, sec.GetServerId())
	if dash.Sync != "dropped" || dash.InAckSet || dash.Lag < 21 || dash.LagMs <= 0 || !dash.Under {
		t.Fatalf("dashboard: %+v", dash)
	}

	// The hold ends; writes move the log to a new extent on every
	// replica, and the secondary is in step again.
	holds[idx].stop()
	val := bytes.Repeat([]byte("x"), 4<<10)
	i := 0
	waitFor(t, "the secondary in sync again", func() (bool, string) {
		if err := tbl.Put(ctx, fmt.Appendf(nil, "fill-%d", i%64), val); err != nil {
			t.Fatal(err)
		}
		i++
		_, by := describe()
		n := 0
		for _, s := range by {
			if s.GetSync().GetState() == api.ReplicaState_REPLICA_STATE_IN_SYNC {
				n++
			}
		}
		return n == 3, fmt.Sprint(by[sec.GetServerId()].GetSync())
	})
	waitFor(t, "tabula_partitions_under_replicated back to 0", func() (bool, string) {
		v := gauge(t, reg, "tabula_partitions_under_replicated")
		return v == 0, fmt.Sprint(v)
	})
	h.MaxStalenessMs = 0
	h.MinLsn = wrote
	g, err := eventually(t, func() (*api.GetResponse, error) { return sc.Get(ctx, &api.GetRequest{Header: h, Key: key}) })
	if err != nil || string(g.GetValue()) != "v2" {
		t.Fatalf("read_any at the secondary back in step: %v, %v", g, err)
	}
}

// waitFor polls cond until it holds, failing the test with cond's last
// description after 30 s.
func waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, desc := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %s", what, desc)
		}
		<-tick.C
	}
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

type dashReplicaView struct {
	Sync     string `json:"sync"`
	InAckSet bool   `json:"in_ack_set"`
	Lag      uint64 `json:"lag"`
	LagMs    int64  `json:"lag_ms"`
	Under    bool   `json:"-"`
}

// dashboardReplica is server's replica of table t's partition in the
// dashboard's JSON.
func dashboardReplica(t *testing.T, c *testcluster.Cluster, server string) dashReplicaView {
	t.Helper()
	rec := httptest.NewRecorder()
	c.Master(0).DashboardHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/api/cluster", nil))
	var snap struct {
		Summary map[string]int64 `json:"summary"`
		Tables  []struct {
			Name       string `json:"name"`
			Partitions []struct {
				Under    bool `json:"under_replicated"`
				Replicas []struct {
					dashReplicaView
					Server string `json:"server"`
				} `json:"replicas"`
			} `json:"partitions"`
		} `json:"tables"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &snap); err != nil {
		t.Fatal(err)
	}
	if snap.Summary["partitions_under_replicated"] != 1 {
		t.Fatalf("dashboard summary %v", snap.Summary)
	}
	for _, tb := range snap.Tables {
		for _, p := range tb.Partitions {
			for _, r := range p.Replicas {
				if tb.Name == "t" && r.Server == server {
					v := r.dashReplicaView
					v.Under = p.Under
					return v
				}
			}
		}
	}
	t.Fatalf("no replica on %s in the dashboard: %s", server, rec.Body.String())
	return dashReplicaView{}
}
