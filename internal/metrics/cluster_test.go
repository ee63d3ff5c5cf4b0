package metrics_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/metrics"
	"github.com/tabuladb/tabula/internal/testcluster"
	"github.com/tabuladb/tabula/tablemaster"
	"github.com/tabuladb/tabula/tableserver"
)

// scrape fetches url's metrics over HTTP and parses them.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	return fams
}

// sum adds the samples of family name whose labels include want, over
// every scrape.
func sum(scrapes []map[string]*dto.MetricFamily, name string, want map[string]string) (total float64, found bool) {
	for _, fams := range scrapes {
		f := fams[name]
		if f == nil {
			continue
		}
	metric:
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue metric
				}
			}
			found = true
			switch {
			case m.Counter != nil:
				total += m.GetCounter().GetValue()
			case m.Gauge != nil:
				total += m.GetGauge().GetValue()
			case m.Histogram != nil:
				total += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return total, found
}

// TestClusterMetrics runs a master and three servers, each with its own
// Registry served over HTTP as each process serves its own, does Puts and
// Gets through the SDK, and checks that the scraped figures moved with the
// right labels.
func TestClusterMetrics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	masterReg := metrics.New(metrics.Options{})
	const servers = 3
	var serverRegs [servers]*metrics.Registry
	for i := range serverRegs {
		serverRegs[i] = metrics.New(metrics.Options{})
	}
	c, err := testcluster.Start(ctx, testcluster.Options{
		Servers: servers,
		MasterOptions: func(o *tablemaster.Options) {
			o.Metrics = masterReg.Registerer()
			o.UnaryInterceptors = []grpc.UnaryServerInterceptor{masterReg.UnaryServerInterceptor()}
			o.StreamInterceptors = []grpc.StreamServerInterceptor{masterReg.StreamServerInterceptor()}
		},
		ServerOptions: func(i int, o *tableserver.Options) {
			o.Metrics = serverRegs[i].Registerer()
			o.UnaryInterceptors = []grpc.UnaryServerInterceptor{serverRegs[i].UnaryServerInterceptor()}
			o.StreamInterceptors = []grpc.StreamServerInterceptor{serverRegs[i].StreamServerInterceptor()}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	}()
	var urls []string
	for _, r := range append([]*metrics.Registry{masterReg}, serverRegs[:]...) {
		hs, err := r.Listen("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer hs.Close()
		urls = append(urls, hs.URL())
	}

	cl, err := client.New(ctx, client.Options{Masters: c.MasterAddrs(), Credential: c.Credential()})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	const parts = 4
	if _, err := cl.CreateTable(ctx, "users", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: parts, Storage: "ssd", Replication: 3}); err != nil {
		t.Fatal(err)
	}
	tbl := cl.Table("users")
	const n = 20
	for i := range n {
		if err := tbl.Put(ctx, fmt.Appendf(nil, "k%d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		if _, err := tbl.Get(ctx, fmt.Appendf(nil, "k%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	// A request every server refuses (no partition 0): counted as an error
	// with its code, under its tenant and table.
	cc, err := grpc.NewClient(c.ServerAddrs()[0], append(c.Credential().DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	_, refused := api.NewTableServerClient(cc).Put(ctx, &api.PutRequest{
		Header: &api.RequestHeader{Tenant: api.DefaultTenant, Table: "users"}, Key: []byte("x"), Value: []byte("y")})
	if refused == nil {
		t.Fatal("a Put naming no partition was accepted")
	}
	// A table that does not exist: the master's NOT_FOUND.
	if _, err := cl.DescribeTable(ctx, "nosuch"); api.CodeOf(err) != api.ErrorCode_ERROR_CODE_NOT_FOUND {
		t.Fatalf("describe a missing table: %v, want NOT_FOUND", err)
	}

	var srv []map[string]*dto.MetricFamily
	for _, u := range urls[1:] {
		srv = append(srv, scrape(t, u))
	}
	mst := []map[string]*dto.MetricFamily{scrape(t, urls[0])}
	users := map[string]string{"tenant": api.DefaultTenant, "table": "users"}
	with := func(m map[string]string, kv ...string) map[string]string {
		out := map[string]string{}
		for k, v := range m {
			out[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}

	// Requests, per tenant, table and op: every Put and Get once (the SDK
	// retries nothing on a healthy cluster).
	// Every Put and Get succeeded once; the SDK may have retried some (a
	// primary still starting), and those count as errors. One more Put
	// was refused below.
	for op, want := range map[string]float64{"TableServer/Put": n + 1, "TableServer/Get": n} {
		reqs, _ := sum(srv, "tabula_rpc_requests_total", with(users, "op", op))
		errs, _ := sum(srv, "tabula_rpc_errors_total", with(users, "op", op))
		if reqs-errs != n || reqs < want {
			t.Errorf("%s: requests %v, errors %v; want %d answered without error", op, reqs, errs, n)
		}
	}
	// Replication between the servers (3 replicas) runs on streams whose
	// batches count as ReplicateBatch calls, one latency sample each.
	noLabels := map[string]string{"tenant": "", "table": ""}
	batches, _ := sum(srv, "tabula_rpc_requests_total", with(noLabels, "op", "ExtentNode/ReplicateBatch"))
	if batches < 1 {
		t.Errorf("ExtentNode/ReplicateBatch requests = %v, want the replicated writes' batches", batches)
	}
	if v, _ := sum(srv, "tabula_rpc_latency_seconds", with(noLabels, "op", "ExtentNode/ReplicateBatch")); v != batches {
		t.Errorf("ReplicateBatch latency samples = %v, want one per batch (%v)", v, batches)
	}
	if v, found := sum(srv, "tabula_rpc_requests_total", with(noLabels, "op", "ExtentNode/ReplicateStream")); found {
		t.Errorf("ExtentNode/ReplicateStream recorded as %v requests: a stream's life is no request", v)
	}
	getReqs, _ := sum(srv, "tabula_rpc_requests_total", with(users, "op", "TableServer/Get"))
	if v, _ := sum(srv, "tabula_rpc_latency_seconds", with(users, "op", "TableServer/Get")); v != getReqs {
		t.Errorf("Get latency samples = %v, want one per request (%v)", v, getReqs)
	}
	refusedCode := strings.TrimPrefix(api.CodeOf(refused).String(), "ERROR_CODE_")
	if v, _ := sum(srv, "tabula_rpc_errors_total", with(users, "op", "TableServer/Put", "error", refusedCode)); v < 1 {
		t.Errorf("refused Put errors{error=%q} = %v, want >= 1", refusedCode, v)
	}
	// The master: the table's creation, its map lookups, the NOT_FOUND.
	if v, _ := sum(mst, "tabula_rpc_requests_total", with(users, "op", "Master/CreateTable")); v != 1 {
		t.Errorf("CreateTable requests = %v, want 1", v)
	}
	nosuch := map[string]string{"tenant": api.DefaultTenant, "table": "nosuch", "op": "Master/DescribeTable", "code": "NotFound", "error": "NOT_FOUND"}
	if v, _ := sum(mst, "tabula_rpc_errors_total", nosuch); v != 1 {
		t.Errorf("DescribeTable errors %v = %v, want 1", nosuch, v)
	}
	if v, _ := sum(mst, "tabula_rpc_requests_total", map[string]string{"op": "Master/Heartbeat", "tenant": ""}); v == 0 {
		t.Error("no heartbeats counted")
	}

	// Component figures.
	checks := []struct {
		scrapes []map[string]*dto.MetricFamily
		name    string
		labels  map[string]string
		min     float64
		max     float64
	}{
		// Primaries have applied every write (secondaries follow
		// asynchronously); reserved keys (the applied LSN) count too.
		{srv, "tabula_engine_writes_total", nil, n, 1e9},
		{srv, "tabula_engine_keys", nil, n, 1e6},
		{srv, "tabula_engine_reads_total", nil, n, 1e9},
		{srv, "tabula_engine_log_bytes", nil, 1, 1e12},
		{srv, "tabula_server_partitions", map[string]string{"kind": "point"}, 3 * parts, 3 * parts},
		{srv, "tabula_replication_replicas", map[string]string{"role": "primary"}, parts, parts},
		{srv, "tabula_replication_replicas", map[string]string{"role": "secondary"}, 2 * parts, 2 * parts},
		{srv, "tabula_replication_lag_records", nil, 0, 1e9},
		{srv, "tabula_stream_appends_total", nil, 1, 1e9},
		{srv, "tabula_stream_replicated_writes_total", nil, 1, 1e9},
		{srv, "tabula_stream_journal_commits_total", nil, 1, 1e9},
		{srv, "tabula_stream_secondary_drops_total", nil, 0, 1e9},
		{srv, "tabula_coproc_calls_total", nil, 0, 0},
		{mst, "tabula_master_tables", map[string]string{"kind": "point"}, 1, 1},
		{mst, "tabula_master_partitions", nil, parts, parts},
		{mst, "tabula_master_replicas", map[string]string{"role": "primary"}, parts, parts},
		{mst, "tabula_master_servers", map[string]string{"state": "alive"}, servers, servers},
		{mst, "tabula_master_servers", map[string]string{"state": "dead"}, 0, 0},
		{mst, "tabula_master_leader", nil, 1, 1},
		{mst, "tabula_master_proposals_total", nil, 2, 1e9},
		{mst, "tabula_master_streams", nil, parts, 1e9},
	}
	for _, ck := range checks {
		v, found := sum(ck.scrapes, ck.name, ck.labels)
		if !found || v < ck.min || v > ck.max {
			t.Errorf("%s%v = %v (found %v), want in [%v, %v]", ck.name, ck.labels, v, found, ck.min, ck.max)
		}
	}
}
